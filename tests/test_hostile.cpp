// Hostile and unusual model files: each is either loaded correctly or refused
// with one line naming the file (zk::error), never a crash, and reading it never
// allocates more than the file's size in one piece (the heap is watched by
// tests/alloc_tracker.h). The files are tiny random models (tests/tiny_model.h)
// with one thing made wrong: aliasing or overlapping tensor data, a byte size
// that overflows 64 bits, a vocabulary of 0 or 2^31 tokens, merges naming
// unknown tokens, a 10 MB chat template, heads that do not divide the width,
// and .zack rank tables past the head dim.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>

#include "engine/chat.h"
#include "engine/model.h"
#include "ggml-like/error.h"
#include "ggml-like/gguf.h"
#include "tests/alloc_tracker.h"
#include "tests/temp_dir.h"
#include "tests/tiny_model.h"

namespace fs = std::filesystem;
using zk::gguf_value;

namespace {

std::string read_bytes(const std::string& path) { return zk_test::read_file<std::string>(path); }

void write_bytes(const std::string& path, const std::string& b) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(b.data(), (std::streamsize)b.size());
    ASSERT_TRUE(f.good());
}

template <typename T>
T get(const std::string& b, size_t at) {
    T v;
    std::memcpy(&v, b.data() + at, sizeof v);
    return v;
}
template <typename T>
void put(std::string& b, size_t at, T v) {
    std::memcpy(&b[at], &v, sizeof v);
}

// Where the fields of a GGUF header sit, found by an independent walk of the
// format (gguf.h): each key's value, each tensor's dims, type and offset.
struct layout {
    std::map<std::string, size_t> value;       // first byte of the value (after its type)
    std::map<std::string, size_t> dims, offset;  // tensor: first dim, data offset field
};

size_t skip_value(const std::string& b, size_t at, uint32_t type) {
    static const size_t fixed[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == 8) return at + 8 + get<uint64_t>(b, at);
    if (type == 9) {
        const uint32_t et = get<uint32_t>(b, at);
        const uint64_t n = get<uint64_t>(b, at + 4);
        at += 12;
        for (uint64_t k = 0; k < n; k++) at = skip_value(b, at, et);
        return at;
    }
    return at + fixed[type];
}

layout walk(const std::string& b) {
    layout l;
    const uint64_t n_tensors = get<uint64_t>(b, 8), n_kv = get<uint64_t>(b, 16);
    size_t at = 24;
    auto str = [&](size_t& p) {
        const uint64_t n = get<uint64_t>(b, p);
        std::string s = b.substr(p + 8, n);
        p += 8 + n;
        return s;
    };
    for (uint64_t k = 0; k < n_kv; k++) {
        const std::string key = str(at);
        const uint32_t type = get<uint32_t>(b, at);
        l.value[key] = at + 4;
        at = skip_value(b, at + 4, type);
    }
    for (uint64_t k = 0; k < n_tensors; k++) {
        const std::string name = str(at);
        const uint32_t nd = get<uint32_t>(b, at);
        l.dims[name] = at + 4;
        at += 4 + 8 * nd + 4;
        l.offset[name] = at;
        at += 8;
    }
    return l;
}

// Copies a GGUF with some keys replaced (or removed when the value is null).
void rewrite(const std::string& src, const std::string& dst,
             const std::vector<std::pair<std::string, const gguf_value*>>& changes) {
    auto f = zk::gguf_file::open(src);
    zk::gguf_writer w;
    for (const auto& kv : f->kv()) w.set(kv.first, kv.second);
    for (const auto& [key, v] : changes) {
        if (v) w.set(key, *v);
        else w.remove(key);
    }
    for (const auto& t : f->tensors()) w.add_tensor_ref(t.name, t.type, t.shape, t.data, t.n_bytes);
    w.write(dst);
}

struct outcome {
    bool loaded = false;
    std::string error;
    size_t largest = 0;  // largest single allocation while loading
    size_t peak = 0;     // peak heap growth while loading
};

// model_load(path) with the heap watched; any exception but zk::error escapes.
outcome load_watched(const std::string& path, const std::function<void(const zk::model&)>& use = nullptr) {
    outcome o;
    zk_test::alloc_stats& s = zk_test::allocs();
    const size_t base = s.live.load();
    s.reset_peak();
    try {
        auto m = zk::model_load(path);
        if (use) use(*m);
        o.loaded = true;
    } catch (const zk::error& e) {
        o.error = e.what();
    }
    o.largest = s.largest.load();
    o.peak = s.peak.load() - base;
    return o;
}

class Hostile : public zk_test::TempDirTest {
protected:
    Hostile() : TempDirTest("zk_hostile") {}

    // A tiny model at path(name) (F32 weights unless told otherwise).
    std::string tiny(const std::string& name, zk_test::tiny_model_params p = small()) {
        zk_test::tiny_model_write(path(name), p);
        return path(name);
    }
    static zk_test::tiny_model_params small() {
        zk_test::tiny_model_params p;
        p.n_layer = 2, p.n_embd = 64, p.n_head = 4, p.n_head_kv = 2, p.n_ff = 64;
        p.weight_type = zk::dtype::F32;
        return p;
    }

    // The file is refused with one line that names it and contains `expect`,
    // and no single allocation was larger than the file.
    void expect_refused(const std::string& p, const std::string& expect) {
        const outcome o = load_watched(p);
        ASSERT_FALSE(o.loaded) << p << " was accepted";
        EXPECT_EQ(o.error.rfind(p + ": ", 0), 0u) << o.error;
        EXPECT_NE(o.error.find(expect), std::string::npos) << o.error;
        EXPECT_EQ(o.error.find('\n'), std::string::npos) << o.error;
        const size_t size = fs::file_size(p);
        EXPECT_LE(o.largest, size) << o.error;
        std::printf("refused (%zu-byte file, largest allocation %zu, peak heap +%zu): %s\n", size, o.largest,
                    o.peak, o.error.c_str());
    }
};

TEST_F(Hostile, TensorDataAliases) {
    std::string b = read_bytes(tiny("m.gguf"));
    const layout l = walk(b);
    put<uint64_t>(b, l.offset.at("blk.0.attn_k.weight"), get<uint64_t>(b, l.offset.at("blk.0.attn_v.weight")));
    write_bytes(path("alias.gguf"), b);
    expect_refused(path("alias.gguf"), "overlap in the data section");
}

TEST_F(Hostile, TensorDataOverlaps) {
    std::string b = read_bytes(tiny("m.gguf"));
    const layout l = walk(b);
    // attn_q starts 32 bytes into token_embd, whose data is longer than that.
    put<uint64_t>(b, l.offset.at("blk.0.attn_q.weight"), get<uint64_t>(b, l.offset.at("token_embd.weight")) + 32);
    write_bytes(path("overlap.gguf"), b);
    expect_refused(path("overlap.gguf"), "overlap in the data section");
}

// general.alignment 1 lets a tensor start at an odd address: F16 loads there
// were misaligned (UBSan, through the gguf fuzz target). Refused now.
TEST_F(Hostile, TensorDataAtAnOddAddress) {
    const std::string p = std::string(ZACK_SOURCE_DIR) + "/tests/data/fuzz/gguf/misaligned_f16";
    std::string msg;
    try {
        zk::gguf_file::open(p);
    } catch (const zk::error& e) {
        msg = e.what();
    }
    EXPECT_NE(msg.find("tensor 't': data at file offset 91 is not 4-byte aligned (general.alignment is 1"),
              std::string::npos) << msg;
}

TEST_F(Hostile, ByteSizeOverflows64Bits) {
    // F32 [2^31, 2^31]: 2^62 elements fit in int64, 2^64 bytes do not fit in 64 bits.
    std::string b = read_bytes(tiny("m.gguf"));
    const layout l = walk(b);
    put<uint64_t>(b, l.dims.at("blk.0.attn_q.weight"), 1ull << 31);
    put<uint64_t>(b, l.dims.at("blk.0.attn_q.weight") + 8, 1ull << 31);
    write_bytes(path("overflow.gguf"), b);
    expect_refused(path("overflow.gguf"), "byte size overflows");
}

// A u8 array takes 1 byte per value in the file and ~100 in memory: the reader
// charges metadata against 16 x the file size (+ 16 MiB) before allocating it.
TEST_F(Hostile, MetadataOfAHundredTimesTheFileSize) {
    const uint64_t n = 2u << 20;  // 2M u8 values: a 2 MB file asking for ~200 MB
    std::string b;
    auto u32 = [&](uint32_t v) { b.append((const char*)&v, 4); };
    auto u64 = [&](uint64_t v) { b.append((const char*)&v, 8); };
    u32(0x46554747u), u32(3), u64(0), u64(1);
    u64(3), b += "big", u32(9), u32(0), u64(n);
    b.append(n, '\x01');
    write_bytes(path("meta.gguf"), b);
    zk_test::alloc_stats& s = zk_test::allocs();
    const size_t base = s.live.load();
    s.reset_peak();
    std::string msg;
    try {
        zk::gguf_file::open(path("meta.gguf"));
    } catch (const zk::error& e) {
        msg = e.what();
    }
    EXPECT_NE(msg.find("metadata too large for the file"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_LE(s.peak.load() - base, b.size() * 16 + (16u << 20));
    EXPECT_LE(s.largest.load(), b.size());
}

TEST_F(Hostile, VocabularyOfNoTokens) {
    const gguf_value empty = zk::gguf_value::make_arr(zk::gguf_type::STRING, {});
    const gguf_value no_types = zk::gguf_value::make_arr(zk::gguf_type::INT32, {});
    const gguf_value no_merges = zk::gguf_value::make_arr(zk::gguf_type::STRING, {});
    rewrite(tiny("m.gguf"), path("v0.gguf"),
            {{"tokenizer.ggml.tokens", &empty}, {"tokenizer.ggml.token_type", &no_types},
             {"tokenizer.ggml.merges", &no_merges}});
    expect_refused(path("v0.gguf"), "missing or empty tokenizer.ggml.tokens");
}

TEST_F(Hostile, VocabularyOf2To31Tokens) {
    std::string b = read_bytes(tiny("m.gguf"));
    const layout l = walk(b);
    put<uint64_t>(b, l.value.at("tokenizer.ggml.tokens") + 4, 1ull << 31);
    write_bytes(path("v31.gguf"), b);
    expect_refused(path("v31.gguf"), "array length too large");
}

TEST_F(Hostile, MergesNameUnknownTokens) {
    const gguf_value merges = zk::gguf_value::make_arr_str({"\xC4\xA0 t", "zz qq"});
    rewrite(tiny("m.gguf"), path("merges.gguf"), {{"tokenizer.ggml.merges", &merges}});
    expect_refused(path("merges.gguf"), "merge 1 'zz qq' names tokens that are not in the vocabulary");
}

TEST_F(Hostile, HeadsDoNotDivideTheWidth) {
    zk_test::tiny_model_params p = small();
    p.n_embd = 130;  // 4 heads of 32 (rounded down) would cover 128 of 130 channels
    expect_refused(tiny("heads.gguf", p), "4 heads do not divide the embedding width 130");
}

TEST_F(Hostile, OutOfRangeHyperParameters) {
    const std::string m = tiny("m.gguf");
    const gguf_value big = gguf_value::make_u64(1ull << 32 | 2);  // 2 once cut to 32 bits
    rewrite(m, path("kv.gguf"), {{"llama.attention.head_count_kv", &big}});
    expect_refused(path("kv.gguf"), "attention.head_count_kv = 4294967298 is out of range");
    const gguf_value eps = gguf_value::make_f32(-1.0f);
    rewrite(m, path("eps.gguf"), {{"llama.attention.layer_norm_rms_epsilon", &eps}});
    expect_refused(path("eps.gguf"), "layer_norm_rms_epsilon -1 is out of range");
}

TEST_F(Hostile, TenMegabyteChatTemplate) {
    // A long but harmless template: it loads, falls back to ChatML, renders, and
    // costs no allocation larger than the file.
    std::string tpl;
    while (tpl.size() < (10u << 20)) tpl += "{% for message in messages %}{{ message['content'] }}{% endfor %}\n";
    const gguf_value v = gguf_value::make_str(tpl);
    rewrite(tiny("m.gguf"), path("tpl.gguf"), {{"tokenizer.chat_template", &v}});
    std::string rendered;
    const outcome o = load_watched(path("tpl.gguf"), [&](const zk::model& m) {
        const zk::chat_template t = zk::chat_template_detect(m.file->get_str("tokenizer.chat_template"));
        EXPECT_EQ(t.kind, zk::chat_template_kind::CHATML);
        rendered = zk::chat_apply(t, {{"user", "hi"}}, true);
    });
    ASSERT_TRUE(o.loaded) << o.error;
    EXPECT_EQ(rendered, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_LE(o.largest, fs::file_size(path("tpl.gguf")));
}

// The .zack cases start from a real .zack of the tiny model (calib/zack_file.cpp).
TEST_F(Hostile, ZackRankTablePastTheHeadDim) {
    const std::string z = path("m.zack");
    zk_test::tiny_zack_write(tiny("m.gguf"), z, 64);
    auto f = zk::gguf_file::open(z);
    const int D = (int)(f->get_int("llama.embedding_length") / f->get_int("llama.attention.head_count"));
    std::vector<int32_t> k;
    for (const auto& e : f->find("zack.rank_table.k")->arr) k.push_back((int32_t)e.as_int());
    ASSERT_FALSE(k.empty());
    k.back() = D + 1;
    const gguf_value bad = gguf_value::make_arr_i32(k);
    rewrite(z, path("rank.zack"), {{"zack.rank_table.k", &bad}});
    expect_refused(path("rank.zack"), "is out of range (expected 1.." + std::to_string(D) + ", the head dim)");
    const gguf_value align = gguf_value::make_u32((uint32_t)D * 2);
    rewrite(z, path("align.zack"), {{"zack.rank_align", &align}});
    expect_refused(path("align.zack"), "zack.rank_align = " + std::to_string(2 * D) + " is out of range");
    // Unchanged, the same file loads.
    EXPECT_TRUE(load_watched(z).loaded);
}

// Value codebooks (engine/kv_vq.h): keys without their tensors, and books the
// engine cannot read, are refused in one line.
TEST_F(Hostile, ZackValueCodebooks) {
    const std::string z = path("m.zack");
    zk_test::tiny_zack_write(tiny("m.gguf"), z, 64);
    const gguf_value c4 = gguf_value::make_u32(4), c3 = gguf_value::make_u32(3), k16 = gguf_value::make_u32(16),
                     k48 = gguf_value::make_u32(48);
    // both value codes' books (precision 1: zack.vq, 0: zack.vq0), each under its own names
    for (const std::string name : {"vq", "vq0"}) {
        const std::string kd = "zack." + name + ".dim", ks = "zack." + name + ".size";
        rewrite(z, path(name + "dim.zack"), {{kd, &c4}});
        expect_refused(path(name + "dim.zack"), "value codebooks need both " + kd + " and " + ks);
        rewrite(z, path(name + "odd.zack"), {{kd, &c3}, {ks, &k16}});
        expect_refused(path(name + "odd.zack"), "is not a multiple of 3 channels a code");
        rewrite(z, path(name + "k48.zack"), {{kd, &c4}, {ks, &k48}});
        expect_refused(path(name + "k48.zack"), "48 centroids; a power of two");
        rewrite(z, path(name + "none.zack"), {{kd, &c4}, {ks, &k16}});
        expect_refused(path(name + "none.zack"), "blk.0.zack." + name);
    }
}

}  // namespace
