// H2O (heavy hitters): a slot's importance is the attention probability it has
// received, summed over every query token and every query head of its group
// since it entered the cache.
#include <vector>

#include "engine/evict/evict.h"

namespace zk {

namespace {

class evict_h2o : public evict_policy {
public:
    explicit evict_h2o(const evict_params& p) : evict_policy(p) {}
    std::string name() const override { return "h2o"; }
    bool needs_attention() const override { return true; }
    void observe(const evict_observation&, const float* logits, int64_t n, float* score) const override {
        thread_local std::vector<float> p;
        p.resize(n);
        evict_softmax(logits, n, 1.0f, p.data());
        for (int64_t s = 0; s < n; s++) score[s] += p[s];
    }
    void rank(const kv_block& b, float* importance) const override {
        for (int64_t s = 0; s < b.n_used; s++) importance[s] = b.score[s];
    }
};

}  // namespace

std::unique_ptr<evict_policy> evict_make_h2o(const evict_params& p) { return std::make_unique<evict_h2o>(p); }

}  // namespace zk
