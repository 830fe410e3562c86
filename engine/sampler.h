// Token sampler: turns one row of logits [n_vocab] into a token id.
//
// Chain (the order of llama.cpp's default chain, minus the samplers zack does not
// implement): penalties -> top-k -> top-p -> min-p -> temperature -> draw.
// Penalties (llama.cpp's semantics) look at the last repeat_last_n accepted ids:
// for an id seen c > 0 times there, the repeat penalty divides a positive logit
// (multiplies a negative one) once, then logit -= c * frequency_penalty + presence_penalty.
// temp == 0 is greedy (argmax of the penalized logits, ties -> lowest id); the
// truncation filters then do nothing. As in llama.cpp, top-p and min-p judge the
// probabilities at temperature 1 (softmax of the penalized logits that survived
// top-k); the temperature only reshapes the distribution over the survivors.
//
// Reproducibility: the PRNG is std::mt19937_64 seeded with `seed` (fully specified
// by the C++ standard), and a draw is u = (next() >> 11) * 2^-53, in [0, 1); one
// draw per non-greedy sample() call. Candidates with equal logits are ordered by
// ascending id, so the same seed, logits and history give the same tokens with any
// standard library (only a different libm exp() could move a draw that sits on a
// boundary).
//
// Cost per token: O(n_vocab). top-k keeps a heap of the k best (O(n log k) worst
// case, ~O(n) in practice); top-p without top-k buckets the candidates by logit
// and sorts only the bucket where the cumulative probability crosses top_p.
// All buffers are allocated in the constructor.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace zk {

struct sampler_params {
    float temp = 0.8f;            // 0 = greedy
    int32_t top_k = 40;           // 0 = off; values >= n_vocab are off too
    float top_p = 0.95f;          // 1 = off
    float min_p = 0.05f;          // 0 = off
    float repeat_penalty = 1.0f;  // 1 = off (llama.cpp semantics: divide positive logits, multiply negative)
    int32_t repeat_last_n = 64;   // how many accepted tokens the penalties look back on; 0 = off
    float presence_penalty = 0.0f;   // subtracted once from every id in that window (0 = off)
    float frequency_penalty = 0.0f;  // subtracted once per occurrence in that window (0 = off)
    uint64_t seed = 0xFFFFFFFF;   // 0xFFFFFFFF = random seed from the clock
};

constexpr uint64_t sampler_seed_random = 0xFFFFFFFF;

// Throws zk::error naming the offending field for nonsense: temp < 0 (or NaN),
// top_p outside (0, 1], min_p outside [0, 1), top_k < 0, repeat_penalty <= 0,
// repeat_last_n < 0, a presence or frequency penalty that is not finite.
void sampler_validate_params(const sampler_params& p);

class sampler {
public:
    // Validates p and n_vocab > 0; preallocates every buffer (no allocation per token).
    sampler(const sampler_params& p, int32_t n_vocab);

    // logits: [n_vocab] floats, not modified. Returns a token id in [0, n_vocab).
    int32_t sample(const float* logits);

    // Records a token (sampled or from the prompt) for the repetition penalty:
    // a ring buffer of the last repeat_last_n tokens. Throws for ids outside the vocab.
    void accept(int32_t token);

    // Forgets the penalty history and re-seeds the PRNG with seed(), so a reset
    // sampler repeats the sequence it produced after construction.
    void reset();

    uint64_t seed() const { return seed_; }  // the actual seed used (resolved when random)
    const sampler_params& params() const { return params_; }
    int32_t n_vocab() const { return n_vocab_; }

private:
    struct candidate {
        float logit;  // penalized logit
        int32_t id;
        float w;      // scratch weight: exp(logit - max) at T = 1, later at T = temp
    };

    void apply_penalties();
    int32_t sample_greedy() const;
    void select_top_k(size_t k);  // cand_[0, k) <- the k best of cand_, sorted best-first
    // Top-p over the unordered cand_[0, n) without sorting them all: returns the kept count.
    size_t select_top_p_bucketed(size_t n, double target, float max_logit);
    double draw_uniform();                 // [0, 1)

    sampler_params params_;
    int32_t n_vocab_;
    uint64_t seed_;
    std::mt19937_64 rng_;

    std::vector<candidate> cand_;         // [n_vocab] working set, reordered in place
    std::vector<candidate> scratch_;      // [n_vocab] second buffer for top-p regrouping
    std::vector<int32_t> history_;        // [repeat_last_n] ring buffer of accepted ids
    size_t history_head_ = 0;             // next slot to write
    size_t history_size_ = 0;             // valid entries (<= repeat_last_n)
    std::vector<uint32_t> penalty_count_; // [n_vocab] occurrences in the window; zero between calls
};

}  // namespace zk
