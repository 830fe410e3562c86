// StreamingLLM: the attention sinks (first positions, protected by the base
// selection) and a window of the newest tokens; nothing else survives.
#include "engine/evict/evict.h"

namespace zk {

namespace {

class evict_streaming : public evict_policy {
public:
    explicit evict_streaming(const evict_params& p) : evict_policy(p) {}
    std::string name() const override { return "streaming"; }
    // Newer is more important, so the top of the budget is the recent window.
    void rank(const kv_block& b, float* importance) const override {
        for (int64_t s = 0; s < b.n_used; s++) importance[s] = (float)b.pos[s];
    }
};

}  // namespace

std::unique_ptr<evict_policy> evict_make_streaming(const evict_params& p) {
    return std::make_unique<evict_streaming>(p);
}

}  // namespace zk
