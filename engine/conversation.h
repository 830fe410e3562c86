// A multi-turn chat on one session: the history stays in the KV cache (each
// turn feeds only the new text), and the context never gets stuck.
//
// Context management (what Ollama does, truthfully reported):
// - Before a turn, the rendered history plus the new message must leave room
//   for the reply: `reserve` tokens (n_predict when set, at most half the
//   context; otherwise a quarter of it). If it does not, the oldest whole turns
//   (a user message and the replies after it) are dropped, the system message
//   always kept, until it does; the cache is then rebuilt from the remaining
//   history (one prefill). If only the new message is left and it still does not
//   fit with at least one token of room, the turn is refused and nothing changes.
// - When the reply itself fills the context and older turns remain, they are
//   dropped the same way (leaving a quarter of the context free) and the reply
//   goes on from where it was, after a re-prefill of what is left plus the reply
//   so far. With nothing left to drop the reply stops there (CONTEXT_FULL).
// Every drop is reported once through on_notice, with the turns and tokens
// dropped. (Shifting the cache in place, as llama.cpp does, would need the
// quantized and compressed cache layouts to re-rotate their keys; a re-prefill
// works for every layout.)
#pragma once
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "engine/chat.h"
#include "engine/generate.h"

namespace zk {

struct conversation_reply {
    generate_stats stats;       // of the last generate_run; text and n_gen cover the whole reply
    bool refused = false;       // the message does not fit even alone: nothing was generated
    std::string refusal;        // why, one line (not sent to on_notice)
    int turns_dropped = 0;      // over this reply (before it and while it ran)
    int64_t tokens_prefilled = 0;  // tokens fed as prompt (delta or rebuild), over this reply
};

struct conversation_params {
    int64_t n_predict = -1;                  // tokens per reply (-1 = until end of generation)
    std::vector<std::string> stop_texts;     // reverse prompts
};

class conversation {
public:
    // system: the system message ("" = none; the template may add its own default).
    conversation(session& s, sampler& smp, chat_template tpl, std::string system);

    // Adds `user` and generates the reply, streaming it to on_text; on_notice
    // gets one line per context event ("dropped the oldest 2 turns (311 tokens)
    // to make room", "the reply filled the context ..."). Throws zk::error for a
    // template error (e.g. roles that do not alternate), leaving the history as it was.
    conversation_reply reply(const std::string& user, const conversation_params& p,
                             const std::function<void(const std::string&)>& on_text,
                             const std::function<void(const std::string&)>& on_notice,
                             const std::atomic<bool>* interrupt);

    // Forgets every turn (keeps the system message) and empties the cache.
    void clear();
    // Replaces the history (a leading "system" message becomes the system
    // message); the cache is rebuilt at the next turn. Validates the roles by
    // rendering it; throws zk::error otherwise.
    void set_messages(const std::vector<chat_message>& msgs);
    // The whole history, system message first when there is one.
    std::vector<chat_message> messages() const;

    // Tokens the rendered history would take from scratch (BOS included).
    int64_t n_tokens_rendered(const std::vector<chat_message>& msgs, bool add_generation_prompt) const;

private:
    std::vector<chat_message> with_system(const std::vector<chat_message>& turns) const;
    // Rebuilds the cache from `text` (the rendered history, maybe plus a partial reply).
    void rebuild(const std::string& text);

    session& s_;
    sampler& smp_;
    chat_template tpl_;
    std::string system_;
    std::vector<chat_message> turns_;  // user/assistant messages, oldest first
    std::string cached_;               // the text whose tokens are in the cache (BOS aside)
    bool cache_valid_ = true;
};

}  // namespace zk
