#include "calib/codebook.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "ggml-like/dtype.h"
#include "ggml-like/error.h"
#include "ggml-like/threadpool.h"
#include "kernels/attention.h"

namespace zk {

value_sampler::value_sampler(const model_hparams& hp, int64_t max_rows, int64_t stride)
    : KV_(hp.n_head_kv), D_(hp.head_dim), max_rows_(max_rows), stride_(std::max<int64_t>(1, stride)) {
    seen_.assign(hp.n_layer, 0);
    rows_.resize(hp.n_layer);
}

int64_t value_sampler::n_rows(int il) const { return (int64_t)(rows_[il].size() / ((size_t)KV_ * D_)); }

void value_sampler::on_qkv(int layer, int64_t n, const int32_t*, const float*, const float*, const float* v) {
    const size_t row = (size_t)KV_ * D_;
    std::vector<float>& r = rows_[layer];
    for (int64_t t = 0; t < n; t++, seen_[layer]++) {
        if (seen_[layer] % stride_ || (int64_t)(r.size() / row) >= max_rows_) continue;
        r.insert(r.end(), v + t * row, v + (t + 1) * row);
    }
}

void calib_observer_tee::on_layer_input(int layer, int64_t n, const float* x) {
    a_.on_layer_input(layer, n, x);
    b_.on_layer_input(layer, n, x);
}
void calib_observer_tee::on_qkv(int layer, int64_t n, const int32_t* pos, const float* q, const float* k,
                                const float* v) {
    a_.on_qkv(layer, n, pos, q, k, v);
    b_.on_qkv(layer, n, pos, q, k, v);
}
void calib_observer_tee::on_attn(int layer, int64_t n, const float* attn) {
    a_.on_attn(layer, n, attn);
    b_.on_attn(layer, n, attn);
}
void calib_observer_tee::set_pool(thread_pool* pool) {
    a_.set_pool(pool);
    b_.set_pool(pool);
}

namespace {

// Lloyd's k-means on X [n x c] into cb [K x c]: K distinct rows to start, an
// empty cell restarts on a random row. The assignment step, n x K x c, is the
// cost (8 x 256 books: 4x that of 4 x 64); it is the encoder's own nearest-
// centroid search (kvq_vq_nearest), so training assigns rows as coding will.
void kmeans(const float* X, int64_t n, int c, int K, int iters, std::mt19937_64& rng, float* cb) {
    std::uniform_int_distribution<int64_t> pick(0, n - 1);
    for (int k = 0; k < K; k++) std::copy_n(X + pick(rng) * c, c, cb + k * c);
    std::vector<int> idx((size_t)n);
    std::vector<double> sum((size_t)K * c);
    std::vector<int64_t> cnt(K);
    for (int it = 0; it < iters; it++) {
        for (int64_t t = 0; t < n; t++) idx[t] = kvq_vq_nearest(X + t * c, cb, K, c);
        std::fill(sum.begin(), sum.end(), 0.0);
        std::fill(cnt.begin(), cnt.end(), 0);
        for (int64_t t = 0; t < n; t++) {
            cnt[idx[t]]++;
            for (int j = 0; j < c; j++) sum[(size_t)idx[t] * c + j] += X[t * c + j];
        }
        for (int k = 0; k < K; k++) {
            if (cnt[k] == 0) {
                std::copy_n(X + pick(rng) * c, c, cb + k * c);
                continue;
            }
            for (int j = 0; j < c; j++) cb[k * c + j] = (float)(sum[(size_t)k * c + j] / cnt[k]);
        }
    }
}

}  // namespace

void calib_vq_roundtrip(const kv_vq_books& b, const kv_vq_book& h, const float* x, float* y) {
    std::vector<uint8_t> codes((size_t)kv_vq_row_bytes(b.d / b.c, b.bits()) + KV_VQ_PAD);
    uint16_t scale = 0;
    kvq_vq_encode_row(b, h, x, b.d, codes.data(), &scale);
    const kv_vq_book enc_only{h.enc, h.enc};
    kvq_vq_decode_row(b, enc_only, codes.data(), scale, b.d, y);
}

vq_train_params vq_train_params_for(int code) {
    ZK_ASSERT(code >= 0 && code < KV_VQ_CODES);
    vq_train_params p;
    p.c = k_vq_dim[code], p.K = k_vq_size[code];
    return p;
}

vq_train_report calib_train_codebooks(zack_calibration& c, int code, const value_sampler& s,
                                      const vq_train_params& p, thread_pool* pool) {
    const int L = c.n_layer, KV = c.n_kv, D = c.d, C = p.c, K = p.K, NG = D / C;
    kvq_vq_check(C, K, D);
    if ((int64_t)c.rv.size() != (int64_t)L * KV * D * D) ZK_THROW("value codebooks: the calibration has no V rotation");
    // row t of n is held out when t % H == H - 1 (n / H rows), unless that leaves fewer than the 4K
    // training rows k-means needs
    auto holds_out = [&](int64_t n) { return p.holdout > 1 && n - n / p.holdout >= 4 * K; };
    auto held = [&](int64_t n, int64_t t) { return holds_out(n) && t % p.holdout == p.holdout - 1; };
    auto n_train = [&](int64_t n) { return holds_out(n) ? n - n / p.holdout : n; };
    for (int il = 0; il < L; il++)
        if (n_train(s.n_rows(il)) < 4 * K)
            ZK_THROW("value codebooks: layer %d has %lld sampled value rows for training; %d centroids need at "
                     "least %d", il, (long long)n_train(s.n_rows(il)), K, 4 * K);
    zack_calibration::vq_set& v = c.vq[code];
    v.c = C, v.K = K;
    const size_t per_head = (size_t)D * K;
    v.enc.assign((size_t)L * KV * per_head, 0.0f);
    v.gain.assign((size_t)L * KV * D, 1.0f);
    const int64_t nh = (int64_t)L * KV;
    std::vector<double> err_train((size_t)nh, 0.0), err_held((size_t)nh, -1.0);
    auto head = [&](int64_t h) {
        const int il = (int)(h / KV), g = (int)(h % KV);
        const int64_t n = s.n_rows(il), nt = n_train(n);
        const float* raw = s.rows(il).data();
        const double* R = c.rv.data() + (size_t)h * D * D;  // column j = direction j
        // rotated rows y = R^T v [n x D]; the training ones at unit RMS, grouped [NG x nt x C]
        std::vector<float> Y((size_t)n * D), Xg((size_t)nt * D);
        std::vector<double> acc(D);
        for (int64_t t = 0, i = 0; t < n; t++) {
            const float* v = raw + ((size_t)t * KV + g) * D;
            float* y = Y.data() + (size_t)t * D;
            // y_j = sum_r R[r][j] v_r, r in order; the loop over j runs along R's rows
            for (int j = 0; j < D; j++) acc[j] = 0;
            for (int r = 0; r < D; r++) {
                const double vr = v[r];
                const double* Rr = R + (size_t)r * D;
                for (int j = 0; j < D; j++) acc[j] += Rr[j] * vr;
            }
            for (int j = 0; j < D; j++) y[j] = (float)acc[j];
            if (held(n, t)) continue;
            double ss = 0;
            for (int j = 0; j < D; j++) ss += (double)y[j] * y[j];
            const float sc = fp16_to_fp32(fp32_to_fp16((float)std::sqrt(ss / D)));
            const float inv = sc > 0 ? 1.0f / sc : 0.0f;
            for (int q = 0; q < NG; q++)
                for (int j = 0; j < C; j++) Xg[((size_t)q * nt + i) * C + j] = y[q * C + j] * inv;
            i++;
        }
        std::mt19937_64 rng(p.seed + (uint64_t)h * 7919);
        float* enc = v.enc.data() + (size_t)h * per_head;
        for (int q = 0; q < NG; q++)
            kmeans(Xg.data() + (size_t)q * nt * C, nt, C, K, p.iters, rng, enc + (size_t)q * K * C);
        // the gain per channel: sum x^2 / sum x_hat x over the training rows
        kv_vq_books b;
        b.c = C, b.K = K, b.d = D;
        const kv_vq_book bk{enc, enc};
        std::vector<double> xx(D, 0.0), yx(D, 0.0);
        std::vector<float> yh((size_t)n * D);
        for (int64_t t = 0; t < n; t++) {
            const float* y = Y.data() + (size_t)t * D;
            calib_vq_roundtrip(b, bk, y, yh.data() + (size_t)t * D);
            if (held(n, t)) continue;
            for (int j = 0; j < D; j++) xx[j] += (double)y[j] * y[j], yx[j] += (double)yh[(size_t)t * D + j] * y[j];
        }
        float* gain = v.gain.data() + (size_t)h * D;
        for (int j = 0; j < D; j++) gain[j] = yx[j] > 0 ? (float)std::clamp(xx[j] / yx[j], 0.25, 4.0) : 1.0f;
        // the row error of the decoded rows (with the gain), apart for the rows k-means saw
        double e[2] = {0, 0}, x2[2] = {0, 0};
        for (int64_t t = 0; t < n; t++) {
            const int k = held(n, t);
            for (int j = 0; j < D; j++) {
                const double y = Y[(size_t)t * D + j], d = y - (double)yh[(size_t)t * D + j] * gain[j];
                e[k] += d * d, x2[k] += y * y;
            }
        }
        err_train[(size_t)h] = x2[0] > 0 ? e[0] / x2[0] : 0.0;
        if (nt < n) err_held[(size_t)h] = x2[1] > 0 ? e[1] / x2[1] : 0.0;
    };
    pool_parallel_for(pool, nh, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t h = b; h < e; h++) head(h);
    });
    vq_train_report rep;
    rep.train_rows = n_train(s.n_rows(0));
    rep.heldout_rows = s.n_rows(0) - rep.train_rows;
    for (int64_t h = 0; h < nh; h++) rep.train_err += err_train[(size_t)h] / (double)nh;
    if (rep.heldout_rows > 0) {
        rep.heldout_err = 0;
        for (int64_t h = 0; h < nh; h++) rep.heldout_err += err_held[(size_t)h] / (double)nh;
    }
    return rep;
}

kv_vq_books calib_codebooks_view(const zack_calibration& c, int code, std::vector<float>& dec) {
    kv_vq_books b;
    const zack_calibration::vq_set& v = c.vq[code];
    if (v.enc.empty()) return b;
    const int L = c.n_layer, KV = c.n_kv, D = c.d;
    b.c = v.c, b.K = v.K, b.d = D;
    const size_t per_head = (size_t)D * b.K;
    ZK_ASSERT(v.enc.size() == (size_t)L * KV * per_head && v.gain.size() == (size_t)L * KV * D);
    dec.resize(v.enc.size());
    for (size_t h = 0; h < (size_t)L * KV; h++) {
        const float* e = v.enc.data() + h * per_head;
        float* d = dec.data() + h * per_head;
        kvq_vq_decoding_book(b.c, b.K, D, e, v.gain.data() + h * D, d);
        b.heads.push_back(kv_vq_book{e, d});
    }
    return b;
}

}  // namespace zk
