// The CPU backend (engine/backend.h): the kernels of kernels/cpu/ on a pool of
// threads, over host buffers. Dense ops are in backend_cpu.cpp; attention, the
// q/k projection and KV append (the per-head scheduling of flash-decoding,
// tiled prefill, exact sinks and eviction observation) in backend_cpu_attn.cpp.
#pragma once
#include <memory>

#include "engine/backend.h"

namespace zk {

class backend_cpu final : public backend {
public:
    explicit backend_cpu(int n_threads);

    backend_device device() const override { return backend_device::CPU; }
    thread_pool& host_pool() override { return pool_; }
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

    void project_qk(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                    forward_buffers& fb) override;
    void kv_append(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                   forward_buffers& fb) override;
    void attention(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                   forward_buffers& fb) override;

private:
    // A prefill segment alone in its pass, with the tiled kernel
    // (kernels/attention_prefill.h); false, doing nothing, where it does not apply.
    bool attention_prefill(const backend_seq& sq, const model_hparams& hp, int il, forward_buffers& fb);
    // The same for a cache with quantized slots, dequantized once for the chunk,
    // as partials the per-token tasks merge with the exact sinks' (fb.tail_lo,
    // fb.tail_part).
    void attention_prefill_tails(const backend_seq& s, const model_hparams& hp, int il, forward_buffers& fb);
    static bool prefill_tiles(const backend_seq& s, const model_hparams& hp, int il);

    thread_pool pool_;
};

}  // namespace zk
