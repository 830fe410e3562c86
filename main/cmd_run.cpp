// `zack run`: one-shot answers (-p), plain completion (-p --raw) and an
// interactive multi-turn chat whose history stays in the KV cache.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>

#include "engine/chat.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "ggml-like/error.h"
#include "ggml-like/interrupt.h"
#include "main/commands.h"

namespace zk {

namespace {

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

void print_text(const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
}

void print_timings(const generate_stats& st) {
    std::fprintf(stderr, "[prompt: %lld tokens in %.2f s (%.1f tok/s); generated: %lld tokens in %.2f s (%.1f tok/s); stop: %s]\n",
                 (long long)st.n_prompt, st.prefill_s, st.n_prompt / std::max(st.prefill_s, 1e-9),
                 (long long)st.n_gen, st.gen_s, st.n_gen / std::max(st.gen_s, 1e-9),
                 stop_reason_name(st.reason));
}

chat_template pick_template(const model& m, const run_opts& ro) {
    if (!ro.chat_template.empty()) return chat_template_from_name(ro.chat_template);
    return chat_template_detect(m.file->get_str("tokenizer.chat_template", ""));
}

generate_stats run_turn(session& s, sampler& smp, const std::vector<int32_t>& ids, int64_t n_predict) {
    g_interrupt.store(false);
    g_generating.store(true);
    generate_stats st;
    try {
        st = generate_run(s, smp, ids, n_predict, print_text, &g_interrupt);
    } catch (...) {
        g_generating.store(false);
        throw;
    }
    g_generating.store(false);
    return st;
}

int run_chat(const model& m, session& s, sampler& smp, const model_opts& mo, const run_opts& ro) {
    const vocab& voc = *m.voc;
    const chat_template tpl = pick_template(m, ro);
    std::vector<chat_message> history;
    if (!ro.system.empty()) history.push_back({"system", ro.system});
    std::string cached;  // the text whose tokens are in the cache (BOS aside)
    const bool tty = isatty(STDIN_FILENO);
    std::fprintf(stderr, "zack chat (%s template). Type a message; /clear starts over, /exit or Ctrl-D quits, "
                 "Ctrl-C stops a reply.\n", chat_template_name(tpl.kind));
    std::string line;
    for (;;) {
        std::fprintf(stderr, "> ");
        std::fflush(stderr);
        if (!std::getline(std::cin, line)) break;
        if (line == "/exit" || line == "/quit") break;
        if (line == "/clear") {
            s.reset();
            smp.reset();
            cached.clear();
            history.resize(ro.system.empty() ? 0 : 1);
            std::fprintf(stderr, "[chat cleared]\n");
            continue;
        }
        if (line.empty()) continue;
        history.push_back({"user", line});
        const std::string full = chat_apply(tpl, history, true);
        std::string delta;
        if (full.compare(0, cached.size(), cached) == 0) {
            delta = full.substr(cached.size());
        } else {  // the template re-rendered earlier turns differently: start the cache over
            s.reset();
            delta = full;
        }
        std::vector<int32_t> ids = voc.encode(delta, s.n_past() == 0, true);
        if (s.n_past() + (int64_t)ids.size() + 1 > s.n_ctx()) {
            std::fprintf(stderr, "[context is full: %lld of %lld tokens used and this turn needs %zu more; "
                         "/clear starts a new chat, or restart with a larger -c]\n",
                         (long long)s.n_past(), (long long)s.n_ctx(), ids.size());
            history.pop_back();
            if (delta == full) cached.clear();
            continue;
        }
        const generate_stats st = run_turn(s, smp, ids, ro.n_predict);
        print_text("\n");
        if (st.reason == stop_reason::INTERRUPTED) std::fprintf(stderr, "[stopped]\n");
        if (mo.verbose) print_timings(st);
        history.push_back({"assistant", st.text});
        cached = full + st.text;
        if (st.reason == stop_reason::CONTEXT_FULL) {
            std::fprintf(stderr, "[context is full (%lld tokens): /clear starts a new chat]\n", (long long)s.n_ctx());
            cached = "\x01";  // the last token is not cached: force a fresh prefill next turn
        }
        if (!tty) std::fflush(stdout);
    }
    return 0;
}

}  // namespace

int cmd_run(const model_opts& mo, const sampler_params& sp, const run_opts& ro) {
    if (ro.raw && !ro.has_prompt) ZK_THROW("--raw needs a prompt (-p TEXT)");
    sampler_validate_params(sp);
    session_params sparams = options_session_params(mo);
    auto m = model_load(mo.model_path);
    options_resolve_ranks(mo, *m, sparams);
    session s(*m, sparams);
    sampler smp(sp, m->hp.n_vocab);
    if (mo.verbose) {
        std::fprintf(stderr, "model: %s\n", model_describe(*m).c_str());
        std::fprintf(stderr, "kv cache: %s; threads %d; seed %llu\n", s.cache().describe(m->hp.head_dim).c_str(),
                     sparams.n_threads, (unsigned long long)smp.seed());
        if (!sparams.ranks_k.empty()) {
            long sk = 0, sv = 0;
            for (size_t i = 0; i < sparams.ranks_k.size(); i++) sk += sparams.ranks_k[i], sv += sparams.ranks_v[i];
            std::fprintf(stderr, "zack: mean rank K %.1f, V %.1f of %d (%.1f%% of K/V dims removed)\n",
                         (double)sk / sparams.ranks_k.size(), (double)sv / sparams.ranks_v.size(), m->hp.head_dim,
                         100.0 * (1.0 - (double)(sk + sv) / (2.0 * m->hp.head_dim * sparams.ranks_k.size())));
        }
    }

    struct sigaction sa = {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);

    if (!ro.has_prompt) return run_chat(*m, s, smp, mo, ro);

    std::vector<int32_t> ids;
    if (ro.raw) {
        ids = m->voc->encode(ro.prompt, true, true);
    } else {
        std::vector<chat_message> msgs;
        if (!ro.system.empty()) msgs.push_back({"system", ro.system});
        msgs.push_back({"user", ro.prompt});
        ids = m->voc->encode(chat_apply(pick_template(*m, ro), msgs, true), true, true);
    }
    const generate_stats st = run_turn(s, smp, ids, ro.n_predict);
    if (!ro.raw) print_text("\n");
    if (mo.verbose) print_timings(st);
    return 0;
}

}  // namespace zk
