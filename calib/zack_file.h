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
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ggml-like/gguf.h"

namespace zk {

struct model;

// Rotations and singular values of every (layer, KV head).
struct zack_calibration {
    int n_layer = 0, n_kv = 0, d = 0;
    std::vector<double> rqk, rv;           // [n_layer x n_kv x d x d], R[i][j] column j = direction j
    // Alternative key bases (calib/keybasis.h), same layout; empty in files from
    // before they existed: kqa/kqb the score basis (A for queries, B for keys),
    // kpair the RoPE-pair selection (A = B = kpair).
    std::vector<double> kqa, kqb, kpair;
    std::vector<double> sigma_k, sigma_v;  // [n_layer x n_kv x d], descending
    int64_t n_tokens = 0;                  // calibration tokens
    int64_t n_ctx = 0;                     // window length of the statistics pass
    std::string corpus;                    // description of the corpus
};

struct zack_spectra;
// The singular values of a calibration as rank selection sees them.
zack_spectra zack_calibration_spectra(const zack_calibration& c);

struct zack_write_params {
    int rank_align = 4;
    // Store folded W_v / W_o as F32 instead of fold_output_type (exact; for tests
    // and for measuring what re-quantization costs).
    bool folded_f32 = false;
    std::vector<float> table_rates = {0.0f, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f};
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

// Throws zk::error early (before a long calibration) when PATH's directory is
// missing or not writable, or PATH is a directory.
void zack_file_check_writable(const std::string& path);

}  // namespace zk
