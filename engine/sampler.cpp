// Token sampler; the chain and its conventions are described in sampler.h.
#include "engine/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "ggml-like/error.h"

namespace zk {

// ---------------------------------------------------------------------------
// Parameters
// ---------------------------------------------------------------------------

void sampler_validate_params(const sampler_params& p) {
    // Written as !(ok) so that NaN fails every check.
    if (!(p.temp >= 0.0f) || std::isinf(p.temp))
        ZK_THROW("sampler: temp must be a finite value >= 0 (0 = greedy), got %g", (double)p.temp);
    if (p.top_k < 0) ZK_THROW("sampler: top_k must be >= 0 (0 = off), got %d", (int)p.top_k);
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
        ZK_THROW("sampler: top_p must be in (0, 1] (1 = off), got %g", (double)p.top_p);
    if (!(p.min_p >= 0.0f && p.min_p < 1.0f))
        ZK_THROW("sampler: min_p must be in [0, 1) (0 = off), got %g", (double)p.min_p);
    if (!(p.repeat_penalty > 0.0f) || std::isinf(p.repeat_penalty))
        ZK_THROW("sampler: repeat_penalty must be a finite value > 0 (1 = off), got %g",
                 (double)p.repeat_penalty);
    if (p.repeat_last_n < 0)
        ZK_THROW("sampler: repeat_last_n must be >= 0 (0 = off), got %d", (int)p.repeat_last_n);
    if (!std::isfinite(p.presence_penalty))
        ZK_THROW("sampler: presence_penalty must be a finite value (0 = off), got %g", (double)p.presence_penalty);
    if (!std::isfinite(p.frequency_penalty))
        ZK_THROW("sampler: frequency_penalty must be a finite value (0 = off), got %g", (double)p.frequency_penalty);
}

static uint64_t sampler_resolve_seed(uint64_t seed) {
    if (seed != sampler_seed_random) return seed;
    // splitmix64 finalizer over the clock so that close start times give unrelated seeds.
    uint64_t z = (uint64_t)std::chrono::high_resolution_clock::now().time_since_epoch().count();
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    // Keep the reported seed usable: passing it back must not mean "random" again.
    return z == sampler_seed_random ? z ^ 1 : z;
}

// ---------------------------------------------------------------------------
// sampler
// ---------------------------------------------------------------------------

sampler::sampler(const sampler_params& p, int32_t n_vocab)
    : params_(p), n_vocab_(n_vocab), seed_(sampler_resolve_seed(p.seed)), rng_(seed_) {
    sampler_validate_params(p);
    if (n_vocab <= 0) ZK_THROW("sampler: n_vocab must be > 0, got %d", (int)n_vocab);
    cand_.resize((size_t)n_vocab);
    scratch_.resize((size_t)n_vocab);
    history_.assign((size_t)p.repeat_last_n, 0);
    penalty_count_.assign((size_t)n_vocab, 0);
}

void sampler::reset() {
    history_head_ = 0;
    history_size_ = 0;
    rng_.seed(seed_);
}

void sampler::accept(int32_t token) {
    if (token < 0 || token >= n_vocab_)
        ZK_THROW("sampler: accepted token id %d outside the vocabulary [0, %d)", (int)token, (int)n_vocab_);
    if (history_.empty()) return;
    history_[history_head_] = token;
    history_head_ = (history_head_ + 1) % history_.size();
    history_size_ = std::min(history_size_ + 1, history_.size());
}

// Two passes over the window: count each id, then penalize each distinct id once
// (its count is zeroed as it is done, so penalty_count_ is all zero between calls).
void sampler::apply_penalties() {
    const float rp = params_.repeat_penalty, fp = params_.frequency_penalty, pp = params_.presence_penalty;
    if ((rp == 1.0f && fp == 0.0f && pp == 0.0f) || history_size_ == 0) return;
    for (size_t i = 0; i < history_size_; ++i) penalty_count_[history_[i]]++;
    for (size_t i = 0; i < history_size_; ++i) {
        const int32_t id = history_[i];
        const uint32_t c = penalty_count_[id];
        if (c == 0) continue;
        penalty_count_[id] = 0;
        float& l = cand_[id].logit;  // cand_ is still in id order here
        if (rp != 1.0f) l = l <= 0.0f ? l * rp : l / rp;
        l -= (float)c * fp + pp;
    }
}

int32_t sampler::sample_greedy() const {
    size_t best = 0;
    for (size_t i = 1; i < cand_.size(); ++i)
        if (cand_[i].logit > cand_[best].logit) best = i;  // strict: ties keep the lowest id
    return cand_[best].id;
}

// Total order: higher logit first, equal logits by ascending id. Being total, it
// makes the selected sets and their order independent of the standard library.
static bool candidate_better(float la, int32_t ia, float lb, int32_t ib) {
    return la > lb || (la == lb && ia < ib);
}

void sampler::select_top_k(size_t k) {
    auto better = [](const candidate& a, const candidate& b) {
        return candidate_better(a.logit, a.id, b.logit, b.id);
    };
    // Heap of the k best seen so far, worst on top: most candidates lose one
    // comparison against the top and cost nothing more.
    candidate* c = cand_.data();
    std::make_heap(c, c + k, better);
    for (size_t i = k; i < cand_.size(); ++i) {
        if (!better(c[i], c[0])) continue;
        std::pop_heap(c, c + k, better);
        c[k - 1] = c[i];
        std::push_heap(c, c + k, better);
    }
    std::sort_heap(c, c + k, better);  // best first
}

// Buckets of width 1/8 logit below the best one; everything further than 32 below
// (relative probability < 1e-14) shares the last bucket.
static constexpr int top_p_n_buckets = 256;
static constexpr float top_p_buckets_per_logit = 8.0f;

static inline int top_p_bucket(float max_logit, float logit) {
    const float d = (max_logit - logit) * top_p_buckets_per_logit;
    return d < (float)(top_p_n_buckets - 1) ? (int)d : top_p_n_buckets - 1;
}

size_t sampler::select_top_p_bucketed(size_t n, double target, float max_logit) {
    double mass[top_p_n_buckets] = {};
    size_t count[top_p_n_buckets] = {};
    for (size_t i = 0; i < n; ++i) {
        const int b = top_p_bucket(max_logit, cand_[i].logit);
        mass[b] += cand_[i].w;
        count[b]++;
    }
    // Every bucket before `cross` is kept whole; the cut falls inside `cross`.
    double cum = 0.0;
    int cross = -1;
    for (int b = 0; b < top_p_n_buckets; ++b) {
        if (cum + mass[b] >= target) {
            cross = b;
            break;
        }
        cum += mass[b];
    }
    if (cross < 0) return n;  // rounding kept the sum below target: keep everything
    size_t n_above = 0;
    for (int b = 0; b < cross; ++b) n_above += count[b];

    // Regroup into scratch_: [kept buckets, id order | crossing bucket], then order
    // only the crossing bucket and cut it where the cumulative probability reaches target.
    size_t out_above = 0, out_cross = n_above;
    for (size_t i = 0; i < n; ++i) {
        const int b = top_p_bucket(max_logit, cand_[i].logit);
        if (b < cross)
            scratch_[out_above++] = cand_[i];
        else if (b == cross)
            scratch_[out_cross++] = cand_[i];
    }
    std::sort(scratch_.begin() + n_above, scratch_.begin() + out_cross, [](const candidate& a, const candidate& b) {
        return candidate_better(a.logit, a.id, b.logit, b.id);
    });
    size_t kept = n_above;
    while (kept < out_cross) {
        cum += scratch_[kept++].w;
        if (cum >= target) break;
    }
    cand_.swap(scratch_);  // both hold n_vocab entries: no allocation
    return kept;
}

double sampler::draw_uniform() {
    return (double)(rng_() >> 11) * (1.0 / 9007199254740992.0);  // 53 random bits / 2^53
}

int32_t sampler::sample(const float* logits) {
    ZK_ASSERT(logits != nullptr);
    const size_t n_vocab = cand_.size();
    bool has_nan = false;
    for (size_t i = 0; i < n_vocab; ++i) {
        has_nan |= logits[i] != logits[i];
        cand_[i] = {logits[i], (int32_t)i, 0.0f};
    }
    if (has_nan) ZK_THROW("sampler: the logits contain NaN (n_vocab %zu)", n_vocab);
    apply_penalties();
    if (params_.temp == 0.0f) return sample_greedy();

    // cand_[0, n) are the live candidates; when `sorted`, they are ordered best-first.
    size_t n = n_vocab;
    bool sorted = false;

    // top-k
    if (params_.top_k > 0 && (size_t)params_.top_k < n) {
        n = (size_t)params_.top_k;
        select_top_k(n);
        sorted = true;
    }

    float max_logit = cand_[0].logit;
    if (!sorted)
        for (size_t i = 1; i < n; ++i) max_logit = std::max(max_logit, cand_[i].logit);
    if (!std::isfinite(max_logit))
        ZK_THROW("sampler: the largest logit is %g; need a finite value", (double)max_logit);

    // Probabilities at T = 1 relative to the best: w = p / p_max. top-p measures
    // against the normalizer z of the whole top-k set.
    const bool use_top_p = params_.top_p < 1.0f;
    double z = 0.0;
    if (use_top_p) {
        for (size_t i = 0; i < n; ++i) {
            cand_[i].w = std::exp(cand_[i].logit - max_logit);
            z += cand_[i].w;
        }
    }

    // min-p: keep p >= min_p * p_max, i.e. logit >= max_logit + log(min_p). It runs
    // before top-p here because both keep a best-first prefix of the same order, so
    // they commute, and min-p is a cheap O(n) pass that leaves top-p less to do.
    if (params_.min_p > 0.0f) {
        const float min_logit = max_logit + std::log(params_.min_p);
        size_t out = 0;
        for (size_t i = 0; i < n; ++i)
            if (cand_[i].logit >= min_logit) cand_[out++] = cand_[i];  // keeps the order
        n = out;
    }

    // top-p: the shortest best-first prefix whose probability reaches top_p (>= 1 token).
    if (use_top_p) {
        const double target = (double)params_.top_p * z;
        if (sorted) {
            double cum = 0.0;
            size_t i = 0;
            while (i < n) {
                cum += cand_[i++].w;
                if (cum >= target) break;
            }
            n = i;
        } else {
            n = select_top_p_bucketed(n, target, max_logit);
        }
    }

    // temperature + draw. The best candidate always survives, so max_logit still holds.
    const float inv_temp = 1.0f / params_.temp;
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) {
        cand_[i].w = std::exp((cand_[i].logit - max_logit) * inv_temp);
        total += cand_[i].w;
    }
    const double u = draw_uniform() * total;
    double acc = 0.0;
    for (size_t i = 0; i < n; ++i) {
        acc += cand_[i].w;
        if (u < acc) return cand_[i].id;
    }
    // Only reachable through rounding in acc: the last candidate with weight.
    for (size_t i = n; i-- > 0;)
        if (cand_[i].w > 0.0f) return cand_[i].id;
    return cand_[0].id;
}

}  // namespace zk
