// Keyformer: the score function is a Gumbel-softmax of the attention logits,
// softmax((logit + g) / tau) with g ~ Gumbel(0, 1), accumulated over query
// tokens; tau rises from tau_init to tau_end along the context, so the
// regularising noise matters less as the context grows. The noise of (layer,
// head, query position, key position) is a hash of the seed: runs are
// deterministic whatever the thread count.
#include <cmath>
#include <vector>

#include "engine/evict/evict.h"

namespace zk {

namespace {

uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

class evict_keyformer : public evict_policy {
public:
    explicit evict_keyformer(const evict_params& p) : evict_policy(p) {}
    std::string name() const override { return "keyformer"; }
    bool needs_attention() const override { return true; }
    void observe(const evict_observation& o, const float* logits, int64_t n, float* score) const override {
        thread_local std::vector<float> z, p;
        z.resize(n);
        p.resize(n);
        const uint64_t base = mix64(p_.seed ^ mix64(((uint64_t)o.layer << 40) ^ ((uint64_t)o.head << 32) ^ (uint32_t)o.q_pos));
        for (int64_t s = 0; s < n; s++) {
            const uint64_t h = mix64(base ^ (uint64_t)(uint32_t)o.slot_pos[s]);
            const double u = ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);  // (0, 1)
            z[s] = logits[s] + (float)(-std::log(-std::log(u)));
        }
        const double f = o.n_ctx > 0 ? std::min(1.0, (double)o.q_pos / (double)o.n_ctx) : 0.0;
        const float tau = (float)(p_.tau_init + (p_.tau_end - p_.tau_init) * f);
        evict_softmax(z.data(), n, 1.0f / tau, p.data());
        for (int64_t s = 0; s < n; s++) score[s] += p[s];
    }
    void rank(const kv_block& b, float* importance) const override {
        for (int64_t s = 0; s < b.n_used; s++) importance[s] = b.score[s];
    }
};

}  // namespace

std::unique_ptr<evict_policy> evict_make_keyformer(const evict_params& p) {
    return std::make_unique<evict_keyformer>(p);
}

}  // namespace zk
