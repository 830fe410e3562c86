// Fuzz target "gguf": the GGUF reader (header, metadata, tensor table) and the
// tensor data behind it: every accepted tensor's first row is dequantized and
// dotted with an activation row, for whatever types dtype.h supports.
// Seeds: tiny llama and qwen2 models, a file with one tensor of every supported
// type, a file with every metadata value type; scripts/fuzz.sh adds the
// corrupted files of tests/test_gguf.cpp.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>

#include "ggml-like/dtype.h"
#include "ggml-like/error.h"
#include "ggml-like/gguf.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/tiny_model.h"

namespace zk_fuzz {

namespace {

// Elements of a row dequantized per tensor: enough to cover every block kind.
constexpr int64_t k_max_row = 4096;

[[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "fuzz gguf: invariant broken: %s\n", what);
    std::abort();
}

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

void fuzz_gguf_init() {}

void fuzz_gguf_one(const uint8_t* data, size_t size) {
    const std::string& path = fuzz_file_set(data, size);
    std::unique_ptr<zk::gguf_file> f;
    try {
        f = zk::gguf_file::open(path);
    } catch (const zk::error&) {
        return;
    }
    for (const auto& kv : f->kv()) {
        (void)kv.second.to_display();
        try { (void)f->get_int(kv.first); } catch (const zk::error&) {}
        try { (void)f->get_float(kv.first); } catch (const zk::error&) {}
        try { (void)f->get_str(kv.first); } catch (const zk::error&) {}
        try { (void)f->get_bool(kv.first, false); } catch (const zk::error&) {}
    }
    static std::vector<float> row(k_max_row), act(k_max_row);
    static std::vector<uint8_t> act_q(k_max_row * 4);
    for (size_t i = 0; i < act.size(); i++) act[i] = std::sin(0.37f * (float)i);
    for (const zk::gguf_tensor& t : f->tensors()) {
        if (f->data_offset() + t.offset + t.n_bytes > f->file_size()) fail("tensor data outside the file");
        if (f->find_tensor(t.name) != &t) fail("tensor index");
        const zk::dtype_traits& tr = zk::dtype_get_traits(t.type);
        // a known type zack does not read (TQ1_0, IQ2_XS, ...): the reader lists
        // it (zack info marks it) and model loading refuses it by name
        if (!tr.supported) continue;
        const int64_t n = std::min<int64_t>(t.shape[0], k_max_row / tr.block_size * tr.block_size);
        if (n <= 0) continue;
        if (zk::dtype_row_size(t.type, n) > t.n_bytes) fail("row larger than the tensor");
        zk::dtype_dequantize_row(t.type, t.data, row.data(), n);
        zk::dtype vt;
        try {
            vt = zk::dtype_vec_dot_type(t.type);
        } catch (const zk::error&) {
            continue;  // an activation-only type (Q8_1, Q8_K)
        }
        zk::dtype_quantize_row(vt, act.data(), act_q.data(), n);
        (void)zk::dtype_vec_dot(t.type, t.data, act_q.data(), n);
    }
}

std::vector<std::pair<std::string, std::string>> fuzz_gguf_seeds() {
    std::vector<std::pair<std::string, std::string>> out;
    const std::string dir = fuzz_scratch_dir();
    zk_test::tiny_model_params p;
    p.n_layer = 1, p.n_embd = 32, p.n_head = 2, p.n_head_kv = 1, p.n_ff = 32, p.byte_vocab = false;
    zk_test::tiny_model_write(dir + "/seed.gguf", p);
    out.push_back({"tiny_llama_q8_0.gguf", read_file(dir + "/seed.gguf")});
    p.qwen2 = true, p.weight_type = zk::dtype::F16;
    zk_test::tiny_model_write(dir + "/seed.gguf", p);
    out.push_back({"tiny_qwen2_f16.gguf", read_file(dir + "/seed.gguf")});

    // One tensor of 256 elements (two rows of 128 where the block allows) per
    // supported type, random bytes with finite f16 scales kept by chance.
    {
        zk::gguf_writer w;
        w.set("general.architecture", zk::gguf_value::make_str("llama"));
        std::mt19937 rng(5);
        for (uint32_t id = 0; id < 64; id++) {
            if (!zk::dtype_is_supported(id)) continue;
            const zk::dtype t = (zk::dtype)id;
            const int64_t bs = zk::dtype_get_traits(t).block_size;
            const std::vector<int64_t> shape = bs <= 128 ? std::vector<int64_t>{128, 2} : std::vector<int64_t>{256};
            const size_t nb = zk::dtype_row_size(t, shape[0]) * (shape.size() > 1 ? 2 : 1);
            std::vector<uint8_t> bytes(nb);
            for (auto& b : bytes) b = (uint8_t)(rng() & 0x3f);  // small values: no f16 inf/NaN
            w.add_tensor(std::string("t.") + zk::dtype_name(t), t, shape, bytes.data(), bytes.size());
        }
        w.write(dir + "/types.gguf");
        out.push_back({"every_type.gguf", read_file(dir + "/types.gguf")});
    }
    // Every metadata value type, nested arrays, an alignment of 64.
    {
        using zk::gguf_value;
        zk::gguf_writer w;
        w.set("general.alignment", gguf_value::make_u32(64));
        w.set("t.u8", gguf_value::make_u8(255));
        w.set("t.i8", gguf_value::make_i8(-128));
        w.set("t.u16", gguf_value::make_u16(65535));
        w.set("t.i16", gguf_value::make_i16(-32768));
        w.set("t.u32", gguf_value::make_u32(4000000000u));
        w.set("t.i32", gguf_value::make_i32(-2000000000));
        w.set("t.u64", gguf_value::make_u64(~0ull));
        w.set("t.i64", gguf_value::make_i64(INT64_MIN));
        w.set("t.f32", gguf_value::make_f32(-1.5e-5f));
        w.set("t.f64", gguf_value::make_f64(3.14159));
        w.set("t.bool", gguf_value::make_bool(true));
        w.set("t.str", gguf_value::make_str("h\xc3\xa9llo\n"));
        w.set("t.arr_str", gguf_value::make_arr_str({"<s>", "", "\xc4\xa0the"}));
        w.set("t.arr_f32", gguf_value::make_arr_f32({0.f, -0.25f, 1e30f}));
        std::vector<gguf_value> rows = {gguf_value::make_arr_i32({1, 2}), gguf_value::make_arr_i32({})};
        w.set("t.nested", gguf_value::make_arr(zk::gguf_type::ARRAY, rows));
        const float x[32] = {1.0f};
        w.add_tensor("t.f32", zk::dtype::F32, {32}, x, sizeof x);
        w.write(dir + "/meta.gguf");
        out.push_back({"every_value_type.gguf", read_file(dir + "/meta.gguf")});
    }
    return out;
}

}  // namespace zk_fuzz
