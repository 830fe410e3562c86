// KVCrush as a wrapper around any policy. The inner policy selects the
// important tokens with (1 - crush) of the budget; the rest of the budget goes
// to representatives of the tokens it would evict:
//  1. every token (position) gets a binary vector with one bit per
//     (layer, KV head) block of the model: 1 if the inner policy keeps it there;
//  2. an anchor vector: `mean` (the majority bit of each head), `random`
//     (seeded), or `alternate` (0101...);
//  3. per block, the would-be-evicted tokens are ordered by Hamming distance to
//     the anchor (then position) and cut into as many equal buckets as there are
//     representative slots; the middle token of each bucket is kept.
// One distance per token and a sort: O(S log S), no pairwise distances.
#include <algorithm>
#include <vector>

#include "engine/evict/evict.h"

namespace zk {

namespace {

class evict_kvcrush : public evict_policy {
public:
    evict_kvcrush(const evict_params& p, std::unique_ptr<evict_policy> inner)
        : evict_policy(p), inner_(std::move(inner)) {}
    std::string name() const override { return "kvcrush(" + inner_->name() + ")"; }
    bool needs_attention() const override { return inner_->needs_attention(); }
    void observe(const evict_observation& o, const float* logits, int64_t n, float* score) const override {
        inner_->observe(o, logits, n, score);
    }
    bool reset_scores() const override { return inner_->reset_scores(); }
    void rank(const kv_block& b, float* importance) const override { inner_->rank(b, importance); }

    void select(const kv_cache& c, int64_t budget, std::vector<std::vector<uint8_t>>& keep) const override {
        const int64_t n_rep = (int64_t)(p_.crush * (double)budget);
        inner_->select(c, budget - n_rep, keep);
        if (n_rep == 0) return;
        const int nb = c.n_layer() * c.n_head_kv();
        const int W = (nb + 63) / 64;
        // the positions present in any block
        std::vector<int32_t> P;
        for (int i = 0; i < nb; i++) {
            const kv_block& b = c.block(i / c.n_head_kv(), i % c.n_head_kv());
            P.insert(P.end(), b.pos, b.pos + b.n_used);
        }
        std::sort(P.begin(), P.end());
        P.erase(std::unique(P.begin(), P.end()), P.end());
        auto index_of = [&](int32_t pos) { return std::lower_bound(P.begin(), P.end(), pos) - P.begin(); };
        std::vector<uint64_t> bits(P.size() * W, 0);
        for (int i = 0; i < nb; i++) {
            const kv_block& b = c.block(i / c.n_head_kv(), i % c.n_head_kv());
            for (int64_t s = 0; s < b.n_used; s++)
                if (keep[i][s]) bits[index_of(b.pos[s]) * W + i / 64] |= 1ULL << (i % 64);
        }
        const std::vector<uint64_t> anchor = make_anchor(bits, P.size(), nb, W);
        std::vector<std::pair<int, int64_t>> cand;  // (distance, slot)
        for (int i = 0; i < nb; i++) {
            const kv_block& b = c.block(i / c.n_head_kv(), i % c.n_head_kv());
            cand.clear();
            for (int64_t s = 0; s < b.n_used; s++) {
                if (keep[i][s]) continue;
                const uint64_t* v = &bits[index_of(b.pos[s]) * W];
                int d = 0;
                for (int w = 0; w < W; w++) d += __builtin_popcountll(v[w] ^ anchor[w]);
                cand.push_back({d, s});
            }
            if ((int64_t)cand.size() <= n_rep) {
                for (const auto& e : cand) keep[i][e.second] = 1;
                continue;
            }
            std::sort(cand.begin(), cand.end());
            const int64_t S = (int64_t)cand.size();
            for (int64_t k = 0; k < n_rep; k++) {
                const int64_t lo = S * k / n_rep, hi = S * (k + 1) / n_rep;  // bucket [lo, hi)
                keep[i][cand[(lo + hi) / 2].second] = 1;
            }
        }
    }

private:
    std::vector<uint64_t> make_anchor(const std::vector<uint64_t>& bits, size_t n, int nb, int W) const {
        std::vector<uint64_t> a(W, 0);
        uint64_t rng = p_.seed * 0x9E3779B97F4A7C15ULL + 1;
        for (int i = 0; i < nb; i++) {
            bool bit = false;
            if (p_.crush_anchor == "mean") {
                size_t ones = 0;
                for (size_t t = 0; t < n; t++) ones += (bits[t * W + i / 64] >> (i % 64)) & 1;
                bit = 2 * ones >= n;
            } else if (p_.crush_anchor == "random") {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                bit = rng & 1;
            } else {
                bit = i & 1;
            }
            if (bit) a[i / 64] |= 1ULL << (i % 64);
        }
        return a;
    }

    std::unique_ptr<evict_policy> inner_;
};

}  // namespace

std::unique_ptr<evict_policy> evict_make_kvcrush(const evict_params& p, std::unique_ptr<evict_policy> inner) {
    return std::make_unique<evict_kvcrush>(p, std::move(inner));
}

}  // namespace zk
