#include "engine/backend.h"

#include "engine/backend_cpu.h"
#include "ggml-like/error.h"

namespace zk {

backend_device backend_device_parse(const std::string& s) {
    if (s == "cpu") return backend_device::CPU;
    if (s == "cuda") return backend_device::CUDA;
    ZK_THROW("unknown device '%s' (cpu, cuda)", s.c_str());
}

const char* backend_device_name(backend_device d) { return d == backend_device::CUDA ? "cuda" : "cpu"; }

// The one file that reads the build's backend define.
bool backend_cuda_built() {
#ifdef ZACK_WITH_CUDA
    return true;
#else
    return false;
#endif
}

void backend_check_device(backend_device d) {
    if (d == backend_device::CPU) return;
    if (!backend_cuda_built())
        ZK_THROW("device cuda: this zack was built without CUDA (configure with cmake -DZACK_CUDA=ON)");
    // The CUDA kernels (kernels/cuda/) are built and tested on their own; the
    // forward pass that drives them through this interface is issue #18's.
    ZK_THROW("device cuda: the CUDA forward pass is not available yet; use device cpu");
}

std::unique_ptr<backend> backend_create(const backend_params& p) {
    if (p.n_threads < 1 || p.n_threads > 512)
        ZK_THROW("thread count must be between 1 and 512, got %d", p.n_threads);
    backend_check_device(p.device);
    return std::make_unique<backend_cpu>(p.n_threads);
}

}  // namespace zk
