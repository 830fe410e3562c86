#include "kernels/cuda/gemm.h"

#include "ggml-like/error.h"
#include "kernels/cuda/cuda_common.cuh"

#include <vector>

#if !defined(ZK_SIMT)
#include <cublas_v2.h>
#endif

namespace zk {
namespace cuda {

#if defined(ZK_SIMT)

namespace {
// rows [0, n) of a row-major [n, k] matrix as f32 (exact for f16)
std::vector<float> load_rows(cuda_gemm_type t, const void* p, int64_t n, int64_t k) {
    std::vector<float> out((size_t)(n * k));
    for (size_t i = 0; i < out.size(); i++)
        out[i] = t == CUDA_GEMM_F32 ? ((const float*)p)[i] : simt::f16_to_f32(((const uint16_t*)p)[i]);
    return out;
}
void check_buffer(const void* p, size_t bytes, const char* what) {
    const simt::buffer* b = simt::buffer_find(p);
    if (!b) ZK_THROW("cuda_gemm: %s is not in a device buffer", what);
    simt::check_global(b, p, bytes, 1, __FILE__, __LINE__);
}
}  // namespace

// The harness's stand-in for cuBLAS: the same contract on the host.
void cuda_gemm(const cuda_gemm_args& a, cuda_stream) {
    if (a.M == 0 || a.N == 0) return;
    const size_t es = a.type == CUDA_GEMM_F32 ? 4 : 2;
    check_buffer(a.X, (size_t)(a.M * a.K) * es, "X");
    check_buffer(a.W, (size_t)(a.N * a.K) * es, "W");
    check_buffer(a.Y, (size_t)(a.M * a.N) * 4, "Y");
    const std::vector<float> x = load_rows(a.type, a.X, a.M, a.K), w = load_rows(a.type, a.W, a.N, a.K);
    for (int64_t m = 0; m < a.M; m++)
        for (int64_t n = 0; n < a.N; n++) {
            const float* xr = x.data() + m * a.K;
            const float* wr = w.data() + n * a.K;
            double s = 0;
            for (int64_t k = 0; k < a.K; k++) s += (double)xr[k] * wr[k];
            a.Y[m * a.N + n] = (float)s;
        }
}

#else

namespace {

const char* cublas_name(cublasStatus_t s) {
    switch (s) {
        case CUBLAS_STATUS_SUCCESS: return "success";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
        case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
        case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
        default: return "error";
    }
}

#define ZK_CUBLAS_CHECK(call)                                                                              \
    do {                                                                                                   \
        const cublasStatus_t st_ = (call);                                                                 \
        if (st_ != CUBLAS_STATUS_SUCCESS) ZK_THROW("cuBLAS %s in %s (%s:%d)", cublas_name(st_), #call, __FILE__, __LINE__); \
    } while (0)

struct cublas_handle {
    cublasHandle_t h = nullptr;
    cublas_handle() { ZK_CUBLAS_CHECK(cublasCreate(&h)); }
    ~cublas_handle() { cublasDestroy(h); }
};

}  // namespace

// Row-major Y = X W^T is column-major Y^T = W X^T: with W (row-major N x K)
// read as the column-major K x N matrix it is, op(A) = T; X likewise, op(B) = N.
void cuda_gemm(const cuda_gemm_args& a, cuda_stream stream) {
    if (a.M == 0 || a.N == 0) return;
    thread_local cublas_handle handle;
    ZK_CUBLAS_CHECK(cublasSetStream(handle.h, (cudaStream_t)stream));
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType_t t = a.type == CUDA_GEMM_F32 ? CUDA_R_32F : CUDA_R_16F;
    // f32 stays f32 (no TF32): the reference path; f16 takes the tensor cores
    const cublasComputeType_t ct = CUBLAS_COMPUTE_32F;
    ZK_CUBLAS_CHECK(cublasGemmEx(handle.h, CUBLAS_OP_T, CUBLAS_OP_N, (int)a.N, (int)a.M, (int)a.K, &one, a.W, t,
                                 (int)a.K, a.X, t, (int)a.K, &zero, a.Y, CUDA_R_32F, (int)a.N, ct,
                                 CUBLAS_GEMM_DEFAULT));
}

#endif

}  // namespace cuda
}  // namespace zk
