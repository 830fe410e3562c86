#include "calib/sensitivity.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "calib/eigen.h"
#include "engine/forward_buffers.h"
#include "engine/kv_quant.h"
#include "ggml-like/error.h"
#include "ggml-like/threadpool.h"
#include "kernels/attention.h"
#include "kernels/cpu/simd.h"

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
    : m_(m), p_(p), max_ctx_(max_ctx) {
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
    if (p_.query_block < 1) ZK_THROW("sensitivity: query block must be positive");
    vt_.resize(L_);
    mgram_.resize(L_);
    mchol_.assign((size_t)L_ * KV_, 0);
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
    if (p_.quant) {
        if (bases_.empty() || bases_[0] != 0) ZK_THROW("sensitivity: quantized caches are simulated in the pca basis");
        if (p_.group < 1 || p_.residual < p_.group || p_.residual % p_.group || p_.sinks < 0)
            ZK_THROW("sensitivity: bad 4-bit layout (group %d, residual %d, sinks %d)", p_.group, p_.residual, p_.sinks);
        if (!c.k_score.empty()) {
            if (c.k_score.size() != (size_t)L_ * KV_ * D_) ZK_THROW("sensitivity: the key scores have the wrong size");
            korder_.resize(c.k_score.size());
            // the scores as the file stores them (f32), so that ties fall as in sessions
            const std::vector<float> sc(c.k_score.begin(), c.k_score.end());
            std::vector<int32_t> o;
            for (size_t h = 0; h < (size_t)L_ * KV_; h++) {
                zack_key_order(D_, sc.data() + h * D_, o);
                std::copy(o.begin(), o.end(), korder_.begin() + h * D_);
            }
            wides_ = keybasis_wide_rows(D_, (size_t)L_ * KV_, sc.data(), p_.widths_group);
        }
        if (!c.kw_score.empty()) {
            const size_t nr = (size_t)L_ * KV_ * D_ * D_;
            if (c.kw_score.size() != (size_t)L_ * KV_ * D_ || c.kwa.size() != nr || c.kwb.size() != nr)
                ZK_THROW("sensitivity: the key quantization pair has the wrong size");
            // the widths from the pair's proxy, as stored (f32)
            const std::vector<float> sc(c.kw_score.begin(), c.kw_score.end());
            wides_ = keybasis_wide_rows(D_, (size_t)L_ * KV_, sc.data(), p_.widths_group);
            to_pair_.resize(nr);
            from_pair_.resize(nr);
            for (size_t h = 0; h < (size_t)L_ * KV_; h++) {
                const double* R = c.rqk.data() + h * D_ * D_;
                const double* A = c.kwa.data() + h * D_ * D_;
                const double* B = c.kwb.data() + h * D_ * D_;
                for (int j = 0; j < D_; j++)
                    for (int i = 0; i < D_; i++) {
                        double tp = 0, fp = 0;  // (B^T R)[j][i], (R^T A)[j][i]
                        for (int x = 0; x < D_; x++) {
                            tp += B[(size_t)x * D_ + j] * R[(size_t)x * D_ + i];
                            fp += R[(size_t)x * D_ + j] * A[(size_t)x * D_ + i];
                        }
                        to_pair_[(h * D_ + j) * D_ + i] = (float)tp;
                        from_pair_[(h * D_ + j) * D_ + i] = (float)fp;
                    }
            }
        }
        for (int i = 0; i < k_sens_n_prec; i++)
            for (int j = 0; j < k_sens_n_prec; j++)
                if (pair_measured(i, j)) acc_.rel_q[i][j].assign((size_t)L_ * KV_, 0.0);
        for (const kv_vq_books* b : p_.vq)
            if (b && (b->d != D_ || b->heads.size() != (size_t)L_ * KV_))
                ZK_THROW("sensitivity: the value codebooks do not match the model");
        for (int b = 0; b < k_sens_n_prec - 1; b++) {
            ktq_[b].resize(L_);
            vtq_[b].resize(L_);
        }
        if (!c.k_mean.empty()) {  // R^T mean per head, R = rqk (column j = direction j)
            if (c.k_mean.size() != (size_t)L_ * KV_ * D_) ZK_THROW("sensitivity: the mean keys have the wrong size");
            kmean_.assign((size_t)L_ * KV_ * D_, 0.0f);
            for (size_t h = 0; h < (size_t)L_ * KV_; h++)
                for (int j = 0; j < D_; j++) {
                    double s = 0;
                    for (int i = 0; i < D_; i++) s += c.rqk[(h * D_ + i) * D_ + j] * c.k_mean[h * D_ + i];
                    kmean_[h * D_ + j] = (float)s;
                }
        }
    }
}

void sensitivity_observer::on_layer_input(int layer, int64_t n, const float* x) {
    xnorm_.resize(n);
    for (int64_t t = 0; t < n; t++) {
        double s = 0;
        for (int e = 0; e < E_; e++) s += (double)x[t * E_ + e] * x[t * E_ + e];
        xnorm_[t] = (float)s;
    }
}

// W~ of `layer` as f32, transposed, into wt_: rows i*d..(i+1)*d are
// (W_o[:, i*d:(i+1)*d] R_v[g(i)])^T = R_v^T W_o[:, i*d:(i+1)*d]^T, [d x n_embd];
// and the layer's M_g the first time it comes.
void sensitivity_observer::prepare_wo(int layer) {
    if (wo_layer_ == layer) return;
    const weight_view& wo = m_.layers[layer].wo;
    const int64_t HD = (int64_t)H_ * D_;
    raw_.resize((size_t)E_ * HD);
    wt_.resize((size_t)HD * E_);
    const size_t rb = dtype_row_size(wo.type, HD);
    pool_parallel_for(pool_, E_, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; r++)
            dtype_dequantize_row(wo.type, (const uint8_t*)wo.data + rb * r, raw_.data() + r * HD, HD);
    });
    pool_parallel_for(pool_, H_, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; i++)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasTrans, D_, E_, D_, 1.0f,
                        rv_.data() + ((size_t)layer * KV_ + i / G_) * D_ * D_, D_, raw_.data() + i * D_, (int)HD, 0.0f,
                        wt_.data() + (size_t)i * D_ * E_, E_);
    });
    wo_layer_ = layer;
    std::vector<float>& M = mgram_[layer];
    if (!M.empty()) return;
    const int GD = G_ * D_;
    M.resize((size_t)KV_ * GD * GD);
    // M_g [GD x GD] = W~_g^T W~_g = wt_g wt_g^T, wt_g = rows g*GD.. of wt_ [GD x n_embd],
    // replaced by its Cholesky factor R_g (M_g = R_g^T R_g) where it has one
    pool_parallel_for(pool_, KV_, 1, [&](int64_t b, int64_t e, int) {
        std::vector<double> Md, R;
        for (int64_t g = b; g < e; g++) {
            const float* w = wt_.data() + (size_t)g * GD * E_;
            float* Mg = M.data() + (size_t)g * GD * GD;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, GD, GD, E_, 1.0f, w, E_, w, E_, 0.0f, Mg, GD);
            Md.assign(Mg, Mg + (size_t)GD * GD);
            const bool chol = cholesky_upper(GD, Md.data(), R);
            if (chol) std::copy(R.begin(), R.end(), Mg);
            mchol_[(size_t)layer * KV_ + g] = chol;
        }
    });
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

// Rows [from, to) of the layer's window as the quantized caches return them:
// 8-bit keys and values per token; 4/2-bit values per token (a group of one)
// and, for each group of p_.group positions that `to` completes, 4/2-bit keys
// per channel and values per token against the group's steps.
void sensitivity_observer::quantize_window(int layer, int64_t from, int64_t to) {
    const int D = D_, KV = KV_, GR = p_.group;
    const std::vector<float>& kt = kt_[0][layer];
    const std::vector<float>& vt = vt_[layer];
    const float* mu = kmean_.empty() ? nullptr : kmean_.data() + (size_t)layer * KV * D;  // [KV x D]
    constexpr int NQB = k_sens_n_prec - 1;
    for (int b = 0; b < NQB; b++)
        if (ktq_[b][layer].empty()) {
            ktq_[b][layer].resize((size_t)max_ctx_ * KV * D);
            if (!sens_keys_only(k_sens_prec[1 + b]) || (kv_bits_vq(k_sens_prec[1 + b]) && p_.vq[k_sens_prec[1 + b]]))
                vtq_[b][layer].resize((size_t)max_ctx_ * KV * D);
        }
    // one job per (precision, KV head): each writes its own rows
    pool_parallel_for(pool_, (int64_t)NQB * KV, 1, [&](int64_t jb, int64_t je, int) {
        std::vector<int8_t> c8(D);
        std::vector<uint8_t> cq((size_t)GR * kv_qb_row_bytes(4, D) + 64);
        std::vector<uint16_t> s1(std::max({D, kv_n_blocks(D, KV_Q8_BLOCK), GR * kv_n_blocks(D, KV_Q4_VBLOCK)})),
            s2(std::max(D, KV_GRID_STEPS));
        std::vector<float> grp((size_t)GR * D), pgrp(to_pair_.empty() ? 0 : (size_t)GR * D), perm((size_t)D);
        for (int64_t job = jb; job < je; job++) {
            const int b = (int)(job / KV), g = (int)(job % KV);
            const int bits = k_sens_prec[1 + b], wi = sens_wide_index(bits);
            if (wi >= 0 && wides_[wi].empty()) continue;  // widths codes: not measured without the proxy
            for (int64_t t = from; t < to; t++) {
                const size_t o = ((size_t)t * KV + g) * D;
                if (kv_bits_vq(bits) && p_.vq[bits]) {  // values: vector codes, per token
                    const kv_vq_books& books = *p_.vq[bits];
                    const kv_vq_book& bk = books.heads[(size_t)layer * KV + g];
                    kvq_vq_encode_row(books, bk, vt.data() + o, D, cq.data(), s1.data());
                    kvq_vq_decode_row(books, bk, cq.data(), s1[0], D, vtq_[b][layer].data() + o);
                }
                if (sens_keys_only(bits)) continue;  // keys only, per group below
                if (bits == 8) {
                    for (int side = 0; side < 2; side++) {
                        const float* x = (side ? vt : kt).data() + o;
                        float* y = (side ? vtq_[b] : ktq_[b])[layer].data() + o;
                        if (!side && mu) {  // keys less the mean, then back: the scores shift alike
                            for (int c = 0; c < D; c++) y[c] = x[c] - mu[(size_t)g * D + c];
                            x = y;
                        }
                        kvq_quantize_q8_row(x, D, c8.data(), s1.data());
                        kvq_dequantize_q8_row(c8.data(), s1.data(), D, y);
                        if (!side && mu)
                            for (int c = 0; c < D; c++) y[c] += mu[(size_t)g * D + c];
                    }
                } else {
                    kvq_quantize_vrow(bits, vt.data() + o, D, cq.data(), s1.data(), s2.data());
                    kvq_dequantize_vrow(bits, cq.data(), s1.data(), s2.data(), D, vtq_[b][layer].data() + o);
                }
            }
            if (bits == 8) continue;
            for (int64_t g0 = from / GR * GR; g0 + GR <= to; g0 += GR) {
                if (g0 + GR <= from) continue;  // completed by an earlier chunk
                // the group's rows of src [tokens x KV x D] through a quantizer into dst
                auto group_through = [&](const float* src, float* dst, bool keys) {
                    for (int t = 0; t < GR; t++)
                        std::copy_n(src + ((size_t)(g0 + t) * KV + g) * D, D, grp.data() + (size_t)t * D);
                    const float* m = keys && mu ? mu + (size_t)g * D : nullptr;  // less the mean, then back
                    if (keys) {
                        if (m)
                            for (int t = 0; t < GR; t++)
                                for (int c = 0; c < D; c++) grp[(size_t)t * D + c] -= m[c];
                        const sens_key_layout kl =
                            sens_key_layout_of(bits, D, wi >= 0 ? &wides_[wi][(size_t)layer * KV + g] : nullptr);
                        // unequal widths: the directions in the session's order (engine/session.h)
                        const bool unequal = kl.tail || kl.zero || kl.mid;
                        const size_t hp = ((size_t)layer * KV + g) * D * D;
                        const float* to = unequal && !to_pair_.empty() ? to_pair_.data() + hp : nullptr;
                        const int32_t* order = unequal && !to && !korder_.empty()
                                               ? korder_.data() + ((size_t)layer * KV + g) * D
                                               : nullptr;
                        auto reorder = [&](bool back) {  // each row: into the order, or back from it
                            if (to) {  // ... or into the pair's coordinates and back: rows Y M^T
                                const float* M = back ? from_pair_.data() + hp : to;
                                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, GR, D, D, 1.0f, grp.data(), D, M,
                                            D, 0.0f, pgrp.data(), D);
                                std::copy(pgrp.begin(), pgrp.end(), grp.begin());
                            }
                            for (int t = 0; order && t < GR; t++) {
                                float* row = grp.data() + (size_t)t * D;
                                for (int c = 0; c < D; c++) {
                                    if (back)
                                        perm[order[c]] = row[c];
                                    else
                                        perm[c] = row[order[c]];
                                }
                                std::copy_n(perm.data(), D, row);
                            }
                        };
                        reorder(false);
                        kvq_quantize_keys(kl.bits, grp.data(), GR, D, cq.data(), s1.data(), s2.data(), nullptr,
                                          kl.tail, kl.zero, kl.mid);
                        kvq_dequantize_keys(kl.bits, cq.data(), s1.data(), s2.data(), GR, D, grp.data(), kl.tail,
                                            kl.zero, kl.mid);
                        reorder(true);
                        if (m)
                            for (int t = 0; t < GR; t++)
                                for (int c = 0; c < D; c++) grp[(size_t)t * D + c] += m[c];
                    } else {  // per token, the grids coded against the group's steps
                        kvq_quantize_values(bits, grp.data(), GR, D, cq.data(), s1.data(), s2.data());
                        kvq_dequantize_values(bits, cq.data(), s1.data(), s2.data(), GR, D, grp.data());
                    }
                    for (int t = 0; t < GR; t++)
                        std::copy_n(grp.data() + (size_t)t * D, D, dst + ((size_t)(g0 + t) * KV + g) * D);
                };
                group_through(kt.data(), ktq_[b][layer].data(), true);
                if (!sens_keys_only(bits)) group_through(vt.data(), vtq_[b][layer].data(), false);
            }
        }
    });
}

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
    pool_parallel_for(pool_, n, 1, [&](int64_t tb, int64_t te, int) {
        for (int64_t t = tb; t < te; t++)
            for (int g = 0; g < KV; g++) {
                const size_t h = ((size_t)layer * KV + g) * D * D;
                const size_t o = ((size_t)(base + t) * KV + g) * D;
                for (int m : bases_) rotate_t(b_[m].data() + h, k + (t * KV + g) * D, kt_[m][layer].data() + o, D);
                rotate_t(rv_.data() + h, v + (t * KV + g) * D, vt.data() + o, D);
            }
    });
    n_win_[layer] = base + n;
    if (p_.quant) quantize_window(layer, base, base + n);

    std::vector<int64_t> rows;  // the chunk's measured query rows
    for (int64_t t = 0; t < n; t++)
        if ((pos[t] + 1) % p_.query_stride == 0) rows.push_back(t);
    if (rows.empty()) return;
    if (layer == 0) acc_.n_queries += (int64_t)rows.size();
    prepare_wo(layer);

    const int GD = G * D;
    const int64_t NQ = (int64_t)rows.size();
    const int NB = (int)bases_.size();
    const float scale = m_.hp.score_scale();
    // A sliding-window layer's query at position p sees the keys > p - n_swa
    // (key index = position here): the first visible index of nk causal keys.
    const int64_t n_swa = m_.hp.layer_is_swa(layer) ? m_.hp.n_swa : 0;
    auto first_key = [n_swa](int64_t nk) { return n_swa > 0 ? std::max<int64_t>(0, nk - n_swa) : 0; };
    // dK: per (basis, KV head, query, rank < last) the change of the group's
    // outputs [NB x KV x NQ x (NR-1) x GD]; dV: per (KV head, query, rank) ||dy||^2.
    std::vector<float>& dk = dk_;  // every element is written below (kept from chunk to chunk)
    fb_grow_to(dk, (int64_t)NB * KV * NQ * (NR - 1) * GD);
    std::vector<double> dv_abs((size_t)KV * NQ * NR, 0.0);
    const float* wt = wt_.data();  // W~ transposed: the value suffix sums walk its rows

    // Full-rank outputs of every query head, [KV x NQ x GD] (the same in every basis).
    std::vector<float>& ofull = ofull_;
    fb_grow_to(ofull, (int64_t)KV * NQ * GD);
    const int64_t nk_max = base + rows.back() + 1;  // keys the last measured query sees
    // Queries in blocks of p_.query_block rows, each block's products over the keys
    // its last query sees (causal: the rest would multiply zeros). qblk[b] = first
    // row of block b, qblk.back() = NQ; nkb[b] = keys block b sees.
    const int64_t k_qblock = p_.query_block;
    std::vector<int64_t> qblk, nkb;
    for (int64_t r0 = 0; r0 < NQ; r0 += k_qblock) {
        qblk.push_back(r0);
        nkb.push_back(base + rows[(size_t)std::min(NQ, r0 + k_qblock) - 1] + 1);
    }
    qblk.push_back(NQ);
    const int64_t n_qblk = (int64_t)nkb.size();
    const int kstride = KV * D;

    // Keys: one job per (basis, KV head, query head) over all measured queries,
    // in BLAS: scores accumulate block by block of the rank grid (the block
    // between two candidate ranks), after each block the masked softmax gives
    // that rank's probabilities, and one product per query block gives every
    // rank's outputs (rows (query, rank): a GEMM of NR times the rows).
    auto key_job = [&](int64_t b, int64_t e, int) {
        std::vector<float> qraw((size_t)NQ * D), qt((size_t)NQ * D), sc((size_t)NQ * nk_max);
        std::vector<float> pm((size_t)NQ * NR * nk_max);  // [NQ x NR x nk_max]
        std::vector<float> o((size_t)NQ * NR * D);        // [NQ x NR x D]
        for (int64_t job = b; job < e; job++) {
            const int bi = (int)(job / (KV * G));
            const int m = bases_[bi];
            const int g = (int)(job / G % KV), i = (int)(job % G);
            const float* A = a_[m].data() + ((size_t)layer * KV + g) * D * D;
            const float* kw = kt_[m][layer].data() + (size_t)g * D;
            const float* vw = vt.data() + (size_t)g * D;
            for (int64_t qi = 0; qi < NQ; qi++)
                std::copy_n(q + (rows[qi] * H + g * G + i) * D, D, qraw.data() + qi * D);
            // q~ = A^T q for every measured query: [NQ x D] = [NQ x D] x A [D x D]
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)NQ, D, D, 1.0f, qraw.data(), D, A, D, 0.0f,
                        qt.data(), D);
            std::fill(sc.begin(), sc.end(), 0.0f);
            for (int64_t bq = 0; bq < n_qblk; bq++) {
                const int64_t r0 = qblk[bq], nq = qblk[bq + 1] - r0, nkq = nkb[bq];
                for (int r = 0; r < NR; r++) {
                    const int j0 = r ? p_.ranks[r - 1] : 0, nj = p_.ranks[r] - j0;
                    // sc += q~[:, j0:j0+nj] k~[:, j0:j0+nj]^T, scaled as the engine scales
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)nkq, nj, scale,
                                qt.data() + r0 * D + j0, D, kw + j0, kstride, 1.0f, sc.data() + r0 * nk_max,
                                (int)nk_max);
                    for (int64_t qi = r0; qi < r0 + nq; qi++) {
                        const int64_t nk = base + rows[qi] + 1, k0 = first_key(nk);  // causal, windowed
                        const float* srow = sc.data() + qi * nk_max;
                        float* prow = pm.data() + ((size_t)qi * NR + r) * nk_max;
                        std::fill(prow, prow + k0, 0.0f);
                        std::copy(srow + k0, srow + nk, prow + k0);
                        const float z =
                            simd::exp_shift_sum(prow + k0, (int)(nk - k0), simd::max_f32(prow + k0, (int)(nk - k0)));
                        simd::scale_f32(prow + k0, (int)(nk - k0), 1.0f / z);
                        std::fill(prow + nk, prow + nkq, 0.0f);
                    }
                }
                // outputs at every rank: [nq*NR x D] = P [nq*NR x nk] x V^ [nk x D]
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(nq * NR), D, (int)nkq, 1.0f,
                            pm.data() + (size_t)r0 * NR * nk_max, (int)nk_max, vw, kstride, 0.0f,
                            o.data() + (size_t)r0 * NR * D, D);
            }
            for (int64_t qi = 0; qi < NQ; qi++) {
                const float* of = o.data() + ((size_t)qi * NR + NR - 1) * D;  // full rank
                if (bi == 0) std::copy_n(of, D, ofull.data() + ((size_t)g * NQ + qi) * GD + (size_t)i * D);
                float* dkq = dk.data() + (((size_t)bi * KV + g) * NQ + qi) * (NR - 1) * GD;
                for (int r = 0; r < NR - 1; r++) {
                    const float* orow = o.data() + ((size_t)qi * NR + r) * D;
                    for (int c = 0; c < D; c++) dkq[(size_t)r * GD + (size_t)i * D + c] = orow[c] - of[c];
                }
            }
        }
    };
    // Values: rank r drops components >= r of every o^_i, so
    // dy(r) = -sum_{j >= r} sum_i o^_ij W~[:, i*d + j], summed from the last
    // block of the rank grid down, for a block of queries at a time in BLAS
    // (the rows of W~^T a block of dims needs are read once for all of them).
    const int64_t k_vrows = k_qblock;
    const int64_t n_vblk = (NQ + k_vrows - 1) / k_vrows;
    auto value_job = [&](int64_t b, int64_t e, int) {
        std::vector<float> acc((size_t)k_vrows * E_);  // [nq x n_embd]: -dy of each query
        for (int64_t job = b; job < e; job++) {
            const int g = (int)(job / n_vblk);
            const int64_t q0 = job % n_vblk * k_vrows, nq = std::min(k_vrows, NQ - q0);
            std::fill(acc.begin(), acc.end(), 0.0f);
            // ranks[NR - 1] = d drops nothing: dv_abs stays 0 there
            for (int r = NR - 2; r >= 0; r--) {
                const int j0 = p_.ranks[r], nj = p_.ranks[r + 1] - j0;  // dims [j0, j0 + nj) join the sum
                for (int i = 0; i < G; i++)
                    // acc += o^[:, i, j0:j0+nj] [nq x nj] x W~^T rows (g*G+i)*d + j0.. [nj x n_embd]
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, E_, nj, 1.0f,
                                ofull.data() + ((size_t)g * NQ + q0) * GD + (size_t)i * D + j0, GD,
                                wt + ((size_t)(g * G + i) * D + j0) * E_, E_, 1.0f, acc.data(), E_);
                for (int64_t qi = 0; qi < nq; qi++) {
                    const float* a = acc.data() + qi * E_;
                    double s2 = 0;
                    for (int e2 = 0; e2 < E_; e2++) s2 += (double)a[e2] * a[e2];
                    dv_abs[((size_t)g * NQ + q0 + qi) * NR + r] = s2;
                }
            }
        }
    };
    pool_parallel_for(pool_, (int64_t)NB * KV * G, 1, key_job);
    pool_parallel_for(pool_, (int64_t)KV * n_vblk, 1, value_job);

    // Quantized caches at full rank (pca basis): per (KV head, query head) and
    // for every pair of key and value precisions but (16, 16) the outputs with
    // the rows as the cache would return them, exact for the sinks and (4/2-bit)
    // the newest tokens.
    std::vector<float>& dq = dq_;  // the measured variants' rows are written, and only they are read
    constexpr int NP = k_sens_n_prec;
    constexpr int NV = NP * NP;  // variants, index i * NP + j (keys at k_sens_prec[i], values at [j]); 0 unused
    if (p_.quant) {
        fb_grow_to(dq, (int64_t)NV * KV * NQ * GD);
        auto quant_job = [&](int64_t b, int64_t e, int) {
            std::vector<float> qraw((size_t)NQ * D), qt((size_t)NQ * D);
            std::vector<float> sc((size_t)NP * NQ * nk_max);  // scores with keys at each precision
            std::vector<float> pe((size_t)NQ * nk_max), pq((size_t)NQ * nk_max), o((size_t)NQ * D);
            for (int64_t job = b; job < e; job++) {
                const int g = (int)(job / G), i = (int)(job % G);
                const float* A = a_[0].data() + ((size_t)layer * KV + g) * D * D;
                for (int64_t qi = 0; qi < NQ; qi++)
                    std::copy_n(q + (rows[qi] * H + g * G + i) * D, D, qraw.data() + qi * D);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)NQ, D, D, 1.0f, qraw.data(), D, A, D, 0.0f,
                            qt.data(), D);
                for (int pk = 0; pk < NP; pk++)
                    for (int64_t bq = 0; bq < n_qblk; bq++)
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(qblk[bq + 1] - qblk[bq]),
                                    (int)nkb[bq], D, scale, qt.data() + qblk[bq] * D, D,
                                    (pk ? ktq_[pk - 1][layer] : kt_[0][layer]).data() + (size_t)g * D, kstride, 0.0f,
                                    sc.data() + ((size_t)pk * NQ + qblk[bq]) * nk_max, (int)nk_max);
                for (int var = 1; var < NV; var++) {
                    const int pk = var / NP, pv = var % NP;
                    if (!pair_measured(pk, pv)) continue;
                    // the slots a quantized side returns quantized: [sinks, qlim); a head with
                    // a 4/2-bit side keeps its newest tokens exact on both sides (engine/kv_cache.h)
                    const bool windowed = sens_windowed(k_sens_prec[pk]) || sens_windowed(k_sens_prec[pv]);
                    auto limit = [&](int prec, int64_t nk) -> int64_t {
                        if (prec == 0) return 0;
                        if (!windowed) return nk;
                        return nk >= p_.residual ? ((nk - p_.residual) / p_.group + 1) * p_.group : 0;
                    };
                    for (int64_t qi = 0; qi < NQ; qi++) {
                        const int64_t t = base + rows[qi], nk = t + 1, k0 = first_key(nk);
                        const int64_t klim = limit(pk, nk), vlim = limit(pv, nk);
                        const float* er = sc.data() + qi * nk_max;
                        const float* qr = sc.data() + (size_t)pk * NQ * nk_max + qi * nk_max;
                        float* pe_r = pe.data() + qi * nk_max;
                        float* pq_r = pq.data() + qi * nk_max;
                        const int64_t nkq = nkb[(size_t)(qi / k_qblock)];  // the row's block's keys
                        std::fill(pe_r, pe_r + nkq, 0.0f);
                        std::fill(pq_r, pq_r + nkq, 0.0f);
                        // scores: quantized keys in [sinks, klim), exact elsewhere; the
                        // probabilities go to pq_r where the value is quantized
                        // ([sinks, vlim)), to pe_r elsewhere
                        const int64_t q0 = std::max<int64_t>(k0, std::min<int64_t>(p_.sinks, nk));  // first quantizable slot
                        const int64_t kq0 = q0, kq1 = std::max(q0, std::min(klim, nk));
                        std::copy(er + k0, er + kq0, pe_r + k0);
                        std::copy(qr + kq0, qr + kq1, pe_r + kq0);
                        std::copy(er + kq1, er + nk, pe_r + kq1);
                        const int nn = (int)(nk - k0);
                        const float z = simd::exp_shift_sum(pe_r + k0, nn, simd::max_f32(pe_r + k0, nn));
                        simd::scale_f32(pe_r + k0, nn, 1.0f / z);
                        const int64_t vq0 = q0, vq1 = std::max(q0, std::min(vlim, nk));
                        std::copy(pe_r + vq0, pe_r + vq1, pq_r + vq0);
                        std::fill(pe_r + vq0, pe_r + vq1, 0.0f);
                    }
                    for (int64_t bq = 0; bq < n_qblk; bq++) {
                        const int64_t r0 = qblk[bq], nq = qblk[bq + 1] - r0;
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, D, (int)nkb[bq], 1.0f,
                                    pe.data() + r0 * nk_max, (int)nk_max, vt.data() + (size_t)g * D, kstride, 0.0f,
                                    o.data() + r0 * D, D);
                        if (pv)
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, D, (int)nkb[bq], 1.0f,
                                        pq.data() + r0 * nk_max, (int)nk_max,
                                        vtq_[pv - 1][layer].data() + (size_t)g * D, kstride, 1.0f, o.data() + r0 * D,
                                        D);
                    }
                    for (int64_t qi = 0; qi < NQ; qi++) {
                        float* dst = dq.data() + (((size_t)var * KV + g) * NQ + qi) * GD + (size_t)i * D;
                        const float* of = ofull.data() + ((size_t)g * NQ + qi) * GD + (size_t)i * D;
                        for (int c2 = 0; c2 < D; c2++) dst[c2] = o[(size_t)qi * D + c2] - of[c2];
                    }
                }
            }
        };
        pool_parallel_for(pool_, (int64_t)KV * G, 1, quant_job);
    }

    // ||dy||^2 = x M_g x^T for every row x of dK (keys) and of dQ (quantized
    // caches), in blocks of rows over the pool: sk [NB x KV x nrow], sq [NV x KV x NQ].
    const int64_t nrow = NQ * (NR - 1);
    std::vector<double> sk((size_t)NB * KV * nrow), sq(p_.quant ? (size_t)NV * KV * NQ : 0);
    struct mdot_block {
        const float* x;  // [n x GD]
        int64_t n;
        const float* m;  // [GD x GD]: M_g, or R_g where chol
        bool chol;
        double* out;     // [n]
    };
    constexpr int64_t k_block_rows = 128;
    std::vector<mdot_block> blocks;
    auto add_rows = [&](const float* x, int64_t n, int g, double* out) {
        const float* M = mgram_[layer].data() + (size_t)g * GD * GD;
        const bool chol = mchol_[(size_t)layer * KV + g] != 0;
        for (int64_t r0 = 0; r0 < n; r0 += k_block_rows)
            blocks.push_back({x + r0 * GD, std::min(k_block_rows, n - r0), M, chol, out + r0});
    };
    for (int g = 0; g < KV; g++) {
        for (int bi = 0; bi < NB; bi++)
            add_rows(dk.data() + ((size_t)bi * KV + g) * nrow * GD, nrow, g, sk.data() + ((size_t)bi * KV + g) * nrow);
        for (int var = 1; p_.quant && var < NV; var++)
            if (pair_measured(var / NP, var % NP))
                add_rows(dq.data() + ((size_t)var * KV + g) * NQ * GD, NQ, g, sq.data() + ((size_t)var * KV + g) * NQ);
    }
    pool_parallel_for(pool_, (int64_t)blocks.size(), 1, [&](int64_t b, int64_t e, int) {
        std::vector<float> Z((size_t)k_block_rows * GD);
        for (int64_t j = b; j < e; j++) {
            const mdot_block& bl = blocks[(size_t)j];
            if (bl.chol) {  // x M x^T = |x R^T|^2: a triangular product, half the work of x M
                std::copy_n(bl.x, (size_t)bl.n * GD, Z.data());
                cblas_strmm(CblasRowMajor, CblasRight, CblasUpper, CblasTrans, CblasNonUnit, (int)bl.n, GD, 1.0f,
                            bl.m, GD, Z.data(), GD);
            } else {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)bl.n, GD, GD, 1.0f, bl.x, GD, bl.m, GD,
                            0.0f, Z.data(), GD);
            }
            for (int64_t r = 0; r < bl.n; r++) {
                const float* x = bl.chol ? Z.data() + r * GD : bl.x + r * GD;
                const float* z = Z.data() + r * GD;
                double s2 = 0;
                for (int c = 0; c < GD; c++) s2 += (double)x[c] * z[c];
                bl.out[r] = s2;
            }
        }
    });
    for (int g = 0; g < KV; g++) {
        for (int bi = 0; bi < NB; bi++) {
            const int m = bases_[bi];
            const double* s2 = sk.data() + ((size_t)bi * KV + g) * nrow;
            for (int64_t qi = 0; qi < NQ; qi++) {
                const double xn = std::max(1e-30, (double)xnorm_[rows[qi]]);
                for (int r = 0; r < NR - 1; r++) {
                    const size_t a = acc_.at(layer, g, r);
                    acc_.abs_k[m][a] += s2[qi * (NR - 1) + r];
                    acc_.rel_k[m][a] += s2[qi * (NR - 1) + r] / xn;
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
        for (int var = 1; p_.quant && var < NV; var++) {
            if (!pair_measured(var / NP, var % NP)) continue;
            const double* s2 = sq.data() + ((size_t)var * KV + g) * NQ;
            for (int64_t qi = 0; qi < NQ; qi++)
                acc_.rel_q[var / NP][var % NP][(size_t)layer * KV + g] +=
                    s2[qi] / std::max(1e-30, (double)xnorm_[rows[qi]]);
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
    for (auto& row : s.rel_q)
        for (auto& v : row)
            for (double& x : v) x /= n;
    return s;
}

}  // namespace zk

namespace zk {

std::vector<std::vector<int32_t>> calib_spread_windows(const std::vector<std::vector<int32_t>>& docs, int64_t body,
                                                       int64_t n_tokens, int64_t per_window) {
    ZK_ASSERT(body >= 1 && per_window >= 0);
    std::vector<std::vector<int32_t>> all;  // every window of every document
    for (const auto& d : docs)
        for (size_t at = 0; at < d.size(); at += (size_t)body)
            all.emplace_back(d.begin() + at, d.begin() + std::min(d.size(), at + (size_t)body));
    // Evenly spaced picks of `want` windows; each file's last window is short, so
    // as many more are picked as it takes for the picks to hold n_tokens (a
    // corpus of five files gave 31,840 of 32,768 tokens when counted as full).
    const int64_t cost = body + per_window, na = (int64_t)all.size();
    auto pick = [&](int64_t want, std::vector<std::vector<int32_t>>* out) {
        int64_t got = 0;
        for (int64_t i = 0; i < want; i++) {
            const std::vector<int32_t>& w = all[(size_t)(i * na / want)];
            got += (int64_t)w.size() + per_window;
            if (out) out->push_back(w);
        }
        return got;
    };
    int64_t want = std::max<int64_t>(1, (n_tokens + cost - 1) / cost);
    while (want < na && pick(want, nullptr) < n_tokens) want++;
    if (na <= want) return all;
    std::vector<std::vector<int32_t>> out;
    pick(want, &out);
    return out;
}

zack_sens_curves calib_sensitivity(const model& m, const zack_calibration& c,
                                   const std::vector<std::vector<int32_t>>& docs, const calib_params& p,
                                   const sens_params& sp) {
    sensitivity_observer obs(m, c, sp, p.n_ctx);
    // Windows spread over the whole corpus: the curves depend on the kind of text
    // (measured on SmolLM2-135M: curves from the first 2K tokens, a licence, gave
    // 30% less KL than sigma at rate 0.3 on held-out docs; curves from that text
    // itself, 70%), so the pass sees as many parts of the corpus as it can.
    const bool bos = m.voc->add_bos() && m.voc->bos() >= 0;
    const int64_t fed =
        calib_feed(m, calib_spread_windows(docs, p.n_ctx - (bos ? 1 : 0), p.n_tokens, bos ? 1 : 0), p, obs, "sensitivity");
    const zack_sensitivity r = obs.result();
    zack_sens_curves out;
    out.grid = r.ranks;
    for (int b = 0; b < k_key_basis_count; b++) out.k[b] = r.rel_k[b];
    out.v = r.rel_v;
    if (!r.rel_q[0][1].empty()) {
        const size_t nh = (size_t)r.n_layer * r.n_kv;
        out.qbits.assign(k_sens_prec, k_sens_prec + k_sens_n_prec);
        // [0][0]: exact, loss 0; NaN where not measured (a tail as values, with 16- or 8-bit values)
        out.q.assign((size_t)k_sens_n_prec * k_sens_n_prec * nh, std::nan(""));
        std::fill_n(out.q.begin(), nh, 0.0);
        for (int i = 0; i < k_sens_n_prec; i++)
            for (int j = 0; j < k_sens_n_prec; j++)
                if (!r.rel_q[i][j].empty()) std::copy(r.rel_q[i][j].begin(), r.rel_q[i][j].end(), out.q.begin() + (i * k_sens_n_prec + j) * nh);
    }
    out.metric = "rel: mean over measured queries of |dy|^2 / |x|^2 (dy: the residual-stream change of the head at "
                 "that rank, x: the layer's input)";
    out.queries = r.n_queries;
    out.tokens = fed;
    return out;
}

}  // namespace zk
