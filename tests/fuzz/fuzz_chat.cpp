// Fuzz target "chat": template selection from arbitrary Jinja source (and the
// --chat-template name), then rendering arbitrary conversations.
// Input: the template text up to a NUL, a flags byte, then messages separated by
// NULs, each a role byte and its content. Checked: rendering a conversation
// without the generation prompt gives a prefix of rendering it with more
// messages (chat.h's prefix property, which multi-turn chat relies on).
// Seeds: the real templates of tests/data/chat_templates.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "engine/chat.h"
#include "ggml-like/error.h"
#include "tests/fuzz/fuzz_targets.h"

namespace zk_fuzz {

void fuzz_chat_init() {}

void fuzz_chat_one(const uint8_t* data, size_t size) {
    fuzz_reader in(data, size);
    const std::string src = in.until('\0');
    const uint8_t flags = in.byte();
    static const char* const roles[] = {"system", "user", "assistant", "tool", ""};
    std::vector<zk::chat_message> msgs;
    while (!in.done()) {
        const uint8_t r = in.byte();
        msgs.push_back({roles[r % 5], in.until('\0')});
    }
    try {
        (void)zk::chat_template_from_name(src);
    } catch (const zk::error&) {
    }
    const zk::chat_template t = zk::chat_template_detect(src);
    std::string full;
    try {
        full = zk::chat_apply(t, msgs, flags & 1);
    } catch (const zk::error&) {
        return;  // a conversation the template's family refuses (roles must alternate)
    }
    for (size_t k = 0; k <= msgs.size(); k++) {
        const std::vector<zk::chat_message> head(msgs.begin(), msgs.begin() + k);
        const std::string part = zk::chat_apply(t, head, false);
        if (full.compare(0, part.size(), part) != 0) {
            std::fprintf(stderr, "fuzz chat: %s: the first %zu messages do not render a prefix\n",
                         zk::chat_template_name(t.kind), k);
            std::abort();
        }
    }
}

std::vector<std::pair<std::string, std::string>> fuzz_chat_seeds() {
    std::vector<std::pair<std::string, std::string>> out;
    const std::string conv = std::string("\x01\x00", 2) + "You are terse." + std::string(1, '\0') + "\x01" +
                             "Hi there " + std::string(1, '\0') + "\x02" + " Hello! " + std::string(1, '\0') +
                             "\x01" + "\xE2\x80\x83 again\n";
    const std::string dir = std::string(ZACK_SOURCE_DIR) + "/tests/data/chat_templates";
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
        if (e.path().extension() != ".jinja") continue;
        std::ifstream f(e.path(), std::ios::binary);
        const std::string src(std::istreambuf_iterator<char>(f), {});
        out.push_back({e.path().stem().string(), src + std::string(1, '\0') + conv});
    }
    for (const char* name : {"chatml", "llama3", "llama2", "gemma"})
        out.push_back({std::string("name_") + name, std::string(name) + std::string(1, '\0') + conv});
    return out;
}

}  // namespace zk_fuzz
