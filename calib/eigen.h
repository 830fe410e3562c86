// Symmetric eigen-decomposition through LAPACK dsyevd (divide and conquer), the
// step that turns a calibration Gram matrix into a rotation and singular values.
#pragma once
#include <vector>

namespace zk {

// C: [n x n] symmetric, row-major (only the upper triangle C[i][j], j >= i, is
// read). Returns eigenvalues in `vals` [n] in DESCENDING order and the matching
// unit eigenvectors as the columns of `vecs` [n x n] row-major: vecs[i*n + j] is
// component i of direction j, so C = vecs diag(vals) vecs^T.
// Sign convention (so that two runs and two corpora are comparable): each
// eigenvector's largest-magnitude component is positive.
// Throws zk::error if LAPACK reports failure (e.g. NaN input).
void eigen_sym_desc(int n, const double* C, std::vector<double>& vals, std::vector<double>& vecs);

// W: [n x n] row-major. W = U diag(S) V^T with S descending (>= 0) and U, V
// orthogonal [n x n] row-major (column j = singular direction j). LAPACK dgesvd.
void svd_square_desc(int n, const double* W, std::vector<double>& U, std::vector<double>& S, std::vector<double>& V);

// A: [n x n] symmetric, row-major. R [n x n] row-major upper triangular (zeros
// below the diagonal) with A = R^T R, through LAPACK dpotrf. Returns false,
// leaving R unspecified, when A is not numerically positive definite (a
// Gram matrix of fewer vectors than n, for one).
bool cholesky_upper(int n, const double* A, std::vector<double>& R);

}  // namespace zk
