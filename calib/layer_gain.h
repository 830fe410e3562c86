// Per-layer corrections of a KV plan's predicted losses, measured end to end.
//
// The sensitivity pass (calib/sensitivity.h) prices each head by the relative
// error of its layer's attention output, and plans add those prices up. The
// price of a whole layer can be off by a large factor: on Qwen2.5-Coder-1.5B
// (plan at 9.9% of the f16 bytes, held-out Node.js docs at 2K) making one layer
// exact removed between 0.16x and 7.8x the loss the plan predicted for it, and
// layers 7, 13 and 19 were under-priced 6-8x (bench/RESULTS.md, 2026-12-03
// "what a layer costs"). So the calibration measures it: for a plan at the
// target, the KL to the full cache on held-out windows (calib/plan_kl.h), and
// for each layer l the KL of the same plan with layer l exact. The KL layer l
// removes, over the loss the plan predicts for it, relative to the same ratio
// over the whole plan (the losses' unit is not nats: on SmolLM2 a layer's
// predicted loss is about 1/100 of the KL it removes, on the 1.5B about 1/1),
// is its gain, clipped to [lo, hi]; plans then count every loss of layer l
// gain[l] times (plan_inputs::weigh_layers). One window's figures are noisy
// (on the 1.5B two windows' per-layer figures correlated at 0.02; on SmolLM2
// most layers' removals are noise around zero, and taking them at face value
// made held-out plans worse, KL 0.19 -> 0.32), so a layer keeps gain 1 unless
// what it removes differs from its price by more than z standard errors of
// the mean of the paired per-position differences. A plan whose layers remove
// no KL in sum gets gains of 1.
//
// Cost: besides the full cache's pass and the plan's, one pass per layer, each
// from that layer's inputs in the plan's pass (session::decode_from), so layer
// l runs n_layer - l layers: about n_layer / 2 full passes. On the 1.5B (28
// layers) two 2048-token windows took 20 minutes on 2 threads, against 6 for
// the rest of `zack calibrate`. Memory: the plan's layer inputs of one window
// (window x n_embd x n_layer floats, 0.35 GB there) and the full cache's
// log-probabilities at the scored positions (n_vocab floats each, 1.2 GB).
#pragma once
#include <cstdint>
#include <vector>

#include "calib/plan.h"
#include "engine/session.h"

namespace zk {

struct model;
class kl_windows;

// Keeps the residual stream entering every layer of a pass, x[l] [rows x
// n_embd] in the order the rows arrive: what session::decode_from(l, ...)
// takes to run the same rows from layer l on.
struct calib_layer_inputs : session_observer {
    std::vector<std::vector<float>> x;
    int64_t n_embd;
    calib_layer_inputs(int n_layer, int64_t e) : x((size_t)n_layer), n_embd(e) {}
    void clear() {
        for (auto& v : x) v.clear();
    }
    void on_layer_input(int layer, int64_t n, const float* in) override {
        x[(size_t)layer].insert(x[(size_t)layer].end(), in, in + n * n_embd);
    }
    void on_qkv(int, int64_t, const int32_t*, const float*, const float*, const float*) override {}
};

struct layer_gain_params {
    int64_t n_tokens = 6144;  // tokens, in windows of n_ctx (calib/plan_kl.h)
    int64_t n_ctx = 3072;
    int64_t n_score = 768;    // positions scored at the end of each window
    double target = 0.10;     // the plan measured (fraction of the f16 cache)
    double lo = 0.25, hi = 8;  // gains are clipped to [lo, hi]
    double z = 2;             // a gain moves off 1 where the removal is this many standard errors off its price
    int n_threads = 2;
    bool progress = true;     // a line per layer on stderr
};

struct layer_gains {
    kv_plan plan;                    // the plan measured (from the inputs without gains)
    double kl = 0;                   // its mean KL
    std::vector<double> predicted;   // [n_layer] the loss the plan predicts for each layer's heads
    std::vector<double> removed;     // [n_layer] the KL making layer l exact removes (may be negative)
    std::vector<double> removed_se;  // [n_layer] its standard error (paired per-position differences)
    double scale = 0;                // the removed KL over the predicted loss, summed over the layers
    std::vector<double> gain;        // [n_layer] removed / (predicted x scale), clipped; 1 where nothing
                                     // is predicted or scale <= 0
    int64_t tokens = 0;              // positions scored per plan
    int moved() const {              // layers whose gain is not 1
        int n = 0;
        for (double g : gain) n += g != 1.0;
        return n;
    }
    int64_t window_tokens = 0;       // tokens a full pass runs
};

// zm: the .zack model (host memory: the passes decode from stored layer
// inputs); in: its plan inputs without gains (the fitted rank weight set);
// docs: token documents, windows taken from their end. Throws zk::error when
// the target has no plan or the documents have no window.
layer_gains calib_measure_layer_gains(const model& zm, const plan_inputs& in,
                                      const std::vector<std::vector<int32_t>>& docs, const layer_gain_params& p);
// The same on windows already run with the full cache (their baseline kept):
// p's n_tokens, n_ctx and n_score are kw's, not read here.
layer_gains calib_measure_layer_gains(const model& zm, const plan_inputs& in, const kl_windows& kw,
                                      const layer_gain_params& p);

}  // namespace zk
