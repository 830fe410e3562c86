// A tiny llama-family model with random weights, for tests that need a whole
// model but not a good one: soak runs, sanitizer runs of the engine and fuzz
// seeds. A decode step costs tens of microseconds, so thousands of tokens fit
// in a CI test. The tokenizer is a real byte-level BPE ("gpt2", pre "smollm")
// over the 256 byte tokens, a few merges and the ChatML control tokens, so the
// chat template, special-token parsing and UTF-8 streaming all take their usual
// paths; generated text is random bytes.
#pragma once
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "calib/calibrate.h"
#include "calib/gram.h"
#include "calib/zack_file.h"
#include "engine/model.h"
#include "engine/session.h"
#include "engine/unicode.h"
#include "ggml-like/dtype.h"
#include "ggml-like/error.h"
#include "ggml-like/gguf.h"

namespace zk_test {

struct tiny_model_params {
    int n_layer = 2;
    int n_embd = 256;
    int n_head = 4;       // head dim = n_embd / n_head
    int n_head_kv = 2;
    int n_ff = 256;
    int n_ctx_train = 32768;
    zk::dtype weight_type = zk::dtype::Q8_0;  // matrices; norms are F32
    bool qwen2 = false;   // qwen2 architecture (Q/K/V biases, NeoX RoPE)
    bool byte_vocab = true;  // 256 byte tokens + merges + ChatML; false: 8 tokens (small fuzz seeds)
    uint32_t seed = 1;
};

// Token texts and merges of the tiny vocabulary. Ids 0..2 are the control
// tokens <|endoftext|> (BOS/EOS), <|im_start|>, <|im_end|> (end of turn).
struct tiny_vocab {
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    std::vector<std::string> merges;
};

inline tiny_vocab tiny_vocab_make(bool byte_vocab) {
    tiny_vocab v;
    for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
        v.tokens.push_back(s);
        v.types.push_back(3);  // control
    }
    auto byte_text = [](uint8_t b) {
        std::string s;
        zk::unicode_append_utf8(s, zk::unicode_byte_to_cpt(b));
        return s;
    };
    if (!byte_vocab) {
        for (const char* s : {"a", "b", "ab", "Ġ", "Ġab"}) v.tokens.push_back(s), v.types.push_back(1);
        v.merges = {"a b", "Ġ ab"};
        return v;
    }
    for (int b = 0; b < 256; b++) v.tokens.push_back(byte_text((uint8_t)b)), v.types.push_back(1);
    // Merges of frequent English pairs, each naming tokens that exist by then.
    const char* pairs[][2] = {{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"}, {"e", "r"}, {"a", "n"},
                              {"o", "n"}, {"Ġ", "a"}, {"r", "e"}, {"Ġ", "s"}, {"o", "u"}, {"i", "s"},
                              {"Ġ", "w"}, {"e", "n"}, {"Ġ", "c"}, {"a", "t"}, {"Ġ", "i"}, {"in", "g"},
                              {"Ġ", "o"}, {"Ġ", "b"}};
    for (const auto& p : pairs) {
        v.merges.push_back(std::string(p[0]) + " " + p[1]);
        v.tokens.push_back(std::string(p[0]) + p[1]);
        v.types.push_back(1);
    }
    return v;
}

// Writes the model to `path` (gguf_writer: temporary file + rename).
inline void tiny_model_write(const std::string& path, const tiny_model_params& p) {
    using zk::dtype;
    using zk::gguf_value;
    const tiny_vocab voc = tiny_vocab_make(p.byte_vocab);
    const int64_t E = p.n_embd, D = p.n_embd / p.n_head, F = p.n_ff, V = (int64_t)voc.tokens.size();
    const std::string a = p.qwen2 ? "qwen2" : "llama";
    zk::gguf_writer w;
    w.set("general.architecture", gguf_value::make_str(a));
    w.set("general.name", gguf_value::make_str("tiny-random"));
    w.set(a + ".block_count", gguf_value::make_u32((uint32_t)p.n_layer));
    w.set(a + ".context_length", gguf_value::make_u32((uint32_t)p.n_ctx_train));
    w.set(a + ".embedding_length", gguf_value::make_u32((uint32_t)E));
    w.set(a + ".feed_forward_length", gguf_value::make_u32((uint32_t)F));
    w.set(a + ".attention.head_count", gguf_value::make_u32((uint32_t)p.n_head));
    w.set(a + ".attention.head_count_kv", gguf_value::make_u32((uint32_t)p.n_head_kv));
    w.set(a + ".rope.freq_base", gguf_value::make_f32(10000.0f));
    w.set(a + ".attention.layer_norm_rms_epsilon", gguf_value::make_f32(1e-5f));
    w.set("tokenizer.ggml.model", gguf_value::make_str("gpt2"));
    w.set("tokenizer.ggml.pre", gguf_value::make_str("smollm"));
    w.set("tokenizer.ggml.tokens", gguf_value::make_arr_str(voc.tokens));
    w.set("tokenizer.ggml.token_type", gguf_value::make_arr_i32(voc.types));
    w.set("tokenizer.ggml.merges", gguf_value::make_arr_str(voc.merges));
    w.set("tokenizer.ggml.bos_token_id", gguf_value::make_u32(0));
    w.set("tokenizer.ggml.eos_token_id", gguf_value::make_u32(0));

    std::mt19937 rng(p.seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    // Weights scaled by 1/sqrt(fan-in) keep activations O(1) through the layers.
    auto add = [&](const std::string& name, dtype t, std::vector<int64_t> shape, float scale) {
        const int64_t cols = shape[0], rows = shape.size() > 1 ? shape[1] : 1;
        std::vector<float> row((size_t)cols);
        const size_t rb = zk::dtype_row_size(t, cols);
        std::vector<uint8_t> bytes(rb * (size_t)rows);
        for (int64_t r = 0; r < rows; r++) {
            for (float& x : row) x = scale < 0 ? 1.0f : scale * nd(rng);
            zk::dtype_quantize_row(t, row.data(), bytes.data() + rb * (size_t)r, cols);
        }
        w.add_tensor(name, t, shape, bytes.data(), bytes.size());
    };
    const dtype wt = p.weight_type;
    const float se = 1.0f / std::sqrt((float)E), sf = 1.0f / std::sqrt((float)F);
    add("token_embd.weight", wt, {E, V}, 1.0f);
    add("output_norm.weight", dtype::F32, {E}, -1);
    for (int il = 0; il < p.n_layer; il++) {
        const std::string b = "blk." + std::to_string(il) + ".";
        add(b + "attn_norm.weight", dtype::F32, {E}, -1);
        add(b + "attn_q.weight", wt, {E, p.n_head * D}, se);
        add(b + "attn_k.weight", wt, {E, p.n_head_kv * D}, se);
        add(b + "attn_v.weight", wt, {E, p.n_head_kv * D}, se);
        add(b + "attn_output.weight", wt, {p.n_head * D, E}, se);
        if (p.qwen2) {
            add(b + "attn_q.bias", dtype::F32, {p.n_head * D}, 0.1f);
            add(b + "attn_k.bias", dtype::F32, {p.n_head_kv * D}, 0.1f);
            add(b + "attn_v.bias", dtype::F32, {p.n_head_kv * D}, 0.1f);
        }
        add(b + "ffn_norm.weight", dtype::F32, {E}, -1);
        add(b + "ffn_gate.weight", wt, {E, F}, se);
        add(b + "ffn_up.weight", wt, {E, F}, se);
        add(b + "ffn_down.weight", wt, {F, E}, sf);
    }
    w.write(path);
}

// Calibrates the tiny model at `model_path` on n_tokens random tokens and writes
// its .zack to out_path with the real writer (calib/zack_file.h).
inline void tiny_zack_write(const std::string& model_path, const std::string& out_path, int64_t n_tokens = 256,
                            uint32_t seed = 7) {
    const std::unique_ptr<zk::model> m = zk::model_load(model_path);
    std::mt19937 rng(seed);
    std::vector<int32_t> doc((size_t)n_tokens);
    for (int32_t& t : doc) t = 3 + (int32_t)(rng() % (uint32_t)(m->voc->n_tokens() - 3));
    zk::calib_params cp;
    cp.n_tokens = n_tokens;
    cp.n_ctx = std::min<int64_t>(n_tokens, 128);
    cp.n_threads = 1;
    cp.progress = false;
    zk::gram_accumulator acc(m->hp);
    zk::calib_collect(*m, {doc}, cp, acc);
    zk::zack_calibration c = zk::calib_decompose(*m, acc);
    c.n_ctx = cp.n_ctx;
    c.corpus = "random tokens";
    zk::zack_write_params wp;
    wp.folded_f32 = m->layers[0].wv.type == zk::dtype::F32;
    zk::zack_file_write(*m, c, wp, out_path);
}

// A tiny model written to a new directory under /tmp and loaded; the
// directory goes with the object.
class tiny_model_loaded {
public:
    explicit tiny_model_loaded(const tiny_model_params& p = tiny_model_params{}) {
        char dir[] = "/tmp/zk_tiny_XXXXXX";
        if (!mkdtemp(dir)) ZK_THROW("tiny_model_loaded: mkdtemp failed");
        dir_ = dir;
        tiny_model_write(dir_ + "/m.gguf", p);
        model_ = zk::model_load(dir_ + "/m.gguf");
    }
    ~tiny_model_loaded() {
        model_.reset();
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }
    tiny_model_loaded(const tiny_model_loaded&) = delete;
    tiny_model_loaded& operator=(const tiny_model_loaded&) = delete;
    const zk::model& get() const { return *model_; }

private:
    std::string dir_;
    std::unique_ptr<zk::model> model_;
};

// n ordinary byte tokens of a fixed pattern (ids 3.., past the control tokens).
inline std::vector<int32_t> tiny_model_tokens(size_t n) {
    std::vector<int32_t> t(n);
    for (size_t i = 0; i < n; i++) t[i] = 3 + (int32_t)(i * 37 % 270);
    return t;
}

// The logits a session computes on toks: a prefill of the first n_prefill
// (every token's logits when prefill_logits, else none), then one-token steps
// for the rest; rows of n_vocab, concatenated.
inline std::vector<float> tiny_model_session_logits(const zk::model& m, const zk::session_params& sp,
                                                    const std::vector<int32_t>& toks, int64_t n_prefill,
                                                    bool prefill_logits) {
    zk::session s(m, sp);
    const size_t nv = (size_t)m.hp.n_vocab;
    const float* lg = s.decode(toks.data(), n_prefill, prefill_logits);
    std::vector<float> out;
    if (prefill_logits) out.assign(lg, lg + (size_t)n_prefill * nv);
    for (size_t t = (size_t)n_prefill; t < toks.size(); t++) {
        lg = s.decode(&toks[t], 1);
        out.insert(out.end(), lg, lg + nv);
    }
    return out;
}

}  // namespace zk_test
