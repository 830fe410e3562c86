// The bases a key head can be compressed in. Each gives a pair of [d x d]
// matrices A (for queries) and B (for keys), column j = direction j, with
// A B^T = I, so that at rank r the score q . k is approximated by
// (A[:, :r]^T q) . (B[:, :r]^T k) and is exact at r = d; the cache keeps the
// r-dim k~ = B[:, :r]^T k, the query is projected with A online.
//
//   pca    A = B = R_qk, the eigenvectors of C_q + C_k (post-RoPE, the paper's):
//          keeps the directions with the most q and k energy.
//   score  minimises the expected score error E (q^T (I - A_r B_r^T) k)^2 for
//          independent q and k: with C_q = L_q L_q^T, C_k = L_k L_k^T and
//          L_q^T L_k = X S Y^T (SVD), A = L_q^-T X S^1/2, B = L_k^-T Y S^1/2.
//          A direction with much key energy but none of the queries' (which
//          cannot change a score) is dropped first.
//   pairs  whole RoPE frequency pairs, in order of their expected score
//          energy per channel tr(C_q,f C_k,f) / |f|: a selection, which commutes with RoPE (it
//          could be folded into W_q / W_k; the engine gathers the channels).
#pragma once
#include <string>
#include <vector>

#include "kernels/rope.h"

namespace zk {

enum class key_basis : int { PCA = 0, SCORE = 1, PAIRS = 2 };
constexpr int k_key_basis_count = 3;
const char* key_basis_name(key_basis b);
key_basis key_basis_from_name(const std::string& s);  // throws on an unknown name

// Cq, Ck: [d x d] symmetric (row-major). A, B: [d x d]; sv: [d] the singular
// values of L_q^T L_k (the score energy of each direction), descending.
void keybasis_score(int d, const double* Cq, const double* Ck, std::vector<double>& A, std::vector<double>& B,
                    std::vector<double>& sv);
// The selection matrix P [d x d] (A = B = P; column j is a unit vector) and the
// energy of each kept direction [d]. Dims past rope.n_dims (not rotated) count
// as single channels.
void keybasis_pairs(int d, const rope_params& rope, const double* Cq, const double* Ck, std::vector<double>& P,
                    std::vector<double>& energy);

}  // namespace zk
