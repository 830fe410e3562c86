// tool_chat: renders conversations with zk::chat_apply for the python tests.
//   tool_chat CASE.json            prints chat_apply's output to stdout, byte for byte
//   tool_chat --detect CASE.json   prints "<kind name>\n<default system text>"
//   tool_chat --batch CASES.json   CASES.json is an array of cases; prints a JSON array
//                                  of {"ok": bool, "text": output, "error": message}
// A case: {"template": "<jinja source or empty>", "name": "<optional kind name>",
//          "messages": [{"role": ..., "content": ...}, ...], "add_generation_prompt": bool}
// A non-empty "name" overrides detection from "template". In the single-case modes
// errors (zk::error, e.g. roles that do not alternate) go to stderr, exit status 1.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/chat.h"
#include "ggml-like/error.h"

static zk::chat_template tool_template(const nlohmann::json& c) {
    const std::string name = c.value("name", std::string());
    return name.empty() ? zk::chat_template_detect(c.value("template", std::string()))
                        : zk::chat_template_from_name(name);
}

static std::string tool_render(const nlohmann::json& c) {
    std::vector<zk::chat_message> msgs;
    for (const auto& m : c.at("messages"))
        msgs.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
    return zk::chat_apply(tool_template(c), msgs, c.value("add_generation_prompt", false));
}

int main(int argc, char** argv) {
    const std::string mode = argc == 3 ? argv[1] : "";
    if (!(argc == 2 || (argc == 3 && (mode == "--detect" || mode == "--batch")))) {
        std::fprintf(stderr, "usage: %s [--detect | --batch] CASE.json\n", argv[0]);
        return 2;
    }
    const char* path = argv[argc - 1];
    try {
        std::ifstream in(path, std::ios::binary);
        if (!in) ZK_THROW("tool_chat: cannot open '%s'", path);
        const nlohmann::json j = nlohmann::json::parse(in);
        std::string out;
        if (mode == "--batch") {
            nlohmann::json results = nlohmann::json::array();
            for (const auto& c : j) {
                try {
                    results.push_back({{"ok", true}, {"text", tool_render(c)}, {"error", ""}});
                } catch (const zk::error& e) {
                    results.push_back({{"ok", false}, {"text", ""}, {"error", e.what()}});
                }
            }
            out = results.dump();
        } else if (mode == "--detect") {
            const zk::chat_template t = tool_template(j);
            out = std::string(zk::chat_template_name(t.kind)) + "\n" + t.default_system;
        } else {
            out = tool_render(j);
        }
        std::fwrite(out.data(), 1, out.size(), stdout);
        return std::fflush(stdout) == 0 ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
