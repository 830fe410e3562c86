// Calibration statistics: streaming Gram matrices per (layer, KV head), in
// double precision, fed by the engine's session_observer during forward passes.
//
// For KV head g of layer l (query heads G(g) = g*group .. g*group + group - 1):
//   C_qk[l][g] = sum_t ( k_g(t) k_g(t)^T + sum_{i in G(g)} q_i(t) q_i(t)^T )   [d x d]
//   kept as its two halves C_k (keys) and C_q (the group's queries), which the
//   score-optimal key basis (calib/keybasis.h) needs apart.
//   C_v [l][g] = sum_t v_g(t) v_g(t)^T                 (v_stat V, the paper's)
//            or  sum_t sum_{i in G(g)} o_i(t) o_i(t)^T  (v_stat ATTN, the default)
//   C_kg[l][g] = sum over groups of n_g kbar kbar^T, kbar the mean key of a group
//   of k_gram_key_group consecutive positions (n_g of them in one pass), so that
//   C_k - C_kg is the keys' scatter within their groups: what per-channel
//   KIVI grids over such groups are left to code (calib/keybasis.h's order).
// where o_i = sum_s p_is v_g(s) is what W_o actually multiplies: attention
// outputs weight each value by the attention it receives, so values that
// attention concentrates on (sink tokens) count as much as they matter. On
// SmolLM2-135M this halves the KL divergence of V compression against v v^T.
// q and k are taken after RoPE (the rotation is applied online, see DESIGN.md 3).
// The W_o half of the V-O pairing does not depend on the corpus and is added
// by gram_wo() when the decomposition is taken. Memory is fixed
// (4 x n_layer x n_kv x d x d doubles), whatever the corpus length.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/session.h"

namespace zk {

class thread_pool;

// An observer of a calibration pass: it gets the session's pool (not owned;
// nullptr detaches) to spread its own per-layer work while the workers idle.
struct calib_observer : session_observer {
    virtual void set_pool(thread_pool* pool) = 0;
};

enum class gram_v_stat { V, ATTN };
// The token groups of C_kg: the KIVI key group (kv_cache_params::group's default;
// gram_accumulator::set_key_group for another).
constexpr int k_gram_key_group = 32;
const char* gram_v_stat_name(gram_v_stat s);
gram_v_stat gram_v_stat_from_name(const std::string& name);  // "v" | "attn"; throws otherwise

class gram_accumulator : public calib_observer {
public:
    // pool (optional, not owned) spreads each layer's (head, K|V) updates over threads.
    explicit gram_accumulator(const model_hparams& hp, thread_pool* pool = nullptr,
                              gram_v_stat v_stat = gram_v_stat::ATTN);

    void on_qkv(int layer, int64_t n, const int32_t* pos, const float* q, const float* k,
                const float* v) override;
    void on_attn(int layer, int64_t n, const float* attn) override;
    gram_v_stat v_stat() const { return v_stat_; }
    // The KIVI key group C_kg's token groups follow (default k_gram_key_group), before any token.
    void set_key_group(int group);

    // Use `pool` (not owned; nullptr = the calling thread only) for later updates.
    void set_pool(thread_pool* pool) override;
    int64_t n_tokens() const { return n_tokens_; }  // tokens seen (counted at layer 0)
    int n_layer() const { return n_layer_; }
    int n_kv() const { return n_kv_; }
    int head_dim() const { return d_; }
    // Full symmetric [d x d] row-major copies of the sums so far.
    std::vector<double> qk(int layer, int g) const;  // C_q + C_k
    std::vector<double> q(int layer, int g) const;   // sum over the group's query heads of q q^T
    std::vector<double> k(int layer, int g) const;   // k k^T
    std::vector<double> k_within(int layer, int g) const;  // C_k - C_kg: the scatter within key groups
    // The mean key of KV head g [d] (after RoPE): a constant part of the keys
    // (a bias, a low RoPE frequency) that the cache can leave out (calib/zack_file.h k_mean).
    std::vector<double> k_mean(int layer, int g) const;
    std::vector<double> v(int layer, int g) const;

private:
    std::vector<double> full(const std::vector<double>& upper, int layer, int g) const;
    int n_layer_, n_head_, n_kv_, d_;
    thread_pool* pool_;
    gram_v_stat v_stat_;
    int key_group_ = k_gram_key_group;
    int64_t n_tokens_ = 0;
    std::vector<double> c_q_, c_k_;  // [n_layer x n_kv x d x d], upper triangles maintained by dsyrk
    std::vector<double> c_kg_;  // [n_layer x n_kv x d x d] group means' Gram, upper triangle
    std::vector<double> c_v_;   // [n_layer x n_kv x d x d]
    std::vector<double> k_sum_;  // [n_layer x n_kv x d]
    std::vector<std::vector<double>> scratch_;  // per thread: [n x (group+1) x d] doubles
};

// The W_o half of C_v (paper, section 4.3: V's token dimension concatenated
// with W_o,i's output dimension). W_o is [n_embd x n_head*d]; the block query
// head i reads is B_i = W_o[:, i*d : (i+1)*d] ([n_embd x d]); for each KV head g
// returns sum_{i in G(g)} B_i^T B_i as [n_kv x d x d] row-major.
std::vector<double> gram_wo(const weight_view& wo, int n_head, int n_kv, int d);

}  // namespace zk
