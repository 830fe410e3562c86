#include "calib/sensitivity.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ggml-like/error.h"
#include "ggml-like/threadpool.h"

namespace zk {

std::vector<int> sens_default_ranks(int d, int align) {
    const int step = std::max(std::max(1, align), d / 16);
    std::vector<int> r;
    for (int x = step; x < d; x += step) r.push_back(x);
    r.push_back(d);
    return r;
}

sensitivity_observer::sensitivity_observer(const model& m, const zack_calibration& c, const sens_params& p,
                                           int64_t max_ctx)
    : m_(m), c_(c), p_(p), max_ctx_(max_ctx) {
    const model_hparams& hp = m.hp;
    L_ = hp.n_layer, H_ = hp.n_head, KV_ = hp.n_head_kv, G_ = hp.n_group(), D_ = hp.head_dim, E_ = hp.n_embd;
    if (c.n_layer != L_ || c.n_kv != KV_ || c.d != D_)
        ZK_THROW("sensitivity: calibration shapes (%d layers, %d KV heads, dim %d) do not match the model", c.n_layer,
                 c.n_kv, c.d);
    if (p_.ranks.empty()) p_.ranks = sens_default_ranks(D_, 1);
    if (p_.ranks.back() != D_) ZK_THROW("sensitivity: the last candidate rank must be the head dim %d", D_);
    for (size_t i = 0; i < p_.ranks.size(); i++)
        if (p_.ranks[i] < 1 || (i && p_.ranks[i] <= p_.ranks[i - 1]))
            ZK_THROW("sensitivity: candidate ranks must be ascending and positive");
    if (p_.query_stride < 1) ZK_THROW("sensitivity: query stride must be positive");
    vt_.resize(L_);
    n_win_.assign(L_, 0);
    const size_t nh = (size_t)L_ * KV_ * D_ * D_;
    if (c.rv.size() != nh) ZK_THROW("sensitivity: the calibration has no V rotation");
    rv_.assign(c.rv.begin(), c.rv.end());
    const std::vector<double>* ab[k_key_basis_count][2] = {
        {&c.rqk, &c.rqk}, {&c.kqa, &c.kqb}, {&c.kpair, &c.kpair}};
    acc_.n_layer = L_, acc_.n_kv = KV_, acc_.d = D_;
    acc_.ranks = p_.ranks;
    const size_t n = (size_t)L_ * KV_ * p_.ranks.size();
    for (int m = 0; m < k_key_basis_count; m++) {
        if (ab[m][0]->size() != nh || ab[m][1]->size() != nh) continue;  // not in this calibration
        bases_.push_back(m);
        a_[m].assign(ab[m][0]->begin(), ab[m][0]->end());
        b_[m].assign(ab[m][1]->begin(), ab[m][1]->end());
        kt_[m].resize(L_);
        acc_.abs_k[m].assign(n, 0.0), acc_.rel_k[m].assign(n, 0.0);
    }
    acc_.abs_v.assign(n, 0.0), acc_.rel_v.assign(n, 0.0);
}

void sensitivity_observer::on_layer_input(int layer, int64_t n, const float* x) {
    xnorm_.resize(n);
    for (int64_t t = 0; t < n; t++) {
        double s = 0;
        for (int e = 0; e < E_; e++) s += (double)x[t * E_ + e] * x[t * E_ + e];
        xnorm_[t] = (float)s;
    }
}

// W_o of `layer` as f32 with the V rotation folded into each query head's
// columns: W~[:, i*d:(i+1)*d] = W_o[:, i*d:(i+1)*d] R_v[g(i)], [n_embd x n_head*d].
void sensitivity_observer::prepare_wo(int layer) {
    if (wo_layer_ == layer) return;
    const weight_view& wo = m_.layers[layer].wo;
    const int64_t HD = (int64_t)H_ * D_;
    std::vector<float> raw((size_t)E_ * HD);
    const size_t rb = dtype_row_size(wo.type, HD);
    for (int64_t e = 0; e < E_; e++) dtype_dequantize_row(wo.type, (const uint8_t*)wo.data + rb * e, raw.data() + e * HD, HD);
    wo_.resize(raw.size());
    for (int i = 0; i < H_; i++) {
        const float* R = rv_.data() + ((size_t)layer * KV_ + i / G_) * D_ * D_;
        // [E x d] block times R [d x d]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, E_, D_, D_, 1.0f, raw.data() + (size_t)i * D_, (int)HD, R,
                    D_, 0.0f, wo_.data() + (size_t)i * D_, (int)HD);
    }
    wo_layer_ = layer;
}

namespace {

// y[j] = sum_i R[i][j] x[i]  (R^T x; R [d x d] row-major, column j = direction j)
void rotate_t(const float* R, const float* x, float* y, int d) {
    for (int j = 0; j < d; j++) y[j] = 0.0f;
    for (int i = 0; i < d; i++) {
        const float xi = x[i];
        const float* row = R + (size_t)i * d;
        for (int j = 0; j < d; j++) y[j] += xi * row[j];
    }
}

}  // namespace

void sensitivity_observer::on_qkv(int layer, int64_t n, const int32_t* pos, const float* q, const float* k,
                                  const float* v) {
    ZK_ASSERT(layer >= 0 && layer < L_ && n > 0);
    const int D = D_, KV = KV_, G = G_, H = H_, NR = (int)p_.ranks.size();
    if (pos[0] == 0) n_win_[layer] = 0;
    const int64_t base = n_win_[layer];
    if (pos[0] != base) ZK_THROW("sensitivity: positions must run on from the window start (got %d, expected %lld)", pos[0], (long long)base);
    if (base + n > max_ctx_) ZK_THROW("sensitivity: window longer than %lld tokens", (long long)max_ctx_);
    std::vector<float>& vt = vt_[layer];
    if (vt.empty()) vt.resize((size_t)max_ctx_ * KV * D);
    for (int m : bases_)
        if (kt_[m][layer].empty()) kt_[m][layer].resize((size_t)max_ctx_ * KV * D);
    for (int64_t t = 0; t < n; t++)
        for (int g = 0; g < KV; g++) {
            const size_t h = ((size_t)layer * KV + g) * D * D;
            const size_t o = ((size_t)(base + t) * KV + g) * D;
            for (int m : bases_) rotate_t(b_[m].data() + h, k + (t * KV + g) * D, kt_[m][layer].data() + o, D);
            rotate_t(rv_.data() + h, v + (t * KV + g) * D, vt.data() + o, D);
        }
    n_win_[layer] = base + n;

    std::vector<int64_t> rows;  // the chunk's measured query rows
    for (int64_t t = 0; t < n; t++)
        if ((pos[t] + 1) % p_.query_stride == 0) rows.push_back(t);
    if (rows.empty()) return;
    if (layer == 0) acc_.n_queries += (int64_t)rows.size();
    prepare_wo(layer);

    const int GD = G * D;
    const int64_t HD = (int64_t)H * D;
    const int64_t NQ = (int64_t)rows.size();
    const int NB = (int)bases_.size();
    const float scale = 1.0f / std::sqrt((float)D);
    // dK: per (basis, KV head, query, rank < last) the change of the group's
    // outputs [NB x KV x NQ x (NR-1) x GD]; dV: per (KV head, query, rank) ||dy||^2.
    std::vector<float> dk((size_t)NB * KV * NQ * (NR - 1) * GD);
    std::vector<double> dv_abs((size_t)KV * NQ * NR, 0.0);
    // W~ transposed, [n_head*d x n_embd]: the value suffix sums walk its rows.
    std::vector<float> wt((size_t)HD * E_);
    for (int64_t e = 0; e < E_; e++)
        for (int64_t c = 0; c < HD; c++) wt[(size_t)c * E_ + e] = wo_[(size_t)e * HD + c];

    // One job per (basis, KV head, query); basis 0's job also does the values.
    auto task = [&](int64_t b, int64_t e, int) {
        std::vector<float> qt(D), sc((size_t)NR * max_ctx_), pr(max_ctx_), o((size_t)NR * D), acc(E_), ofull(GD);
        for (int64_t job = b; job < e; job++) {
            const int bi = (int)(job / (KV * NQ));
            const int m = bases_[bi];
            const int g = (int)(job / NQ % KV);
            const int64_t qi = job % NQ, t = rows[qi];
            const int64_t nk = base + t + 1;  // causal: keys 0 .. position
            const float* A = a_[m].data() + ((size_t)layer * KV + g) * D * D;
            const float* kw = kt_[m][layer].data() + (size_t)g * D;
            const float* vw = vt.data() + (size_t)g * D;
            const size_t kstride = (size_t)KV * D;
            float* dkq = dk.data() + (((size_t)bi * KV + g) * NQ + qi) * (NR - 1) * GD;
            for (int i = 0; i < G; i++) {
                rotate_t(A, q + (t * H + g * G + i) * D, qt.data(), D);
                // partial scores: sc[r][s] = sum_{j < ranks[r]} q~_j k~_sj
                for (int64_t s = 0; s < nk; s++) {
                    const float* ks = kw + s * kstride;
                    float run = 0.0f;
                    int j = 0;
                    for (int r = 0; r < NR; r++) {
                        for (; j < p_.ranks[r]; j++) run += qt[j] * ks[j];
                        sc[(size_t)r * max_ctx_ + s] = run * scale;
                    }
                }
                for (int r = 0; r < NR; r++) {
                    const float* srow = sc.data() + (size_t)r * max_ctx_;
                    float mx = -INFINITY;
                    for (int64_t s = 0; s < nk; s++) mx = std::max(mx, srow[s]);
                    float z = 0;
                    for (int64_t s = 0; s < nk; s++) z += pr[s] = std::exp(srow[s] - mx);
                    const float iz = 1.0f / z;
                    float* orow = o.data() + (size_t)r * D;
                    std::fill(orow, orow + D, 0.0f);
                    for (int64_t s = 0; s < nk; s++) {
                        const float p = pr[s] * iz;
                        const float* vs = vw + s * kstride;
                        for (int c = 0; c < D; c++) orow[c] += p * vs[c];
                    }
                }
                const float* of = o.data() + (size_t)(NR - 1) * D;
                std::copy(of, of + D, ofull.data() + (size_t)i * D);
                for (int r = 0; r < NR - 1; r++)
                    for (int c = 0; c < D; c++) dkq[(size_t)r * GD + i * D + c] = o[(size_t)r * D + c] - of[c];
            }
            if (bi != 0) continue;
            // values at rank r drop components >= r of every o^_i: dy(r) = -sum_{j >= r} sum_i o^_ij W~[:, i*d + j]
            std::fill(acc.begin(), acc.end(), 0.0f);
            double* dvq = dv_abs.data() + ((size_t)g * NQ + qi) * NR;
            int r = NR - 2;  // ranks[NR - 1] = d drops nothing: dvq stays 0
            for (int j = D - 1; j >= 0 && r >= 0; j--) {
                for (int i = 0; i < G; i++) {
                    const float oj = ofull[(size_t)i * D + j];
                    const float* w = wt.data() + ((size_t)(g * G + i) * D + j) * E_;
                    for (int e2 = 0; e2 < E_; e2++) acc[e2] += oj * w[e2];
                }
                if (j == p_.ranks[r]) {  // acc = sum over dims >= ranks[r]
                    double s2 = 0;
                    for (int e2 = 0; e2 < E_; e2++) s2 += (double)acc[e2] * acc[e2];
                    dvq[r] = s2;
                    r--;
                }
            }
        }
    };
    const int64_t jobs = (int64_t)NB * KV * NQ;
    if (pool_ && pool_->size() > 1)
        pool_->parallel_for(jobs, 1, task);
    else
        task(0, jobs, 0);

    // keys: ||dy||^2 = dK M dK^T per row with M = W~_g^T W~_g [GD x GD]
    std::vector<float> M((size_t)GD * GD), Z;
    const int64_t nrow = NQ * (NR - 1);
    Z.resize((size_t)nrow * GD);
    for (int g = 0; g < KV; g++) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, GD, GD, E_, 1.0f, wo_.data() + (size_t)g * GD, (int)HD,
                    wo_.data() + (size_t)g * GD, (int)HD, 0.0f, M.data(), GD);
        for (int bi = 0; bi < NB; bi++) {
            const int m = bases_[bi];
            const float* X = dk.data() + ((size_t)bi * KV + g) * nrow * GD;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nrow, GD, GD, 1.0f, X, GD, M.data(), GD, 0.0f,
                        Z.data(), GD);
            for (int64_t qi = 0; qi < NQ; qi++) {
                const double xn = std::max(1e-30, (double)xnorm_[rows[qi]]);
                for (int r = 0; r < NR - 1; r++) {
                    const float* x = X + ((size_t)qi * (NR - 1) + r) * GD;
                    const float* z = Z.data() + ((size_t)qi * (NR - 1) + r) * GD;
                    double s2 = 0;
                    for (int c = 0; c < GD; c++) s2 += (double)x[c] * z[c];
                    const size_t a = acc_.at(layer, g, r);
                    acc_.abs_k[m][a] += s2;
                    acc_.rel_k[m][a] += s2 / xn;
                }
            }
        }
        for (int64_t qi = 0; qi < NQ; qi++) {
            const double xn = std::max(1e-30, (double)xnorm_[rows[qi]]);
            for (int r = 0; r < NR; r++) {
                const size_t a = acc_.at(layer, g, r);
                const double v2 = dv_abs[((size_t)g * NQ + qi) * NR + r];
                acc_.abs_v[a] += v2;
                acc_.rel_v[a] += v2 / xn;
            }
        }
    }
}

zack_sensitivity sensitivity_observer::result() const {
    zack_sensitivity s = acc_;
    const double n = std::max<int64_t>(1, acc_.n_queries);
    for (int m = 0; m < k_key_basis_count; m++)
        for (auto* v : {&s.abs_k[m], &s.rel_k[m]})
            for (double& x : *v) x /= n;
    for (auto* v : {&s.abs_v, &s.rel_v})
        for (double& x : *v) x /= n;
    return s;
}

}  // namespace zk
