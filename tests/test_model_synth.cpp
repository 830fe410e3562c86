// Synthetic random-weight models (engine/model_synth.h): the files load with
// the engine's loader and run (finite logits that depend on the input), the
// bytes are the requested values within each type's quantization error where
// zack quantized them, the random-block types have the requested spread, and
// the shape table agrees with the real models' GGUFs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/model_synth.h"
#include "engine/session.h"
#include "ggml-like/error.h"
#include "ggml-like/gguf.h"
#include "tests/temp_dir.h"

namespace {

using zk::dtype;

using zk_test::temp_dir;

const zk::synth_shape& tiny() { return zk::synth_shape_find("tiny"); }

// `tiny` with 256-wide rows, so that K types are written as themselves (tiny's
// 64- and 128-wide rows take the fallbacks).
zk::synth_shape tiny256() {
    zk::synth_shape s = tiny();
    s.name = "tiny256";
    s.n_embd = 256, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 64, s.n_ff = 512, s.n_vocab = 384;
    return s;
}

// Logits of the last of `tokens`, decoded by a fresh session.
std::vector<float> last_logits(const zk::model& m, const std::vector<int32_t>& tokens) {
    zk::session_params sp;
    sp.n_ctx = 64;
    sp.n_threads = 2;
    zk::session s(m, sp);
    const float* l = nullptr;
    for (int32_t t : tokens) l = s.decode(&t, 1);  // one at a time: the decode path
    return std::vector<float>(l, l + m.hp.n_vocab);
}

// Writes shape s in type t, loads it, runs it: finite logits of a sane size
// that change with the input.
void check_runs(const zk::synth_shape& s, dtype t) {
    SCOPED_TRACE(std::string(s.name) + " " + zk::dtype_name(t));
    temp_dir d;
    const std::string path = d / "m.gguf";
    zk::model_synth_write(s, t, 7, path, false, 2);
    const std::unique_ptr<zk::model> m = zk::model_load(path);
    EXPECT_EQ(m->hp.arch, s.arch);
    EXPECT_EQ(m->hp.n_layer, s.n_layer);
    EXPECT_EQ(m->hp.n_embd, s.n_embd);
    EXPECT_EQ(m->hp.n_head, s.n_head);
    EXPECT_EQ(m->hp.n_head_kv, s.n_head_kv);
    EXPECT_EQ(m->hp.head_dim, s.head_dim);
    EXPECT_EQ(m->hp.n_ff, s.n_ff);
    EXPECT_EQ(m->hp.n_vocab, s.n_vocab);
    EXPECT_EQ(m->voc->n_tokens(), s.n_vocab);
    EXPECT_EQ(m->tied_output, s.tied_output);
    EXPECT_NE(m->hp.name.find("random-weight"), std::string::npos) << m->hp.name;
    EXPECT_NE(m->hp.name.find(s.name), std::string::npos) << m->hp.name;
    EXPECT_EQ(m->layers[0].wq.type, zk::model_synth_matrix_type(t, s.n_embd));

    const std::vector<float> a = last_logits(*m, {5, 100, 42, 7});
    const std::vector<float> b = last_logits(*m, {5, 100, 42, 8});
    const std::vector<float> a2 = last_logits(*m, {5, 100, 42, 7});
    double sum = 0, sum2 = 0, diff = 0;
    for (size_t i = 0; i < a.size(); i++) {
        ASSERT_TRUE(std::isfinite(a[i]) && std::isfinite(b[i])) << "logit " << i;
        sum += a[i], sum2 += (double)a[i] * a[i];
        diff = std::max(diff, (double)std::fabs(a[i] - b[i]));
    }
    const double mean = sum / a.size(), sd = std::sqrt(sum2 / a.size() - mean * mean);
    // the output rows have norm ~1 against a normalised state of norm sqrt(n_embd)
    EXPECT_GT(sd, 0.05) << "logits nearly constant";
    EXPECT_LT(sd, 100.0) << "logits blew up";
    EXPECT_GT(diff, 1e-3 * sd) << "the last token does not change the logits";
    EXPECT_EQ(a, a2) << "the same input gives other logits";
}

}  // namespace

TEST(ModelSynth, TinyRunsInEveryAskedType) {
    for (dtype t : {dtype::F16, dtype::Q8_0, dtype::Q4_0, dtype::Q4_1, dtype::Q5_0, dtype::Q4_K, dtype::Q6_K})
        check_runs(tiny(), t);
}

TEST(ModelSynth, KTypesRunWhereRowsFit) {
    for (dtype t : {dtype::Q2_K, dtype::Q3_K, dtype::Q4_K, dtype::Q5_K, dtype::Q6_K, dtype::IQ4_NL, dtype::Q5_1,
                    dtype::BF16, dtype::F32})
        check_runs(tiny256(), t);
}

// The packed weights' mapping starts on a huge-page boundary and carries the
// MADV_HUGEPAGE advice ("hg" in its VmFlags in /proc/self/smaps), whether or
// not the kernel found huge pages for it.
TEST(ModelSynth, PackedWeightsAskForHugePages) {
    temp_dir d;
    const std::string path = d / "m.gguf";
    zk::model_synth_write(tiny256(), dtype::Q4_K, 7, path, false, 2);
    const std::unique_ptr<zk::model> m = zk::model_load(path);
    ASSERT_GT(m->packed.n_tensors, 0) << "nothing packed: the test needs a packed matrix";
    const uintptr_t base = (uintptr_t)m->packed.base;
    EXPECT_EQ(base % zk::k_packed_align, 0u);
    std::FILE* f = std::fopen("/proc/self/smaps", "r");
    ASSERT_NE(f, nullptr);
    char line[512];
    bool in = false, found = false;
    std::string flags;
    while (std::fgets(line, sizeof(line), f)) {
        unsigned long long a, b;
        char dash;
        if (std::sscanf(line, "%llx%c%llx", &a, &dash, &b) == 3 && dash == '-') {
            in = a <= base && base < b;
            if (in) {
                found = true;
                EXPECT_GE(b - base, m->packed.bytes) << "the mapping is split";
            }
        } else if (in && std::strncmp(line, "VmFlags:", 8) == 0) {
            flags = line;
        }
    }
    std::fclose(f);
    ASSERT_TRUE(found) << "no mapping holds the packed weights";
    EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
}

TEST(ModelSynth, KFallbackAsLlamaCpp) {
    EXPECT_EQ(zk::model_synth_matrix_type(dtype::Q4_K, 256), dtype::Q4_K);
    EXPECT_EQ(zk::model_synth_matrix_type(dtype::Q4_K, 896), dtype::Q5_0);
    EXPECT_EQ(zk::model_synth_matrix_type(dtype::Q6_K, 576), dtype::Q8_0);
    EXPECT_EQ(zk::model_synth_matrix_type(dtype::Q5_K, 64), dtype::Q5_1);
    EXPECT_EQ(zk::model_synth_matrix_type(dtype::Q2_K, 64), dtype::IQ4_NL);
    EXPECT_EQ(zk::model_synth_matrix_type(dtype::Q8_0, 64), dtype::Q8_0);
}

// Where zack quantized the values, the file's dequantized weights are the
// requested ones within the type's error bound, per block of 32: F32 exact,
// F16/BF16 the rounding of the format, Q8_0 d/2 = amax/254, Q4_1 d/2 =
// (max - min)/30, Q4_0 |d| = amax/8 (the value opposite the largest one may
// clamp from 8 to 7 steps). Plus f16 rounding of the scales.
TEST(ModelSynth, QuantizedWeightsMatchTheRequestedValues) {
    for (dtype t : {dtype::F32, dtype::F16, dtype::BF16, dtype::Q8_0, dtype::Q4_0, dtype::Q4_1}) {
        SCOPED_TRACE(zk::dtype_name(t));
        ASSERT_TRUE(zk::model_synth_quantized(t));
        temp_dir d;
        const std::string path = d / "m.gguf";
        const uint64_t seed = 99;
        zk::model_synth_write(tiny(), t, seed, path, false, 2);
        const std::unique_ptr<zk::gguf_file> f = zk::gguf_file::open(path);
        const std::vector<zk::synth_tensor> ts = zk::model_synth_tensors(tiny(), t);
        ASSERT_EQ(f->tensors().size(), ts.size());
        int64_t n_checked = 0;
        double worst = 0;  // the largest error as a fraction of its bound
        for (const zk::synth_tensor& st : ts) {
            const zk::gguf_tensor& gt = f->get_tensor(st.name);
            ASSERT_EQ(gt.type, st.type) << st.name;
            ASSERT_EQ(gt.shape, st.shape) << st.name;
            const int64_t n = st.shape[0];
            const size_t rb = zk::dtype_row_size(st.type, n);
            std::vector<float> want((size_t)n), got((size_t)n);
            for (int64_t r = 0; r < gt.n_rows(); r++) {
                zk::model_synth_row(st, seed, r, want.data());
                zk::dtype_dequantize_row(st.type, gt.data + rb * (size_t)r, got.data(), n);
                for (int64_t b0 = 0; b0 < n; b0 += 32) {
                    float amax = 0, mn = want[b0], mx = want[b0];
                    for (int64_t i = b0; i < b0 + 32 && i < n; i++) {
                        amax = std::max(amax, std::fabs(want[i]));
                        mn = std::min(mn, want[i]);
                        mx = std::max(mx, want[i]);
                    }
                    for (int64_t i = b0; i < b0 + 32 && i < n; i++) {
                        double bound = 0;
                        switch (st.type) {
                            case dtype::F32: bound = 0; break;
                            case dtype::F16: bound = std::fabs(want[i]) / 2048 + 6e-8; break;
                            case dtype::BF16: bound = std::fabs(want[i]) / 256; break;
                            case dtype::Q8_0: bound = amax / 254 * 1.002 + amax / 2048 * 1.01; break;
                            case dtype::Q4_1:
                                bound = (mx - mn) / 30 * 1.002 + (std::fabs(mn) + mx - mn) / 2048 * 1.01;
                                break;
                            case dtype::Q4_0: bound = amax / 8 * 1.002 + amax / 2048 * 1.01; break;
                            default: FAIL() << "no bound for " << zk::dtype_name(st.type);
                        }
                        const double err = std::fabs((double)got[i] - want[i]);
                        ASSERT_LE(err, bound + 1e-9) << st.name << " row " << r << " col " << i << ": got " << got[i]
                                                     << ", asked " << want[i];
                        if (bound > 0) worst = std::max(worst, err / bound);
                        n_checked++;
                    }
                }
            }
        }
        const zk::synth_shape& s = tiny();
        const int64_t E = s.n_embd, V = s.n_vocab, Q = s.n_head * s.head_dim, KV = s.n_head_kv * s.head_dim;
        const int64_t expect = 2 * E * V + E + s.n_layer * (2 * E + E * Q + 2 * E * KV + Q * E + 3 * E * s.n_ff);
        EXPECT_EQ(n_checked, expect) << "every element of every tensor compared";
        // not a vacuous bound: the quantized types do lose something
        if (t != dtype::F32) {
            EXPECT_GT(worst, 0.05);
        }
    }
}

// The values themselves: the requested distribution (mean 0, the tensor's std;
// norms around 1), and rows differ from each other and between seeds.
TEST(ModelSynth, RequestedValues) {
    const std::vector<zk::synth_tensor> ts = zk::model_synth_tensors(tiny(), dtype::F16);
    for (const zk::synth_tensor& st : ts) {
        const int64_t n = st.shape[0], rows = st.shape.size() > 1 ? st.shape[1] : 1;
        double s1 = 0, s2 = 0;
        std::vector<float> v((size_t)n), w((size_t)n);
        for (int64_t r = 0; r < rows; r++) {
            zk::model_synth_row(st, 1, r, v.data());
            for (float x : v) s1 += x, s2 += (double)x * x;
        }
        const double cnt = (double)(n * rows), mean = s1 / cnt, sd = std::sqrt(s2 / cnt - mean * mean);
        const double centre = st.k == zk::synth_tensor::kind::NORM ? 1.0 : 0.0;
        EXPECT_NEAR(mean, centre, 4 * st.std / std::sqrt(cnt) + 1e-6) << st.name;
        EXPECT_NEAR(sd, st.std, 0.25 * st.std) << st.name;
        zk::model_synth_row(st, 2, 0, w.data());
        zk::model_synth_row(st, 1, 0, v.data());
        EXPECT_NE(v, w) << st.name << ": the seed changes the values";
        if (rows > 1) {
            zk::model_synth_row(st, 1, 1, w.data());
            EXPECT_NE(v, w) << st.name << ": rows differ";
        }
    }
}

// Random-block types: no NaN/Inf, mean about 0 and the requested spread.
TEST(ModelSynth, RandomBlocksHaveTheRequestedSpread) {
    const zk::synth_shape s = tiny256();
    for (dtype t : {dtype::Q5_0, dtype::Q5_1, dtype::IQ4_NL, dtype::Q2_K, dtype::Q3_K, dtype::Q4_K, dtype::Q5_K,
                    dtype::Q6_K}) {
        SCOPED_TRACE(zk::dtype_name(t));
        EXPECT_FALSE(zk::model_synth_quantized(t));
        temp_dir d;
        const std::string path = d / "m.gguf";
        zk::model_synth_write(s, t, 3, path, false, 2);
        const std::unique_ptr<zk::gguf_file> f = zk::gguf_file::open(path);
        for (const zk::synth_tensor& st : zk::model_synth_tensors(s, t)) {
            if (st.k != zk::synth_tensor::kind::MATRIX) continue;
            ASSERT_EQ(st.type, t) << st.name << ": 256-wide rows keep the type";
            const zk::gguf_tensor& gt = f->get_tensor(st.name);
            const int64_t n = st.shape[0];
            std::vector<float> v((size_t)(n * gt.n_rows()));
            zk::dtype_dequantize_row(t, gt.data, v.data(), (int64_t)v.size());
            double s1 = 0, s2 = 0;
            for (float x : v) {
                ASSERT_TRUE(std::isfinite(x)) << st.name;
                s1 += x, s2 += (double)x * x;
            }
            const double mean = s1 / v.size(), sd = std::sqrt(s2 / v.size() - mean * mean);
            EXPECT_NEAR(sd, st.std, 0.35 * st.std) << st.name;
            EXPECT_LT(std::fabs(mean), 0.2 * st.std) << st.name;
        }
    }
}

// The same seed writes the same bytes; another seed other bytes.
TEST(ModelSynth, Deterministic) {
    temp_dir d;
    auto bytes = [&](uint64_t seed, const char* name) {
        const std::string p = d / name;
        zk::model_synth_write(tiny(), dtype::Q4_K, seed, p, false, 2);
        const std::unique_ptr<zk::gguf_file> f = zk::gguf_file::open(p);
        const zk::gguf_tensor& t = f->get_tensor("blk.1.ffn_down.weight");
        return std::vector<uint8_t>(t.data, t.data + t.n_bytes);
    };
    EXPECT_EQ(bytes(5, "a.gguf"), bytes(5, "b.gguf"));
    EXPECT_NE(bytes(5, "a.gguf"), bytes(6, "c.gguf"));
}

TEST(ModelSynth, NamesAndErrors) {
    EXPECT_EQ(zk::synth_shape_names(), "tiny, tiny-qwen2, smollm2-135m, qwen2.5-0.5b, qwen2.5-1.5b, llama-8b");
    EXPECT_EQ(zk::synth_weight_type_from_name("Q4_K"), dtype::Q4_K);
    EXPECT_EQ(zk::synth_weight_type_from_name("f16"), dtype::F16);
    try {
        zk::synth_shape_find("huge");
        FAIL() << "no throw";
    } catch (const zk::error& e) {
        EXPECT_NE(std::string(e.what()).find("tiny, tiny-qwen2, smollm2-135m"), std::string::npos) << e.what();
    }
    EXPECT_THROW(zk::synth_weight_type_from_name("q8_1"), zk::error);  // an activation type
    EXPECT_THROW(zk::synth_weight_type_from_name("iq2_xxs"), zk::error);
    EXPECT_EQ(zk::model_synth_label(tiny(), dtype::Q4_K), "random weights, shape tiny, Q4_K");
}

// The shape table against the real models' files (fetched by scripts/setup.sh;
// Qwen2.5-Coder 0.5B / 1.5B have the shapes of Qwen2.5 0.5B / 1.5B).
TEST(ModelSynth, ShapesMatchTheRealModels) {
    const std::string dir = std::string(ZACK_SOURCE_DIR) + "/models/";
    const struct {
        const char* shape;
        std::string file;
    } cases[] = {{"smollm2-135m", ZACK_DEFAULT_MODEL},
                 {"qwen2.5-0.5b", dir + "qwen2.5-coder-0.5b-instruct.gguf"},
                 {"qwen2.5-1.5b", dir + "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"}};
    for (const auto& c : cases) {
        SCOPED_TRACE(c.shape);
        const zk::synth_shape& s = zk::synth_shape_find(c.shape);
        const std::unique_ptr<zk::gguf_file> f = zk::gguf_file::open(c.file);  // throws when missing
        const std::string a = f->get_str("general.architecture");
        EXPECT_EQ(a, s.arch);
        EXPECT_EQ(f->get_int(a + ".block_count"), s.n_layer);
        EXPECT_EQ(f->get_int(a + ".embedding_length"), s.n_embd);
        EXPECT_EQ(f->get_int(a + ".attention.head_count"), s.n_head);
        EXPECT_EQ(f->get_int(a + ".attention.head_count_kv"), s.n_head_kv);
        EXPECT_EQ(f->get_int(a + ".attention.key_length", s.n_embd / s.n_head), s.head_dim);
        EXPECT_EQ(f->get_int(a + ".feed_forward_length"), s.n_ff);
        EXPECT_EQ(f->get_int(a + ".context_length"), s.n_ctx_train);
        EXPECT_FLOAT_EQ((float)f->get_float(a + ".rope.freq_base", 10000.0), s.rope_base);
        EXPECT_FLOAT_EQ((float)f->get_float(a + ".attention.layer_norm_rms_epsilon"), s.rms_eps);
        EXPECT_EQ(f->get_tensor("token_embd.weight").shape[1], s.n_vocab);
        EXPECT_EQ(f->find_tensor("output.weight") == nullptr, s.tied_output);
        EXPECT_EQ(f->find_tensor("blk.0.attn_q.bias") != nullptr, s.qkv_bias);
        EXPECT_EQ(f->get_str("tokenizer.ggml.pre"), s.tok_pre);
        // and the synthetic file's tensors are the real file's, name and shape
        for (const zk::synth_tensor& st : zk::model_synth_tensors(s, dtype::Q4_K)) {
            const zk::gguf_tensor* gt = f->find_tensor(st.name);
            ASSERT_NE(gt, nullptr) << st.name;
            EXPECT_EQ(gt->shape, st.shape) << st.name;
        }
        EXPECT_EQ(f->tensors().size(), zk::model_synth_tensors(s, dtype::Q4_K).size());
    }
}
