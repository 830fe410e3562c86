// SnapKV: the queries of an observation window at the end of the prompt (the
// last snap_window tokens of each forward chunk) vote for the slots they attend
// to; the votes are max-pooled over snap_pool neighbouring slots so that kept
// tokens come with their context. During decode every step is in the window and
// the votes start over after each eviction.
#include <algorithm>
#include <vector>

#include "engine/evict/evict.h"

namespace zk {

namespace {

class evict_snapkv : public evict_policy {
public:
    explicit evict_snapkv(const evict_params& p) : evict_policy(p) {}
    std::string name() const override { return "snapkv"; }
    bool needs_attention() const override { return true; }
    bool reset_scores() const override { return true; }
    void observe(const evict_observation& o, const float* logits, int64_t n, float* score) const override {
        if (o.q_index < o.n_query - p_.snap_window) return;
        thread_local std::vector<float> p;
        p.resize(n);
        evict_softmax(logits, n, 1.0f, p.data());
        for (int64_t s = 0; s < n; s++) score[s] += p[s];
    }
    void rank(const kv_block& b, float* importance) const override {
        const int64_t h = p_.snap_pool / 2;
        for (int64_t s = 0; s < b.n_used; s++) {
            float m = b.score[s];
            for (int64_t u = std::max<int64_t>(0, s - h); u <= std::min<int64_t>(b.n_used - 1, s + h); u++)
                m = std::max(m, b.score[u]);
            importance[s] = m;
        }
    }
};

}  // namespace

std::unique_ptr<evict_policy> evict_make_snapkv(const evict_params& p) { return std::make_unique<evict_snapkv>(p); }

}  // namespace zk
