// `zack run`: one-shot answers (-p / -f), plain completion (--raw) and an
// interactive multi-turn chat (engine/conversation.h keeps its history in the KV
// cache and makes room when the context fills; main/line_edit.h reads the input).
//
// Exit status: 0; 1 for an error; 2 for bad flags; 3 when a one-shot reply (-p,
// --raw) stopped because the context was full (its text is printed, and a line on
// stderr says so); 130 for Ctrl-C at the chat prompt.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/chat.h"
#include "engine/conversation.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "engine/unicode.h"
#include "ggml-like/error.h"
#include "ggml-like/file_out.h"
#include "ggml-like/interrupt.h"
#include "main/commands.h"
#include "main/line_edit.h"

namespace zk {

namespace {

constexpr int k_exit_context_full = 3;

std::atomic<bool> g_interrupt{false};
std::atomic<bool> g_generating{false};

// Ctrl-C stops the reply being generated; at the chat prompt it quits.
void on_sigint(int) {
    if (g_generating.load()) {
        g_interrupt.store(true);
    } else {
        const char nl = '\n';
        (void)!write(STDERR_FILENO, &nl, 1);
        interrupt_remove_temps();
        _exit(130);
    }
}

// Marks a reply in progress for the SIGINT handler, exception-safe.
struct generating_scope {
    generating_scope() {
        g_interrupt.store(false);
        g_generating.store(true);
    }
    ~generating_scope() { g_generating.store(false); }
};

bool g_mid_line = false;  // stdout's last text did not end a line

void print_text(const std::string& s) {
    file_out_stdout(s);
    if (!s.empty()) g_mid_line = s.back() != '\n';
}

// A line on stderr, on a line of its own when a reply is being printed.
void print_notice(const std::string& s) {
    std::fprintf(stderr, "%s[%s]\n", g_mid_line ? "\n" : "", s.c_str());
}

void print_timings(const generate_stats& st) {
    std::fprintf(stderr, "[prompt: %lld tokens in %.2f s (%.1f tok/s); generated: %lld tokens in %.2f s (%.1f tok/s); stop: %s]\n",
                 (long long)st.n_prompt, st.prefill_s, st.n_prompt / std::max(st.prefill_s, 1e-9),
                 (long long)st.n_gen, st.gen_s, st.n_gen / std::max(st.gen_s, 1e-9),
                 stop_reason_name(st.reason));
}

chat_template pick_template(const model& m, const run_opts& ro) {
    if (!ro.chat_template.empty()) return chat_template_from_name(ro.chat_template);
    return model_chat_template(m);
}

void check_utf8(const std::string& s, const char* what) {
    const size_t bad = unicode_utf8_invalid_at(s);
    if (bad != std::string::npos)
        ZK_THROW("%s is not valid UTF-8: byte 0x%02x at offset %zu", what, (unsigned)(unsigned char)s[bad], bad);
}

std::string read_prompt_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) ZK_THROW("%s: cannot read the prompt file", path.c_str());
    std::ostringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    if (!text.empty() && text.back() == '\n') text.pop_back();  // as llama.cpp's -f
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.empty()) ZK_THROW("%s: the prompt file is empty", path.c_str());
    return text;
}

// ---------------------------------------------------------------------------
// Chat commands
// ---------------------------------------------------------------------------

const char* k_chat_help =
    "commands:\n"
    "  /help          this list\n"
    "  /clear         forget the conversation (the system message stays)\n"
    "  /save FILE     write the conversation to FILE as JSON {\"messages\": [{\"role\", \"content\"}, ...]}\n"
    "  /load FILE     continue the conversation saved in FILE\n"
    "  /exit, /quit, /bye, Ctrl-D   leave\n"
    "input: end a line with \\ to go on on the next line; \"\"\" opens and closes a block of lines;\n"
    "a pasted block is taken whole; //text sends /text. Up/Down recall earlier input (~/.zack_history).\n"
    "Ctrl-C stops a reply; at an empty prompt it quits.\n";

void chat_save(const conversation& conv, const std::string& path) {
    nlohmann::json msgs = nlohmann::json::array();
    for (const chat_message& m : conv.messages()) msgs.push_back({{"role", m.role}, {"content", m.content}});
    const nlohmann::json j = {{"messages", msgs}};
    file_out_write(path, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

std::vector<chat_message> chat_read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) ZK_THROW("%s: cannot read", path.c_str());
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
        ZK_THROW("%s: not JSON: %s", path.c_str(), e.what());
    }
    const nlohmann::json& arr = j.is_object() && j.contains("messages") ? j["messages"] : j;
    if (!arr.is_array()) ZK_THROW("%s: expected {\"messages\": [...]}", path.c_str());
    std::vector<chat_message> msgs;
    for (size_t i = 0; i < arr.size(); i++) {
        const nlohmann::json& m = arr[i];
        if (!m.is_object() || !m.contains("role") || !m.contains("content") || !m["role"].is_string() ||
            !m["content"].is_string())
            ZK_THROW("%s: message %zu needs string fields \"role\" and \"content\"", path.c_str(), i);
        msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    return msgs;
}

// Handles a line starting with '/'; returns false for /exit.
bool chat_command(const std::string& line, conversation& conv) {
    const size_t sp = line.find(' ');
    const std::string cmd = line.substr(0, sp);
    std::string arg = sp == std::string::npos ? "" : line.substr(sp + 1);
    while (!arg.empty() && arg.back() == ' ') arg.pop_back();
    if (cmd == "/exit" || cmd == "/quit" || cmd == "/bye") return false;
    if (cmd == "/help" || cmd == "/?") {
        std::fputs(k_chat_help, stderr);
    } else if (cmd == "/clear") {
        conv.clear();
        print_notice("chat cleared");
    } else if (cmd == "/save" || cmd == "/load") {
        if (arg.empty()) {
            print_notice(cmd + " needs a file name: " + cmd + " FILE");
            return true;
        }
        try {
            if (cmd == "/save") {
                chat_save(conv, arg);
                print_notice(strfmt("saved %zu messages to %s", conv.messages().size(), arg.c_str()));
            } else {
                conv.set_messages(chat_read(arg));
                print_notice(strfmt("loaded %zu messages from %s", conv.messages().size(), arg.c_str()));
            }
        } catch (const error& e) {
            print_notice(cmd + ": " + e.what());
        }
    } else {
        print_notice("unknown command " + cmd + "; /help lists the commands (//text sends /text)");
    }
    return true;
}

int run_chat(conversation& conv, const conversation_params& cp, const model_opts& mo, bool color) {
    const char* home = std::getenv("HOME");
    const bool tty = isatty(STDIN_FILENO) && isatty(STDERR_FILENO);
    line_editor ed(tty && home && *home ? std::string(home) + "/.zack_history" : "");
    std::fprintf(stderr, "zack chat. Type a message; /help lists the commands, /exit or Ctrl-D quits, "
                 "Ctrl-C stops a reply.\n");
    const std::string in_color = color ? "\x1b[32m" : "";
    const std::string prompt = color ? "\x1b[33m> \x1b[0m" : "> ";
    for (;;) {
        std::string line;
        const line_status st = ed.read(prompt, "... ", in_color, &line);
        if (st == line_status::END) break;
        if (st == line_status::INTERRUPT) return 130;
        if (line.empty()) continue;
        ed.history_add(line);
        if (line[0] == '/' && line.compare(0, 2, "//") != 0) {
            if (!chat_command(line, conv)) break;
            continue;
        }
        if (line.compare(0, 2, "//") == 0) line.erase(0, 1);
        const size_t bad = unicode_utf8_invalid_at(line);
        if (bad != std::string::npos) {
            print_notice(strfmt("not sent: the input is not valid UTF-8 (byte 0x%02x at offset %zu)",
                                (unsigned)(unsigned char)line[bad], bad));
            continue;
        }
        conversation_reply r;
        {
            generating_scope gs;
            r = conv.reply(line, cp, print_text, print_notice, &g_interrupt);
        }
        if (r.refused) {
            print_notice(r.refusal);
            continue;
        }
        print_text("\n");
        if (r.stats.reason == stop_reason::INTERRUPTED) print_notice("stopped");
        if (mo.verbose) print_timings(r.stats);
    }
    return 0;
}

}  // namespace

int cmd_run(const model_opts& mo, const sampler_params& sp, const run_opts& ro_in) {
    run_opts ro = ro_in;
    if (ro.color.empty()) ro.color = "off";
    if (ro.color != "on" && ro.color != "off" && ro.color != "auto")
        ZK_THROW("--color takes on, off or auto, got '%s'", ro.color.c_str());
    if (ro.escape && ro.no_escape) ZK_THROW("give -e (--escape) or --no-escape, not both");
    if (!ro.prompt_file.empty()) {
        if (ro.has_prompt) ZK_THROW("give the prompt with -p or -f FILE, not both");
        ro.prompt = read_prompt_file(ro.prompt_file);
        ro.has_prompt = true;
    }
    if (ro.escape) {
        ro.prompt = options_unescape(ro.prompt);
        ro.system = options_unescape(ro.system);
        for (std::string& r : ro.reverse) r = options_unescape(r);
    }
    check_utf8(ro.prompt, ro.prompt_file.empty() ? "the prompt (-p)" : ro.prompt_file.c_str());
    check_utf8(ro.system, "the system message (--system)");
    for (const std::string& r : ro.reverse) check_utf8(r, "a reverse prompt (-r)");
    if (ro.raw && !ro.has_prompt) ZK_THROW("--raw needs a prompt (-p TEXT or -f FILE)");
    if (ro.raw && ro.interactive) ZK_THROW("--raw (-no-cnv) continues text once; it does not go with -i/-cnv");
    const bool color = ro.color == "on" || (ro.color == "auto" && isatty(STDERR_FILENO));

    sampler_validate_params(sp);
    session_params sparams = options_session_params(mo);
    auto m = model_load(mo.model_path);
    options_resolve_ranks(mo, *m, sparams);
    session s(*m, sparams);
    sampler smp(sp, m->hp.n_vocab);
    if (mo.verbose) {
        std::fprintf(stderr, "model: %s\n", model_describe(*m).c_str());
        std::fprintf(stderr, "kv cache: %s; threads %d; seed %llu%s\n", s.cache().describe(m->hp.head_dim).c_str(),
                     sparams.n_threads, (unsigned long long)smp.seed(),
                     sp.seed == sampler_seed_random ? " (random)" : "");
        if (!sparams.ranks_k.empty()) {
            long sk = 0, sv = 0;
            for (size_t i = 0; i < sparams.ranks_k.size(); i++) sk += sparams.ranks_k[i], sv += sparams.ranks_v[i];
            std::fprintf(stderr, "zack: mean rank K %.1f, V %.1f of %d (%.1f%% of K/V dims removed)\n",
                         (double)sk / sparams.ranks_k.size(), (double)sv / sparams.ranks_v.size(), m->hp.head_dim,
                         100.0 * (1.0 - (double)(sk + sv) / (2.0 * m->hp.head_dim * sparams.ranks_k.size())));
        }
        for (const std::string& n : options_llama_notes(mo)) std::fprintf(stderr, "note: %s\n", n.c_str());
    }

    struct sigaction sa = {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);

    conversation_params cp;
    cp.n_predict = ro.n_predict;
    cp.stop_texts = ro.reverse;

    if (ro.raw) {
        const std::vector<int32_t> ids = m->voc->encode(ro.prompt, true, true);
        generate_stats st;
        {
            generating_scope gs;
            st = generate_run(s, smp, ids, ro.n_predict, print_text, &g_interrupt,
                              cp.stop_texts.empty() ? nullptr : &cp.stop_texts);
        }
        // On a terminal the shell prompt then starts on its own line; into a pipe or
        // a file the output stays exactly the continuation.
        if (isatty(STDOUT_FILENO) && (st.text.empty() || st.text.back() != '\n')) print_text("\n");
        if (mo.verbose) print_timings(st);
        if (st.reason == stop_reason::CONTEXT_FULL) {
            print_notice(strfmt("context full: the completion stopped at the context size of %lld tokens (raise -c "
                                "for longer output)", (long long)s.n_ctx()));
            return k_exit_context_full;
        }
        return 0;
    }

    conversation conv(s, smp, pick_template(*m, ro), ro.system);
    if (!ro.has_prompt) return run_chat(conv, cp, mo, color);

    conversation_reply r;
    {
        generating_scope gs;
        r = conv.reply(ro.prompt, cp, print_text, print_notice, &g_interrupt);
    }
    if (r.refused) ZK_THROW("%s", r.refusal.c_str());
    print_text("\n");
    if (mo.verbose) print_timings(r.stats);
    if (ro.interactive) return run_chat(conv, cp, mo, color);
    return r.stats.reason == stop_reason::CONTEXT_FULL ? k_exit_context_full : 0;
}

}  // namespace zk
