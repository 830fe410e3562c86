#include "calib/eigen.h"

#include <cmath>

#include "ggml-like/error.h"

// Debian's liblapack-dev ships no lapacke.h; the Fortran symbol is declared here.
extern "C" void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda,
                        double* w, double* work, const int* lwork, int* iwork, const int* liwork,
                        int* info);

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
