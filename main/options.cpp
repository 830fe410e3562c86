#include "main/options.h"

#include <cstdio>
#include <fstream>
#include <thread>

#include "calib/ranks.h"
#include "ggml-like/error.h"
#include "ggml-like/interrupt.h"

namespace zk {

void options_add_model(CLI::App& app, model_opts& o) {
    app.add_option("-m,--model", o.model_path, "model file (.gguf or .zack)")->required();
    app.add_option("-t,--threads", o.n_threads, "threads (0 = all hardware threads)")
        ->check(CLI::Range(0, 512));
    app.add_option("-c,--ctx-size", o.n_ctx, "context size in tokens")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
    app.add_option("-b,--batch-size", o.n_batch, "tokens per forward chunk during prompt processing")
        ->check(CLI::Range(int64_t(1), int64_t(1) << 16));
    app.add_option("--kv-type", o.kv_type, "KV cache element type")->check(CLI::IsMember({"f32", "f16"}));
    // The KV flags are validated by the engine (zk::error with the flag name),
    // not by CLI11, so that every front end gets the same messages.
    app.add_option("--kv-bits", o.kv_bits, "KV cache precision: 16 (--kv-type rows), 8 or 4 (KIVI layout)");
    app.add_option("--kv-group", o.kv_group, "4-bit: tokens per per-channel key quantization group");
    app.add_option("--kv-residual", o.kv_residual,
                   "4-bit: newest tokens kept in full precision, a multiple of the group (0 = 128 tokens, "
                   "or one group if larger)");
    app.add_flag("--kv-gear", o.kv_gear, "4-bit: GEAR error correction (low-rank + sparse outliers per group)");
    app.add_option("--kv-gear-rank", o.kv_gear_rank, "GEAR: rank of the residual approximation");
    app.add_option("--kv-gear-outliers", o.kv_gear_outliers, "GEAR: fraction of elements kept exactly");
    app.add_option("--kv-evict", o.kv_evict, "token eviction policy: none, streaming, h2o, snapkv, keyformer");
    app.add_option("--kv-budget", o.kv_budget, "tokens kept per (layer, KV head) with --kv-evict");
    app.add_option("--kv-sinks", o.kv_sinks,
                   "attention sinks: the first tokens, never evicted and kept exact (f32, full head dim) in a "
                   "quantized or compressed cache (0 = none)");
    app.add_option("--kv-recent", o.kv_recent, "eviction: newest tokens always kept (-1 = min(32, budget/4))");
    app.add_option("--kv-crush", o.kv_crush,
                   "KVCrush: fraction of the budget for representatives of evicted tokens (0 = off, < 1)");
    app.add_option("--kv-crush-anchor", o.kv_crush_anchor, "KVCrush anchor: mean, random or alternate");
    app.add_option("--kv-rate", o.kv_rate,
                   "ZACK: overall fraction of K/V dimensions removed, in [0, 1) (needs a .zack model; -1 = off)");
    app.add_option("--kv-eps", o.kv_eps, "ZACK: singular-value removal rate shared by all heads, in [0, 1) (-1 = off)");
    app.add_flag("--kv-uniform", o.kv_uniform, "ZACK: same rank for every head instead of adaptive ranks (ablation)");
    app.add_flag("-v,--verbose", o.verbose, "print model, cache and timing details to stderr");
}

void options_add_sampling(CLI::App& app, sampler_params& p) {
    app.add_option("--temp", p.temp, "sampling temperature (0 = greedy)")->check(CLI::Range(0.0f, 100.0f));
    app.add_option("--top-k", p.top_k, "keep the k most likely tokens (0 = off)")->check(CLI::Range(0, 1 << 24));
    app.add_option("--top-p", p.top_p, "nucleus sampling: keep tokens up to this probability mass (1 = off)")
        ->check(CLI::Range(0.0f, 1.0f));
    app.add_option("--min-p", p.min_p, "drop tokens below min-p x the top probability (0 = off)")
        ->check(CLI::Range(0.0f, 1.0f));
    app.add_option("--repeat-penalty", p.repeat_penalty, "penalty for repeated tokens (1 = off)")
        ->check(CLI::Range(0.0f, 100.0f));
    app.add_option("--repeat-last-n", p.repeat_last_n, "how many recent tokens the penalty looks at")
        ->check(CLI::Range(0, 1 << 20));
    app.add_option("-s,--seed", p.seed, "random seed (4294967295 = from the clock)");
}

void options_add_run(CLI::App& app, run_opts& o) {
    app.add_option("-p,--prompt", o.prompt, "answer this prompt as one chat turn and exit (without it: interactive chat)");
    app.add_option("-n,--n-predict", o.n_predict, "tokens to generate per reply (-1 = until the model stops)")
        ->check(CLI::Range(int64_t(-1), int64_t(1) << 30));
    app.add_flag("--raw", o.raw, "with -p: continue the prompt as plain text, no chat template");
    app.add_option("--system", o.system, "system message (default: the template's own, if any)");
    app.add_option("--chat-template", o.chat_template,
                   "override the chat template: chatml, llama3, llama2, gemma (default: from the model)");
}

session_params options_session_params(const model_opts& o) {
    session_params p;
    p.n_threads = o.n_threads > 0 ? o.n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
    p.n_ctx = o.n_ctx;
    p.n_batch = o.n_batch;
    p.kv_type = dtype_from_name(o.kv_type);
    p.kv_bits = o.kv_bits;
    p.kv_group = o.kv_group;
    p.kv_residual = o.kv_residual;
    p.kv_gear = o.kv_gear;
    p.kv_gear_rank = o.kv_gear_rank;
    p.kv_gear_outliers = o.kv_gear_outliers;
    p.evict.policy = o.kv_evict;
    p.evict.budget = o.kv_budget;
    p.evict.n_sink = o.kv_sinks;
    p.evict.n_recent = o.kv_recent;
    p.evict.crush = o.kv_crush;
    p.evict.crush_anchor = o.kv_crush_anchor;
    kv_cache_validate_params(session_kv_params(p));
    evict_validate_params(p.evict, p.n_ctx);
    return p;
}

}  // namespace zk

namespace zk {

void options_resolve_ranks(const model_opts& o, const model& m, session_params& p) {
    if (o.kv_rate < 0 && o.kv_rate != -1) ZK_THROW("--kv-rate %g is out of range [0, 1) (-1 = off)", o.kv_rate);
    if (o.kv_eps < 0 && o.kv_eps != -1) ZK_THROW("--kv-eps %g is out of range [0, 1) (-1 = off)", o.kv_eps);
    const bool want = o.kv_rate >= 0 || o.kv_eps >= 0;
    if (!want) {
        if (o.kv_uniform) ZK_THROW("--kv-uniform needs --kv-rate");
        return;
    }
    if (o.kv_rate >= 0 && o.kv_eps >= 0) ZK_THROW("give either --kv-rate or --kv-eps, not both");
    if (!m.zack.present)
        ZK_THROW("%s: --kv-rate/--kv-eps need a .zack model; make one with: zack calibrate -m %s -o MODEL.zack",
                 m.file->path().c_str(), m.file->path().c_str());
    const zack_spectra spec = zack_spectra::from_model(m);
    zack_ranks r;
    if (o.kv_rate >= 0) {
        ranks_validate_rate(o.kv_rate);
        r = ranks_for_rate(spec, o.kv_rate, m.zack.rank_align, o.kv_uniform);
    } else {
        if (o.kv_uniform) ZK_THROW("--kv-uniform works with --kv-rate, not --kv-eps");
        ranks_validate_eps(o.kv_eps);
        r = ranks_from_eps(spec, o.kv_eps, m.zack.rank_align);
    }
    p.ranks_k = r.k;
    p.ranks_v = r.v;
}

void options_write_file(const std::string& path, const std::string& text) {
    const std::string tmp = path + ".tmp";
    const interrupt_temp removed_on_signal(tmp);  // Ctrl-C while writing leaves nothing
    {
        std::ofstream out(tmp, std::ios::binary);
        if (!out) ZK_THROW("%s: cannot write", tmp.c_str());
        out << text;
        out.flush();
        if (!out) {
            std::remove(tmp.c_str());
            ZK_THROW("%s: write failed", tmp.c_str());
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        ZK_THROW("%s: cannot rename to %s", tmp.c_str(), path.c_str());
    }
}

}  // namespace zk
