#include "engine/generate.h"

#include <chrono>

#include "ggml-like/error.h"

namespace zk {

const char* stop_reason_name(stop_reason r) {
    switch (r) {
        case stop_reason::END_OF_GENERATION: return "end of generation";
        case stop_reason::LENGTH: return "length";
        case stop_reason::CONTEXT_FULL: return "context full";
        case stop_reason::INTERRUPTED: return "interrupted";
        case stop_reason::STOP_TEXT: return "reverse prompt";
    }
    return "?";
}

// True when a stop text ends inside the last `added` bytes of `text`.
static bool generate_ends_in_stop(const std::string& text, size_t added, const std::vector<std::string>& stops) {
    for (const std::string& t : stops) {
        if (t.empty()) continue;
        const size_t from = text.size() >= added + t.size() ? text.size() - added - t.size() + 1 : 0;
        if (text.find(t, from) != std::string::npos) return true;
    }
    return false;
}

generate_stats generate_run(session& s, sampler& smp, const std::vector<int32_t>& prompt,
                            int64_t n_predict, const std::function<void(const std::string&)>& on_text,
                            const std::atomic<bool>* interrupt, const std::vector<std::string>* stop_texts) {
    using clock = std::chrono::steady_clock;
    const vocab& voc = *s.mdl().voc;
    generate_stats st;
    st.n_prompt = (int64_t)prompt.size();
    if (prompt.empty()) ZK_THROW("the prompt is empty: nothing to generate from");
    if (s.n_past() + st.n_prompt > s.n_ctx())
        ZK_THROW("prompt of %lld tokens does not fit in the context (%lld of %lld tokens already used); "
                 "raise -c or shorten the prompt",
                 (long long)st.n_prompt, (long long)s.n_past(), (long long)s.n_ctx());

    auto t0 = clock::now();
    const float* logits = s.decode(prompt.data(), st.n_prompt);
    for (int32_t t : prompt) smp.accept(t);
    auto t1 = clock::now();
    st.prefill_s = std::chrono::duration<double>(t1 - t0).count();

    utf8_stream out;
    st.reason = stop_reason::LENGTH;
    while (n_predict < 0 || st.n_gen < n_predict) {
        if (interrupt && interrupt->load()) {
            st.reason = stop_reason::INTERRUPTED;
            break;
        }
        const int32_t tok = smp.sample(logits);
        if (voc.is_eog(tok)) {
            st.reason = stop_reason::END_OF_GENERATION;
            break;
        }
        smp.accept(tok);
        st.n_gen++;
        const std::string text = out.push(voc.token_to_piece(tok));
        if (!text.empty()) {
            st.text += text;
            on_text(text);
        }
        if (s.n_past() >= s.n_ctx()) {
            st.reason = stop_reason::CONTEXT_FULL;  // this token's text is printed but not cached
            st.last_cached = false;
            break;
        }
        // Every printed token is fed, so the cache always holds what a chat has shown.
        logits = s.decode(&tok, 1);
        if (stop_texts && !text.empty() && generate_ends_in_stop(st.text, text.size(), *stop_texts)) {
            st.reason = stop_reason::STOP_TEXT;
            break;
        }
    }
    const std::string rest = out.flush();
    if (!rest.empty()) {
        st.text += rest;
        on_text(rest);
    }
    st.gen_s = std::chrono::duration<double>(clock::now() - t1).count();
    return st;
}

}  // namespace zk
