// The calibration pipeline behind `zack calibrate`: run the model over token
// documents, accumulate Gram matrices (calib/gram.h), eigen-decompose them into
// rotations and singular values (calib/eigen.h), and summarize the spectra.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "calib/gram.h"
#include "calib/zack_file.h"
#include "engine/model.h"

namespace zk {

struct calib_params {
    int64_t n_tokens = 16384;  // statistics budget (tokens fed, BOS included)
    int64_t n_ctx = 1024;      // window length: the session is reset between windows
    int n_threads = 2;
    bool progress = true;      // progress lines on stderr
};

// Feeds the documents (token ids without BOS) in windows of up to n_ctx tokens,
// each starting with BOS when the vocabulary adds one, until n_tokens tokens have
// been seen or the documents run out, to an uncompressed session observed by
// `obs` (which gets the session's pool while it runs). Returns the token count.
// `label` names the pass in the progress line.
int64_t calib_feed(const model& m, const std::vector<std::vector<int32_t>>& docs, const calib_params& p,
                   calib_observer& obs, const char* label);
// calib_feed into the Gram statistics.
int64_t calib_collect(const model& m, const std::vector<std::vector<int32_t>>& docs, const calib_params& p,
                      gram_accumulator& acc);

// Eigen-decomposes every head: R_qk, sigma_k from C_qk; R_v, sigma_v from
// C_v + the W_o Gram of the query heads of the group (gram_wo).
// sigma = sqrt(max(lambda, 0)).
zack_calibration calib_decompose(const model& m, const gram_accumulator& acc);

// Smallest number of leading dims whose singular values hold `mass` (e.g. 0.9)
// of the head's sum (no alignment).
int calib_dims_for_mass(const double* sigma, int d, double mass);

// Human-readable summary: per layer the dims for 90% / 99% of the sigma mass
// (K and V, per KV head), then the ranks and overall rate for a few eps values.
void calib_print_summary(FILE* out, const zack_calibration& c, int rank_align);

}  // namespace zk
