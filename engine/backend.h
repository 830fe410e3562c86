// The compute backend of a forward pass: every operation the pass runs on
// activations (weight matmuls, norms, RoPE, the gated activation, the q/k
// projection of compressed heads, KV append and attention) goes through this
// interface, and the backend is chosen in one place, backend_create(), when a
// session (or a batch_decoder) is made. engine/session.cpp and
// engine/arch_block.cpp call only this interface; the kernels behind it are
// declared in kernels/<op>.h with a CPU reference and, where built, a CUDA twin.
//
//   CPU   engine/backend_cpu.{h,cpp} (dense ops on a thread pool) and
//         engine/backend_cpu_attn.cpp (attention scheduling: flash-decoding
//         slot ranges, tiled prefill, exact sinks, eviction observation)
//   CUDA  engine/backend_cuda.{h,cpp} (dense ops over the kernels of
//         kernels/cuda/) and engine/backend_cuda_kv.cpp (the device mirror of
//         the KV cache, attention plans); built into zack with -DZACK_CUDA=ON,
//         and into the SIMT harness tests (tests/simt) without a GPU.
//
// Buffers: a pass's activations live in forward_buffers (engine/forward_buffers.h),
// which the backend makes (buffers_create) and owns the layout of; on the CPU
// they are host arrays, read directly by observers and eviction.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/arch.h"
#include "engine/kv_cache.h"
#include "engine/forward_buffers.h"
#include "ggml-like/threadpool.h"
#include "kernels/matmul.h"
#include "kernels/rope.h"

namespace zk {

enum class backend_device { CPU, CUDA };

// "cpu" or "cuda"; throws naming the accepted values.
backend_device backend_device_parse(const std::string& s);
const char* backend_device_name(backend_device d);
// Whether this build has the CUDA kernels (cmake -DZACK_CUDA=ON).
bool backend_cuda_built();

struct backend_params {
    backend_device device = backend_device::CPU;
    int n_threads = 2;
};

class backend {
public:
    virtual ~backend() = default;
    virtual backend_device device() const = 0;
    // The threads host-side work may use (calibration statistics, eviction).
    virtual thread_pool& host_pool() = 0;
    // Returns when every op issued so far has finished (CPU: they have; CUDA:
    // waits for the stream). Only the profile (engine/backend_profile.h) needs it.
    virtual void sync() {}

    // Throws zk::error (one line, ending "; use device cpu") when this backend
    // cannot run a cache of these parameters; a session then falls back to the
    // CPU where its parameters allow it, as for the buffers below.
    virtual void cache_check(const kv_cache_params& p) const { (void)p; }
    // Buffers for passes over up to n_rows rows of up to max_seqs sequences
    // (forward_buffers' constructor says what the other arguments size).
    virtual std::unique_ptr<forward_buffers> buffers_create(const model_hparams& hp, int64_t n_rows, int max_seqs,
                                                            int n_threads, int64_t cap, int gear_rank,
                                                            bool observe) = 0;

    // ---- dense ops; shapes row-major, n_tok rows
    // x [n x n_embd] <- the rows of `tokens` of the embedding table, times `scale`
    virtual void embed(const weight_view& table, const int32_t* tokens, int64_t n, float scale, float* x) = 0;
    // Y [n_tok x n_rows] = X [n_tok x n_cols] W^T (kernels/matmul.h)
    virtual void matmul(const weight_view& w, const float* x, int64_t n_tok, float* y, forward_buffers& fb) = 0;
    virtual void matmul_multi(const weight_view* ws, float* const* ys, int n_w, const float* x, int64_t n_tok,
                              forward_buffers& fb) = 0;
    // y = rmsnorm(x) * w over rows of n (x, y may alias)
    virtual void rmsnorm(const float* x, const float* w, float* y, int64_t n_tok, int64_t n, float eps) = 0;
    // y[t] += b for each of n_tok rows of n
    virtual void add_bias(float* y, const float* b, int64_t n_tok, int64_t n) = 0;
    // x += y over n elements
    virtual void add(float* x, const float* y, int64_t n) = 0;
    virtual void rope_table(const rope_params& p, const int32_t* pos, int64_t n_tok, float* cs) = 0;
    virtual void rope_apply(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, const rope_params& p,
                            const float* cs) = 0;
    // g [n_tok x F] <- act(g) * u (SwiGLU or GeGLU by the architecture)
    virtual void glu(arch_act act, float* g, const float* u, int64_t n_tok, int64_t F) = 0;
    // y <- c tanh(y / c) over n elements
    virtual void softcap(float* y, int64_t n, float c) = 0;

    // The logits of a pass leave the backend here: they are computed into
    // logits_target(out, n) (CPU: host memory `out` itself; CUDA: device
    // scratch of n floats) and logits_fetch copies them to `out` (CPU: nothing).
    virtual float* logits_target(float* out, int64_t n) { return out; }
    virtual void logits_fetch(float* out, const float* y, int64_t n) {}

    // ---- attention side, for one layer of a pass over seqs[0 .. n_seqs)
    // q~ = q R and k~ = k R of compressed sequences' heads, in place in fb.q, fb.k.
    virtual void project_qk(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                            forward_buffers& fb) = 0;
    // Appends every sequence's new k, v rows (fb.k, fb.v) to its cache; a
    // prefill segment with hold (kv_append_holds).
    virtual void kv_append(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                           forward_buffers& fb) = 0;
    // fb.attn [rows x n_head x head_dim] <- attention of every row against its
    // own sequence's cache (which already holds the row's key and value): a
    // prefill segment reads kv_cache::view_attend (its own rows and the window
    // before it at full precision), a decode segment view().
    virtual void attention(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                           forward_buffers& fb) = 0;
    // The pass over seqs is done (its logits fetched, if any): a backend that
    // appended to its own copy of the caches first (CUDA) brings the host
    // caches up to date here, before anything on the host reads them.
    virtual void pass_end(const backend_seq* seqs, int n_seqs, const model_hparams& hp, forward_buffers& fb) {}
    // Tests: where a backend keeps its own copy of cache c, the first
    // difference between that copy and c ("" when they agree, or no copy).
    virtual std::string kv_copy_check(const kv_cache& c) { return ""; }
};

// Where the CUDA backend plugs in: a build with -DZACK_CUDA=ON installs
// engine/backend_cuda.h's functions here itself; the SIMT harness tests install
// the harness build of the same backend (tests/simt/test_backend_cuda.cpp).
struct backend_cuda_entry {
    std::unique_ptr<backend> (*create)(const backend_params& p) = nullptr;
    void (*check)() = nullptr;  // throws with a one-line reason without a usable device
    std::string (*describe)() = nullptr;  // the device, e.g. "NVIDIA H100 80GB HBM3, 132 SMs"
};
void backend_cuda_install(const backend_cuda_entry& e);
// The CUDA device the backend would use, or why there is none (--version).
std::string backend_cuda_describe();

// Throws with a one-line reason when the device cannot run a forward pass in
// this build (front ends call it before loading a model).
void backend_check_device(backend_device d);
// The one place a device is chosen; throws as backend_check_device.
std::unique_ptr<backend> backend_create(const backend_params& p);

}  // namespace zk
