// The generation loop shared by `zack run` (one-shot and chat) and later bench
// and eval: feed a prompt, then sample and feed one token at a time, streaming
// each token's text as valid UTF-8.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/session.h"

namespace zk {

enum class stop_reason { END_OF_GENERATION, LENGTH, CONTEXT_FULL, INTERRUPTED, STOP_TEXT };
const char* stop_reason_name(stop_reason r);

struct generate_stats {
    int64_t n_prompt = 0;
    int64_t n_gen = 0;
    double prefill_s = 0;
    double gen_s = 0;
    stop_reason reason = stop_reason::LENGTH;
    std::string text;  // everything generated, as printed
    bool last_cached = true;  // false when the context filled before the last token was fed
};

// Feeds `prompt` (must fit: throws a clear error otherwise), then generates up to
// n_predict tokens (< 0: until end of generation or a full context). on_text gets
// each printable UTF-8 chunk. `interrupt` (may be null) stops generation when set.
// `stop_texts` (may be null; llama.cpp's reverse prompts): generation stops, with
// STOP_TEXT, after the token whose text completes one of them (that token is
// printed and fed). The sampled end-of-generation token is not fed to the cache.
generate_stats generate_run(session& s, sampler& smp, const std::vector<int32_t>& prompt,
                            int64_t n_predict, const std::function<void(const std::string&)>& on_text,
                            const std::atomic<bool>* interrupt, const std::vector<std::string>* stop_texts = nullptr);

}  // namespace zk
