#include "calib/eigen.h"

#include <cmath>

#include "ggml-like/error.h"

// Debian's liblapack-dev ships no lapacke.h; the Fortran symbol is declared here.
extern "C" void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda,
                        double* w, double* work, const int* lwork, int* iwork, const int* liwork,
                        int* info);

extern "C" void dgesvd_(const char* jobu, const char* jobvt, const int* m, const int* n, double* a, const int* lda,
                        double* s, double* u, const int* ldu, double* vt, const int* ldvt, double* work,
                        const int* lwork, int* info);

extern "C" void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info);

namespace zk {

void eigen_sym_desc(int n, const double* C, std::vector<double>& vals, std::vector<double>& vecs) {
    ZK_ASSERT(n > 0);
    for (int64_t i = 0; i < (int64_t)n * n; i++)
        if (!std::isfinite(C[i])) ZK_THROW("eigen-decomposition: the %dx%d matrix has a non-finite entry", n, n);
    // LAPACK is column-major: the row-major upper triangle is its lower triangle ('L').
    std::vector<double> a(C, C + (size_t)n * n);
    std::vector<double> w(n);
    const char jobz = 'V', uplo = 'L';
    int lwork = -1, liwork = -1, info = 0;
    double wq = 0;
    int iwq = 0;
    dsyevd_(&jobz, &uplo, &n, a.data(), &n, w.data(), &wq, &lwork, &iwq, &liwork, &info);
    if (info != 0) ZK_THROW("eigen-decomposition: dsyevd workspace query failed (info %d)", info);
    lwork = (int)wq;
    liwork = iwq;
    std::vector<double> work(lwork);
    std::vector<int> iwork(liwork);
    dsyevd_(&jobz, &uplo, &n, a.data(), &n, w.data(), work.data(), &lwork, iwork.data(), &liwork, &info);
    if (info != 0) ZK_THROW("eigen-decomposition of a %dx%d matrix failed (dsyevd info %d)", n, n, info);

    // dsyevd: ascending eigenvalues, column j of `a` (a[j*n + i]) is eigenvector j.
    vals.assign(n, 0);
    vecs.assign((size_t)n * n, 0);
    for (int j = 0; j < n; j++) {
        const int src = n - 1 - j;
        const double* col = a.data() + (size_t)src * n;
        int imax = 0;
        for (int i = 1; i < n; i++)
            if (std::fabs(col[i]) > std::fabs(col[imax])) imax = i;
        const double s = col[imax] < 0 ? -1.0 : 1.0;
        vals[j] = w[src];
        for (int i = 0; i < n; i++) vecs[(size_t)i * n + j] = s * col[i];
    }
}

}  // namespace zk

namespace zk {

void svd_square_desc(int n, const double* W, std::vector<double>& U, std::vector<double>& S, std::vector<double>& V) {
    ZK_ASSERT(n > 0);
    for (int64_t i = 0; i < (int64_t)n * n; i++)
        if (!std::isfinite(W[i])) ZK_THROW("SVD: the %dx%d matrix has a non-finite entry", n, n);
    // Column-major LAPACK sees the row-major W as W^T = V S U^T: its "U" is our V
    // and its "V^T" is our U^T, both returned column-major.
    std::vector<double> a(W, W + (size_t)n * n), u((size_t)n * n), vt((size_t)n * n);
    S.assign(n, 0);
    const char job = 'A';
    int lwork = -1, info = 0;
    double wq = 0;
    dgesvd_(&job, &job, &n, &n, a.data(), &n, S.data(), u.data(), &n, vt.data(), &n, &wq, &lwork, &info);
    if (info != 0) ZK_THROW("SVD: dgesvd workspace query failed (info %d)", info);
    lwork = (int)wq;
    std::vector<double> work(lwork);
    dgesvd_(&job, &job, &n, &n, a.data(), &n, S.data(), u.data(), &n, vt.data(), &n, work.data(), &lwork, &info);
    if (info != 0) ZK_THROW("SVD of a %dx%d matrix failed (dgesvd info %d)", n, n, info);
    // W^T = u diag(S) vt (column-major) => W = vt^T diag(S) u^T: our U[i][j] = vt(j, i) col-major = vt[i*n + j],
    // our V[i][j] = u(i, j) col-major = u[j*n + i].
    U.assign((size_t)n * n, 0);
    V.assign((size_t)n * n, 0);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            U[(size_t)i * n + j] = vt[(size_t)i * n + j];
            V[(size_t)i * n + j] = u[(size_t)j * n + i];
        }
}

bool cholesky_upper(int n, const double* A, std::vector<double>& R) {
    ZK_ASSERT(n > 0);
    // Row-major A read as column-major is A^T = A; the factor of its lower
    // triangle, L (A = L L^T, column-major), is R = L^T read row-major.
    R.assign(A, A + (size_t)n * n);
    const char uplo = 'L';
    int info = 0;
    dpotrf_(&uplo, &n, R.data(), &n, &info);
    if (info != 0) return false;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) R[(size_t)i * n + j] = 0.0;  // below the diagonal: A's, untouched
    return true;
}

}  // namespace zk
