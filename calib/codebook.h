// Value codebooks for vector-coded values (engine/kv_vq.h, KV_LAYOUT_VQ):
// k-means on the value rows of the calibration text, per (layer, KV head) and
// group of c channels, in the V rotation's basis (the basis the .zack's folded
// W_v writes the cache in).
//
// Rows are coded at unit RMS (the cache stores each token's RMS as its f16
// scale). A decoded row is pulled towards its cell's centre (at 4 channels x
// 64 centroids on Qwen2.5-Coder-1.5B it keeps about 0.81 of its length along
// itself), every token alike, so attention's value sums shrink too; a gain per
// channel, sum x^2 / sum x_hat x over the training rows, undoes that on average
// and costs nothing at run time (it scales the decoding centroids). Without it
// the codes lost to the 2-bit grid in KL despite 2.4x less row error; with it
// they halve its KL (bench/RESULTS.md "vector codes").
#pragma once
#include <cstdint>
#include <vector>

#include "calib/gram.h"
#include "calib/zack_file.h"
#include "engine/kv_vq.h"
#include "engine/model.h"

namespace zk {

// What calibrate trains, per value precision code (engine/kv_vq.h): for code
// 1, c = 4 channels a code and K = 64 centroids (1.5 bits an element, 1.625 with
// the scale at 128 channels); for code 0, 8 x 256 (1 bit, 1.125 with the scale).
// Plans count a value side at these precisions in these bytes (calib/plan.h).
constexpr int k_vq_dim[KV_VQ_CODES] = {8, 4};
constexpr int k_vq_size[KV_VQ_CODES] = {256, 64};

struct vq_train_params {
    int c = k_vq_dim[1], K = k_vq_size[1];
    int iters = 12;             // Lloyd iterations
    int64_t max_rows = 12288;   // training rows a head (sampled evenly over the statistics pass)
    int holdout = 8;            // every holdout-th sampled row is kept out of training and measures the books
                                // (0 = none; none either where that would leave fewer than 4K training rows)
    uint64_t seed = 1;
};

// How well a set of books codes rows: the mean over heads of the relative row
// error sum |y - y_hat|^2 / sum |y|^2 (decoded with the gain, at the row's f16
// scale), on the rows k-means saw and on the held-out ones. A held-out error
// well above the training one means the books have learnt their rows, not the
// source: more rows a centroid (--tokens, --value-codes) is the remedy.
struct vq_train_report {
    int64_t train_rows = 0, heldout_rows = 0;  // a head (layer 0's)
    double train_err = 0, heldout_err = -1;    // -1: nothing held out
};

// Keeps value rows of the statistics pass: every `stride`-th token a layer
// sees, up to max_rows, as the source model computes them ([KV x d] a token).
class value_sampler : public calib_observer {
public:
    value_sampler(const model_hparams& hp, int64_t max_rows, int64_t stride);
    void on_qkv(int layer, int64_t n, const int32_t* pos, const float* q, const float* k, const float* v) override;
    void set_pool(thread_pool*) override {}
    // rows of layer il: [n_rows(il) x KV x d]
    const std::vector<float>& rows(int il) const { return rows_[il]; }
    int64_t n_rows(int il) const;

private:
    int KV_, D_;
    int64_t max_rows_, stride_;
    std::vector<int64_t> seen_;
    std::vector<std::vector<float>> rows_;
};

// Both observers see every event (the statistics pass feeds the Gram statistics
// and the value sampler at once).
class calib_observer_tee : public calib_observer {
public:
    calib_observer_tee(calib_observer& a, calib_observer& b) : a_(a), b_(b) {}
    void on_layer_input(int layer, int64_t n, const float* x) override;
    void on_qkv(int layer, int64_t n, const int32_t* pos, const float* q, const float* k, const float* v) override;
    void on_attn(int layer, int64_t n, const float* attn) override;
    void set_pool(thread_pool* pool) override;

private:
    calib_observer &a_, &b_;
};

// The training parameters of value code `code`'s books (c and K above).
vq_train_params vq_train_params_for(int code);

// Trains every head's book on the sampled rows, rotated by c.rv, and stores
// them in c.vq[code]. pool (optional) spreads the heads.
vq_train_report calib_train_codebooks(zack_calibration& c, int code, const value_sampler& s,
                                      const vq_train_params& p, thread_pool* pool = nullptr);

// The books of value code `code` of a calibration as a cache reads them (no
// heads when it has none): dec receives the decoding centroids (enc x gain) the
// returned books point into, as do c's vectors.
kv_vq_books calib_codebooks_view(const zack_calibration& c, int code, std::vector<float>& dec);

// One row's unit-RMS k-means codes (the encoder engine/kv_vq.h uses), decoded
// without the gain: the training's x_hat. For tests and the gain.
void calib_vq_roundtrip(const kv_vq_books& b, const kv_vq_book& h, const float* x, float* y);

}  // namespace zk
