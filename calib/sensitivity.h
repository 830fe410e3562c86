// Measured sensitivity of every (layer, KV head, K|V) to its rank: how much the
// layer's output moves when that one head keeps only its first r dimensions.
//
// A session_observer on an uncompressed session of the source model. For a
// sample of query tokens (every `query_stride`-th position of each window) and
// every KV head g it recomputes the group's attention exactly as the engine
// would at each candidate rank r, with everything else exact:
//   K at rank r:  scores from the first r dims of the projected q~ and k~
//                 (q~ = A^T q, k~ = B^T k; A = B = R_qk for the post-RoPE PCA)
//   V at rank r:  values keep their first r rotated dims (v^ = R_v^T v)
// and maps the change of the group's attention outputs through the (V-folded)
// W_o columns it feeds, dy = sum_i W_o,i R_v (o^_i(r) - o^_i) [n_embd]: the
// perturbation the residual stream receives. Per (layer, head, kind, rank) it
// sums ||dy||^2 (abs) and ||dy||^2 / ||x||^2 (rel, x = the residual stream the
// layer's attention adds to, i.e. the perturbation relative to the signal that
// the next RMSNorm rescales).
//
// Layout of the curves: [n_layer x n_kv x n_ranks], ranks ascending, the last
// one = head_dim (loss 0 by construction).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "calib/calibrate.h"
#include "calib/keybasis.h"
#include "calib/zack_file.h"
#include "engine/model.h"
#include "engine/session.h"
#include "kernels/attention.h"

namespace zk {

class thread_pool;

struct sens_params {
    std::vector<int> ranks;  // candidate ranks, ascending, last = head_dim (empty: sens_default_ranks)
    int query_stride = 4;    // every query_stride-th position of a window is a measured query
    // measured queries of a chunk per block of the attention products, each block
    // over the keys its last query sees (smaller: fewer causal zeros, smaller GEMMs)
    int query_block = 16;
    // Quantized caches simulated at full rank (keys in the pca basis), as the
    // engine lays them out (engine/kv_cache.h): 8-bit every token; 4-bit and
    // 2-bit KIVI, keys per channel over groups of `group` tokens, keys and values
    // once they leave the newest `residual` tokens. The first `sinks` positions
    // stay exact. Every pair of (key, value) precisions in k_sens_prec is
    // measured (16 = exact), so plans can mix them per head.
    bool quant = true;
    int group = 32, residual = 128, sinks = 4;
    // The KIVI group the per-head key widths are chosen for (keybasis_wide_rows:
    // 32 or 64, the groups whose errors are measured): the plans' group, which
    // calibrate makes `group` too; tests simulate smaller groups with the widths of 32.
    int widths_group = 32;
    // Vector-coded values (engine/kv_vq.h), measured as value precisions 1 and
    // 0 (vq[code]) with 8-, 4- and 2-bit keys and the tails when set (the
    // calibration's books, calib_codebooks_view; not owned).
    const kv_vq_books* vq[KV_VQ_CODES] = {nullptr, nullptr};
    // The value codes that have books, bit `code` set for each (sens_pair_measured).
    unsigned vq_codes() const { return (vq[0] ? 1u : 0u) | (vq[1] ? 2u : 0u); }
};

// The precisions of the simulated caches: index 0 is exact (16), then the
// quantized layouts; 1 (keys only) stands for 2-bit keys whose last
// sens_tail(d) channels are a 1-bit tail (kernels/attention.h), measured with
// 4- and 2-bit values (sens_pair_measured): on Qwen2.5-Coder-1.5B the tail
// from channel 32 of 128 keeps 99.2% of perplexity where rank cuts of the same
// bytes do not (bench/RESULTS.md).
// 0 (keys only) is that tail with its last sens_zero(d) channels at 0 bits,
// each its group's mean: on Qwen2.5-Coder-1.5B such channels from 96 of 128
// cost less KL per byte than the plans' other steps at 14% of the f16 bytes.
// 9 and 10 (keys only) are per-head widths (calib/keybasis.h keybasis_key_widths):
// the directions in the quantization order, the first n4 in 4-bit codes, then
// n2 in 2-bit codes, a 1-bit tail of n1, the last n0 at 0 bits, for rows of
// 1.75 and 2.5 bits a channel (the bytes of the tail above; of 2-bit keys).
// 5 and 6 are the same without the 2-bit width: .zack files from before it
// measured those (plans still read them), zack calibrate no longer does.
// Measured only where the calibration has the proxy (zack_calibration::k_score).
// Why: in numpy on Qwen2.5-Coder-1.5B's keys, such rows lose 26% less
// attention output than the 2/1-bit tail at 28 bytes and 53% less than 2-bit
// keys at 40 (bench/RESULTS.md "key bits per channel"); end to end the plans
// gain less ("2-bit key channels").
constexpr int k_sens_n_prec = 8;
constexpr int k_sens_prec[k_sens_n_prec] = {16, 8, 4, 2, 1, 0, 9, 10};
constexpr int k_sens_tail_code = 1;  // = k_plan_tail_code (calib/plan.h)
constexpr int k_sens_zero_code = 0;  // = k_plan_zero_code
constexpr int k_sens_n_wide = k_key_n_wide;  // calib/keybasis.h k_key_wide_bits
constexpr int k_sens_wide_code[k_sens_n_wide] = {5, 6, 9, 10};  // not 8: the 8-bit precision
// The index of a widths code in k_sens_wide_code, or -1.
inline int sens_wide_index(int code) {
    for (int w = 0; w < k_sens_n_wide; w++)
        if (code == k_sens_wide_code[w]) return w;
    return -1;
}
// 3/4 of the channels, at most KV_KEY_TAIL_MAX (Gemma 3's 256: 128)
inline int sens_tail(int d) { return std::min(d - d / 4, KV_KEY_TAIL_MAX); }
// the last quarter of the channels (of the tail above)
inline int sens_zero(int d) { return std::min(d / 4, sens_tail(d)); }
inline bool sens_keys_only(int code) {
    return code == k_sens_tail_code || code == k_sens_zero_code || sens_wide_index(code) >= 0;
}
// Whether a side at this code keeps KIVI's window of exact newest tokens.
inline bool sens_windowed(int code) { return code <= 4 || sens_wide_index(code) >= 0; }
// The key layout a precision code stands for: bits of the codes, the 1-bit
// tail, the 0-bit channels and the 2-bit ones of 4-bit codes (as
// engine/kv_quant.h takes them).
struct sens_key_layout {
    int bits, tail, zero, mid;
};
// wide: the head's widths for a widths code (calib/keybasis.h).
inline sens_key_layout sens_key_layout_of(int code, int d, const key_widths* wide = nullptr) {
    if (code == k_sens_tail_code) return {2, sens_tail(d), 0, 0};
    if (code == k_sens_zero_code) return {2, sens_tail(d) - sens_zero(d), sens_zero(d), 0};
    if (sens_wide_index(code) >= 0) return {4, wide ? wide->n1 : 0, wide ? wide->n0 : 0, wide ? wide->n2 : 0};
    return {code, 0, 0, 0};
}
// Whether the pair (keys at k_sens_prec[i], values at [j]) is measured: every
// pair but (16, 16) of the others; a tail (with or without 0-bit channels) only
// as keys, with 4- or 2-bit values. Codes 1 and 0 as values are vector-coded
// values (engine/kv_vq.h), measured where that code has books (bit `code` of
// vq_codes, sens_params::vq_codes) against keys below 16 bits.
inline bool sens_pair_measured(int i, int j, unsigned vq_codes = 0) {
    if (i == 0 && j == 0) return false;
    if (kv_bits_vq(k_sens_prec[j]) && (vq_codes >> k_sens_prec[j] & 1u)) return i > 0;
    if (sens_keys_only(k_sens_prec[j])) return false;
    return !sens_keys_only(k_sens_prec[i]) || k_sens_prec[j] == 4 || k_sens_prec[j] == 2;
}

// A grid of about 16 ranks: multiples of max(align, d / 16), ending at d.
std::vector<int> sens_default_ranks(int d, int align);

struct zack_sensitivity {
    int n_layer = 0, n_kv = 0, d = 0;
    std::vector<int> ranks;                 // [n_r]
    // Keys per basis (calib/keybasis.h; empty: not measured), values:
    // [n_layer x n_kv x n_r] each: mean ||dy||^2 (abs) and ||dy||^2 / ||x||^2 (rel) per query.
    std::vector<double> abs_k[k_key_basis_count], rel_k[k_key_basis_count];
    std::vector<double> abs_v, rel_v;
    // Quantized caches at full rank, rel [n_layer x n_kv] per (key precision,
    // value precision) index into k_sens_prec; [0][0] (exact) and everything
    // when not measured: empty.
    std::vector<double> rel_q[k_sens_n_prec][k_sens_n_prec];
    int64_t n_queries = 0;                  // measured query tokens (per layer)
    int n_r() const { return (int)ranks.size(); }
    size_t at(int layer, int g, int ri) const { return ((size_t)layer * n_kv + g) * ranks.size() + ri; }
};

class sensitivity_observer : public calib_observer {
public:
    // c: the rotations (rqk, rv) of the calibration being measured. The model is
    // the source (unfolded) model the session runs.
    sensitivity_observer(const model& m, const zack_calibration& c, const sens_params& p, int64_t max_ctx);
    void on_layer_input(int layer, int64_t n, const float* x) override;
    void on_qkv(int layer, int64_t n, const int32_t* pos, const float* q, const float* k, const float* v) override;
    void set_pool(thread_pool* pool) override { pool_ = pool; }
    // Means over the measured queries.
    zack_sensitivity result() const;

private:
    void prepare_wo(int layer);
    void quantize_window(int layer, int64_t from, int64_t to);
    const model& m_;
    sens_params p_;
    int64_t max_ctx_;
    thread_pool* pool_ = nullptr;
    int L_, H_, KV_, G_, D_, E_;
    // Per basis and layer: window keys projected by B (k~); per layer values
    // rotated (v^); [max_ctx x n_kv x d] floats, filled as chunks arrive
    // (windows restart at position 0).
    std::vector<std::vector<float>> kt_[k_key_basis_count], vt_;
    // The same window as the quantized caches would return it, pca basis, per
    // quantized precision (k_sens_prec[1 + b]): [b][layer][max_ctx x n_kv x d]
    // (4/2-bit keys only for complete groups).
    std::vector<std::vector<float>> ktq_[k_sens_n_prec - 1], vtq_[k_sens_n_prec - 1];
    // The calibration's mean key in the pca basis [n_layer x n_kv x d] (empty
    // without one): quantized keys are coded less it, as a session caches them.
    std::vector<float> kmean_;
    // [L x KV x D] the quantization order of the pca directions (from zack_calibration::k_score):
    // tailed key layouts are measured in it, as sessions code them; empty = pca order
    std::vector<int32_t> korder_;
    // Where the calibration has the quantization pair (zack_calibration::kwa/kwb),
    // tailed layouts are coded in it instead: [L x KV x D x D] to_pair_ = B^T R
    // (pca rows into the pair's, row-major, z_j = sum_i to_pair_[j][i] y_i) and
    // from_pair_ = R^T A (back); empty = the order above.
    std::vector<float> to_pair_, from_pair_;
    // [k_sens_n_wide][L x KV] each head's widths for the widths codes (from
    // zack_calibration::widths_score); empty = those codes not measured
    key_wide_rows wides_;
    // sens_pair_measured, and a widths code only where the widths are known
    bool pair_measured(int i, int j) const {
        return sens_pair_measured(i, j, p_.vq_codes()) && (sens_wide_index(k_sens_prec[i]) < 0 || !wides_[0].empty());
    }
    std::vector<int64_t> n_win_;
    std::vector<float> xnorm_;        // ||x||^2 of the current chunk's rows [n]
    // on_qkv's per-chunk arrays (dK, dQ, the full-rank outputs), kept so that a
    // chunk allocates nothing: sized for the largest chunk so far
    std::vector<float> dk_, dq_, ofull_;
    // W~ = W_o with R_v folded into each query head's columns, transposed, for
    // the current layer: [n_head*d x n_embd] (raw_: W_o dequantized, [n_embd x n_head*d]).
    std::vector<float> wt_, raw_;
    int wo_layer_ = -1;
    // Per layer, once: M_g = W~_g^T W~_g per KV head, [n_kv x G*d x G*d] (W~_g: the
    // group's columns of W~). A chunk's key losses are dK M dK^T, and the layer
    // comes back every chunk (empty until its first).
    // (M_g is kept as its Cholesky factor R_g, upper triangular, where it has one:
    // mchol_ [n_layer x n_kv]; a group with more query dims than n_embd has none.)
    std::vector<std::vector<float>> mgram_;
    std::vector<char> mchol_;
    // Per basis: A (queries) and B (keys), and R_v; float [n_layer x n_kv x d x d].
    std::vector<int> bases_;  // the bases measured (those the calibration has)
    std::vector<float> a_[k_key_basis_count], b_[k_key_basis_count], rv_;
    zack_sensitivity acc_;
};

// The sensitivity pass of `zack calibrate`: feeds the documents (calib_feed,
// windows of p.n_ctx) to the uncompressed source model with c's rotations and
// returns the curves to store in the .zack (the rel metric: mean over measured
// queries of ||dy||^2 / ||x||^2, which predicts end-to-end KL better than
// ||dy||^2 itself; see bench/RESULTS.md). Keys are measured in every basis c has.
// Cuts the documents into windows of `body` tokens and keeps about n_tokens of
// them evenly spaced over the whole corpus (all of them when there are fewer),
// each window costing body + per_window tokens when fed (1: the BOS calib_feed
// puts before it; counted, or the feed's budget would cut the last, furthest window).
std::vector<std::vector<int32_t>> calib_spread_windows(const std::vector<std::vector<int32_t>>& docs, int64_t body,
                                                       int64_t n_tokens, int64_t per_window = 0);
zack_sens_curves calib_sensitivity(const model& m, const zack_calibration& c,
                                   const std::vector<std::vector<int32_t>>& docs, const calib_params& p,
                                   const sens_params& sp);

}  // namespace zk
