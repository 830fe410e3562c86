// Synthetic random-weight models of named shapes (model_synth.h).
// Sections: the shape table, weight types, the values (a counter-based random
// stream per tensor row), random blocks with set scales, the tensor list, the
// tokenizer, the writer.
#include "engine/model_synth.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "engine/arch.h"
#include "engine/unicode.h"
#include "ggml-like/error.h"
#include "ggml-like/gguf.h"
#include "ggml-like/quant_ref.h"  // block structs: where the f16 scale fields of a block sit
#include "ggml-like/threadpool.h"

namespace zk {

// ---------------------------------------------------------------------------
// Shapes. The real models' numbers as their GGUFs hold them (`zack info`):
// SmolLM2-135M-Instruct (rope base 1e5, tied output), Qwen2.5-0.5B/1.5B (rms eps
// 1e-6; the GGUFs carry a separate output.weight), Llama-3-8B (llama.cpp's
// llama-bpe tokenizer, separate output; its rope scaling is left out).

namespace {

const std::vector<synth_shape> k_shapes = {
    // name, arch, like | layers, embd, heads, KV heads, head dim, ffn, vocab, ctx |
    // rope base, rms eps | Q/K/V biases, tied output | tokenizer pre
    {"tiny", "llama", "a test model", 2, 64, 4, 2, 16, 128, 512, 2048, 10000.0f, 1e-5f, false, false, "smollm"},
    // the qwen2 architecture's paths (Q/K/V biases, a separate output matrix) at tiny's size
    {"tiny-qwen2", "qwen2", "a test model", 2, 64, 4, 2, 16, 128, 512, 2048, 1e6f, 1e-6f, true, false, "qwen2"},
    {"smollm2-135m", "llama", "SmolLM2-135M", 30, 576, 9, 3, 64, 1536, 49152, 8192, 100000.0f, 1e-5f, false, true,
     "smollm"},
    {"qwen2.5-0.5b", "qwen2", "Qwen2.5-0.5B", 24, 896, 14, 2, 64, 4864, 151936, 32768, 1e6f, 1e-6f, true, false,
     "qwen2"},
    {"qwen2.5-1.5b", "qwen2", "Qwen2.5-1.5B", 28, 1536, 12, 2, 128, 8960, 151936, 32768, 1e6f, 1e-6f, true, false,
     "qwen2"},
    {"llama-8b", "llama", "Llama-3-8B", 32, 4096, 32, 8, 128, 14336, 128256, 8192, 500000.0f, 1e-5f, false, false,
     "llama-bpe"},
};

std::string lower(std::string s) {
    for (char& c : s) c = (char)std::tolower((unsigned char)c);
    return s;
}

}  // namespace

const std::vector<synth_shape>& synth_shapes() { return k_shapes; }

std::string synth_shape_names() {
    std::string s;
    for (const synth_shape& sh : k_shapes) s += (s.empty() ? "" : ", ") + std::string(sh.name);
    return s;
}

const synth_shape& synth_shape_find(const std::string& name) {
    for (const synth_shape& sh : k_shapes)
        if (name == sh.name) return sh;
    ZK_THROW("unknown shape '%s' (accepted: %s)", name.c_str(), synth_shape_names().c_str());
}

// ---------------------------------------------------------------------------
// Weight types

const std::vector<dtype>& synth_weight_types() {
    static const std::vector<dtype> types = {dtype::F32,  dtype::F16,  dtype::BF16, dtype::Q4_0,   dtype::Q4_1,
                                             dtype::Q5_0, dtype::Q5_1, dtype::Q8_0, dtype::IQ4_NL, dtype::Q2_K,
                                             dtype::Q3_K, dtype::Q4_K, dtype::Q5_K, dtype::Q6_K};
    return types;
}

std::string synth_weight_type_names() {
    std::string s;
    for (dtype t : synth_weight_types()) s += (s.empty() ? "" : ", ") + lower(dtype_name(t));
    return s;
}

dtype synth_weight_type_from_name(const std::string& name) {
    for (dtype t : synth_weight_types())
        if (lower(name) == lower(dtype_name(t))) return t;
    ZK_THROW("unknown weight type '%s' (accepted: %s)", name.c_str(), synth_weight_type_names().c_str());
}

dtype model_synth_matrix_type(dtype t, int64_t n_cols) {
    auto fits = [&](dtype u) { return n_cols % dtype_get_traits(u).block_size == 0; };
    if (fits(t)) return t;
    switch (t) {  // llama.cpp's fallbacks for rows a K block does not divide
        case dtype::Q2_K:
        case dtype::Q3_K: t = dtype::IQ4_NL; break;
        case dtype::Q4_K: t = dtype::Q5_0; break;
        case dtype::Q5_K: t = dtype::Q5_1; break;
        case dtype::Q6_K: t = dtype::Q8_0; break;
        default: break;
    }
    return fits(t) ? t : dtype::F16;
}

bool model_synth_quantized(dtype t) {
    switch (t) {
        case dtype::F32:
        case dtype::F16:
        case dtype::BF16:
        case dtype::Q4_0:
        case dtype::Q4_1:
        case dtype::Q8_0: return true;
        default: return false;
    }
}

// ---------------------------------------------------------------------------
// Values: each row has its own stream (splitmix64 from seed, tensor name and
// row), so rows can be made in any order on any thread and a test can ask for
// any row again.

namespace {

inline uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t row_state(uint64_t seed, const std::string& name, int64_t row) {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the name
    for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
    uint64_t x = seed ^ h;
    uint64_t y = splitmix64(x) ^ ((uint64_t)row * 0xd1b54a32d192ed03ull);
    return splitmix64(y);
}

// Sum of four 16-bit uniforms, centred and scaled to variance 1 (|x| < 3.47).
inline float unit_normal(uint64_t& x) {
    const uint64_t r = splitmix64(x);
    const float s = (float)((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48));
    return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

}  // namespace

void model_synth_row(const synth_tensor& t, uint64_t seed, int64_t row, float* out) {
    uint64_t x = row_state(seed, t.name, row);
    const float base = t.k == synth_tensor::kind::NORM ? 1.0f : 0.0f;
    for (int64_t i = 0; i < t.shape[0]; i++) out[i] = base + t.std * unit_normal(x);
}

// ---------------------------------------------------------------------------
// Random blocks for the types zack has no quantizer for: random bytes, then the
// f16 scale field (d) and, where the type has one, the offset field (dmin, m)
// set per block. The constants come from the dequantizer itself: over sample
// blocks, v1 = the values with (d, offset) = (1, 0) and v2 = with (0, 1); the
// offset r * d with r = -E[v1] / E[v2] centres the values, and d = std * c
// gives them standard deviation std.

namespace {

struct scale_fields {
    int n = 0;              // 0: not a random-block type
    size_t off[2] = {0, 0};  // byte offsets of the f16 fields in a block
    float c = 0, r = 0;     // d = std * c, offset = r * d
};

void put_f16(uint8_t* p, float v) {
    const uint16_t h = fp32_to_fp16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

scale_fields scale_fields_layout(dtype t) {
    scale_fields f;
    switch (t) {
        case dtype::Q5_0: f.n = 1, f.off[0] = offsetof(block_q5_0, d); break;
        case dtype::Q5_1: f.n = 2, f.off[0] = offsetof(block_q5_1, d), f.off[1] = offsetof(block_q5_1, m); break;
        case dtype::IQ4_NL: f.n = 1, f.off[0] = offsetof(block_iq4_nl, d); break;
        case dtype::Q2_K: f.n = 2, f.off[0] = offsetof(block_q2_K, d), f.off[1] = offsetof(block_q2_K, dmin); break;
        case dtype::Q3_K: f.n = 1, f.off[0] = offsetof(block_q3_K, d); break;
        case dtype::Q4_K: f.n = 2, f.off[0] = offsetof(block_q4_K, d), f.off[1] = offsetof(block_q4_K, dmin); break;
        case dtype::Q5_K: f.n = 2, f.off[0] = offsetof(block_q5_K, d), f.off[1] = offsetof(block_q5_K, dmin); break;
        case dtype::Q6_K: f.n = 1, f.off[0] = offsetof(block_q6_K, d); break;
        default: break;
    }
    return f;
}

scale_fields scale_fields_measure(dtype t) {
    scale_fields f = scale_fields_layout(t);
    if (f.n == 0) return f;
    const dtype_traits& tr = dtype_get_traits(t);
    const int64_t bs = tr.block_size;
    std::vector<uint8_t> b(tr.type_size);
    std::vector<float> v1((size_t)bs), v2((size_t)bs, 0.0f);
    double s1 = 0, s2 = 0, s11 = 0, s22 = 0, s12 = 0;
    int64_t n = 0;
    uint64_t x = 12345;
    for (int k = 0; k < 512; k++) {
        for (size_t i = 0; i < b.size(); i += 8) {
            const uint64_t r = splitmix64(x);
            std::memcpy(b.data() + i, &r, std::min<size_t>(8, b.size() - i));
        }
        put_f16(b.data() + f.off[0], 1.0f);
        if (f.n == 2) put_f16(b.data() + f.off[1], 0.0f);
        dtype_dequantize_row(t, b.data(), v1.data(), bs);
        if (f.n == 2) {
            put_f16(b.data() + f.off[0], 0.0f);
            put_f16(b.data() + f.off[1], 1.0f);
            dtype_dequantize_row(t, b.data(), v2.data(), bs);
        }
        for (int64_t i = 0; i < bs; i++) {
            s1 += v1[i], s2 += v2[i], s11 += (double)v1[i] * v1[i], s22 += (double)v2[i] * v2[i];
            s12 += (double)v1[i] * v2[i];
        }
        n += bs;
    }
    if (f.n == 1) {
        f.c = (float)(1.0 / std::sqrt(s11 / (double)n));  // the rms, mean included
        return f;
    }
    const double m1 = s1 / n, m2 = s2 / n;
    const double r = -m1 / m2;
    const double var = (s11 / n - m1 * m1) + r * r * (s22 / n - m2 * m2) + 2 * r * (s12 / n - m1 * m2);
    f.r = (float)r;
    f.c = (float)(1.0 / std::sqrt(var));
    return f;
}

const scale_fields& scale_fields_get(dtype t) {
    static const std::vector<scale_fields> table = [] {
        std::vector<scale_fields> v(64);
        for (dtype u : synth_weight_types()) v[(size_t)u] = scale_fields_measure(u);
        return v;
    }();
    ZK_ASSERT((size_t)t < table.size());
    return table[(size_t)t];
}

// One row of a matrix (n_cols elements of t) into dst; tmp holds n_cols floats.
void make_row(const synth_tensor& st, uint64_t seed, int64_t row, uint8_t* dst, float* tmp) {
    const int64_t n = st.shape[0];
    const scale_fields& f = scale_fields_get(st.type);
    if (f.n == 0) {
        model_synth_row(st, seed, row, tmp);
        dtype_quantize_row(st.type, tmp, dst, n);
        return;
    }
    const dtype_traits& tr = dtype_get_traits(st.type);
    const size_t bytes = dtype_row_size(st.type, n);
    uint64_t x = row_state(seed, st.name, row);
    for (size_t i = 0; i < bytes; i += 8) {
        const uint64_t r = splitmix64(x);
        std::memcpy(dst + i, &r, std::min<size_t>(8, bytes - i));
    }
    const float d = st.std * f.c;
    for (size_t b = 0; b < bytes; b += tr.type_size) {
        put_f16(dst + b + f.off[0], d);
        if (f.n == 2) put_f16(dst + b + f.off[1], f.r * d);
    }
}

}  // namespace

// ---------------------------------------------------------------------------
// Tensors, in llama.cpp's file order

std::vector<synth_tensor> model_synth_tensors(const synth_shape& s, dtype wt) {
    if (std::find(synth_weight_types().begin(), synth_weight_types().end(), wt) == synth_weight_types().end())
        ZK_THROW("weight type %s cannot be written (accepted: %s)", dtype_name(wt), synth_weight_type_names().c_str());
    const int64_t E = s.n_embd, D = s.head_dim, F = s.n_ff, V = s.n_vocab;
    const int64_t Q = s.n_head * D, KV = s.n_head_kv * D;
    std::vector<synth_tensor> out;
    auto norm = [&](arch_tensor t, int il, int64_t n) {
        out.push_back({arch_tensor_name(t, il), synth_tensor::kind::NORM, dtype::F32, {n}, 0.05f});
    };
    auto bias = [&](arch_tensor t, int il, int64_t n) {
        out.push_back({arch_tensor_name(t, il), synth_tensor::kind::BIAS, dtype::F32, {n}, 0.02f});
    };
    // rows of `cols` elements: values of standard deviation 1/sqrt(cols) keep
    // a product with a normalised activation O(1)
    auto mat = [&](arch_tensor t, int il, int64_t cols, int64_t rows) {
        out.push_back({arch_tensor_name(t, il), synth_tensor::kind::MATRIX, model_synth_matrix_type(wt, cols),
                       {cols, rows}, 1.0f / std::sqrt((float)cols)});
    };
    mat(arch_tensor::TOKEN_EMBD, -1, E, V);
    norm(arch_tensor::OUTPUT_NORM, -1, E);
    if (!s.tied_output) mat(arch_tensor::OUTPUT, -1, E, V);
    for (int il = 0; il < s.n_layer; il++) {
        norm(arch_tensor::ATTN_NORM, il, E);
        mat(arch_tensor::ATTN_Q, il, E, Q);
        mat(arch_tensor::ATTN_K, il, E, KV);
        mat(arch_tensor::ATTN_V, il, E, KV);
        if (s.qkv_bias) {
            bias(arch_tensor::ATTN_Q_BIAS, il, Q);
            bias(arch_tensor::ATTN_K_BIAS, il, KV);
            bias(arch_tensor::ATTN_V_BIAS, il, KV);
        }
        mat(arch_tensor::ATTN_OUT, il, Q, E);
        norm(arch_tensor::FFN_NORM, il, E);
        mat(arch_tensor::FFN_GATE, il, E, F);
        mat(arch_tensor::FFN_UP, il, E, F);
        mat(arch_tensor::FFN_DOWN, il, F, E);
    }
    return out;
}

// ---------------------------------------------------------------------------
// Tokenizer: ChatML control tokens (0 <|endoftext|> = BOS, 1 <|im_start|>,
// 2 <|im_end|> = EOS), the 256 byte tokens, a few merges of English pairs, then
// fillers up to n_vocab. Fillers are printable ASCII (which byte-level BPE maps
// to itself), so they decode as their own text.

namespace {

struct synth_vocab {
    std::vector<std::string> tokens, merges;
    std::vector<int32_t> types;
};

synth_vocab synth_vocab_make(int n_vocab) {
    synth_vocab v;
    for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) v.tokens.push_back(s), v.types.push_back(3);
    for (int b = 0; b < 256; b++) {
        std::string s;
        unicode_append_utf8(s, unicode_byte_to_cpt((uint8_t)b));
        v.tokens.push_back(s), v.types.push_back(1);
    }
    const char* pairs[][2] = {{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"}, {"e", "r"}, {"a", "n"},
                              {"o", "n"}, {"Ġ", "a"}, {"r", "e"}, {"Ġ", "s"}, {"i", "s"}, {"in", "g"}};
    for (const auto& p : pairs) {
        v.merges.push_back(std::string(p[0]) + " " + p[1]);
        v.tokens.push_back(std::string(p[0]) + p[1]), v.types.push_back(1);
    }
    ZK_ASSERT((int)v.tokens.size() <= n_vocab);
    for (int i = (int)v.tokens.size(); i < n_vocab; i++) {
        v.tokens.push_back(strfmt("<synth_%d>", i));
        v.types.push_back(1);
    }
    return v;
}

}  // namespace

// ---------------------------------------------------------------------------
// The file

std::string model_synth_label(const synth_shape& s, dtype wt) {
    return strfmt("random weights, shape %s, %s", s.name, dtype_name(wt));
}

void model_synth_write(const synth_shape& s, dtype wt, uint64_t seed, const std::string& path, bool progress,
                       int n_threads) {
    const std::vector<synth_tensor> tensors = model_synth_tensors(s, wt);
    const arch_desc& A = arch_find(s.arch, path);
    auto key = [&](arch_key k) { return arch_key_name(A, k); };
    gguf_writer w;
    w.set("general.architecture", gguf_value::make_str(s.arch));
    w.set("general.name", gguf_value::make_str(strfmt("synthetic random-weight model, shape %s (%s)", s.name,
                                                       dtype_name(wt))));
    w.set("general.description",
          gguf_value::make_str(strfmt("random weights (seed %llu) in the shape of %s, written by zack for speed "
                                      "measurements; not a trained model, its output is noise",
                                      (unsigned long long)seed, s.like)));
    w.set(key(arch_key::BLOCK_COUNT), gguf_value::make_u32((uint32_t)s.n_layer));
    w.set(key(arch_key::CONTEXT_LENGTH), gguf_value::make_u32((uint32_t)s.n_ctx_train));
    w.set(key(arch_key::EMBEDDING_LENGTH), gguf_value::make_u32((uint32_t)s.n_embd));
    w.set(key(arch_key::FEED_FORWARD_LENGTH), gguf_value::make_u32((uint32_t)s.n_ff));
    w.set(key(arch_key::HEAD_COUNT), gguf_value::make_u32((uint32_t)s.n_head));
    w.set(key(arch_key::HEAD_COUNT_KV), gguf_value::make_u32((uint32_t)s.n_head_kv));
    if (s.head_dim * s.n_head != s.n_embd) {
        w.set(key(arch_key::KEY_LENGTH), gguf_value::make_u32((uint32_t)s.head_dim));
        w.set(key(arch_key::VALUE_LENGTH), gguf_value::make_u32((uint32_t)s.head_dim));
    }
    w.set(key(arch_key::ROPE_FREQ_BASE), gguf_value::make_f32(s.rope_base));
    w.set(key(arch_key::RMS_EPS), gguf_value::make_f32(s.rms_eps));
    const synth_vocab voc = synth_vocab_make(s.n_vocab);
    w.set("tokenizer.ggml.model", gguf_value::make_str("gpt2"));
    w.set("tokenizer.ggml.pre", gguf_value::make_str(s.tok_pre));
    w.set("tokenizer.ggml.tokens", gguf_value::make_arr_str(voc.tokens));
    w.set("tokenizer.ggml.token_type", gguf_value::make_arr_i32(voc.types));
    w.set("tokenizer.ggml.merges", gguf_value::make_arr_str(voc.merges));
    w.set("tokenizer.ggml.bos_token_id", gguf_value::make_u32(0));
    w.set("tokenizer.ggml.eos_token_id", gguf_value::make_u32(2));
    w.set("tokenizer.ggml.add_bos_token", gguf_value::make_bool(false));

    size_t total = 0;
    for (const synth_tensor& t : tensors)
        total += dtype_row_size(t.type, t.shape[0]) * (size_t)(t.shape.size() > 1 ? t.shape[1] : 1);
    const int nt = n_threads > 0 ? n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
    thread_pool pool(nt);
    const bool show = progress && total > ((size_t)64 << 20);
    size_t done = 0;
    int shown = -1;
    for (const synth_tensor& t : tensors) {
        const size_t row_bytes = dtype_row_size(t.type, t.shape[0]);
        w.add_tensor_fill(t.name, t.type, t.shape, [&, row_bytes](int64_t row0, int64_t n_rows, uint8_t* dst) {
            pool.parallel_for(n_rows, 1, [&](int64_t b, int64_t e, int) {
                std::vector<float> tmp((size_t)t.shape[0]);
                for (int64_t r = b; r < e; r++) make_row(t, seed, row0 + r, dst + row_bytes * (size_t)r, tmp.data());
            });
            done += row_bytes * (size_t)n_rows;
            const int pct = (int)(100.0 * (double)done / (double)total);
            if (show && pct != shown) {
                shown = pct;
                std::fprintf(stderr, "\rshape: writing %s (%s): %zu / %zu MiB   ", s.name, dtype_name(wt),
                             done >> 20, total >> 20);
            }
        });
    }
    w.write(path);
    if (show) std::fprintf(stderr, "\r%100s\r", "");
}

}  // namespace zk
