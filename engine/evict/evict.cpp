#include "engine/evict/evict.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ggml-like/error.h"

namespace zk {

namespace {

class evict_none : public evict_policy {
public:
    explicit evict_none(const evict_params& p) : evict_policy(p) {}
    std::string name() const override { return "none"; }
    void rank(const kv_block& b, float* importance) const override {
        for (int64_t s = 0; s < b.n_used; s++) importance[s] = 0;
    }
    void select(const kv_cache& c, int64_t, std::vector<std::vector<uint8_t>>& keep) const override {
        keep.resize((size_t)c.n_layer() * c.n_head_kv());
        for (int l = 0; l < c.n_layer(); l++)
            for (int h = 0; h < c.n_head_kv(); h++) keep[(size_t)l * c.n_head_kv() + h].assign(c.block(l, h).n_used, 1);
    }
};

struct registry_entry {
    const char* name;
    std::unique_ptr<evict_policy> (*make)(const evict_params&);
};

std::unique_ptr<evict_policy> make_none(const evict_params& p) { return std::make_unique<evict_none>(p); }

const registry_entry k_registry[] = {
    {"none", make_none},
    {"streaming", evict_make_streaming},
    {"h2o", evict_make_h2o},
    {"snapkv", evict_make_snapkv},
    {"keyformer", evict_make_keyformer},
};

}  // namespace

void evict_softmax(const float* logits, int64_t n, float inv_temp, float* p) {
    float mx = -INFINITY;
    for (int64_t s = 0; s < n; s++) mx = std::max(mx, logits[s] * inv_temp);
    if (mx == -INFINITY) {
        std::fill(p, p + n, 0.0f);
        return;
    }
    double sum = 0;
    for (int64_t s = 0; s < n; s++) {
        p[s] = std::exp(logits[s] * inv_temp - mx);
        sum += p[s];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t s = 0; s < n; s++) p[s] *= inv;
}

int64_t evict_n_recent(const evict_params& p) {
    return p.n_recent >= 0 ? p.n_recent : std::min<int64_t>(32, p.budget / 4);
}

void evict_select_top(const float* importance, const int32_t* pos, int64_t n, int64_t budget,
                      const evict_params& p, uint8_t* keep) {
    if (n <= budget) {
        std::fill(keep, keep + n, 1);
        return;
    }
    std::fill(keep, keep + n, 0);
    int64_t kept = 0;
    const int64_t recent = std::min(n, evict_n_recent(p));
    for (int64_t s = 0; s < n; s++)
        if (pos[s] < p.n_sink || s >= n - recent) keep[s] = 1, kept++;
    std::vector<int64_t> cand;
    cand.reserve(n);
    for (int64_t s = 0; s < n; s++)
        if (!keep[s]) cand.push_back(s);
    const int64_t want = std::min<int64_t>((int64_t)cand.size(), std::max<int64_t>(0, budget - kept));
    // stable on descending importance, newer first on ties
    std::stable_sort(cand.begin(), cand.end(), [&](int64_t a, int64_t b) {
        if (importance[a] != importance[b]) return importance[a] > importance[b];
        return a > b;
    });
    for (int64_t i = 0; i < want; i++) keep[cand[i]] = 1;
}

void evict_policy::select(const kv_cache& c, int64_t budget, std::vector<std::vector<uint8_t>>& keep) const {
    keep.resize((size_t)c.n_layer() * c.n_head_kv());
    std::vector<float> imp;
    for (int l = 0; l < c.n_layer(); l++)
        for (int h = 0; h < c.n_head_kv(); h++) {
            const kv_block& b = c.block(l, h);
            imp.resize(b.n_used);
            rank(b, imp.data());
            std::vector<uint8_t>& k = keep[(size_t)l * c.n_head_kv() + h];
            k.resize(b.n_used);
            evict_select_top(imp.data(), b.pos, b.n_used, budget, p_, k.data());
        }
}

void evict_validate_params(const evict_params& p, int64_t n_ctx) {
    bool known = false;
    for (const auto& e : k_registry) known |= p.policy == e.name;
    if (!known) {
        std::string names;
        for (const auto& e : k_registry) names += std::string(names.empty() ? "" : ", ") + e.name;
        ZK_THROW_PARAM("evict.policy", "evict.policy: unknown policy '%s' (known: %s)", p.policy.c_str(), names.c_str());
    }
    if (p.n_sink < 0 || p.n_sink > 64)
        ZK_THROW_PARAM("evict.n_sink", "evict.n_sink must be between 0 and 64 tokens, got %d", p.n_sink);
    if (p.policy == "none") {
        if (p.budget != 0) ZK_THROW_PARAM("evict.budget", "evict.budget %lld needs an eviction policy (evict.policy)",
                                          (long long)p.budget);
        if (p.crush != 0) ZK_THROW_PARAM("evict.crush", "evict.crush needs an eviction policy (evict.policy) to wrap");
        return;
    }
    if (p.budget <= 0)
        ZK_THROW_PARAM("evict.budget", "evict.policy %s needs a positive evict.budget in tokens, got %lld",
                       p.policy.c_str(), (long long)p.budget);
    if (p.n_recent < -1)
        ZK_THROW_PARAM("evict.n_recent", "evict.n_recent must be >= 0, got %lld", (long long)p.n_recent);
    if (p.n_sink + evict_n_recent(p) >= p.budget)
        ZK_THROW_PARAM("evict.budget", "evict.budget %lld leaves no room beyond %d sink and %lld recent tokens",
                       (long long)p.budget, p.n_sink, (long long)evict_n_recent(p));
    if (p.chunk <= 0) ZK_THROW("eviction chunk must be positive, got %lld", (long long)p.chunk);
    if (p.snap_window <= 0) ZK_THROW("snapkv window must be positive, got %d", p.snap_window);
    if (p.snap_pool <= 0 || p.snap_pool % 2 == 0)
        ZK_THROW("snapkv pool width must be odd and positive, got %d", p.snap_pool);
    if (!(p.tau_init > 0 && p.tau_end > 0))
        ZK_THROW("keyformer temperatures must be positive, got %g and %g", p.tau_init, p.tau_end);
    if (!(p.crush >= 0 && p.crush < 1))
        ZK_THROW_PARAM("evict.crush", "evict.crush must be a fraction of the budget in [0, 1), got %g", p.crush);
    if (p.crush_anchor != "mean" && p.crush_anchor != "random" && p.crush_anchor != "alternate")
        ZK_THROW_PARAM("evict.crush_anchor", "evict.crush_anchor must be mean, random or alternate, got '%s'",
                       p.crush_anchor.c_str());
    (void)n_ctx;
}

std::vector<std::string> evict_policy_names() {
    std::vector<std::string> v;
    for (const auto& e : k_registry) v.push_back(e.name);
    return v;
}

std::unique_ptr<evict_policy> evict_policy_create(const evict_params& p, int64_t n_ctx) {
    evict_validate_params(p, n_ctx);
    for (const auto& e : k_registry)
        if (p.policy == e.name) {
            std::unique_ptr<evict_policy> pol = e.make(p);
            if (p.crush > 0) pol = evict_make_kvcrush(p, std::move(pol));
            return pol;
        }
    ZK_THROW_PARAM("evict.policy", "evict.policy: unknown policy '%s'", p.policy.c_str());
}

void evict_run(kv_cache& c, const evict_policy& policy, int64_t budget) {
    std::vector<std::vector<uint8_t>> keep;
    policy.select(c, budget, keep);
    for (int l = 0; l < c.n_layer(); l++)
        for (int h = 0; h < c.n_head_kv(); h++) {
            const std::vector<uint8_t>& k = keep[(size_t)l * c.n_head_kv() + h];
            ZK_ASSERT((int64_t)k.size() == c.block(l, h).n_used);
            c.compact(l, h, k.data());
            kv_block& b = c.block(l, h);
            if (policy.reset_scores() && !b.score.empty()) std::fill(b.score.begin(), b.score.begin() + b.n_used, 0.0f);
        }
}

}  // namespace zk
