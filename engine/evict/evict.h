// Token eviction for the KV cache: small swappable policies behind one
// interface. A policy scores the slots of each (layer, KV head) block
// (optionally from the attention the session shows it), and the base selection
// keeps the protected slots (the first n_sink positions and the n_recent newest
// slots) plus the best-scored others up to the budget. Wrappers (kvcrush)
// override the selection of the whole cache. A registry maps names to
// constructors that validate their parameters.
//
//   none       never evicts
//   streaming  StreamingLLM: attention sinks + the recent window
//   h2o        heavy hitters: attention probabilities accumulated over every query
//   snapkv     attention of an observation window (the last snap_window queries of
//              each forward chunk, i.e. the end of the prompt; during decode the
//              queries since the last eviction), max-pooled over neighbouring slots
//   keyformer  accumulated softmax((logit + Gumbel noise) / tau), tau annealed from
//              tau_init to tau_end along the context; deterministic noise from the seed
//   + kvcrush  (--kv-crush F) a fraction F of the budget holds representatives of
//              the would-be-evicted tokens, chosen by Hamming-distance bucketing of
//              per-head keep/evict bit vectors
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/kv_cache.h"

namespace zk {

struct evict_params {
    std::string policy = "none";
    int64_t budget = 0;          // tokens kept per (layer, KV head) after an eviction
    int n_sink = 4;              // first positions always kept (and exact in a lossy cache, engine/session.h)
    int64_t n_recent = -1;       // newest slots always kept (-1 = min(32, budget / 4))
    int64_t chunk = 64;          // decode evicts once the cache holds budget + chunk
    int snap_window = 32;        // snapkv observation window (queries)
    int snap_pool = 7;           // snapkv max-pool width (odd)
    float tau_init = 1.0f;       // keyformer temperature schedule
    float tau_end = 2.0f;
    uint64_t seed = 0x5eed;      // keyformer noise, kvcrush random anchor
    float crush = 0.0f;          // kvcrush: fraction of the budget for representatives (0 = off)
    std::string crush_anchor = "mean";  // mean | random | alternate
};

// One query row the attention kernel showed the policy.
struct evict_observation {
    int layer;
    int head;                // KV head
    int32_t q_pos;           // position of the query token
    int64_t q_index;         // index of the query in the current forward chunk
    int64_t n_query;         // tokens in the chunk
    int64_t n_ctx;           // context size (keyformer's schedule)
    const int32_t* slot_pos; // [n] positions of the block's slots
};

class evict_policy {
public:
    virtual ~evict_policy() = default;
    virtual std::string name() const = 0;
    // Whether the session must show attention logits to observe().
    virtual bool needs_attention() const { return false; }
    // Adds one query row's contribution to score[s], s < n. logits: scaled
    // attention scores of the row, -inf for slots the query cannot see.
    virtual void observe(const evict_observation& o, const float* logits, int64_t n, float* score) const {
        (void)o, (void)logits, (void)n, (void)score;
    }
    // Whether scores start over after each eviction.
    virtual bool reset_scores() const { return false; }
    // importance[s] for the block's slots s < n_used (higher = keep).
    virtual void rank(const kv_block& b, float* importance) const = 0;
    // keep[i][s] for every block i = layer * n_head_kv + head: at most `budget`
    // slots per block (all of them when a block holds fewer).
    virtual void select(const kv_cache& c, int64_t budget, std::vector<std::vector<uint8_t>>& keep) const;

    const evict_params& params() const { return p_; }

protected:
    explicit evict_policy(const evict_params& p) : p_(p) {}
    evict_params p_;
};

// The protected slots of a block: pos < n_sink, and the n_recent newest.
int64_t evict_n_recent(const evict_params& p);
// Keeps the protected slots and the highest-importance others, `budget` in all
// (ties go to the newer slot). keep [n].
void evict_select_top(const float* importance, const int32_t* pos, int64_t n, int64_t budget,
                      const evict_params& p, uint8_t* keep);

// Validates p against the context size (throws zk::error with the flag name).
void evict_validate_params(const evict_params& p, int64_t n_ctx);
// The registered policy names.
std::vector<std::string> evict_policy_names();
// Validates and builds p.policy, wrapped in kvcrush when p.crush > 0.
std::unique_ptr<evict_policy> evict_policy_create(const evict_params& p, int64_t n_ctx);

// Runs one eviction: every block keeps at most `budget` slots. Scores are reset
// when the policy asks for it.
void evict_run(kv_cache& c, const evict_policy& policy, int64_t budget);

// Factories, one per policy file.
std::unique_ptr<evict_policy> evict_make_streaming(const evict_params& p);
std::unique_ptr<evict_policy> evict_make_h2o(const evict_params& p);
std::unique_ptr<evict_policy> evict_make_snapkv(const evict_params& p);
std::unique_ptr<evict_policy> evict_make_keyformer(const evict_params& p);
std::unique_ptr<evict_policy> evict_make_kvcrush(const evict_params& p, std::unique_ptr<evict_policy> inner);

// Softmax of one logits row into p (n entries, -inf entries give 0).
void evict_softmax(const float* logits, int64_t n, float inv_temp, float* p);

}  // namespace zk
