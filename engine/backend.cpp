#include "engine/backend.h"

#include "engine/backend_cpu.h"
#include "engine/backend_profile.h"
#include "ggml-like/error.h"
#ifdef ZACK_WITH_CUDA
#include "engine/backend_cuda.h"
#endif

namespace zk {

namespace {

backend_cuda_entry& cuda_entry() {
#ifdef ZACK_WITH_CUDA
    static backend_cuda_entry e{&backend_cuda_create, &backend_cuda_check, &backend_cuda_device_describe};
#else
    static backend_cuda_entry e;
#endif
    return e;
}

}  // namespace

void backend_cuda_install(const backend_cuda_entry& e) { cuda_entry() = e; }

std::string backend_cuda_describe() {
    if (!cuda_entry().create) return "not built (cmake -DZACK_CUDA=ON)";
    try {
        cuda_entry().check();
    } catch (const zk::error& e) {
        return std::string("built in; ") + e.what();
    }
    return "built in; device: " + (cuda_entry().describe ? cuda_entry().describe() : std::string("visible"));
}

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
    if (!cuda_entry().create)
        ZK_THROW("device cuda: this zack was built without CUDA (configure with cmake -DZACK_CUDA=ON)");
    cuda_entry().check();
}

std::unique_ptr<backend> backend_create(const backend_params& p) {
    if (p.n_threads < 1 || p.n_threads > 512)
        ZK_THROW("thread count must be between 1 and 512, got %d", p.n_threads);
    backend_check_device(p.device);
    std::unique_ptr<backend> b;
    if (p.device == backend_device::CUDA)
        b = cuda_entry().create(p);
    else
        b = std::make_unique<backend_cpu>(p.n_threads);
    return backend_profile_requested() ? backend_profile_wrap(std::move(b)) : std::move(b);
}

}  // namespace zk
