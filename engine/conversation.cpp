// A multi-turn chat with context management; the rules are in conversation.h.
#include "engine/conversation.h"

#include <algorithm>

#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "ggml-like/error.h"

namespace zk {

namespace {

// Drops the oldest turn of t (everything before its second user message);
// false when fewer than two user messages are left.
bool conversation_drop_oldest(std::vector<chat_message>& t) {
    size_t first = 0;
    while (first < t.size() && t[first].role != "user") first++;
    size_t next = first + 1;
    while (next < t.size() && t[next].role != "user") next++;
    if (next >= t.size()) return false;
    t.erase(t.begin(), t.begin() + (long)next);
    return true;
}

std::string conversation_turns_word(int n) { return n == 1 ? "turn" : strfmt("%d turns", n); }

}  // namespace

conversation::conversation(session& s, sampler& smp, chat_template tpl, std::string system)
    : s_(s), smp_(smp), tpl_(std::move(tpl)), system_(std::move(system)) {}

std::vector<chat_message> conversation::with_system(const std::vector<chat_message>& turns) const {
    std::vector<chat_message> out;
    if (!system_.empty()) out.push_back({"system", system_});
    out.insert(out.end(), turns.begin(), turns.end());
    return out;
}

std::vector<chat_message> conversation::messages() const { return with_system(turns_); }

int64_t conversation::n_tokens_rendered(const std::vector<chat_message>& msgs, bool add_generation_prompt) const {
    return (int64_t)s_.mdl().voc->encode(chat_apply(tpl_, msgs, add_generation_prompt), true, true).size();
}

void conversation::clear() {
    turns_.clear();
    s_.reset();
    smp_.reset();
    cached_.clear();
    cache_valid_ = true;
}

void conversation::set_messages(const std::vector<chat_message>& msgs) {
    std::string system = system_;
    std::vector<chat_message> turns;
    for (size_t i = 0; i < msgs.size(); i++) {
        const chat_message& m = msgs[i];
        if (m.role == "system" && i == 0) {
            system = m.content;
            continue;
        }
        if (m.role != "user" && m.role != "assistant")
            ZK_THROW("message %zu has role '%s' (a chat has one leading system message, then user and assistant)",
                     i, m.role.c_str());
        turns.push_back(m);
    }
    std::vector<chat_message> all;
    if (!system.empty()) all.push_back({"system", system});
    all.insert(all.end(), turns.begin(), turns.end());
    chat_apply(tpl_, all, true);  // throws for what the template rejects
    system_ = system;
    turns_ = turns;
    s_.reset();
    cached_.clear();
    cache_valid_ = false;
}

void conversation::rebuild(const std::string& text) {
    s_.reset();
    cached_ = text;
    cache_valid_ = true;
}

conversation_reply conversation::reply(const std::string& user, const conversation_params& p,
                                       const std::function<void(const std::string&)>& on_text,
                                       const std::function<void(const std::string&)>& on_notice,
                                       const std::atomic<bool>* interrupt) {
    const vocab& voc = *s_.mdl().voc;
    const int64_t C = s_.n_ctx();
    const int64_t reserve = p.n_predict > 0 ? std::min<int64_t>(p.n_predict, C / 2) : C / 4;
    conversation_reply r;

    std::vector<chat_message> t = turns_;
    t.push_back({"user", user});
    std::string prompt = chat_apply(tpl_, with_system(t), true);  // throws before anything changes

    // The new text on top of what the cache holds, when it still leaves room.
    std::vector<int32_t> ids;
    bool incremental = cache_valid_ && s_.n_past() > 0 && prompt.compare(0, cached_.size(), cached_) == 0;
    if (incremental) {
        ids = voc.encode(std::string_view(prompt).substr(cached_.size()), false, true);
        incremental = s_.n_past() + (int64_t)ids.size() + reserve <= C;
    }
    if (!incremental) {
        // Rebuild from the history, dropping the oldest turns until the reply has room.
        int64_t n = n_tokens_rendered(with_system(t), true);
        const int64_t before = n;
        int dropped = 0;
        while (n + reserve > C && conversation_drop_oldest(t)) {
            dropped++;
            n = n_tokens_rendered(with_system(t), true);
        }
        if (n >= C) {
            r.refused = true;
            r.refusal = (strfmt("this message needs %lld tokens%s, more than the context of %lld tokens holds with room "
                             "for a reply: not sent; shorten it or restart with a larger -c",
                             (long long)n, system_.empty() ? "" : " with the system message", (long long)C));
            return r;
        }
        if (dropped > 0) {
            on_notice(strfmt("context: dropped the oldest %s (%lld tokens) to make room; the model no longer sees "
                             "them", conversation_turns_word(dropped).c_str(), (long long)(before - n)));
            r.turns_dropped += dropped;
        }
        prompt = chat_apply(tpl_, with_system(t), true);
        rebuild(prompt);
        ids = voc.encode(prompt, true, true);
    }
    turns_ = t;  // the user message is in; the reply follows

    std::string reply_text;
    int64_t n_gen = 0;
    double prefill_s = 0, gen_s = 0;
    std::string fed = prompt;  // the text whose tokens are (or are about to be) in the cache
    for (;;) {
        const int64_t left = p.n_predict < 0 ? -1 : p.n_predict - n_gen;
        generate_stats st = generate_run(s_, smp_, ids, left, on_text, interrupt,
                                         p.stop_texts.empty() ? nullptr : &p.stop_texts);
        r.tokens_prefilled += (int64_t)ids.size();
        reply_text += st.text;
        n_gen += st.n_gen;
        prefill_s += st.prefill_s;
        gen_s += st.gen_s;
        fed += st.text;
        r.stats = st;
        if (st.reason != stop_reason::CONTEXT_FULL || (p.n_predict >= 0 && n_gen >= p.n_predict)) break;

        // The reply filled the context: make room by dropping older turns, if any.
        std::vector<chat_message> shrunk = turns_;
        const int64_t before = (int64_t)voc.encode(chat_apply(tpl_, with_system(shrunk), true) + reply_text, true,
                                                   true).size();
        int64_t n = before;
        int dropped = 0;
        while (n + C / 4 > C && conversation_drop_oldest(shrunk)) {
            dropped++;
            n = (int64_t)voc.encode(chat_apply(tpl_, with_system(shrunk), true) + reply_text, true, true).size();
        }
        if (dropped == 0 || n >= C) {
            on_notice(strfmt("context full: the reply stopped at the context size of %lld tokens (raise -c for "
                             "longer replies)", (long long)C));
            cache_valid_ = false;  // the last token was printed but not fed
            break;
        }
        on_notice(strfmt("context: the reply reached the context size (%lld tokens); dropped the oldest %s (%lld "
                         "tokens) and went on", (long long)C, conversation_turns_word(dropped).c_str(),
                         (long long)(before - n)));
        r.turns_dropped += dropped;
        turns_ = shrunk;
        fed = chat_apply(tpl_, with_system(turns_), true) + reply_text;
        rebuild(fed);
        ids = voc.encode(fed, true, true);
    }
    r.stats.text = reply_text;
    r.stats.n_gen = n_gen;
    r.stats.n_prompt = r.tokens_prefilled;
    r.stats.prefill_s = prefill_s;
    r.stats.gen_s = gen_s;
    turns_.push_back({"assistant", reply_text});
    if (cache_valid_) cached_ = fed;
    return r;
}

}  // namespace zk
