// The sensitivity observer (calib/sensitivity.h) against a plain double
// re-implementation of its definition on a synthetic layer: random q, k, v,
// rotations, key bases and W_o, fed in two chunks of one window. Tolerance:
// 1e-3 relative (the observer works in float with BLAS). Value codebooks are
// random books of 2 channels x 8 centroids: vector-coded values (precision 1).
// Run alone and on a pool of two threads with queries in blocks of one, with
// the same results.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "calib/eigen.h"
#include "calib/keybasis.h"
#include "calib/sensitivity.h"
#include "engine/kv_quant.h"
#include "ggml-like/error.h"
#include "ggml-like/threadpool.h"
#include "kernels/attention.h"

namespace {

using vec = std::vector<double>;

vec random_orthogonal(int n, std::mt19937& rng) {
    std::normal_distribution<double> g(0.0, 1.0);
    vec m((size_t)n * n);
    for (double& x : m) x = g(rng);
    vec U, S, V;
    zk::svd_square_desc(n, m.data(), U, S, V);
    return U;
}

vec random_spd(int n, std::mt19937& rng) {
    std::normal_distribution<double> g(0.0, 1.0);
    vec m((size_t)n * n), c((size_t)n * n, 0.0);
    for (double& x : m) x = g(rng);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            for (int k = 0; k < n; k++) c[i * n + j] += m[i * n + k] * m[j * n + k];
    return c;
}

// E, the model width: below G*D = 16 the group's W~ has fewer rows than
// columns and M_g = W~_g^T W~_g is singular; from 16 it has a Cholesky factor,
// which the observer then uses.
void matches_definition(int E) {
    const int L = 1, H = 4, KV = 2, G = 2, D = 8, N = 12, stride = 3;
    std::mt19937 rng(17);
    std::normal_distribution<double> g(0.0, 1.0);
    std::vector<float> wo((size_t)E * H * D), q((size_t)N * H * D), k((size_t)N * KV * D), v((size_t)N * KV * D),
        x((size_t)N * E);
    for (auto* a : {&wo, &q, &k, &v, &x})
        for (float& f : *a) f = (float)g(rng);
    zk::model m;
    m.hp.n_layer = L, m.hp.n_head = H, m.hp.n_head_kv = KV, m.hp.head_dim = D, m.hp.n_embd = E;
    zk::layer_weights lw{};
    lw.wo = zk::weight_view{zk::dtype::F32, E, (int64_t)H * D, wo.data()};
    m.layers.push_back(lw);
    zk::zack_calibration c;
    c.n_layer = L, c.n_kv = KV, c.d = D;
    zk::rope_params rp;
    rp.n_dims = D;
    rp.style = zk::rope_style::NEOX;
    for (int h = 0; h < KV; h++) {
        const vec r1 = random_orthogonal(D, rng), r2 = random_orthogonal(D, rng);
        c.rqk.insert(c.rqk.end(), r1.begin(), r1.end());
        c.rv.insert(c.rv.end(), r2.begin(), r2.end());
        const vec cq = random_spd(D, rng), ck = random_spd(D, rng);
        vec A, B, sv, P, e;
        zk::keybasis_score(D, cq.data(), ck.data(), A, B, sv);
        zk::keybasis_pairs(D, rp, cq.data(), ck.data(), P, e);
        c.kqa.insert(c.kqa.end(), A.begin(), A.end());
        c.kqb.insert(c.kqb.end(), B.begin(), B.end());
        c.kpair.insert(c.kpair.end(), P.begin(), P.end());
        for (int j = 0; j < D; j++) c.k_score.push_back(std::exp(2.0 * g(rng)));  // the quantization proxy, spread
    }
    // its order and the per-head widths, as the observer derives them
    const std::vector<float> score32(c.k_score.begin(), c.k_score.end());
    std::vector<std::vector<int32_t>> order(KV);
    for (int h = 0; h < KV; h++) zk::zack_key_order(D, score32.data() + (size_t)h * D, order[h]);
    const zk::key_wide_rows wide = zk::keybasis_wide_rows(D, KV, score32.data());
    int n4 = 0, n2 = 0, n1 = 0, n0 = 0;  // rows of every width among them: the case worth measuring
    for (int w = 0; w < zk::k_sens_n_wide; w++)
        for (int h = 0; h < KV; h++) {
            const zk::key_widths& kw = wide[w][h];
            ASSERT_EQ(kw.n4 + kw.n2 + kw.n1 + kw.n0, D);
            n4 += kw.n4, n2 += kw.n2, n1 += kw.n1, n0 += kw.n0;
        }
    ASSERT_TRUE(n4 > 0 && n2 > 0 && n1 > 0 && n0 > 0) << n4 << " " << n2 << " " << n1 << " " << n0;
    zk::sens_params sp;
    sp.ranks = {2, 4, 6, 8};
    sp.query_stride = stride;
    sp.group = 2, sp.residual = 4, sp.sinks = 1;  // small enough that the window has every kind of slot
    // value codebooks (random, gains 1..1.5) for vector-coded values: value code 1
    // with 2 channels a code and 8 centroids, code 0 with 4 and 16
    struct rand_books {
        std::vector<float> enc, gain, dec;
        zk::kv_vq_books b;
    } rb[zk::KV_VQ_CODES];
    for (int code = 0; code < zk::KV_VQ_CODES; code++) {
        const int cc = code ? 2 : 4, K = code ? 8 : 16;
        rand_books& r = rb[code];
        r.enc.resize((size_t)KV * D * K), r.gain.resize((size_t)KV * D), r.dec.resize(r.enc.size());
        for (float& f : r.enc) f = (float)g(rng);
        for (size_t i = 0; i < r.gain.size(); i++) r.gain[i] = 1.0f + 0.5f * (float)((i + code) % 7) / 7;
        r.b.c = cc, r.b.K = K, r.b.d = D;
        for (int h = 0; h < KV; h++) {
            zk::kvq_vq_decoding_book(cc, K, D, r.enc.data() + (size_t)h * D * K, r.gain.data() + (size_t)h * D,
                                     r.dec.data() + (size_t)h * D * K);
            r.b.heads.push_back(zk::kv_vq_book{r.enc.data() + (size_t)h * D * K, r.dec.data() + (size_t)h * D * K});
        }
        sp.vq[code] = &r.b;
    }
    std::vector<int32_t> pos(N);
    for (int t = 0; t < N; t++) pos[t] = t;
    auto measure = [&](zk::thread_pool* pool, int query_block) {
        zk::sens_params sq = sp;
        sq.query_block = query_block;
        zk::sensitivity_observer obs(m, c, sq, N);
        obs.set_pool(pool);
        for (int c0 : {0, 6}) {  // one window in two chunks
            obs.on_layer_input(0, 6, x.data() + (size_t)c0 * E);
            obs.on_qkv(0, 6, pos.data() + c0, q.data() + (size_t)c0 * H * D, k.data() + (size_t)c0 * KV * D,
                       v.data() + (size_t)c0 * KV * D);
        }
        return obs.result();
    };
    const zk::zack_sensitivity got = measure(nullptr, 16);
    ASSERT_EQ(got.n_queries, N / stride);
    {
        // Jobs split over a pool's two threads, and every measured query a block of
        // its own (a chunk's two queries see 3 and 6 keys, or 9 and 12): the same
        // sums to float rounding.
        zk::thread_pool pool(2);
        const zk::zack_sensitivity par = measure(&pool, 1);
        auto same = [](const std::vector<double>& a, const std::vector<double>& b, const char* what) {
            ASSERT_EQ(a.size(), b.size()) << what;
            for (size_t i = 0; i < a.size(); i++) EXPECT_NEAR(a[i], b[i], 1e-5 * std::fabs(a[i])) << what << " " << i;
        };
        for (int b = 0; b < zk::k_key_basis_count; b++) same(got.rel_k[b], par.rel_k[b], "rel_k");
        same(got.rel_v, par.rel_v, "rel_v");
        for (int i = 0; i < zk::k_sens_n_prec; i++)
            for (int j = 0; j < zk::k_sens_n_prec; j++) same(got.rel_q[i][j], par.rel_q[i][j], "rel_q");
    }

    // The definition, in double.
    const int NR = 4;
    const double scale = 1.0 / std::sqrt((double)D);
    const std::vector<double>* bases[3][2] = {{&c.rqk, &c.rqk}, {&c.kqa, &c.kqb}, {&c.kpair, &c.kpair}};
    auto proj = [&](const std::vector<double>& R, int g2, const float* a, vec& out) {  // out = R_g^T a
        out.assign(D, 0.0);
        for (int j = 0; j < D; j++)
            for (int i = 0; i < D; i++) out[j] += R[((size_t)g2 * D + i) * D + j] * a[i];
    };
    auto dy_norm = [&](int g2, const std::vector<vec>& dOhat) {  // ||sum_i W_o,i R_v dO^_i||^2
        double s = 0;
        for (int e = 0; e < E; e++) {
            double y = 0;
            for (int i = 0; i < G; i++) {
                const int h = g2 * G + i;
                for (int j = 0; j < D; j++) {
                    double w = 0;  // (W_o,h R_v)[e][j]
                    for (int a = 0; a < D; a++) w += wo[(size_t)e * H * D + h * D + a] * c.rv[((size_t)g2 * D + a) * D + j];
                    y += w * dOhat[i][j];
                }
            }
            s += y * y;
        }
        return s;
    };
    for (int b = 0; b < 3; b++)
        for (int g2 = 0; g2 < KV; g2++)
            for (int ri = 0; ri < NR; ri++) {
                double want_k = 0, want_v = 0;
                for (int t = stride - 1; t < N; t += stride) {
                    double xn = 0;
                    for (int e = 0; e < E; e++) xn += (double)x[(size_t)t * E + e] * x[(size_t)t * E + e];
                    std::vector<vec> dk(G), dv(G);
                    for (int i = 0; i < G; i++) {
                        vec qt, kt, vh;
                        proj(*bases[b][0], g2, q.data() + ((size_t)t * H + g2 * G + i) * D, qt);
                        vec o_r(D, 0.0), o_f(D, 0.0);
                        for (int pass = 0; pass < 2; pass++) {
                            const int r = pass ? D : sp.ranks[ri];
                            std::vector<double> s(t + 1);
                            double mx = -1e300, z = 0;
                            for (int s2 = 0; s2 <= t; s2++) {
                                proj(*bases[b][1], g2, k.data() + ((size_t)s2 * KV + g2) * D, kt);
                                double d = 0;
                                for (int j = 0; j < r; j++) d += qt[j] * kt[j];
                                s[s2] = d * scale;
                                mx = std::max(mx, s[s2]);
                            }
                            for (int s2 = 0; s2 <= t; s2++) z += s[s2] = std::exp(s[s2] - mx);
                            vec& o = pass ? o_f : o_r;
                            for (int s2 = 0; s2 <= t; s2++) {
                                proj(c.rv, g2, v.data() + ((size_t)s2 * KV + g2) * D, vh);
                                for (int j = 0; j < D; j++) o[j] += s[s2] / z * vh[j];
                            }
                        }
                        dk[i].resize(D), dv[i].assign(D, 0.0);
                        for (int j = 0; j < D; j++) dk[i][j] = o_r[j] - o_f[j];
                        for (int j = sp.ranks[ri]; j < D; j++) dv[i][j] = -o_f[j];
                    }
                    want_k += dy_norm(g2, dk) / xn;
                    want_v += dy_norm(g2, dv) / xn;
                }
                want_k /= got.n_queries;
                want_v /= got.n_queries;
                const size_t a = got.at(0, g2, ri);
                EXPECT_NEAR(got.rel_k[b][a], want_k, 1e-3 * want_k + 1e-9) << "basis " << b << " head " << g2 << " rank " << sp.ranks[ri];
                if (b == 0) {
                    EXPECT_NEAR(got.rel_v[a], want_v, 1e-3 * want_v + 1e-9) << "head " << g2 << " rank " << sp.ranks[ri];
                }
            }

    // Quantized caches: every key and value as the 8/4/2-bit cache returns it
    // (pca basis), exact for the sinks and the 4/2-bit residual window; every
    // pair of key and value precisions (16 = exact), and 2-bit keys with a 1-bit
    // tail (and with that tail ending in 0-bit channels) and the per-head widths
    // (4-bit keys, 2-bit channels, a tail, 0-bit channels) against 4- and 2-bit values, those
    // keys' directions in the quantization order.
    const int NP = zk::k_sens_n_prec;
    for (int g2 = 0; g2 < KV; g2++) {
        // the window's rotated rows [N x D] and their quantized copies per precision
        std::vector<float> kr((size_t)N * D), vr((size_t)N * D);
        std::vector<std::vector<float>> kq(NP, kr), vq(NP, vr);
        for (int t = 0; t < N; t++) {
            vec kt, vh;
            proj(c.rqk, g2, k.data() + ((size_t)t * KV + g2) * D, kt);
            proj(c.rv, g2, v.data() + ((size_t)t * KV + g2) * D, vh);
            for (int j = 0; j < D; j++) kr[t * D + j] = (float)kt[j], vr[t * D + j] = (float)vh[j];
        }
        for (int p = 1; p < NP; p++) {
            const int bits = zk::k_sens_prec[p];
            std::vector<int8_t> c8(D);
            std::vector<uint8_t> cq(64);
            std::vector<uint16_t> s1(D), s2(D);
            for (int t = 0; t < N; t++) {
                if (zk::kv_bits_vq(bits)) {  // as values: vector codes against that code's books, per token
                    const zk::kv_vq_books& books = rb[bits].b;
                    uint16_t sc = 0;
                    zk::kvq_vq_encode_row(books, books.heads[g2], &vr[t * D], D, cq.data(), &sc);
                    zk::kvq_vq_decode_row(books, books.heads[g2], cq.data(), sc, D, &vq[p][t * D]);
                }
                if (zk::sens_keys_only(bits)) continue;  // keys only, below
                if (bits == 8) {
                    zk::kvq_quantize_q8_row(&kr[t * D], D, c8.data(), s1.data());
                    zk::kvq_dequantize_q8_row(c8.data(), s1.data(), D, &kq[p][t * D]);
                    zk::kvq_quantize_q8_row(&vr[t * D], D, c8.data(), s1.data());
                    zk::kvq_dequantize_q8_row(c8.data(), s1.data(), D, &vq[p][t * D]);
                } else {
                    zk::kvq_quantize_vrow(bits, &vr[t * D], D, cq.data(), s1.data(), s2.data());
                    zk::kvq_dequantize_vrow(bits, cq.data(), s1.data(), s2.data(), D, &vq[p][t * D]);
                }
            }
            if (bits != 8)
                for (int t0 = 0; t0 + sp.group <= N; t0 += sp.group) {
                    // 2-bit keys whose last sens_tail(D) channels are 1-bit, for the tail code;
                    // the last sens_zero(D) of those at 0 bits instead, for the zero code
                    // the widths codes: 4-bit keys with the head's 2-bit, 1-bit and 0-bit channels
                    const bool keys_only = zk::sens_keys_only(bits);
                    const int wi = zk::sens_wide_index(bits);
                    const int kb = wi >= 0 ? 4 : keys_only ? 2 : bits;
                    const int zero = wi >= 0 ? wide[wi][g2].n0 : bits == zk::k_sens_zero_code ? zk::sens_zero(D) : 0;
                    const int tail = wi >= 0 ? wide[wi][g2].n1 : keys_only ? zk::sens_tail(D) - zero : 0;
                    // unequal widths: the rows' directions in the quantization order, and back
                    const int mid = wi >= 0 ? wide[wi][g2].n2 : 0;
                    const bool perm = tail > 0 || zero > 0 || mid > 0;
                    std::vector<float> grp((size_t)sp.group * D), back((size_t)sp.group * D);
                    for (int t = 0; t < sp.group; t++)
                        for (int j = 0; j < D; j++)
                            grp[(size_t)t * D + j] = kr[(size_t)(t0 + t) * D + (perm ? order[g2][j] : j)];
                    zk::kvq_quantize_keys(kb, grp.data(), sp.group, D, cq.data(), s1.data(), s2.data(), nullptr, tail,
                                          zero, mid);
                    zk::kvq_dequantize_keys(kb, cq.data(), s1.data(), s2.data(), sp.group, D, back.data(), tail, zero,
                                            mid);
                    for (int t = 0; t < sp.group; t++)
                        for (int j = 0; j < D; j++)
                            kq[p][(size_t)(t0 + t) * D + (perm ? order[g2][j] : j)] = back[(size_t)t * D + j];
                    if (keys_only) continue;
                    // a completed group's values: coded against the group's steps
                    zk::kvq_quantize_values(bits, &vr[t0 * D], sp.group, D, cq.data(), s1.data(), s2.data());
                    zk::kvq_dequantize_values(bits, cq.data(), s1.data(), s2.data(), sp.group, D, &vq[p][t0 * D]);
                }
        }
        for (int pk = 0; pk < NP; pk++)
            for (int pv = 0; pv < NP; pv++) {
                if (!zk::sens_pair_measured(pk, pv, 3u)) {  // (16, 16); a tail with 16/8-bit values; 16-bit
                                                              // keys with vector-coded values
                    EXPECT_TRUE(got.rel_q[pk][pv].empty()) << pk << " " << pv;
                    continue;
                }
                // the slots a side at precision p returns quantized: [sinks, lim); a head
                // with a KIVI side keeps its newest tokens exact on both sides
                const bool windowed = zk::sens_windowed(zk::k_sens_prec[pk]) || zk::sens_windowed(zk::k_sens_prec[pv]);
                auto lim = [&](int p, int nk) {
                    if (p == 0) return 0;
                    if (!windowed) return nk;
                    return nk >= sp.residual ? ((nk - sp.residual) / sp.group + 1) * sp.group : 0;
                };
                double want = 0;
                for (int t = stride - 1; t < N; t += stride) {
                    double xn = 0;
                    for (int e = 0; e < E; e++) xn += (double)x[(size_t)t * E + e] * x[(size_t)t * E + e];
                    const int nk = t + 1, klim = lim(pk, nk), vlim = lim(pv, nk);
                    std::vector<vec> dq(G);
                    for (int i = 0; i < G; i++) {
                        vec qt;
                        proj(c.rqk, g2, q.data() + ((size_t)t * H + g2 * G + i) * D, qt);
                        vec o[2] = {vec(D, 0.0), vec(D, 0.0)};
                        for (int pass = 0; pass < 2; pass++) {  // 0 exact, 1 quantized
                            std::vector<double> sc(nk);
                            double mx = -1e300, z = 0;
                            for (int s3 = 0; s3 < nk; s3++) {
                                const bool qz = pass && s3 >= sp.sinks && s3 < klim;
                                const float* kk = qz ? &kq[pk][s3 * D] : &kr[s3 * D];
                                double d = 0;
                                for (int j = 0; j < D; j++) d += qt[j] * kk[j];
                                sc[s3] = d * scale;
                                mx = std::max(mx, sc[s3]);
                            }
                            for (int s3 = 0; s3 < nk; s3++) z += sc[s3] = std::exp(sc[s3] - mx);
                            for (int s3 = 0; s3 < nk; s3++) {
                                const bool qz = pass && s3 >= sp.sinks && s3 < vlim;
                                const float* vv = qz ? &vq[pv][s3 * D] : &vr[s3 * D];
                                for (int j = 0; j < D; j++) o[pass][j] += sc[s3] / z * vv[j];
                            }
                        }
                        dq[i].resize(D);
                        for (int j = 0; j < D; j++) dq[i][j] = o[1][j] - o[0][j];
                    }
                    want += dy_norm(g2, dq) / xn;
                }
                want /= got.n_queries;
                EXPECT_NEAR(got.rel_q[pk][pv][g2], want, 2e-3 * want + 1e-9)
                    << "keys " << zk::k_sens_prec[pk] << "-bit, values " << zk::k_sens_prec[pv] << "-bit, head " << g2;
                EXPECT_GT(want, 0.0);
            }
    }
}

TEST(Sensitivity, MatchesDefinition) { matches_definition(12); }
TEST(Sensitivity, MatchesDefinitionWithCholesky) { matches_definition(20); }

TEST(Sensitivity, BadInput) {
    zk::model m;
    m.hp.n_layer = 1, m.hp.n_head = 2, m.hp.n_head_kv = 1, m.hp.head_dim = 4, m.hp.n_embd = 4;
    zk::zack_calibration c;
    c.n_layer = 2, c.n_kv = 1, c.d = 4;  // wrong layer count
    zk::sens_params sp;
    EXPECT_THROW(zk::sensitivity_observer(m, c, sp, 16), zk::error);
    c.n_layer = 1;
    c.rqk.assign(16, 0.0), c.rv.assign(16, 0.0);
    sp.ranks = {2, 3};  // does not end at the head dim
    EXPECT_THROW(zk::sensitivity_observer(m, c, sp, 16), zk::error);
    sp.ranks = {2, 2, 4};
    EXPECT_THROW(zk::sensitivity_observer(m, c, sp, 16), zk::error);
}

TEST(Sensitivity, SpreadWindows) {
    std::vector<std::vector<int32_t>> docs = {std::vector<int32_t>(100, 1), std::vector<int32_t>(50, 2)};
    auto w = zk::calib_spread_windows(docs, 10, 40);  // 15 windows, keep 4 spread out
    ASSERT_EQ(w.size(), 4u);
    EXPECT_EQ(w[0][0], 1);
    EXPECT_EQ(w.back()[0], 2);
    EXPECT_EQ(zk::calib_spread_windows(docs, 10, 1000).size(), 15u);
    // windows that cost a BOS each: 40 tokens are 4 windows of 11, the last one still in doc 2
    w = zk::calib_spread_windows(docs, 10, 40, 1);
    ASSERT_EQ(w.size(), 4u);  // ceil(40 / 11)
    EXPECT_EQ(w.back()[0], 2);
    // each file's last window is short (100 = 30 + 30 + 30 + 10, 50 = 30 + 20): the picks hold
    // the tokens asked for all the same, and still reach the last file
    for (int64_t n : {60, 90, 120, 150}) {
        w = zk::calib_spread_windows(docs, 30, n);
        int64_t got = 0;
        for (const auto& x : w) got += (int64_t)x.size();
        EXPECT_GE(got, n) << n;
        EXPECT_EQ(w.back()[0], 2) << n;
        EXPECT_LT(w.size(), 6u + (n >= 150)) << n;  // all 6 windows only when they are all needed
    }
}

}  // namespace
