// The .zack file: a GGUF v3 file holding everything of the source model (keys
// and tensors, with W_v / W_o / b_v replaced by their V-rotated versions) plus
// the calibration results. Key and tensor names (models/README.md lists them,
// engine/model.cpp reads them):
//   zack.version u32 = 1                 zack.source.name str (source file name)
//   zack.source.sha256 str (hex)         zack.calib.tokens u64, zack.calib.ctx u32
//   zack.calib.corpus str (description)  zack.rank_align u32
//   zack.rank_table.rates f32[n_rates]
//   zack.rank_table.k / .v i32[n_rates x n_layer x n_kv] (row-major)
//   blk.N.zack.rqk     F32 GGUF shape [d, d, n_kv]: R[g][i][j], column j = direction j
//   blk.N.zack.rv      F32 [d, d, n_kv]: the V rotation already folded (for --compare)
//   blk.N.zack.sigma_k F32 [d, n_kv], descending;  blk.N.zack.sigma_v likewise
//   blk.N.zack.kqa / .kqb / .kpair  F32 [d, d, n_kv]: the score and pairs key
//                      bases (calib/keybasis.h), optional
//   blk.N.zack.kmean   F32 [d, n_kv]: the mean key after RoPE, optional (keys
//                      are cached less it: engine/session.h)
//   blk.N.zack.kscore  F32 [d, n_kv]: per pca direction the proxy that orders the
//                      directions of keys coded at unequal widths
//                      (calib/keybasis.h keybasis_quant_scores), optional
//   blk.N.zack.kwa / .kwb  F32 [d, d, n_kv], blk.N.zack.kwscore F32 [d, n_kv]:
//                      the pair such keys are coded in instead, and its proxy
//                      (calib/keybasis.h keybasis_quant_pair), optional
//   zack.sens.grid i32[n_grid]; zack.sens.k.pca / .k.score / .k.pairs, zack.sens.v
//     f32[n_layer x n_kv x n_grid]; zack.sens.metric str; zack.sens.queries,
//     zack.sens.tokens u64: the measured loss curves, optional;
//   zack.sens.qbits i32[n_p] (16, 8, 4, 2; 1, 0, 5, 6: calib/sensitivity.h), zack.sens.q f32[n_p x n_p x n_layer x n_kv]:
//     the loss of a cache at full rank with its keys at precision qbits[i] and
//     its values at qbits[j] (16: exact) (files from before per-head precision:
//     zack.sens.q8 / zack.sens.q4 f32[n_layer x n_kv], both sides at 8 / 4 bits)
//   zack.plans str[]: KV plans as JSON (calib/plan.h), optional
//   zack.vq.dim u32 (c), zack.vq.size u32 (K); blk.N.zack.vq F32 [c, K, d / c, n_kv]
//     (k-means centroids of the value rows at unit RMS) and blk.N.zack.vq_gain F32
//     [d, n_kv] (the gain per channel a decoded code takes): value codebooks for
//     vector-coded values at value precision 1 (engine/kv_vq.h), optional;
//     zack.vq0.* and blk.N.zack.vq0 / vq0_gain the same for value precision 0
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "calib/plan.h"
#include "engine/kv_vq.h"
#include "ggml-like/gguf.h"

namespace zk {

struct model;

// Measured loss curves (calib/sensitivity.h): per (layer, KV head) the loss of
// the keys in each key basis and of the values at each rank of the grid.
struct zack_sens_curves {
    std::vector<int> grid;                 // candidate ranks, ascending, last = d; empty = not measured
    std::vector<double> k[3], v;           // [n_layer x n_kv x n_grid]; k per key basis (pca, score, pairs)
    // Quantized caches at full rank (calib/sensitivity.h): the precisions (the
    // first 16) and [n_p x n_p x n_layer x n_kv] the loss with keys at qbits[i]
    // and values at qbits[j]; empty = not measured.
    std::vector<int> qbits;
    std::vector<double> q;
    std::string metric;                    // what the numbers are
    int64_t queries = 0, tokens = 0;       // measured query tokens, tokens fed
    double rank_weight = 1;                // plan_inputs::rank_weight (calib/rank_fit.h fits it)
    std::vector<double> layer_gain;        // plan_inputs::layer_gain [n_layer] (calib/layer_gain.h); empty = none
    int group = 32;                        // the KIVI group the losses were measured at (zack.sens.group)
};

// Rotations and singular values of every (layer, KV head).
struct zack_calibration {
    int n_layer = 0, n_kv = 0, d = 0;
    std::vector<double> rqk, rv;           // [n_layer x n_kv x d x d], R[i][j] column j = direction j
    // Alternative key bases (calib/keybasis.h), same layout; empty in files from
    // before they existed: kqa/kqb the score basis (A for queries, B for keys),
    // kpair the RoPE-pair selection (A = B = kpair).
    std::vector<double> kqa, kqb, kpair;
    std::vector<double> sigma_k, sigma_v;  // [n_layer x n_kv x d], descending
    // The mean key after RoPE [n_layer x n_kv x d]; empty in files from before it.
    // A session caches k - mean in the key basis: the shift q.mean is the same
    // for every key of a query, so attention is unchanged, while the cache no
    // longer holds a constant that dwarfs the rest (Qwen2.5-1.5B layer 0: -912
    // along the first pca direction, RMS 6 along the next; an 8-bit scale per
    // 32 channels cannot hold both).
    std::vector<double> k_mean;
    // Per pca direction the proxy that orders a head's directions when its key
    // row codes channels at unequal widths (calib/keybasis.h
    // keybasis_quant_scores; engine/session.h) [n_layer x n_kv x d]; empty in
    // files from before it.
    std::vector<double> k_score;
    // The pair keys coded at unequal widths take instead, where present
    // (calib/keybasis.h keybasis_quant_pair): kwa for queries, kwb for keys
    // [n_layer x n_kv x d x d], its proxy kw_score [n_layer x n_kv x d]
    // (descending a head); empty in files from before it, which code such keys
    // in the pca directions in k_score's order.
    std::vector<double> kwa, kwb, kw_score;
    // The proxy the widths of such rows are water-filled on: the pair's where
    // the calibration has one, else the pca directions'.
    const std::vector<double>& widths_score() const { return kw_score.empty() ? k_score : kw_score; }
    // Value codebooks (calib/codebook.h; engine/kv_vq.h) per value precision
    // code (vq[1]: 4 x 64, vq[0]: 8 x 256), empty when not trained: c channels a
    // code, K centroids, per head the k-means centroids [n_layer x n_kv x d / c x
    // K x c] and per-channel gains [n_layer x n_kv x d].
    struct vq_set {
        int c = 0, K = 0;
        std::vector<float> enc, gain;
    };
    vq_set vq[KV_VQ_CODES];
    int64_t n_tokens = 0;                  // calibration tokens
    int64_t n_ctx = 0;                     // window length of the statistics pass
    std::string corpus;                    // description of the corpus
    zack_sens_curves sens;                 // optional
};

struct zack_spectra;
// The singular values of a calibration as rank selection sees them.
zack_spectra zack_calibration_spectra(const zack_calibration& c);
// What plan prediction needs, from a calibration with sensitivity curves.
plan_inputs zack_calibration_plan_inputs(const zack_calibration& c);
// Whether the calibration has what the rank-weight fit needs (calib/rank_fit.h):
// curves and the loss of every precision pair, 2-bit among them.
bool zack_calibration_fits_rank_weight(const zack_calibration& c);

struct zack_write_params {
    int rank_align = 4;
    // Store folded W_v / W_o as F32 instead of fold_output_type (exact; for tests
    // and for measuring what re-quantization costs).
    bool folded_f32 = false;
    std::vector<float> table_rates = {0.0f, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f};
    // KV plans to record (zack.plans; their source_sha256 is filled in here).
    std::vector<kv_plan> plans;
    // The source file's sha256 when the caller has it (a calibration writes twice:
    // the rank-weight fit's file, then the output); "" = hashed here.
    std::string source_sha256;
};

// True when the file carries zack.version (a .zack, not a plain source GGUF).
bool zack_file_is_zack(const gguf_file& f);

// Writes OUT: all keys and tensors of `src` (the model loaded from src_path), the
// V rotation folded into W_v / b_v / W_o (re-quantized per fold_output_type), the
// zack.* keys and tensors above. Atomic (temporary file + rename).
void zack_file_write(const model& src, const zack_calibration& c, const zack_write_params& p,
                     const std::string& out_path);

// Reads the rotations and singular values back (R and sigma as stored, f32 -> f64);
// rv is left empty when the file has no blk.N.zack.rv. Throws for a non-.zack file.
zack_calibration zack_file_read_calibration(const gguf_file& f);


}  // namespace zk
