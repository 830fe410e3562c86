#include "calib/gram.h"

#include <cblas.h>

#include <cmath>

#include "calib/blas_threads.h"  // openblas_set_num_threads (weak: null for other BLAS)
#include "ggml-like/error.h"
#include "ggml-like/threadpool.h"

namespace zk {

const char* gram_v_stat_name(gram_v_stat s) { return s == gram_v_stat::V ? "v" : "attn"; }

gram_v_stat gram_v_stat_from_name(const std::string& name) {
    if (name == "v") return gram_v_stat::V;
    if (name == "attn") return gram_v_stat::ATTN;
    ZK_THROW("unknown V statistic '%s' (valid: attn, v)", name.c_str());
}

gram_accumulator::gram_accumulator(const model_hparams& hp, thread_pool* pool, gram_v_stat v_stat)
    : n_layer_(hp.n_layer), n_head_(hp.n_head), n_kv_(hp.n_head_kv), d_(hp.head_dim), pool_(pool),
      v_stat_(v_stat) {
    const size_t per = (size_t)n_layer_ * n_kv_ * d_ * d_;
    c_q_.assign(per, 0.0);
    c_k_.assign(per, 0.0);
    c_kg_.assign(per, 0.0);
    c_v_.assign(per, 0.0);
    k_sum_.assign((size_t)n_layer_ * n_kv_ * d_, 0.0);
    set_pool(pool);
}

void gram_accumulator::set_key_group(int group) {
    if (group < 1 || group > 256) ZK_THROW("gram: key group %d is outside 1..256 tokens", group);
    if (n_tokens_ > 0) ZK_THROW("gram: the key group is set before any token");
    key_group_ = group;
}

void gram_accumulator::set_pool(thread_pool* pool) {
    pool_ = pool;
    // The products run on the pool's threads, each its own dsyrk: OpenBLAS's
    // threads would only spin against them (calibrating the 1.5B on 16K tokens
    // with 2 threads: 24% of the samples in OpenBLAS's exec_blas_async).
    if (pool_ && pool_->size() > 1 && openblas_set_num_threads) openblas_set_num_threads(1);
    scratch_.resize(pool_ ? pool_->size() : 1);
}

void gram_accumulator::on_qkv(int layer, int64_t n, const int32_t* pos, const float* q, const float* k,
                              const float* v) {
    ZK_ASSERT(layer >= 0 && layer < n_layer_ && n > 0);
    if (layer == 0) n_tokens_ += n;
    const int D = d_, H = n_head_, KV = n_kv_, G = n_head_ / n_kv_;
    // Task 2g: C_qk of head g from n*(G+1) rows; task 2g+1: C_v of head g from n
    // rows (only when C_v is taken from v; with ATTN it comes from on_attn).
    auto task = [&](int64_t t, int ith) {
        const int g = (int)(t / 2);
        const bool is_v = t % 2;
        if (is_v && v_stat_ != gram_v_stat::V) return;
        std::vector<double>& a = scratch_[ith];
        const int64_t rows = is_v ? n : n * (G + 1) + n;  // keys: + the group means (at most n)
        if ((int64_t)a.size() < rows * D) a.resize(rows * D);
        const size_t at = ((size_t)layer * KV + g) * D * D;
        if (is_v) {
            double* dst = a.data();
            for (int64_t tok = 0; tok < n; tok++) {
                const float* src = v + (tok * KV + g) * D;
                for (int c = 0; c < D; c++) *dst++ = src[c];
            }
            // C += A^T A with A [rows x D] row-major: only C's upper triangle is updated.
            cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, D, (int)n, 1.0, a.data(), D, 1.0, c_v_.data() + at, D);
            return;
        }
        // keys in rows [0, n), the group's queries in rows [n, n (G + 1)): C_k and C_q apart
        double* dk = a.data();
        double* dq = a.data() + n * D;
        double* ksum = k_sum_.data() + ((size_t)layer * KV + g) * D;
        for (int64_t tok = 0; tok < n; tok++) {
            const float* ks = k + (tok * KV + g) * D;
            for (int c = 0; c < D; c++) *dk++ = ks[c], ksum[c] += ks[c];
            for (int i = 0; i < G; i++) {
                const float* qs = q + (tok * H + g * G + i) * D;
                for (int c = 0; c < D; c++) *dq++ = qs[c];
            }
        }
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, D, (int)n, 1.0, a.data(), D, 1.0, c_k_.data() + at, D);
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, D, (int)(n * G), 1.0, a.data() + n * D, D, 1.0,
                    c_q_.data() + at, D);
        // the groups' means: a run of consecutive positions in one group of
        // key_group_ is one row sqrt(n_g) kbar (its share of n_g kbar kbar^T)
        double* gm = a.data() + n * (G + 1) * D;
        int64_t n_groups = 0;
        for (int64_t t0 = 0; t0 < n;) {
            int64_t t1 = t0 + 1;
            while (t1 < n && pos[t1] == pos[t1 - 1] + 1 && pos[t1] / key_group_ == pos[t0] / key_group_)
                t1++;
            double* row = gm + n_groups * D;
            for (int c = 0; c < D; c++) row[c] = 0;
            for (int64_t t = t0; t < t1; t++)
                for (int c = 0; c < D; c++) row[c] += a[(size_t)t * D + c];
            const double f = 1.0 / std::sqrt((double)(t1 - t0));  // sqrt(n_g) x the mean
            for (int c = 0; c < D; c++) row[c] *= f;
            n_groups++;
            t0 = t1;
        }
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, D, (int)n_groups, 1.0, gm, D, 1.0, c_kg_.data() + at, D);
    };
    pool_parallel_for(pool_, 2 * KV, 1, [&](int64_t b, int64_t e, int ith) {
        for (int64_t t = b; t < e; t++) task(t, ith);
    });
}

void gram_accumulator::on_attn(int layer, int64_t n, const float* attn) {
    if (v_stat_ != gram_v_stat::ATTN) return;
    ZK_ASSERT(layer >= 0 && layer < n_layer_ && n > 0);
    const int D = d_, H = n_head_, KV = n_kv_, G = n_head_ / n_kv_;
    // C_v of head g += sum over tokens and the group's query heads of o o^T:
    // the rows of attn for heads g*G .. g*G+G-1 are contiguous per token.
    auto task = [&](int64_t g, int ith) {
        std::vector<double>& a = scratch_[ith];
        const int64_t rows = n * G;
        if ((int64_t)a.size() < rows * D) a.resize(rows * D);
        double* dst = a.data();
        for (int64_t tok = 0; tok < n; tok++) {
            const float* src = attn + (tok * H + g * G) * D;
            for (int c = 0; c < G * D; c++) *dst++ = src[c];
        }
        double* C = c_v_.data() + ((size_t)layer * KV + g) * D * D;
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, D, (int)rows, 1.0, a.data(), D, 1.0, C, D);
    };
    pool_parallel_for(pool_, KV, 1, [&](int64_t b, int64_t e, int ith) {
        for (int64_t t = b; t < e; t++) task(t, ith);
    });
}

std::vector<double> gram_accumulator::full(const std::vector<double>& upper, int layer, int g) const {
    ZK_ASSERT(layer >= 0 && layer < n_layer_ && g >= 0 && g < n_kv_);
    const int D = d_;
    const double* C = upper.data() + ((size_t)layer * n_kv_ + g) * D * D;
    std::vector<double> out((size_t)D * D);
    for (int i = 0; i < D; i++)
        for (int j = i; j < D; j++) out[(size_t)i * D + j] = out[(size_t)j * D + i] = C[(size_t)i * D + j];
    return out;
}

std::vector<double> gram_accumulator::qk(int layer, int g) const {
    std::vector<double> c = full(c_q_, layer, g);
    const std::vector<double> k = full(c_k_, layer, g);
    for (size_t i = 0; i < c.size(); i++) c[i] += k[i];
    return c;
}
std::vector<double> gram_accumulator::q(int layer, int g) const { return full(c_q_, layer, g); }
std::vector<double> gram_accumulator::k(int layer, int g) const { return full(c_k_, layer, g); }
std::vector<double> gram_accumulator::v(int layer, int g) const { return full(c_v_, layer, g); }
std::vector<double> gram_accumulator::k_within(int layer, int g) const {
    std::vector<double> c = full(c_k_, layer, g);
    const std::vector<double> m = full(c_kg_, layer, g);
    for (size_t i = 0; i < c.size(); i++) c[i] -= m[i];
    return c;
}

std::vector<double> gram_accumulator::k_mean(int layer, int g) const {
    ZK_ASSERT(layer >= 0 && layer < n_layer_ && g >= 0 && g < n_kv_);
    const double* s = k_sum_.data() + ((size_t)layer * n_kv_ + g) * d_;
    std::vector<double> m(s, s + d_);
    if (n_tokens_ > 0)
        for (double& x : m) x /= (double)n_tokens_;
    return m;
}

std::vector<double> gram_wo(const weight_view& wo, int n_head, int n_kv, int d) {
    if (wo.n_cols != (int64_t)n_head * d)
        ZK_THROW("attn_output has %lld columns, expected n_head x head_dim = %d", (long long)wo.n_cols, n_head * d);
    const int64_t E = wo.n_rows, HD = wo.n_cols;
    const int G = n_head / n_kv;
    // Dequantize W_o once into doubles [E x HD]; for head group g the rows of the
    // concatenated matrix are W_o[e, i*d : (i+1)*d] for every e and every i in G(g).
    std::vector<float> row(HD);
    std::vector<double> w((size_t)E * HD);
    const size_t rb = dtype_row_size(wo.type, HD);
    for (int64_t e = 0; e < E; e++) {
        dtype_dequantize_row(wo.type, (const uint8_t*)wo.data + rb * e, row.data(), HD);
        for (int64_t c = 0; c < HD; c++) w[(size_t)e * HD + c] = row[c];
    }
    std::vector<double> out((size_t)n_kv * d * d, 0.0);
    for (int g = 0; g < n_kv; g++) {
        double* C = out.data() + (size_t)g * d * d;
        for (int i = g * G; i < (g + 1) * G; i++)
            cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, d, (int)E, 1.0, w.data() + (size_t)i * d, (int)HD,
                        1.0, C, d);
        for (int a = 0; a < d; a++)
            for (int b = a + 1; b < d; b++) C[(size_t)b * d + a] = C[(size_t)a * d + b];
    }
    return out;
}

}  // namespace zk
