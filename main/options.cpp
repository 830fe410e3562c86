#include "main/options.h"

#include <thread>

#include "ggml-like/error.h"

namespace zk {

void options_add_model(CLI::App& app, model_opts& o) {
    app.add_option("-m,--model", o.model_path, "model file (.gguf or .zack)")->required();
    app.add_option("-t,--threads", o.n_threads, "threads (0 = all hardware threads)")
        ->check(CLI::Range(0, 512));
    app.add_option("-c,--ctx-size", o.n_ctx, "context size in tokens")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
    app.add_option("-b,--batch-size", o.n_batch, "tokens per forward chunk during prompt processing")
        ->check(CLI::Range(int64_t(1), int64_t(1) << 16));
    app.add_option("--kv-type", o.kv_type, "KV cache element type")->check(CLI::IsMember({"f32", "f16"}));
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
    return p;
}

}  // namespace zk
