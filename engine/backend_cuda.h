// The CUDA backend (engine/backend.h): the kernels of kernels/cuda/ over device
// memory, on the default stream. Dense ops are in backend_cuda.cpp; the KV
// cache's device mirror, the q/k projection and attention in
// backend_cuda_kv.cpp.
//
// Where things live:
//   weights     uploaded at first use in their GGUF types (one copy per
//               backend, so per session), keyed by their host address;
//               norm and bias vectors too
//   activations forward_buffers' arrays (fb_array) are device memory
//   KV cache    the host kv_cache stays the authority, each block has a
//               device mirror. A decode step appends on the device first
//               (kv_append_device: kv_cache::append_plan replayed by
//               kernels/cuda/kv_append.h, the host's quantization bit for
//               bit) and the host cache follows at the pass's end (pass_end:
//               the rows come over in one transfer after the logits). Else
//               (prefill, GEAR, sinks, scores, a mirror without room)
//               kv_append fetches the new k and v rows, appends them on the
//               host as the CPU backend does, then brings each block's mirror
//               up to date by copying only what the append changed (every
//               array of a block grows at its end, except a windowed side's
//               residual rows, which move when a group is quantized); a block
//               changed otherwise (compact, clear: kv_block::edits) is copied
//               whole
//   logits      computed in device scratch, copied to the caller's memory
//
// Not on the GPU (refused in one line when a session is made): eviction
// policies that read attention logits (h2o, snapkv, keyformer), sliding-window
// layers (their masks), observers of the forward pass (calibration).
//
// Built twice: by the host compiler into zack with -DZACK_CUDA=ON, next to the
// nvcc-compiled kernels; and in every build into the SIMT harness tests
// (tests/simt), where the kernels run as host C++ and dptr<T> checks bounds.
#pragma once
#include <algorithm>
#include <memory>
#include <unordered_map>
#include <vector>

#include "engine/backend.h"
#include "engine/kv_cache.h"
#include "kernels/cuda/attention_decode.h"
#include "kernels/cuda/attention_prefill.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/kv_head.h"
#include "kernels/cuda/matvec.h"

namespace zk {

class kv_cache;

// Grow-only device scratch of at least n elements (contents not kept).
template <class T>
T* cuda_grow(cuda::device_array<T>& a, size_t n, const char* what) {
    if (a.size() < n) a = cuda::device_array<T>(std::max(n, a.size() + a.size() / 2), what);
    return a.data();
}

// The device copy of one host KV block and what of it is copied.
struct cuda_kv_mirror {
    struct array {
        const char* name = nullptr;  // cuda_kv_head_from_view's label of the array
        cuda::device_array<uint8_t> d;
        size_t synced = 0;  // bytes [0, synced) equal the host's
    };
    std::vector<array> arrays;
    uint64_t edits = ~uint64_t(0);  // the block's kv_block::edits when last copied
    int64_t n_quant = -1;
    int64_t n_used = -1;  // the block's n_used when last equal to the host's
    cuda::cuda_kv_head head;  // the block as the attention kernels read it
};

// Host-to-device copies gathered and sent as one transfer plus one scatter
// launch (kernels/cuda/elementwise.h): a decode step's cache rows, positions
// and attention plan are dozens of pieces of a few hundred bytes per layer,
// and each transfer of its own costs about as much as a layer's mat-vecs.
// A send stages its bytes in page-locked memory and returns without waiting
// for the device; each send takes a new part of that memory until recycle()
// (called once the device has run every send: after a wait for the stream)
// or until it is full (then send waits for the stream itself).
class cuda_upload_batch {
public:
    cuda_upload_batch() = default;
    cuda_upload_batch(const cuda_upload_batch&) = delete;
    cuda_upload_batch& operator=(const cuda_upload_batch&) = delete;
    ~cuda_upload_batch();
    // Copies src now; dst receives it at the next send (stream order).
    void add(void* dst, const void* src, size_t bytes);
    void send();
    void recycle() { staged_ = 0; }
    bool empty() const { return pieces_.empty(); }

private:
    std::vector<uint8_t> host_;   // the pieces' bytes, each 16-aligned
    std::vector<cuda::cuda_copy_piece> pieces_;  // src: offsets into the bytes until send()
    size_t bytes_ = 0;
    uint8_t* pinned_ = nullptr;   // what sends transfer: [the pieces' table][the bytes], one after another
    size_t pinned_size_ = 0, staged_ = 0;
    cuda::device_array<uint8_t> dev_;
};

// A decode step's k and v rows appended to the device mirror first
// (kv_append), and to the host cache at the pass's end (pass_end) from a copy
// kept on the device: where in that copy one sequence's rows of a layer are.
struct cuda_kv_deferred {
    kv_cache* cache = nullptr;
    int il = 0;
    int64_t row0 = 0, n = 0;
    size_t at = 0;  // floats into the staging copy: k [n x KV x D], then v
};

class backend_cuda final : public backend {
public:
    explicit backend_cuda(int n_threads);
    ~backend_cuda() override;

    backend_device device() const override { return backend_device::CUDA; }
    thread_pool& host_pool() override { return pool_; }
    void sync() override { cuda::cuda_stream_sync(nullptr); }
    std::unique_ptr<forward_buffers> buffers_create(const model_hparams& hp, int64_t n_rows, int max_seqs,
                                                    int n_threads, int64_t cap, int gear_rank,
                                                    bool observe) override;

    void embed(const weight_view& table, const int32_t* tokens, int64_t n, float scale, float* x) override;
    void matmul(const weight_view& w, const float* x, int64_t n_tok, float* y, forward_buffers& fb) override;
    void matmul_multi(const weight_view* ws, float* const* ys, int n_w, const float* x, int64_t n_tok,
                      forward_buffers& fb) override;
    void rmsnorm(const float* x, const float* w, float* y, int64_t n_tok, int64_t n, float eps) override;
    void add_bias(float* y, const float* b, int64_t n_tok, int64_t n) override;
    void add(float* x, const float* y, int64_t n) override;
    void rope_table(const rope_params& p, const int32_t* pos, int64_t n_tok, float* cs) override;
    void rope_apply(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, const rope_params& p,
                    const float* cs) override;
    void glu(arch_act act, float* g, const float* u, int64_t n_tok, int64_t F) override;
    void softcap(float* y, int64_t n, float c) override;
    float* logits_target(float* out, int64_t n) override;
    void logits_fetch(float* out, const float* y, int64_t n) override;

    void project_qk(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                    forward_buffers& fb) override;
    void kv_append(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                   forward_buffers& fb) override;
    void attention(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                   forward_buffers& fb) override;
    void pass_end(const backend_seq* seqs, int n_seqs, const model_hparams& hp, forward_buffers& fb) override;
    std::string kv_copy_check(const kv_cache& c) override;

private:
    // The device copy of host parameters (a weight matrix, a norm or bias
    // vector) of `bytes` bytes, made at first use.
    const uint8_t* param(const void* host, size_t bytes);
    cuda::cuda_weight weight(const weight_view& w);
    // y = x W^T; xq: x already rounded to 8 bits for K-quant mat-vecs (null: rounded here if needed).
    void matmul_one(const weight_view& w, const float* x, int64_t n_tok, float* y, const cuda::cuda_act_q8* xq);
    const cuda::cuda_act_q8* act_q8(const float* x, int64_t n_tok, int64_t n_cols);
    // Positions pos [n] in device memory: RoPE's table, the projection's sink
    // test and attention's masks all read one upload per pass.
    const int32_t* upload_pos(const int32_t* pos, int64_t n);
    // Brings the mirror of (cache, layer il, head g) up to date with the host block.
    cuda_kv_mirror& mirror_sync(const kv_cache& c, int il, int g);
    // The device copy of a host array that the blocks of cache c share, or
    // nullptr: the positions of a cache without eviction (kv_cache::ramp), one
    // ramp on the device too, uploaded once, rather than a copy per block.
    void* shared_array(const kv_cache& c, const void* host, const char* name);
    // Appends sequence s's new rows of layer il to its mirrors on the device
    // (kv_cache::append_plan replayed by kernels/cuda/kv_append.h, bit for bit
    // the host's quantization) and stages them for the host cache (pass_end).
    // False, with nothing done, where a block cannot: a mirror behind its host
    // block, an array without room, GEAR, sinks, scores, a prefill.
    bool kv_append_device(const backend_seq& s, const model_hparams& hp, int il, forward_buffers& fb);
    // The host block (c, il, g) has caught up with its mirror: mark it synced.
    void mirror_caught_up(const kv_cache& c, int il, int g);
    // What a prefill chunk's queries attend to (kv_cache::view_attend) on the
    // device: the mirror's arrays, with the rows the host cache kept aside for
    // the chunk copied into held at *at (bytes, advanced).
    cuda::cuda_kv_head held_head(const kv_cache& c, int il, int g, uint8_t* held, size_t* at);

    thread_pool pool_;
    cuda::cuda_device_info dev_;
    std::unordered_map<const void*, cuda::device_array<uint8_t>> params_;
    // grow-only scratch
    cuda::device_array<int32_t> d_tok_, d_pos_;
    cuda::device_array<float> d_logits_, d_ytile_, d_partials_;
    cuda::device_array<uint16_t> d_x16_, d_w16_;
    cuda::device_array<int8_t> d_actq_;  // act_q8's codes and metadata
    cuda::device_array<float> d_actm_;
    cuda::cuda_act_q8 act_q8_;
    cuda::device_array<cuda::cuda_attn_item> d_items_;
    cuda::device_array<cuda::cuda_attn_task> d_tasks_;
    cuda::device_array<cuda::cuda_prefill_task> d_ptasks_;
    cuda::device_array<cuda::cuda_attn_part> d_parts_;
    cuda::device_array<int32_t> d_item_parts_;
    std::vector<float> h_k_, h_v_;  // the new k, v rows on their way to the host cache
    // deferred host appends of this pass (kv_append_device) and their rows
    std::vector<cuda_kv_deferred> deferred_;
    cuda::device_array<float> d_stage_;
    size_t staged_ = 0;
    std::vector<float> h_stage_;
    cuda::device_array<uint8_t> d_flush_;  // a flush's window rows in transit
    cuda::device_array<uint8_t> d_held_;   // a prefill chunk's rows kept aside (held_head)
    struct head_plan {
        kv_append_plan plan;
        cuda::cuda_kv_head head;
    };
    std::vector<head_plan> head_plans_;
    std::vector<char> bs_fast_;  // per sequence of a kv_append: appended on the device
    std::vector<int32_t> h_pos_;    // the positions d_pos_ holds
    cuda_upload_batch up_;          // sent before attention reads it
    std::vector<cuda::cuda_attn_item> items_;
    // per cache (kv_cache::id): [n_layer x n_head_kv] mirrors
    std::unordered_map<uint64_t, std::vector<cuda_kv_mirror>> mirrors_;
    std::unordered_map<uint64_t, cuda::device_array<int32_t>> ramps_;  // per cache: kv_cache::ramp
    // compressed heads' projections per (projection table, layer): device
    // matrices, per-head pointers and ranks for q and for k
    struct proj_layer {
        cuda::device_array<float> mats;  // [n_head_kv x 2 x D x D]: q's, then k's per KV head
        cuda::device_array<cuda::dptr<const float>> q_ptr, k_ptr;
        cuda::device_array<int32_t> q_rank, k_rank;
        cuda::device_array<float> k_shift;  // [n_head_kv x D] (backend_seq::k_shift), empty = none
    };
    std::unordered_map<const void*, std::vector<proj_layer>> proj_;
};

std::unique_ptr<backend> backend_cuda_create(const backend_params& p);
// Throws "device cuda: no CUDA device ..." without one.
void backend_cuda_check();
// "NAME, N SMs" of the device the backend uses.
std::string backend_cuda_device_describe();

}  // namespace zk
