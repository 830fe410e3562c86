// conversation (engine/conversation.h) on the real default model, greedy: a
// chat in a small context keeps answering as old turns are dropped, the system
// message stays, the cache never overflows; a reply after a drop is the reply a
// fresh chat with the remaining history gives (the rebuilt cache holds exactly
// that history); a message too long for the context is refused and changes
// nothing; set_messages validates roles.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/chat.h"
#include "engine/conversation.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "ggml-like/error.h"
#include "model_fixture.h"

namespace {

constexpr int64_t k_ctx = 192;

zk::session_params small_ctx() {
    zk::session_params p;
    p.n_ctx = k_ctx;
    p.n_threads = 2;
    return p;
}

zk::sampler_params greedy() {
    zk::sampler_params p;
    p.temp = 0.0f;
    return p;
}

zk::chat_template model_template(const zk::model& m) {
    return zk::chat_template_detect(m.file->get_str("tokenizer.chat_template", ""));
}

struct chat_rig {
    zk::session s;
    zk::sampler smp;
    zk::conversation conv;
    explicit chat_rig(const zk::model& m, const std::string& system = "You are brief.")
        : s(m, small_ctx()), smp(greedy(), m.hp.n_vocab), conv(s, smp, model_template(m), system) {}
};

std::string ignore_text_and_reply(zk::conversation& c, const std::string& user, int64_t n_predict,
                                  std::vector<std::string>* notices, zk::conversation_reply* out) {
    zk::conversation_params p;
    p.n_predict = n_predict;
    std::string text;
    *out = c.reply(user, p, [&](const std::string& t) { text += t; },
                   [&](const std::string& n) { notices->push_back(n); }, nullptr);
    return text;
}

}  // namespace

TEST(conversation, small_context_keeps_answering_and_rebuilds_exactly) {
    const zk::model& m = zk_test::source_model();
    chat_rig rig(m);
    const std::vector<std::string> turns = {"Tell me about cats.", "Tell me about dogs.", "Tell me about birds.",
                                            "Tell me about fish.", "Tell me about horses.", "Tell me about cows."};
    int dropped_turns = 0, checked_rebuilds = 0;
    for (const std::string& t : turns) {
        std::vector<std::string> notices;
        zk::conversation_reply r;
        const std::string text = ignore_text_and_reply(rig.conv, t, 40, &notices, &r);
        ASSERT_FALSE(r.refused) << r.refusal;
        EXPECT_FALSE(text.empty()) << t;
        EXPECT_EQ(text, r.stats.text);
        EXPECT_LE(rig.s.n_past(), k_ctx);
        const std::vector<zk::chat_message> msgs = rig.conv.messages();
        ASSERT_GE(msgs.size(), 3u);
        EXPECT_EQ(msgs[0].role, "system");
        EXPECT_EQ(msgs[0].content, "You are brief.");
        for (size_t i = 1; i < msgs.size(); i++) EXPECT_EQ(msgs[i].role, i % 2 == 1 ? "user" : "assistant");
        EXPECT_EQ(msgs[msgs.size() - 2].content, t);
        EXPECT_EQ(msgs.back().content, text);
        if (r.turns_dropped > 0) {
            dropped_turns += r.turns_dropped;
            ASSERT_EQ(notices.size(), 1u);
            EXPECT_NE(notices[0].find("dropped the oldest"), std::string::npos) << notices[0];
            // A fresh chat with the history that was left gives the same reply.
            chat_rig fresh(m);
            fresh.conv.set_messages(std::vector<zk::chat_message>(msgs.begin(), msgs.end() - 2));
            std::vector<std::string> n2;
            zk::conversation_reply r2;
            EXPECT_EQ(ignore_text_and_reply(fresh.conv, t, 40, &n2, &r2), text) << "turn " << t;
            EXPECT_EQ(r2.turns_dropped, 0);
            checked_rebuilds++;
        } else {
            EXPECT_TRUE(notices.empty());
        }
    }
    EXPECT_GT(dropped_turns, 0) << "a 192-token context must drop turns over six";
    EXPECT_GT(checked_rebuilds, 0);
}

TEST(conversation, too_long_message_is_refused_and_changes_nothing) {
    const zk::model& m = zk_test::source_model();
    chat_rig rig(m);
    std::vector<std::string> notices;
    zk::conversation_reply r;
    ignore_text_and_reply(rig.conv, "Hi", 8, &notices, &r);
    ASSERT_FALSE(r.refused);
    const std::vector<zk::chat_message> before = rig.conv.messages();
    const int64_t n_past = rig.s.n_past();
    std::string long_msg;
    for (int i = 0; i < 300; i++) long_msg += "word ";
    const std::string text = ignore_text_and_reply(rig.conv, long_msg, 8, &notices, &r);
    EXPECT_TRUE(r.refused);
    EXPECT_TRUE(text.empty());
    EXPECT_NE(r.refusal.find("192 tokens"), std::string::npos) << r.refusal;
    EXPECT_EQ(rig.conv.messages().size(), before.size());
    EXPECT_EQ(rig.s.n_past(), n_past);
    // and the chat goes on from the same cache
    ignore_text_and_reply(rig.conv, "Hello again", 8, &notices, &r);
    EXPECT_FALSE(r.refused);
    EXPECT_EQ(r.turns_dropped, 0);
}

TEST(conversation, clear_and_set_messages) {
    const zk::model& m = zk_test::source_model();
    chat_rig rig(m);
    std::vector<std::string> notices;
    zk::conversation_reply r;
    const std::string first = ignore_text_and_reply(rig.conv, "Hi", 12, &notices, &r);
    rig.conv.clear();
    EXPECT_EQ(rig.s.n_past(), 0);
    ASSERT_EQ(rig.conv.messages().size(), 1u);  // the system message stays
    EXPECT_EQ(ignore_text_and_reply(rig.conv, "Hi", 12, &notices, &r), first) << "a cleared chat starts over";
    EXPECT_THROW(rig.conv.set_messages({{"user", "a"}, {"tool", "b"}}), zk::error);
    EXPECT_THROW(rig.conv.set_messages({{"user", "a"}, {"system", "late"}}), zk::error);
    rig.conv.set_messages({{"system", "Other."}, {"user", "a"}, {"assistant", "b"}});
    const auto msgs = rig.conv.messages();
    ASSERT_EQ(msgs.size(), 3u);
    EXPECT_EQ(msgs[0].content, "Other.");
}
