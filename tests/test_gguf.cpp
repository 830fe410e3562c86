// GGUF reader/writer tests: round trips through gguf_writer, byte equality with an
// independent encoder written here, an enumerated table of corrupted files (each
// a mutation of a valid file), random mutations, and facts of the real model.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/model.h"
#include "ggml-like/error.h"
#include "ggml-like/gguf.h"
#include "tests/temp_dir.h"

namespace fs = std::filesystem;
using zk::dtype;
using zk::gguf_file;
using zk::gguf_type;
using zk::gguf_value;
using zk::gguf_writer;

namespace {

// ---------------------------------------------------------------------------
// Helpers

// A scratch directory removed at the end of each test.
class GgufTest : public zk_test::TempDirTest {
protected:
    GgufTest() : TempDirTest("zk_gguf_test") {}
};

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
    // Unlink first: ext4 flushes a file truncated and rewritten in place on close,
    // which makes the many small rewrites below slow.
    std::remove(path.c_str());
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write((const char*)b.data(), (std::streamsize)b.size());
    ASSERT_TRUE(f.good());
}

std::vector<uint8_t> read_bytes(const std::string& path) { return zk_test::read_file(path); }

// Opens PATH expecting zk::error; returns its message ("" if nothing was thrown).
std::string open_error(const std::string& path) {
    try {
        gguf_file::open(path);
    } catch (const zk::error& e) {
        return e.what();
    }
    return "";
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> v(n);
    for (auto& x : v) x = (uint8_t)rng();
    return v;
}

// Bytes of a tensor, from the block sizes of the format (independent of dtype.cpp):
// F32 4 B/elem, F16/BF16 2 B/elem, Q8_0 34 B per 32, Q4_1 20 B per 32.
size_t expected_bytes(dtype t, const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    switch (t) {
        case dtype::F32: return (size_t)n * 4;
        case dtype::F16: case dtype::BF16: return (size_t)n * 2;
        case dtype::Q8_0: return (size_t)n / 32 * 34;
        case dtype::Q4_1: return (size_t)n / 32 * 20;
        default: ADD_FAILURE() << "type not used in these tests"; return 0;
    }
}

// ---------------------------------------------------------------------------
// An independent byte-level GGUF encoder. It records the offset of named fields so
// the corruption table can patch them.

struct raw_gguf {
    std::vector<uint8_t> b;
    std::map<std::string, size_t> at;

    void mark(const char* name) {
        if (name) at[name] = b.size();
    }
    void u8(uint8_t v, const char* m = nullptr) { mark(m); b.push_back(v); }
    void u32(uint32_t v, const char* m = nullptr) {
        mark(m);
        for (int k = 0; k < 4; k++) b.push_back((uint8_t)(v >> (8 * k)));
    }
    void u64(uint64_t v, const char* m = nullptr) {
        mark(m);
        for (int k = 0; k < 8; k++) b.push_back((uint8_t)(v >> (8 * k)));
    }
    void str(const std::string& s, const char* m = nullptr) {
        u64(s.size(), m);
        b.insert(b.end(), s.begin(), s.end());
    }
    void pad(size_t a) {
        while (b.size() % a) b.push_back(0);
    }
    void put_u32(const std::string& field, uint32_t v) {
        ASSERT_TRUE(at.count(field)) << field;
        for (int k = 0; k < 4; k++) b[at[field] + k] = (uint8_t)(v >> (8 * k));
    }
    void put_u64(const std::string& field, uint64_t v) {
        ASSERT_TRUE(at.count(field)) << field;
        for (int k = 0; k < 8; k++) b[at[field] + k] = (uint8_t)(v >> (8 * k));
    }
};

// The valid file the corruption table mutates: 4 keys, 3 tensors, alignment 32, and
// no padding after the last tensor so that any cut of the data is detectable.
//   t.a F32 [8, 2] at 0 (64 B) | t.b F16 [16, 3] at 64 (96 B) | t.c Q8_0 [32, 2] at 160 (68 B)
raw_gguf make_valid_raw() {
    raw_gguf r;
    r.u32(0x46554747u, "magic");  // "GGUF"
    r.u32(3, "version");
    r.u64(3, "n_tensors");
    r.u64(4, "n_kv");

    r.str("general.architecture", "key0_len");
    r.u32(8, "key0_type");
    r.str("llama");
    r.str("general.alignment", "key1_name");
    r.u32(4);
    r.u32(32, "alignment_value");
    r.str("test.arr");
    r.u32(9);
    r.u32(5);  // i32 elements
    r.u64(3, "arr_len");
    r.u32(1), r.u32(2), r.u32((uint32_t)-3);
    r.str("test.str", "key3_name");
    r.u32(8);
    r.str("hello", "str_len");

    r.str("t.a");
    r.u32(2, "ta_ndims");
    r.u64(8, "ta_ne0");
    r.u64(2, "ta_ne1");
    r.u32(0, "ta_type");
    r.u64(0, "ta_offset");
    r.str("t.b", "tb_name");
    r.u32(2);
    r.u64(16);
    r.u64(3);
    r.u32(1);
    r.u64(64, "tb_offset");
    r.str("t.c");
    r.u32(2);
    r.u64(32, "tc_ne0");
    r.u64(2);
    r.u32(8, "tc_type");
    r.u64(160, "tc_offset");
    r.pad(32);
    r.at["data"] = r.b.size();
    std::vector<uint8_t> data = random_bytes(64 + 96 + 68, 7);
    r.b.insert(r.b.end(), data.begin(), data.end());
    return r;
}

// ---------------------------------------------------------------------------
// Round trip through gguf_writer

struct tensor_spec {
    std::string name;
    dtype type;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
};

std::vector<tensor_spec> sample_tensors() {
    std::vector<tensor_spec> ts = {
        {"blk.0.f32", dtype::F32, {7, 3}, {}},
        {"blk.0.f16", dtype::F16, {5, 2, 3}, {}},
        {"token_embd.weight", dtype::Q8_0, {64, 3}, {}},
        {"blk.1.q4_1", dtype::Q4_1, {32, 2, 2, 2}, {}},
        {"single", dtype::BF16, {3}, {}},
    };
    uint32_t seed = 1;
    for (auto& t : ts) t.bytes = random_bytes(expected_bytes(t.type, t.shape), seed++);
    return ts;
}

gguf_value nested_array() {
    // [[1, 2, 3], [], [-4]] of i32, and one level deeper: [[["a"], ["b", "c"]]]
    std::vector<gguf_value> rows;
    rows.push_back(gguf_value::make_arr_i32({1, 2, 3}));
    rows.push_back(gguf_value::make_arr(gguf_type::INT32, {}));
    rows.push_back(gguf_value::make_arr_i32({-4}));
    return gguf_value::make_arr(gguf_type::ARRAY, std::move(rows));
}

gguf_value deep_string_array() {
    std::vector<gguf_value> inner;
    inner.push_back(gguf_value::make_arr_str({"a"}));
    inner.push_back(gguf_value::make_arr_str({"b", "c"}));
    std::vector<gguf_value> outer;
    outer.push_back(gguf_value::make_arr(gguf_type::ARRAY, std::move(inner)));
    return gguf_value::make_arr(gguf_type::ARRAY, std::move(outer));
}

std::vector<std::pair<std::string, gguf_value>> sample_kv() {
    return {
        {"general.architecture", gguf_value::make_str("llama")},
        {"t.u8", gguf_value::make_u8(255)},
        {"t.i8", gguf_value::make_i8(-128)},
        {"t.u16", gguf_value::make_u16(65535)},
        {"t.i16", gguf_value::make_i16(-32768)},
        {"t.u32", gguf_value::make_u32(4000000000u)},
        {"t.i32", gguf_value::make_i32(-2000000000)},
        {"t.u64", gguf_value::make_u64(std::numeric_limits<uint64_t>::max())},
        {"t.i64", gguf_value::make_i64(std::numeric_limits<int64_t>::min())},
        {"t.f32", gguf_value::make_f32(-1.5e-5f)},
        {"t.f64", gguf_value::make_f64(3.141592653589793)},
        {"t.bool_t", gguf_value::make_bool(true)},
        {"t.bool_f", gguf_value::make_bool(false)},
        {"t.str_empty", gguf_value::make_str("")},
        {"t.str_utf8", gguf_value::make_str("h\xc3\xa9llo \xe2\x80\x94 w\xc3\xb6rld\n")},
        {"t.str_nul", gguf_value::make_str(std::string("a\0b", 3))},
        {"t.arr_str", gguf_value::make_arr_str({"<s>", "", "\xc4\xa0the", "x y"})},
        {"t.arr_f32", gguf_value::make_arr_f32({0.f, -0.25f, 1e30f})},
        {"t.arr_u8", gguf_value::make_arr(gguf_type::UINT8, {gguf_value::make_u8(0), gguf_value::make_u8(9)})},
        {"t.arr_empty", gguf_value::make_arr(gguf_type::STRING, {})},
        {"t.nested", nested_array()},
        {"t.nested_str", deep_string_array()},
    };
}

void expect_value_eq(const gguf_value& a, const gguf_value& b, const std::string& key) {
    ASSERT_EQ(a.type, b.type) << key;
    switch (a.type) {
        case gguf_type::STRING: EXPECT_EQ(a.s, b.s) << key; break;
        case gguf_type::FLOAT32: EXPECT_EQ((float)a.f, (float)b.f) << key; break;
        case gguf_type::FLOAT64: EXPECT_EQ(a.f, b.f) << key; break;
        case gguf_type::INT8: case gguf_type::INT16: case gguf_type::INT32: case gguf_type::INT64:
            EXPECT_EQ(a.i, b.i) << key;
            break;
        case gguf_type::ARRAY:
            ASSERT_EQ(a.arr_type, b.arr_type) << key;
            ASSERT_EQ(a.arr.size(), b.arr.size()) << key;
            for (size_t k = 0; k < a.arr.size(); k++)
                expect_value_eq(a.arr[k], b.arr[k], key + "[" + std::to_string(k) + "]");
            break;
        default: EXPECT_EQ(a.u, b.u) << key; break;
    }
}

void check_round_trip(const std::string& path, size_t alignment) {
    const auto kv = sample_kv();
    const auto ts = sample_tensors();
    gguf_writer w;
    if (alignment != 32) w.set("general.alignment", gguf_value::make_u32((uint32_t)alignment));
    for (const auto& e : kv) w.set(e.first, e.second);
    for (const auto& t : ts) w.add_tensor(t.name, t.type, t.shape, t.bytes.data(), t.bytes.size());
    w.write(path);

    auto f = gguf_file::open(path);
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->alignment(), alignment);
    EXPECT_EQ(f->data_offset() % alignment, 0u);
    EXPECT_EQ(f->file_size(), (size_t)fs::file_size(path));

    // Keys in insertion order (general.alignment first when set).
    const size_t extra = alignment != 32 ? 1 : 0;
    ASSERT_EQ(f->kv().size(), kv.size() + extra);
    if (extra) {
        EXPECT_EQ(f->kv()[0].first, "general.alignment");
        EXPECT_EQ(f->kv()[0].second.type, gguf_type::UINT32);
        EXPECT_EQ(f->get_int("general.alignment"), (int64_t)alignment);
    } else {
        EXPECT_EQ(f->find("general.alignment"), nullptr);
    }
    for (size_t k = 0; k < kv.size(); k++) {
        EXPECT_EQ(f->kv()[k + extra].first, kv[k].first);
        expect_value_eq(f->kv()[k + extra].second, kv[k].second, kv[k].first);
        ASSERT_NE(f->find(kv[k].first), nullptr);
    }

    ASSERT_EQ(f->tensors().size(), ts.size());
    const std::vector<uint8_t> file = read_bytes(path);
    uint64_t prev_end = 0;
    for (size_t k = 0; k < ts.size(); k++) {
        const auto& t = f->tensors()[k];
        EXPECT_EQ(t.name, ts[k].name);
        EXPECT_EQ(t.type, ts[k].type) << t.name;
        EXPECT_EQ(t.shape, ts[k].shape) << t.name;
        ASSERT_EQ(t.n_bytes, ts[k].bytes.size()) << t.name;
        EXPECT_EQ(std::memcmp(t.data, ts[k].bytes.data(), t.n_bytes), 0) << t.name;
        EXPECT_EQ(t.offset % alignment, 0u) << t.name;
        EXPECT_EQ((uintptr_t)t.data % alignment, 0u) << t.name;  // mmap is page aligned
        EXPECT_EQ(t.data, f->get_tensor(t.name).data);
        // The padding between tensors is zeros.
        for (uint64_t o = prev_end; o < t.offset; o++)
            ASSERT_EQ(file[f->data_offset() + o], 0) << "padding before " << t.name;
        prev_end = t.offset + t.n_bytes;
        int64_t n = 1;
        for (int64_t d : ts[k].shape) n *= d;
        EXPECT_EQ(t.n_elements(), n);
        EXPECT_EQ(t.n_rows(), n / ts[k].shape[0]);
    }
    // The data section (and so the file) ends padded to the alignment.
    EXPECT_EQ(f->file_size() % alignment, 0u);
    for (size_t o = f->data_offset() + prev_end; o < file.size(); o++) ASSERT_EQ(file[o], 0);
}

TEST_F(GgufTest, RoundTripDefaultAlignment) { check_round_trip(path("rt.gguf"), 32); }

TEST_F(GgufTest, RoundTripOtherAlignments) {
    for (size_t a : {8, 64, 4096}) {
        SCOPED_TRACE(a);
        check_round_trip(path("rt" + std::to_string(a) + ".gguf"), a);
    }
}

// The writer's bytes equal those of the independent encoder above for the same content.
TEST_F(GgufTest, WriterMatchesIndependentEncoding) {
    const auto ta = random_bytes(8 * 2 * 4, 11);
    const auto tb = random_bytes(2 * 34, 12);
    gguf_writer w;
    w.set("general.architecture", gguf_value::make_str("llama"));
    w.set("x.n", gguf_value::make_u32(7));
    w.set("x.list", gguf_value::make_arr_i32({1, -2}));
    w.set("x.flag", gguf_value::make_bool(true));
    w.set("x.n", gguf_value::make_u32(9));  // replaces in place
    w.set("x.gone", gguf_value::make_f32(1.f));
    w.remove("x.gone");
    w.add_tensor("a", dtype::F32, {8, 2}, ta.data(), ta.size());
    w.add_tensor_ref("b", dtype::Q8_0, {32, 2}, tb.data(), tb.size());
    w.write(path("w.gguf"));

    raw_gguf r;
    r.u32(0x46554747u), r.u32(3), r.u64(2), r.u64(4);
    r.str("general.architecture"), r.u32(8), r.str("llama");
    r.str("x.n"), r.u32(4), r.u32(9);
    r.str("x.list"), r.u32(9), r.u32(5), r.u64(2), r.u32(1), r.u32((uint32_t)-2);
    r.str("x.flag"), r.u32(7), r.u8(1);
    r.str("a"), r.u32(2), r.u64(8), r.u64(2), r.u32(0), r.u64(0);
    r.str("b"), r.u32(2), r.u64(32), r.u64(2), r.u32(8), r.u64(64);
    r.pad(32);
    r.b.insert(r.b.end(), ta.begin(), ta.end());
    r.b.insert(r.b.end(), tb.begin(), tb.end());
    r.pad(32);
    EXPECT_EQ(read_bytes(path("w.gguf")), r.b);
}

TEST_F(GgufTest, IndependentEncodingReads) {
    const raw_gguf r = make_valid_raw();
    write_bytes(path("v.gguf"), r.b);
    auto f = gguf_file::open(path("v.gguf"));
    EXPECT_EQ(f->get_str("general.architecture"), "llama");
    EXPECT_EQ(f->get_str("test.str"), "hello");
    const gguf_value* arr = f->find("test.arr");
    ASSERT_NE(arr, nullptr);
    EXPECT_EQ(arr->to_display(), "[1, 2, -3]");
    ASSERT_EQ(f->tensors().size(), 3u);
    EXPECT_EQ(f->data_offset(), r.at.at("data"));
    const auto& c = f->get_tensor("t.c");
    EXPECT_EQ(c.type, dtype::Q8_0);
    EXPECT_EQ(c.shape, (std::vector<int64_t>{32, 2}));
    EXPECT_EQ(c.data, f->tensors()[0].data + 160);
    EXPECT_EQ(c.data + c.n_bytes, f->tensors()[0].data - r.at.at("data") + r.b.size());

    raw_gguf v2 = r;  // version 2 has the same layout
    v2.put_u32("version", 2);
    write_bytes(path("v2.gguf"), v2.b);
    EXPECT_EQ(gguf_file::open(path("v2.gguf"))->version(), 2u);
}

// ---------------------------------------------------------------------------
// Getters and value helpers

TEST_F(GgufTest, GettersAndConversions) {
    gguf_writer w;
    for (const auto& e : sample_kv()) w.set(e.first, e.second);
    const auto bytes = random_bytes(4 * 4, 3);
    w.add_tensor("t", dtype::F32, {4}, bytes.data(), bytes.size());
    const std::string p = path("g.gguf");
    w.write(p);
    auto f = gguf_file::open(p);

    EXPECT_EQ(f->get_int("t.u8"), 255);
    EXPECT_EQ(f->get_int("t.i16"), -32768);
    EXPECT_EQ(f->get_int("t.u32"), 4000000000LL);
    EXPECT_EQ(f->get_int("t.i64"), std::numeric_limits<int64_t>::min());
    EXPECT_EQ(f->get_int("missing", 42), 42);
    EXPECT_FLOAT_EQ((float)f->get_float("t.f32"), -1.5e-5f);
    EXPECT_EQ(f->get_float("t.i32"), -2e9);  // integers convert
    EXPECT_EQ(f->get_float("missing", 0.5), 0.5);
    EXPECT_EQ(f->get_str("missing", "dflt"), "dflt");
    EXPECT_TRUE(f->get_bool("t.bool_t", false));
    EXPECT_FALSE(f->get_bool("t.bool_f", true));
    EXPECT_TRUE(f->get_bool("missing", true));
    EXPECT_EQ(f->find_tensor("nope"), nullptr);
    ASSERT_NE(f->find_tensor("t"), nullptr);

    auto expect_throw = [&](const std::function<void()>& fn, const std::string& sub) {
        try {
            fn();
            ADD_FAILURE() << "no throw, expected '" << sub << "'";
        } catch (const zk::error& e) {
            const std::string m = e.what();
            EXPECT_NE(m.find(p), std::string::npos) << m;
            EXPECT_NE(m.find(sub), std::string::npos) << m;
        }
    };
    expect_throw([&] { f->get_int("missing"); }, "missing key missing");
    expect_throw([&] { f->get_float("missing"); }, "missing key");
    expect_throw([&] { f->get_str("missing"); }, "missing key");
    expect_throw([&] { f->get_int("t.u64"); }, "out of range");  // 2^64-1 > INT64_MAX
    expect_throw([&] { f->get_int("general.architecture"); }, "expected an integer, got string");
    expect_throw([&] { f->get_int("t.f32"); }, "expected an integer, got f32");
    expect_throw([&] { f->get_str("t.u8"); }, "expected string, got u8");
    expect_throw([&] { f->get_str("t.u8", "x"); }, "expected string");
    expect_throw([&] { f->get_float("t.arr_str"); }, "expected a number, got array");
    expect_throw([&] { f->get_bool("t.u8", false); }, "expected bool");
    expect_throw([&] { f->get_tensor("nope"); }, "missing tensor 'nope'");
}

TEST(GgufValue, Display) {
    std::vector<int32_t> ten(10);
    for (int k = 0; k < 10; k++) ten[k] = k;
    EXPECT_EQ(gguf_value::make_arr_i32(ten).to_display(), "[0, 1, 2, 3, 4, 5, 6, 7, ... (10 items)]");
    EXPECT_EQ(gguf_value::make_arr_i32(ten).to_display(3), "[0, 1, 2, ... (10 items)]");
    EXPECT_EQ(gguf_value::make_arr_i32({1, 2}).to_display(), "[1, 2]");
    EXPECT_EQ(gguf_value::make_arr(gguf_type::UINT8, {}).to_display(), "[]");
    EXPECT_EQ(gguf_value::make_arr_str({"a", "b\"c"}).to_display(), "[\"a\", \"b\\\"c\"]");
    EXPECT_EQ(nested_array().to_display(), "[[1, 2, 3], [], [-4]]");
    EXPECT_EQ(gguf_value::make_str("hi\n").to_display(), "\"hi\\n\"");
    EXPECT_EQ(gguf_value::make_bool(true).to_display(), "true");
    EXPECT_EQ(gguf_value::make_u64(18446744073709551615ull).to_display(), "18446744073709551615");
    EXPECT_EQ(gguf_value::make_i8(-5).to_display(), "-5");
    EXPECT_EQ(gguf_value::make_f32(0.5f).to_display(), "0.5");
    EXPECT_EQ(gguf_value::make_f32(1e-5f).to_display(), "1e-05");  // not 9.99999975e-06
    EXPECT_EQ(gguf_value::make_f64(0.1).to_display(), "0.1");
    const std::string longs(200, 'x');
    const std::string shown = gguf_value::make_str(longs).to_display();
    EXPECT_LT(shown.size(), 80u);
    EXPECT_EQ(shown.substr(0, 4), "\"xxx");
    EXPECT_EQ(shown.substr(shown.size() - 4), "\"...");
    // Cutting never splits a UTF-8 sequence: 100 two-byte characters.
    std::string utf;
    for (int k = 0; k < 100; k++) utf += "\xc3\xa9";
    const std::string su = gguf_value::make_str(utf).to_display();
    EXPECT_EQ((su.size() - 5) % 2, 0u) << su;  // minus the quotes and "..."

    EXPECT_THROW(gguf_value::make_arr(gguf_type::INT32, {gguf_value::make_u8(1)}), zk::error);
    EXPECT_EQ(gguf_value::make_bool(true).as_int(), 1);
    EXPECT_THROW(gguf_value::make_str("1").as_float(), zk::error);
    EXPECT_THROW(gguf_value::make_f64(1).as_str(), zk::error);
}

// ---------------------------------------------------------------------------
// Writer failures

TEST_F(GgufTest, WriterRejectsBadInput) {
    gguf_writer w;
    std::vector<uint8_t> b(64 * 4);
    EXPECT_THROW(w.add_tensor("x", dtype::F32, {64}, b.data(), b.size() - 1), zk::error);
    EXPECT_THROW(w.add_tensor("x", dtype::F32, {}, b.data(), 4), zk::error);
    EXPECT_THROW(w.add_tensor("x", dtype::F32, {1, 1, 1, 1, 1}, b.data(), 4), zk::error);
    EXPECT_THROW(w.add_tensor("x", dtype::F32, {64, 0}, b.data(), 0), zk::error);
    EXPECT_THROW(w.add_tensor("x", dtype::Q8_0, {33}, b.data(), 34), zk::error);
    EXPECT_THROW(w.add_tensor("x", (dtype)99, {4}, b.data(), 16), zk::error);
    w.add_tensor("x", dtype::F32, {64}, b.data(), b.size());
    EXPECT_THROW(w.add_tensor("x", dtype::F32, {64}, b.data(), b.size()), zk::error);
    EXPECT_THROW(w.set("general.alignment", gguf_value::make_u32(0)), zk::error);
    EXPECT_THROW(w.set("general.alignment", gguf_value::make_u32(3)), zk::error);
    EXPECT_THROW(w.set("general.alignment", gguf_value::make_str("32")), zk::error);

    gguf_value bad = gguf_value::make_u8(0);
    bad.u = 300;  // does not fit u8
    gguf_writer w2;
    w2.set("bad", bad);
    EXPECT_THROW(w2.write(path("bad.gguf")), zk::error);
    EXPECT_FALSE(fs::exists(path("bad.gguf")));
    EXPECT_TRUE(fs::is_empty(dir_)) << "temporary file left behind";
}

// add_tensor_fill: the same bytes as add_tensor, made at write() in order,
// in chunks of whole rows of at most k_fill_chunk bytes; bad shapes are refused
// as add_tensor refuses them, and a throwing fill leaves no file.
TEST_F(GgufTest, WriterFillStreamsRows) {
    const int64_t cols = 64, rows = (int64_t)(gguf_writer::k_fill_chunk / (cols * 4)) * 2 + 3;  // 2 chunks + 3 rows
    auto value = [&](int64_t r, int64_t c) { return (float)(r * 7 + c) * 0.5f; };
    std::vector<float> whole((size_t)(rows * cols));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) whole[(size_t)(r * cols + c)] = value(r, c);
    gguf_writer a, b;
    const std::vector<float> small = {1, 2, 3, 4};
    a.add_tensor("s", dtype::F32, {4}, small.data(), 16);
    a.add_tensor("w", dtype::F32, {cols, rows}, whole.data(), whole.size() * 4);
    b.add_tensor("s", dtype::F32, {4}, small.data(), 16);
    std::vector<std::pair<int64_t, int64_t>> calls;
    b.add_tensor_fill("w", dtype::F32, {cols, rows}, [&](int64_t row0, int64_t n, uint8_t* dst) {
        calls.push_back({row0, n});
        float* f = (float*)dst;
        for (int64_t r = 0; r < n; r++)
            for (int64_t c = 0; c < cols; c++) f[r * cols + c] = value(row0 + r, c);
    });
    a.write(path("a.gguf"));
    b.write(path("b.gguf"));
    EXPECT_TRUE(read_bytes(path("a.gguf")) == read_bytes(path("b.gguf"))) << "fill and add_tensor write the same file";
    const int64_t chunk = (int64_t)(gguf_writer::k_fill_chunk / (cols * 4));
    const std::vector<std::pair<int64_t, int64_t>> want = {{0, chunk}, {chunk, chunk}, {2 * chunk, 3}};
    EXPECT_EQ(calls, want);

    gguf_writer bad;
    auto nop = [](int64_t, int64_t, uint8_t*) {};
    EXPECT_THROW(bad.add_tensor_fill("x", dtype::Q8_0, {33}, nop), zk::error);
    EXPECT_THROW(bad.add_tensor_fill("x", dtype::F32, {}, nop), zk::error);
    EXPECT_THROW(bad.add_tensor_fill("x", dtype::F32, {4, 0}, nop), zk::error);
    EXPECT_THROW(bad.add_tensor_fill("x", dtype::F32, {4}, nullptr), zk::error);
    bad.add_tensor_fill("x", dtype::F32, {4}, [](int64_t, int64_t, uint8_t*) { throw zk::error("fill failed"); });
    EXPECT_THROW(bad.add_tensor_fill("x", dtype::F32, {4}, nop), zk::error);  // duplicate
    EXPECT_THROW(bad.write(path("bad.gguf")), zk::error);
    EXPECT_FALSE(fs::exists(path("bad.gguf")));
}

TEST_F(GgufTest, WriterFailureLeavesNothing) {
    gguf_writer w;
    w.set("k", gguf_value::make_u32(1));
    // Missing directory: cannot create the temporary file.
    try {
        w.write(path("no/such/dir.gguf"));
        ADD_FAILURE() << "no throw";
    } catch (const zk::error& e) {
        EXPECT_NE(std::string(e.what()).find(path("no/such/dir.gguf")), std::string::npos);
    }
    // Renaming over a (non-empty) directory fails after the data was written.
    fs::create_directory(path("target"));
    write_bytes(path("target/keep"), {1});
    EXPECT_THROW(w.write(path("target")), zk::error);
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(dir_)) left.push_back(e.path().filename());
    EXPECT_EQ(left, std::vector<std::string>{"target"}) << "temporary file left behind";

    // Overwriting an existing file replaces it whole.
    write_bytes(path("m.gguf"), std::vector<uint8_t>(1000, 0xAB));
    w.write(path("m.gguf"));
    EXPECT_EQ(gguf_file::open(path("m.gguf"))->get_int("k"), 1);
}

// ---------------------------------------------------------------------------
// Corrupted files

struct corruption {
    const char* name;
    std::function<void(raw_gguf&)> mutate;
    const char* expect;  // substring of the error message
};

TEST_F(GgufTest, CorruptedFilesAreRejected) {
    const uint64_t huge = 1ull << 60;
    const std::vector<corruption> table = {
        {"bad magic", [](raw_gguf& r) { r.b[0] = 'X'; }, "magic"},
        {"version 1", [](raw_gguf& r) { r.put_u32("version", 1); }, "version (expected 2 or 3, got 1)"},
        {"version 99", [](raw_gguf& r) { r.put_u32("version", 99); }, "version"},
        {"big endian version", [](raw_gguf& r) { r.put_u32("version", 3u << 24); }, "big-endian"},
        {"truncated data", [](raw_gguf& r) { r.b.pop_back(); }, "truncated"},
        {"truncated data section start", [](raw_gguf& r) { r.b.resize(r.at["data"] - 1); }, "truncated"},
        {"offset out of range", [](raw_gguf& r) { r.put_u64("tc_offset", 1 << 20); }, "out of range"},
        {"offset past the end", [](raw_gguf& r) { r.put_u64("tc_offset", ~0ull << 5); }, "out of range"},
        {"misaligned offset", [](raw_gguf& r) { r.put_u64("tb_offset", 65); }, "misaligned"},
        {"unknown type id", [](raw_gguf& r) { r.put_u32("ta_type", 99); }, "tensor 't.a': unknown type id (expected a ggml type id, got 99)"},
        {"type id of Q4_2 (dropped before GGUF)", [](raw_gguf& r) { r.put_u32("ta_type", 4); }, "unknown type id (expected a ggml type id, got 4)"},
        {"type id past the last ggml type", [](raw_gguf& r) { r.put_u32("ta_type", 42); }, "got 42"},
        {"type id 2^32 - 1", [](raw_gguf& r) { r.put_u32("ta_type", ~0u); }, "got 4294967295"},
        {"known type, row not a multiple of its block (IQ2_XXS)", [](raw_gguf& r) { r.put_u32("tc_type", 16); },
         "row length is not a multiple of the IQ2_XXS block size (expected a multiple of 256, got 32)"},
        {"known type laid out by its block size (TQ1_0 [256, 2] is 108 B, 68 in the file)",
         [](raw_gguf& r) { r.put_u64("tc_ne0", 256), r.put_u32("tc_type", 34); }, "(expected 108 bytes at data offset 160, got 68)"},
        {"absurd n_tensors", [&](raw_gguf& r) { r.put_u64("n_tensors", huge); }, "tensor count"},
        {"absurd n_kv", [&](raw_gguf& r) { r.put_u64("n_kv", huge); }, "key count"},
        {"absurd key string length", [](raw_gguf& r) { r.put_u64("key0_len", 1ull << 62); }, "string length"},
        {"absurd value string length", [](raw_gguf& r) { r.put_u64("str_len", ~0ull); }, "string length"},
        {"absurd array length", [&](raw_gguf& r) { r.put_u64("arr_len", huge); }, "array length"},
        {"unknown value type", [](raw_gguf& r) { r.put_u32("key0_type", 13); }, "value type"},
        {"n_dims 0", [](raw_gguf& r) { r.put_u32("ta_ndims", 0); }, "n_dims (expected 1..4, got 0)"},
        {"n_dims 5", [](raw_gguf& r) { r.put_u32("ta_ndims", 5); }, "n_dims (expected 1..4, got 5)"},
        {"zero-sized dimension", [](raw_gguf& r) { r.put_u64("ta_ne1", 0); }, "dimension 1"},
        {"negative dimension", [](raw_gguf& r) { r.put_u64("ta_ne0", ~0ull); }, "dimension 0"},
        {"element count overflow",
         [](raw_gguf& r) { r.put_u64("ta_ne0", 1ull << 40), r.put_u64("ta_ne1", 1ull << 40); }, "overflow"},
        {"byte size overflow", [](raw_gguf& r) { r.put_u64("ta_ne0", 1ull << 62), r.put_u64("ta_ne1", 1); }, "overflow"},
        {"row not a multiple of the block", [](raw_gguf& r) { r.put_u64("tc_ne0", 48); }, "block size"},
        {"duplicate tensor name", [](raw_gguf& r) { r.b[r.at["tb_name"] + 8 + 2] = 'a'; }, "duplicate tensor name 't.a'"},
        {"duplicate key", [](raw_gguf& r) { std::memcpy(&r.b[r.at["key3_name"] + 8 + 5], "arr", 3); }, "duplicate key 'test.arr'"},
        {"alignment 0", [](raw_gguf& r) { r.put_u32("alignment_value", 0); }, "alignment"},
        {"alignment 3", [](raw_gguf& r) { r.put_u32("alignment_value", 3); }, "alignment (expected a non-zero power of two, got 3)"},
        {"alignment changes layout", [](raw_gguf& r) { r.put_u32("alignment_value", 64); }, "misaligned"},
    };
    for (const auto& c : table) {
        SCOPED_TRACE(c.name);
        raw_gguf r = make_valid_raw();
        c.mutate(r);
        const std::string p = path("bad.gguf");
        write_bytes(p, r.b);
        // scripts/fuzz.sh collects these files as seeds of the GGUF fuzz target.
        if (const char* seeds = std::getenv("ZACK_FUZZ_SEED_DIR"))
            write_bytes(std::string(seeds) + "/corrupt_" + std::to_string(&c - table.data()), r.b);
        const std::string msg = open_error(p);
        ASSERT_FALSE(msg.empty()) << "accepted a corrupted file";
        EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << msg;  // starts with "PATH: "
        EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
}

// Tensors of ggml types zack has no kernels for are laid out from the format's
// block size (sizes from gguf-py's GGML_QUANT_SIZES, written out here), named,
// and readable, so `zack info` can show them; loading the file as a model is
// refused with one line naming the first such tensor, its type and the types
// zack computes with.
TEST_F(GgufTest, KnownUnsupportedTypesAreReadAndRefusedByModelLoading) {
    struct spec {
        const char* name;
        uint32_t id;
        const char* type_name;
        int64_t ne0, ne1;
        size_t bytes;  // ne1 rows of ne0 / block x block bytes
    };
    const spec specs[] = {
        {"token_embd.weight", 39, "MXFP4", 64, 3, 3 * 2 * 17},  // 32 elements in 17 B
        {"blk.0.attn_q.weight", 16, "IQ2_XXS", 512, 2, 2 * 2 * 66},
        {"blk.0.attn_k.weight", 34, "TQ1_0", 256, 1, 54},
        {"blk.0.attn_v.weight", 28, "F64", 5, 1, 40},
        {"blk.0.attn_output.weight", 33, "Q4_0_8_8", 32, 8, 8 * 18},
        {"blk.0.ffn_up.weight", 6, "Q5_0", 64, 2, 2 * 2 * 22},  // supported, for contrast
    };
    gguf_writer w;
    w.set("general.architecture", gguf_value::make_str("llama"));
    std::vector<std::vector<uint8_t>> data;
    for (const spec& sp : specs) {
        data.push_back(random_bytes(sp.bytes, sp.id));
        w.add_tensor(sp.name, (dtype)sp.id, {sp.ne0, sp.ne1}, data.back().data(), sp.bytes);
    }
    const std::string p = path("unsupported.gguf");
    w.write(p);

    auto f = gguf_file::open(p);
    ASSERT_EQ(f->tensors().size(), std::size(specs));
    for (size_t i = 0; i < std::size(specs); i++) {
        const zk::gguf_tensor& t = f->tensors()[i];
        SCOPED_TRACE(specs[i].name);
        EXPECT_EQ((uint32_t)t.type, specs[i].id);
        EXPECT_STREQ(zk::dtype_name(t.type), specs[i].type_name);
        EXPECT_EQ(t.n_bytes, specs[i].bytes);
        EXPECT_EQ(std::memcmp(t.data, data[i].data(), t.n_bytes), 0);
        EXPECT_EQ(zk::dtype_is_supported(specs[i].id), specs[i].id == 6);
    }

    std::string msg;
    try {
        zk::model_load(p);
    } catch (const zk::error& e) {
        msg = e.what();
    }
    EXPECT_EQ(msg, p + ": tensor 'token_embd.weight' has type MXFP4, which zack cannot compute with (supported: "
                       "F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, BF16)");

    // The writer refuses an id that is no ggml type.
    gguf_writer w2;
    const auto b = random_bytes(64, 1);
    EXPECT_THROW(w2.add_tensor("x", (dtype)4, {32}, b.data(), 18), zk::error);
    EXPECT_THROW(w2.add_tensor("x", (dtype)42, {32}, b.data(), 18), zk::error);
}

// Every cut of a valid file (header, padding, data) is rejected with zk::error.
TEST_F(GgufTest, EveryTruncationIsRejected) {
    const raw_gguf r = make_valid_raw();
    const std::string p = path("cut.gguf");
    for (size_t n = 0; n < r.b.size(); n++) {
        write_bytes(p, std::vector<uint8_t>(r.b.begin(), r.b.begin() + n));
        const std::string msg = open_error(p);
        ASSERT_FALSE(msg.empty()) << "accepted a file cut at " << n << " of " << r.b.size();
        EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << msg;
        // A cut shows as a short read or as a count/length larger than what is left.
        const bool named = msg.find("truncated") != std::string::npos ||
                           msg.find("too large") != std::string::npos ||
                           msg.find("absurd") != std::string::npos ||
                           msg.find("empty file") != std::string::npos;
        EXPECT_TRUE(named) << "cut at " << n << ": " << msg;
    }
}

// Nesting deeper than the reader allows is an error, not a stack overflow.
TEST_F(GgufTest, DeepNestingIsRejected) {
    raw_gguf r;
    r.u32(0x46554747u), r.u32(3), r.u64(0), r.u64(1);
    r.str("deep"), r.u32(9);
    for (int k = 0; k < 100000; k++) r.u32(9), r.u64(1);
    r.u32(4), r.u64(0);
    write_bytes(path("deep.gguf"), r.b);
    const std::string msg = open_error(path("deep.gguf"));
    EXPECT_NE(msg.find("nested too deep"), std::string::npos) << msg;
}

// A u8 array the file can hold but whose in-memory values would take ~100x the
// file size is rejected before allocating them.
TEST_F(GgufTest, HugeMetadataArrayIsRejected) {
    const uint64_t n = (1ull << 24) + 1;
    raw_gguf r;
    r.u32(0x46554747u), r.u32(3), r.u64(0), r.u64(1);
    r.str("big"), r.u32(9), r.u32(0), r.u64(n);
    r.b.resize(r.b.size() + n, 0);
    write_bytes(path("big.gguf"), r.b);
    const std::string msg = open_error(path("big.gguf"));
    EXPECT_NE(msg.find("array length too large"), std::string::npos) << msg;
}

// Random byte mutations: the reader either accepts the file or throws zk::error;
// it never crashes or reads out of bounds (this test runs under ASan + UBSan).
TEST_F(GgufTest, RandomMutationsNeverCrash) {
    const raw_gguf valid = make_valid_raw();
    const size_t header = valid.at.at("data");
    std::mt19937 rng(1234);
    const std::string p = path("fuzz.gguf");
    int rejected = 0;
    for (int it = 0; it < 1500; it++) {
        std::vector<uint8_t> b = valid.b;
        const int n_mut = 1 + (int)(rng() % 4);
        for (int m = 0; m < n_mut; m++) {
            const size_t at = rng() % header;
            switch (rng() % 3) {
                case 0: b[at] = (uint8_t)rng(); break;
                case 1: b[at] ^= (uint8_t)(1u << (rng() % 8)); break;
                default: b[at] = (rng() & 1) ? 0xff : 0x00; break;
            }
        }
        if (rng() % 4 == 0) b.resize(rng() % b.size());
        write_bytes(p, b);
        try {
            auto f = gguf_file::open(p);
            unsigned sum = 0;
            for (const auto& t : f->tensors()) {  // every accepted tensor lies in the file
                ASSERT_LE(f->data_offset() + t.offset + t.n_bytes, f->file_size());
                sum += t.data[0] + t.data[t.n_bytes - 1];  // touch both ends of the mapping
            }
            (void)sum;
            for (const auto& e : f->kv()) (void)e.second.to_display();
        } catch (const zk::error& e) {
            rejected++;
            ASSERT_EQ(std::string(e.what()).rfind(p + ": ", 0), 0u) << e.what();
        }
    }
    EXPECT_GT(rejected, 100);
}

TEST_F(GgufTest, MissingEmptyAndDirectory) {
    std::string msg = open_error(path("nope.gguf"));
    EXPECT_NE(msg.find(path("nope.gguf") + ": cannot open"), std::string::npos) << msg;
    write_bytes(path("empty.gguf"), {});
    msg = open_error(path("empty.gguf"));
    EXPECT_NE(msg.find(path("empty.gguf") + ": empty file"), std::string::npos) << msg;
    msg = open_error(dir_);
    EXPECT_NE(msg.find(dir_ + ": not a regular file"), std::string::npos) << msg;
    EXPECT_NE(msg.find("directory"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------
// The real model: facts as the gguf Python package reports them.

TEST(GgufModel, SmolLM2Facts) {
    const char* env = std::getenv("ZACK_MODEL");
    const std::string model = env && *env ? env : ZACK_DEFAULT_MODEL;
    ASSERT_TRUE(fs::exists(model)) << "model " << model
                                   << " is missing: run scripts/fetch_model.sh to download it";
    auto f = gguf_file::open(model);
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->alignment(), 32u);
    EXPECT_EQ(f->kv().size(), 33u);
    EXPECT_EQ(f->get_str("general.architecture"), "llama");
    EXPECT_EQ(f->get_int("llama.block_count"), 30);
    EXPECT_EQ(f->get_int("llama.embedding_length"), 576);
    EXPECT_EQ(f->get_int("llama.feed_forward_length"), 1536);
    EXPECT_EQ(f->get_int("llama.attention.head_count"), 9);
    EXPECT_EQ(f->get_int("llama.attention.head_count_kv"), 3);
    EXPECT_EQ(f->get_int("llama.context_length"), 8192);
    EXPECT_EQ(f->get_float("llama.rope.freq_base"), 100000.0);
    EXPECT_EQ((float)f->get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
    EXPECT_EQ(f->get_str("tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(f->get_str("tokenizer.ggml.pre"), "smollm");
    EXPECT_FALSE(f->get_bool("tokenizer.ggml.add_bos_token", true));
    EXPECT_EQ(f->get_int("tokenizer.ggml.eos_token_id"), 2);
    const gguf_value* tokens = f->find("tokenizer.ggml.tokens");
    ASSERT_NE(tokens, nullptr);
    EXPECT_EQ(tokens->arr_type, gguf_type::STRING);
    EXPECT_EQ(tokens->arr.size(), 49152u);
    EXPECT_EQ(tokens->arr[1].s, "<|im_start|>");
    EXPECT_EQ(f->find("tokenizer.ggml.merges")->arr.size(), 48900u);
    EXPECT_EQ(f->find("general.languages")->to_display(), "[\"en\"]");

    ASSERT_EQ(f->tensors().size(), 272u);
    const auto& emb = f->get_tensor("token_embd.weight");
    EXPECT_EQ(emb.type, dtype::Q8_0);
    EXPECT_EQ(emb.shape, (std::vector<int64_t>{576, 49152}));
    EXPECT_EQ(f->data_offset() + emb.offset, 1785664u);
    EXPECT_EQ(emb.n_bytes, 576u / 32 * 34 * 49152);
    const auto& down = f->get_tensor("blk.0.ffn_down.weight");
    EXPECT_EQ(down.type, dtype::Q4_1);
    EXPECT_EQ(down.shape, (std::vector<int64_t>{1536, 576}));
    EXPECT_EQ(f->data_offset() + down.offset, 31868992u);
    EXPECT_EQ(f->get_tensor("blk.0.attn_norm.weight").type, dtype::F32);
    EXPECT_EQ(f->find_tensor("output.weight"), nullptr);  // tied to token_embd
    for (const auto& t : f->tensors())
        EXPECT_LE(f->data_offset() + t.offset + t.n_bytes, f->file_size()) << t.name;
}

}  // namespace
