#include "engine/backend_profile.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace zk {

namespace {

// Rows above this count as prefill in the table (decode steps of a batch of
// up to 8 sequences stay "decode").
constexpr int64_t k_decode_rows = 8;

class backend_profiled final : public backend {
public:
    explicit backend_profiled(std::unique_ptr<backend> inner) : in_(std::move(inner)) {}
    ~backend_profiled() override { print(); }

    backend_device device() const override { return in_->device(); }
    thread_pool& host_pool() override { return in_->host_pool(); }
    std::unique_ptr<forward_buffers> buffers_create(const model_hparams& hp, int64_t n_rows, int max_seqs,
                                                    int n_threads, int64_t cap, int gear_rank,
                                                    bool observe) override {
        return in_->buffers_create(hp, n_rows, max_seqs, n_threads, cap, gear_rank, observe);
    }
    void sync() override { in_->sync(); }
    void cache_check(const kv_cache_params& p) const override { in_->cache_check(p); }

    void embed(const weight_view& table, const int32_t* tokens, int64_t n, float scale, float* x) override {
        timed(OP_EMBED, n, [&] { in_->embed(table, tokens, n, scale, x); });
    }
    void matmul(const weight_view& w, const float* x, int64_t n_tok, float* y, forward_buffers& fb) override {
        timed(OP_MATMUL, n_tok, [&] { in_->matmul(w, x, n_tok, y, fb); }, w.type);
    }
    void matmul_multi(const weight_view* ws, float* const* ys, int n_w, const float* x, int64_t n_tok,
                      forward_buffers& fb) override {
        timed(OP_MATMUL, n_tok, [&] { in_->matmul_multi(ws, ys, n_w, x, n_tok, fb); }, ws[0].type);
    }
    void rmsnorm(const float* x, const float* w, float* y, int64_t n_tok, int64_t n, float eps) override {
        // QK-norm passes heads as rows: n_tok counts rows of n, not tokens
        timed(OP_NORM, n_tok, [&] { in_->rmsnorm(x, w, y, n_tok, n, eps); });
    }
    void add_bias(float* y, const float* b, int64_t n_tok, int64_t n) override {
        timed(OP_BIAS, n_tok, [&] { in_->add_bias(y, b, n_tok, n); });
    }
    void add(float* x, const float* y, int64_t n) override {
        timed(OP_ADD, rows_unknown, [&] { in_->add(x, y, n); });
    }
    void rope_table(const rope_params& p, const int32_t* pos, int64_t n_tok, float* cs) override {
        timed(OP_ROPE, n_tok, [&] { in_->rope_table(p, pos, n_tok, cs); });
    }
    void rope_apply(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, const rope_params& p,
                    const float* cs) override {
        timed(OP_ROPE, n_tok, [&] { in_->rope_apply(x, n_tok, n_heads, head_dim, p, cs); });
    }
    void glu(arch_act act, float* g, const float* u, int64_t n_tok, int64_t F) override {
        timed(OP_GLU, n_tok, [&] { in_->glu(act, g, u, n_tok, F); });
    }
    void softcap(float* y, int64_t n, float c) override {
        timed(OP_SOFTCAP, rows_unknown, [&] { in_->softcap(y, n, c); });
    }
    float* logits_target(float* out, int64_t n) override { return in_->logits_target(out, n); }
    void logits_fetch(float* out, const float* y, int64_t n) override {
        timed(OP_LOGITS_FETCH, rows_unknown, [&] { in_->logits_fetch(out, y, n); });
    }
    void project_qk(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                    forward_buffers& fb) override {
        timed(OP_PROJECT, rows(seqs, n_seqs), [&] { in_->project_qk(seqs, n_seqs, hp, il, fb); });
    }
    void kv_append(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                   forward_buffers& fb) override {
        timed(OP_KV_APPEND, rows(seqs, n_seqs), [&] { in_->kv_append(seqs, n_seqs, hp, il, fb); });
    }
    void attention(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                   forward_buffers& fb) override {
        timed(OP_ATTENTION, rows(seqs, n_seqs), [&] { in_->attention(seqs, n_seqs, hp, il, fb); });
    }
    void pass_end(const backend_seq* seqs, int n_seqs, const model_hparams& hp, forward_buffers& fb) override {
        timed(OP_PASS_END, rows(seqs, n_seqs), [&] { in_->pass_end(seqs, n_seqs, hp, fb); });
    }
    std::string kv_copy_check(const kv_cache& c) override { return in_->kv_copy_check(c); }

private:
    enum op {
        OP_EMBED, OP_MATMUL, OP_NORM, OP_BIAS, OP_ADD, OP_ROPE, OP_GLU, OP_SOFTCAP, OP_LOGITS_FETCH,
        OP_PROJECT, OP_KV_APPEND, OP_ATTENTION, OP_PASS_END, OP_COUNT
    };
    static constexpr const char* k_op_names[OP_COUNT] = {
        "embed", "matmul", "rmsnorm", "add_bias", "add", "rope", "glu", "softcap", "logits_fetch",
        "project_qk", "kv_append", "attention", "pass_end"};
    static constexpr int64_t rows_unknown = -1;
    // [op][weight type id, k_no_type for ops without one][row class: 0 decode, 1 prefill, 2 not told]
    static constexpr int k_no_type = 32;  // ggml type ids zack computes with are below it
    struct cell {
        int64_t calls = 0;
        double seconds = 0;
    };
    cell cells_[OP_COUNT][k_no_type + 1][3];

    static int64_t rows(const backend_seq* seqs, int n_seqs) {
        int64_t n = 0;
        for (int i = 0; i < n_seqs; i++) n += seqs[i].n;
        return n;
    }

    template <class F>
    void timed(op o, int64_t n_rows, F&& f, dtype t = dtype(k_no_type)) {
        using clock = std::chrono::steady_clock;
        const clock::time_point t0 = clock::now();
        f();
        in_->sync();
        const uint32_t ti = (uint32_t)t < (uint32_t)k_no_type ? (uint32_t)t : (uint32_t)k_no_type;
        cell& c = cells_[o][ti][n_rows < 0 ? 2 : n_rows <= k_decode_rows ? 0 : 1];
        c.calls++;
        c.seconds += std::chrono::duration<double>(clock::now() - t0).count();
    }

    void print() const {
        double total = 0;
        int64_t calls = 0;
        for (const auto& op_cells : cells_)
            for (const auto& type_cells : op_cells)
                for (const cell& c : type_cells) total += c.seconds, calls += c.calls;
        if (calls == 0) return;
        static const char* k_class[3] = {"1-8", ">8", "-"};
        std::fprintf(stderr, "\nzack profile (%s backend): %lld ops, %.1f ms timed\n",
                     backend_device_name(in_->device()), (long long)calls, 1e3 * total);
        std::fprintf(stderr, "| op | rows | calls | ms | us/call | %% of timed |\n|---|---|---:|---:|---:|---:|\n");
        for (int o = 0; o < OP_COUNT; o++)
            for (int t = 0; t <= k_no_type; t++)
                for (int k = 0; k < 3; k++) {
                    const cell& c = cells_[o][t][k];
                    if (c.calls == 0) continue;
                    std::fprintf(stderr, "| %s%s%s | %s | %lld | %.2f | %.1f | %.1f%% |\n", k_op_names[o],
                                 t < k_no_type ? " " : "", t < k_no_type ? dtype_name((dtype)t) : "", k_class[k],
                                 (long long)c.calls, 1e3 * c.seconds, 1e6 * c.seconds / (double)c.calls,
                                 total > 0 ? 100.0 * c.seconds / total : 0.0);
                }
    }

    std::unique_ptr<backend> in_;
};

}  // namespace

bool backend_profile_requested() {
    const char* e = std::getenv("ZACK_PROFILE");
    return e && *e && std::strcmp(e, "0") != 0;
}

std::unique_ptr<backend> backend_profile_wrap(std::unique_ptr<backend> inner) {
    return std::make_unique<backend_profiled>(std::move(inner));
}

}  // namespace zk
