// Stability of a calibration: how far apart the rotations of two .zack files of
// the same model are (e.g. calibrated on different corpora or token counts).
//
// Eigenvectors are defined only up to sign, and up to any rotation inside a
// group of (nearly) equal eigenvalues, so R itself is not compared. What the
// engine uses is the rank-r subspace: the projector P = R[:, :r] R[:, :r]^T.
// Per head the distance is ||P_a - P_b||_F / sqrt(2 r), in [0, 1]: 0 for the
// same subspace, 1 for orthogonal ones (it is the RMS sine of the principal
// angles). r is the head's rank in file A at the chosen overall rate.
#pragma once
#include <cstdio>
#include <vector>

#include "calib/zack_file.h"

namespace zk {

// R_a, R_b: [d x d] row-major, column j = direction j.
double compare_projector_distance(const double* ra, const double* rb, int d, int r);

struct compare_layer {
    double dk = 0, dv = 0;  // projector distance, mean over KV heads (dv < 0: no rv in a file)
    double sk = 0, sv = 0;  // spectrum shape difference: L1 distance of sigma / sum(sigma), mean over heads
};

struct compare_result {
    double rate = 0;
    int rank_align = 4;
    std::vector<compare_layer> layers;
    double mean_dk = 0, max_dk = 0, mean_dv = 0, max_dv = 0;
    bool has_v = true;
};

// Throws zk::error when the two calibrations are for different shapes.
compare_result compare_calibrations(const zack_calibration& a, const zack_calibration& b, double rate, int align);
void compare_print(FILE* out, const compare_result& r, const char* name_a, const char* name_b);

}  // namespace zk
