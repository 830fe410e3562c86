// The CLI option table; see options.h.
#include "main/options.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <CLI/CLI.hpp>

#include "calib/alloc.h"
#include "calib/keybasis.h"
#include "calib/plan.h"
#include "calib/ranks.h"
#include "ggml-like/error.h"

namespace zk {

const char* const k_group_model = "Model and context";
const char* const k_group_kv = "KV cache (zack's own flags)";
const char* const k_group_llama = "llama.cpp spellings (mapped onto zack's options)";
const char* const k_group_run = "Prompt and chat";
const char* const k_group_sample = "Sampling";

// ---------------------------------------------------------------------------
// llama.cpp's multi-letter short flags
// ---------------------------------------------------------------------------

const std::vector<option_alias>& options_aliases() {
    static const std::vector<option_alias> table = {
        {"-ngl", "--n-gpu-layers"},    {"-fa", "--flash-attn"},         {"-ctk", "--cache-type-k"},
        {"-ctv", "--cache-type-v"},    {"-sys", "--system-prompt"},     {"-cnv", "--conversation"},
        {"-no-cnv", "--no-conversation"}, {"-if", "--interactive-first"}, {"-co", "--color"},
        {"-mli", "--multiline-input"},
    };
    return table;
}

std::vector<std::string> options_expand_aliases(int argc, const char* const* argv) {
    std::vector<std::string> out;
    bool options_end = false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (options_end || a.size() < 3 || a[0] != '-' || a[1] == '-') {
            options_end = options_end || a == "--";
            out.push_back(a);
            continue;
        }
        const size_t eq = a.find('=');
        const std::string name = a.substr(0, eq);
        const option_alias* hit = nullptr;
        for (const option_alias& al : options_aliases())
            if (name == al.short_name) hit = &al;
        if (hit) {
            out.push_back(hit->long_name + (eq == std::string::npos ? std::string() : a.substr(eq)));
            continue;
        }
        // "-xyz": CLI11 would read bundled one-letter flags (-x -y -z, or -x with
        // the value "yz"), which gives misleading errors for llama.cpp flags zack
        // does not have; name the word instead.
        bool letters = true;
        for (size_t c = 1; c < name.size(); c++)
            letters = letters && (std::isalpha((unsigned char)name[c]) || (c > 1 && name[c] == '-'));
        if (letters && eq == std::string::npos) throw CLI::ExtrasError("unknown flag " + a, CLI::ExitCodes::ExtrasError);
        out.push_back(a);
    }
    return out;
}

// ---------------------------------------------------------------------------
// Option groups
// ---------------------------------------------------------------------------

void options_add_device(CLI::App& app, model_opts& o) {
    app.add_option("--device", o.device,
                   "where the forward pass runs: cpu, cuda (on the CPU, saying why, where it cannot), auto (cuda "
                   "when this build has CUDA and a GPU is visible and the session's features run there, else cpu)")
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}))->group(k_group_model);
}

void options_add_model(CLI::App& app, model_opts& o) {
    app.add_option("-m,--model", o.model_path, "model file (.gguf or .zack)")->required()->group(k_group_model);
    app.add_option("-t,--threads", o.n_threads, "threads (0 = all hardware threads)")
        ->check(CLI::Range(0, 512))->group(k_group_model);
    options_add_device(app, o);
    app.add_option("-c,--ctx-size", o.n_ctx, "context size in tokens")
        ->check(CLI::Range(int64_t(1), int64_t(1) << 20))->group(k_group_model);
    app.add_option("-b,--batch-size", o.n_batch, "tokens per forward chunk during prompt processing")
        ->check(CLI::Range(int64_t(1), int64_t(1) << 16))->group(k_group_model);
    app.add_flag("-v,--verbose", o.verbose, "print model, cache and timing details to stderr")->group(k_group_model);
    options_add_kv(app, o, false);

    const char* g = k_group_llama;
    app.add_option("--cache-type-k", o.cache_type_k,
                   "-ctk: K cache type f32, f16, q8_0 or q4_0 (-> --kv-type / --kv-bits 16, 8, 4; zack stores K "
                   "and V alike, so give -ctv the same)")->group(g);
    app.add_option("--cache-type-v", o.cache_type_v, "-ctv: V cache type, as -ctk")->group(g);
    app.add_option("--n-gpu-layers,--gpu-layers", o.n_gpu_layers,
                   "-ngl: layers on the GPU; accepted, no effect in a CPU build (-v says so)")->group(g);
    app.add_option("--flash-attn", o.flash_attn,
                   "-fa [on|off|auto]: accepted, no effect: zack's attention is always one fused pass")
        ->expected(0, 1)->group(g);
}

void options_add_kv(CLI::App& app, model_opts& o, bool lists_elsewhere) {
    // The KV flags are validated by the engine and options_session_params /
    // options_resolve_ranks (zk::error with the flag name), not by CLI11, so
    // that every front end gets the same messages.
    const char* g = k_group_kv;
    app.add_option("--kv-type", o.kv_type, "KV cache element type")->check(CLI::IsMember({"f32", "f16"}))->group(g);
    if (!lists_elsewhere)
        app.add_option("--kv-bits", o.kv_bits, "KV cache precision: 16 (--kv-type rows), 8, or 4 or 2 (KIVI layout)")
            ->group(g);
    app.add_option("--kv-group", o.kv_group,
                   "4/2-bit: tokens per per-channel key quantization group (default 32, or a KV plan's)")
        ->check(CLI::Range(1, 256))->group(g);
    app.add_option("--kv-residual", o.kv_residual,
                   "4/2-bit: newest tokens kept in full precision, a multiple of the group (0 = 128 tokens, "
                   "or one group if larger)")->group(g);
    app.add_option("--kv-tier", o.kv_tier,
                   "KV plans and 2-bit caches: the N tokens before the residual window kept in 4-bit codes, "
                   "coded at their heads' own widths only when they leave it (a fixed cost; a multiple of the "
                   "group; 0 = none)")->group(g);
    app.add_option("--kv-key-tail", o.kv_key_tail,
                   "4/2-bit keys: their last N channels (the weakest, in a .zack's basis) in 1-bit codes, 0-128; "
                   "a plan's per-head tails take precedence")->group(g);
    app.add_option("--kv-key-zero", o.kv_key_zero,
                   "4/2-bit keys: their last N channels kept as each group's mean (0 bits; a 1-bit tail comes "
                   "before them); a plan's per-head counts take precedence")->group(g);
    app.add_option("--kv-key-mid", o.kv_key_mid,
                   "4-bit keys: N channels before the 1-bit tail (and the 0-bit ones) in 2-bit codes; a plan's "
                   "per-head counts take precedence")->group(g);
    app.add_flag("--kv-gear", o.kv_gear, "4/2-bit: GEAR error correction (low-rank + sparse outliers per group)")
        ->group(g);
    app.add_option("--kv-gear-rank", o.kv_gear_rank, "GEAR: rank of the residual approximation")->group(g);
    app.add_option("--kv-gear-outliers", o.kv_gear_outliers, "GEAR: fraction of elements kept exactly")->group(g);
    if (!lists_elsewhere) {
        app.add_option("--kv-evict", o.kv_evict, "token eviction policy: none, streaming, h2o, snapkv, keyformer")
            ->group(g);
        app.add_option("--kv-budget", o.kv_budget, "tokens kept per (layer, KV head) with --kv-evict (-1 = not set)")
            ->group(g);
    }
    app.add_option("--kv-sinks", o.kv_sinks,
                   "attention sinks: the first tokens, never evicted and kept exact (f32, full head dim) in a "
                   "quantized or compressed cache (0 = none)")->group(g);
    app.add_option("--kv-select", o.kv_select,
                   "a one-token decode step attends to this many tokens' worth of key groups, plus the sinks: with "
                   "4/2-bit keys those whose grids promise the highest q.k, and the residual window and a --kv-tier "
                   "(Quest); with 8/16-bit keys the pages of 32 slots with the most softmax mass (0 = all)")
        ->group(g);
    app.add_option("--kv-select-every", o.kv_select_every,
                   "--kv-select: steps one choice serves; each step chooses afresh for that fraction of the layers, "
                   "the others attend to their last choice plus the tokens since (1 = every step)")
        ->group(g);
    app.add_option("--kv-recent", o.kv_recent, "eviction: newest tokens always kept (-1 = min(32, budget/4))")
        ->group(g);
    app.add_option("--kv-crush", o.kv_crush,
                   "KVCrush: fraction of the budget for representatives of evicted tokens (0 = off, < 1)")->group(g);
    app.add_option("--kv-crush-anchor", o.kv_crush_anchor, "KVCrush anchor: mean, random or alternate")->group(g);
    if (!lists_elsewhere)
        app.add_option("--kv-rate", o.kv_rate,
                       "ZACK: overall fraction of K/V dimensions removed, in [0, 1) (needs a .zack model; -1 = off)")
            ->group(g);
    app.add_option("--kv-eps", o.kv_eps, "ZACK: singular-value removal rate shared by all heads, in [0, 1) (-1 = off)")
        ->group(g);
    app.add_flag("--kv-uniform", o.kv_uniform, "ZACK: same rank for every head instead of adaptive ranks (ablation)")
        ->group(g);
    app.add_option("--kv-alloc", o.kv_alloc,
                   "ZACK: how --kv-rate is shared among heads: sensitivity (by the loss measured at calibration; "
                   "the default when the .zack has it), sigma (the paper's singular-value rule) or uniform")
        ->check(CLI::IsMember({"sensitivity", "sigma", "uniform"}))->group(g);
    app.add_option("--kv-key-basis", o.kv_key_basis,
                   "ZACK: basis of the compressed keys: auto (the best per head, sensitivity), pca, score or pairs")
        ->check(CLI::IsMember({"auto", "pca", "score", "pairs"}))->group(g);
    if (!lists_elsewhere)
        app.add_option("--kv-target", o.kv_target,
                       "a KV plan (precision + ranks) predicted for this fraction of the f16 cache, in (0, 1] "
                       "(a .zack with sensitivity curves)")->group(g);
    app.add_option("--kv-rank-weight", o.kv_rank_weight,
                   "with --kv-target: what a unit of measured rank loss costs against a unit of quantization loss "
                   "(> 0; default: the weight zack calibrate measured, zack.sens.rank_weight)")->group(g);
    if (!lists_elsewhere)
        app.add_option("--kv-plan", o.kv_plan,
                       "a KV plan: a plan file (zack eval --target writes one) or the target of a plan the .zack "
                       "recorded (zack calibrate --kv-target)")->group(g);
}

void options_add_sampling(CLI::App& app, sampler_params& p) {
    const char* g = k_group_sample;
    app.add_option("--temp", p.temp, "sampling temperature (0 = greedy)")->check(CLI::Range(0.0f, 100.0f))->group(g);
    app.add_option("--top-k", p.top_k, "keep the k most likely tokens (0 = off)")->check(CLI::Range(0, 1 << 24))
        ->group(g);
    app.add_option("--top-p", p.top_p, "nucleus sampling: keep tokens up to this probability mass (1 = off)")
        ->check(CLI::Range(0.0f, 1.0f))->group(g);
    app.add_option("--min-p", p.min_p, "drop tokens below min-p x the top probability (0 = off)")
        ->check(CLI::Range(0.0f, 1.0f))->group(g);
    app.add_option("--repeat-penalty", p.repeat_penalty, "penalty for repeated tokens (1 = off)")
        ->check(CLI::Range(0.0f, 100.0f))->group(g);
    app.add_option("--repeat-last-n", p.repeat_last_n,
                   "how many recent tokens the repeat, presence and frequency penalties look at")
        ->check(CLI::Range(0, 1 << 20))->group(g);
    app.add_option("--presence-penalty", p.presence_penalty,
                   "subtracted from the logit of every token seen in the last --repeat-last-n (0 = off)")->group(g);
    app.add_option("--frequency-penalty", p.frequency_penalty,
                   "subtracted from a token's logit once per occurrence in the last --repeat-last-n (0 = off)")
        ->group(g);
    // -1 (llama.cpp) and 4294967295 both mean a random seed; -v prints the seed used.
    app.add_option_function<std::string>(
           "-s,--seed",
           [&p](const std::string& v) {
               if (v == "-1") {
                   p.seed = sampler_seed_random;
                   return;
               }
               char* end = nullptr;
               errno = 0;
               const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
               if (v.empty() || !std::isdigit((unsigned char)v[0]) || *end || errno == ERANGE)
                   throw CLI::ValidationError("--seed", "'" + v + "' is not -1 or a number in [0, 2^64)");
               p.seed = x;
           },
           "random seed (-1 = random; -v prints the seed used)")
        ->default_str("-1")->group(g);
}

void options_add_run(CLI::App& app, run_opts& o) {
    const char* g = k_group_run;
    app.add_option("-p,--prompt", o.prompt, "answer this prompt as one chat turn and exit (without it: interactive chat)")
        ->group(g);
    app.add_option("-f,--file", o.prompt_file, "read the prompt from this file (as -p; one final newline dropped)")
        ->group(g);
    app.add_option("-n,--n-predict,--predict", o.n_predict, "tokens to generate per reply (-1 = until the model stops)")
        ->check(CLI::Range(int64_t(-1), int64_t(1) << 30))->group(g);
    app.add_flag("--raw,--no-conversation", o.raw,
                 "with -p: continue the prompt as plain text, no chat template (-no-cnv)")->group(g);
    app.add_option("--system,--system-prompt", o.system, "system message (-sys; default: the template's own, if any)")
        ->group(g);
    app.add_option("--chat-template", o.chat_template,
                   "override the chat template: chatml, llama3, llama2, gemma (default: from the model)")->group(g);
    app.add_flag("-i,--interactive,--interactive-first,--conversation", o.interactive,
                 "chat; with -p/-f the prompt is the first turn and the chat goes on (-if, -cnv)")->group(g);
    app.add_option("-r,--reverse-prompt", o.reverse,
                   "stop a reply when it produces this text (repeatable); in a chat, it is then your turn")
        ->group(g);
    app.add_flag("-e,--escape", o.escape, "process escapes (\\n \\t \\\\ \\\" \\xHH ...) in -p, -f, --system and -r")
        ->group(g);
    app.add_flag("--no-escape", o.no_escape, "do not process escapes (the default)")->group(g);
    app.add_option("--color", o.color, "-co [on|off|auto]: colour the chat prompt and your input (bare: on; default off)")
        ->expected(0, 1)->group(g);
    app.add_flag("--multiline-input", o.multiline,
                 "-mli: accepted; multi-line input is always on (end a line with \\ or paste a block)")->group(g);
}

void options_cache_type(const std::string& name, const char* flag, std::string* kv_type, int* kv_bits) {
    // zack's 8- and 4-bit caches are its own KIVI-style layouts (engine/kv_cache.h),
    // not llama.cpp's q8_0/q4_0 blocks: the names map onto the same precision.
    if (name == "f32" || name == "f16") {
        *kv_type = name;
        *kv_bits = 16;
    } else if (name == "q8_0") {
        *kv_bits = 8;
    } else if (name == "q4_0") {
        *kv_bits = 4;
    } else {
        ZK_THROW("%s %s: zack's KV cache takes f32, f16, q8_0 or q4_0 (or --kv-bits 16|8|4|2)", flag, name.c_str());
    }
}

session_params options_session_params(const model_opts& o) {
    session_params p;
    p.n_threads = o.n_threads > 0 ? o.n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
    // auto: the GPU where this build and machine have one, quietly the CPU
    // otherwise; cuda: the CPU with a line saying why where the GPU cannot
    // (no device, or a feature its backend lacks: engine/backend_cuda.h)
    if (o.device == "auto") {
        p.device = backend_cuda_built() ? backend_device::CUDA : backend_device::CPU;
        p.device_fallback = session_params::fallback::CPU_QUIET;
    } else {
        p.device = backend_device_parse(o.device);
        p.device_fallback = session_params::fallback::CPU_NOTICE;
    }
    p.n_ctx = o.n_ctx;
    p.n_batch = o.n_batch;
    std::string kv_type = o.kv_type;
    int kv_bits = o.kv_bits;
    if (!o.cache_type_k.empty() || !o.cache_type_v.empty()) {
        const std::string k = o.cache_type_k.empty() ? "f16" : o.cache_type_k;
        const std::string v = o.cache_type_v.empty() ? "f16" : o.cache_type_v;
        std::string tk = kv_type, tv = kv_type;
        int bk = kv_bits, bv = kv_bits;
        options_cache_type(k, "-ctk", &tk, &bk);
        options_cache_type(v, "-ctv", &tv, &bv);
        if (tk != tv || bk != bv)
            ZK_THROW("-ctk %s and -ctv %s differ: zack stores K and V at one precision; give both the same type",
                     k.c_str(), v.c_str());
        if (o.kv_bits != 16 && o.kv_bits != bk)
            ZK_THROW("--kv-bits %d and -ctk/-ctv %s disagree; give one of them", o.kv_bits, k.c_str());
        kv_type = tk;
        kv_bits = bk;
    }
    p.kv.type = dtype_from_name(kv_type);
    p.kv.bits = kv_bits;
    if (o.kv_group > 0) p.kv.group = o.kv_group;
    p.kv.residual = o.kv_residual;
    p.kv.tier = o.kv_tier;
    p.kv.gear = o.kv_gear;
    p.kv.key_tail = o.kv_key_tail;
    p.kv.key_zero = o.kv_key_zero;
    p.kv.key_mid = o.kv_key_mid;
    p.kv.select = o.kv_select;
    p.kv.select_every = o.kv_select_every;
    p.kv.gear_rank = o.kv_gear_rank;
    p.kv.gear_outliers = o.kv_gear_outliers;
    p.evict.policy = o.kv_evict;
    // An explicit --kv-budget without a policy would be ignored: say so instead.
    if (o.kv_budget >= 0 && o.kv_evict == "none")
        ZK_THROW("--kv-budget %lld does nothing without an eviction policy (--kv-evict streaming|h2o|snapkv|keyformer)",
                 (long long)o.kv_budget);
    if (o.kv_budget < -1) ZK_THROW("--kv-budget must be a number of tokens, got %lld", (long long)o.kv_budget);
    p.evict.budget = o.kv_budget < 0 ? 0 : o.kv_budget;
    p.evict.n_sink = o.kv_sinks;
    p.evict.n_recent = o.kv_recent;
    p.evict.crush = o.kv_crush;
    p.evict.crush_anchor = o.kv_crush_anchor;
    // before the cache's own check, which would ask for --kv-bits 4 or 2, which a plan refuses
    if (o.kv_gear && (o.kv_target > 0 || !o.kv_plan.empty()))
        ZK_THROW("--kv-gear does not combine with a KV plan (a plan chooses each head's codes, and GEAR's correction "
                 "is not among them): drop --kv-gear, or use it with --kv-bits 4 or 2");
    kv_cache_validate_params(p.kv);
    evict_validate_params(p.evict, p.n_ctx);
    return p;
}

namespace {

// The engine's parameter names and the flags that set them (one table: a new
// engine parameter with a flag gets its row here).
const struct {
    const char* param;
    const char* flag;
} k_param_flags[] = {
    {"kv.bits", "--kv-bits"},           {"kv.group", "--kv-group"},         {"kv.type", "--kv-type"},
    {"kv.residual", "--kv-residual"},   {"kv.tier", "--kv-tier"},         {"kv.sinks", "--kv-sinks"},
    {"kv.gear_rank", "--kv-gear-rank"}, {"kv.gear_outliers", "--kv-gear-outliers"},
    {"kv.gear", "--kv-gear"},           {"kv.alloc", "--kv-alloc"},
    {"kv.key_tail", "--kv-key-tail"},   {"kv.key_zero", "--kv-key-zero"}, {"kv.key_mid", "--kv-key-mid"},   {"kv.select", "--kv-select"},
    {"kv.select_every", "--kv-select-every"},
    {"evict.policy", "--kv-evict"},     {"evict.budget", "--kv-budget"},
    {"evict.n_sink", "--kv-sinks"},     {"evict.n_recent", "--kv-recent"},
    {"evict.crush_anchor", "--kv-crush-anchor"}, {"evict.crush", "--kv-crush"},
    {"calib.n_tokens", "--tokens"},     {"calib.n_ctx", "--ctx"},
    {"calib.gen_parallel", "--gen-parallel"}, {"calib.sens_tokens", "--sens-tokens"},
    {"kv.plan", "--kv-plan"},           {"kv.target", "--kv-target"},
    {"eval.data", "--data"},            {"eval.file", "-f"},
    {"eval.limit", "--limit"},          {"eval.on_error", "--on-error"},
    {"eval.code_prompt", "--code-prompt"}, {"eval.code_max_tokens", "--code-max-tokens"},
    {"eval.kl_divergence_base", "--kl-divergence-base"}, {"eval.kl_divergence", "--kl-divergence"},
    {"eval.ppl_stride", "--ppl-stride"},
};

bool param_char(char c) { return std::isalnum((unsigned char)c) || c == '_' || c == '.'; }

}  // namespace

std::string options_flag_spelling(const std::string& msg) {
    std::string out;
    size_t i = 0;
    while (i < msg.size()) {
        // a whole word of parameter characters, compared without a trailing '.'
        // (the end of a sentence)
        if (!param_char(msg[i]) || (i > 0 && param_char(msg[i - 1]))) {
            out += msg[i++];
            continue;
        }
        size_t j = i;
        while (j < msg.size() && param_char(msg[j])) j++;
        size_t e = j;
        while (e > i && msg[e - 1] == '.') e--;
        const std::string word = msg.substr(i, e - i);
        const char* flag = nullptr;
        for (const auto& pf : k_param_flags)
            if (word == pf.param) flag = pf.flag;
        out += flag ? std::string(flag) + msg.substr(e, j - e) : msg.substr(i, j - i);
        i = j;
    }
    return out;
}

std::vector<std::string> options_llama_notes(const model_opts& o) {
    std::vector<std::string> notes;
    if (!o.n_gpu_layers.empty()) {
        if (backend_cuda_built())
            notes.push_back("-ngl " + o.n_gpu_layers + ": accepted; the CUDA backend does not run whole layers yet, "
                            "all layers run on the CPU");
        else
            notes.push_back("-ngl " + o.n_gpu_layers +
                            ": accepted; this build has no GPU backend, all layers run on the CPU");
    }
    if (!o.flash_attn.empty())
        notes.push_back("-fa " + o.flash_attn + ": accepted; zack's attention is always one fused pass over the cache");
    return notes;
}

std::string options_unescape(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); i++) {
        if (s[i] != '\\' || i + 1 >= s.size()) {
            out += s[i];
            continue;
        }
        const char e = s[++i];
        switch (e) {
            case 'n': out += '\n'; break;
            case 'r': out += '\r'; break;
            case 't': out += '\t'; break;
            case 'a': out += '\a'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'v': out += '\v'; break;
            case '0': out += '\0'; break;
            case '\\': case '\'': case '"': case '?': out += e; break;
            case 'x': {
                int v = 0, n = 0;
                while (n < 2 && i + 1 < s.size() && std::isxdigit((unsigned char)s[i + 1])) {
                    const char h = s[++i];
                    v = v * 16 + (std::isdigit((unsigned char)h) ? h - '0' : std::tolower((unsigned char)h) - 'a' + 10);
                    n++;
                }
                if (n == 0) out += "\\x";
                else out += (char)v;
                break;
            }
            default: out += '\\', out += e;
        }
    }
    return out;
}

void options_resolve_ranks(const model_opts& o, const model& m, session_params& p) {
    if (std::isnan(o.kv_rate) || (o.kv_rate < 0 && o.kv_rate != -1))
        ZK_THROW("--kv-rate %g is out of range [0, 1) (-1 = off)", o.kv_rate);
    if (std::isnan(o.kv_eps) || (o.kv_eps < 0 && o.kv_eps != -1))
        ZK_THROW("--kv-eps %g is out of range [0, 1) (-1 = off)", o.kv_eps);
    if (std::isnan(o.kv_target) || (o.kv_target != -1 && !(o.kv_target > 0 && o.kv_target <= 1)))
        ZK_THROW("--kv-target %g is outside (0, 1] (a fraction of the f16 full-rank cache)", o.kv_target);
    if (std::isnan(o.kv_rank_weight) || (o.kv_rank_weight != -1 && !(o.kv_rank_weight > 0)))
        ZK_THROW("--kv-rank-weight %g must be positive", o.kv_rank_weight);
    if (o.kv_rank_weight > 0 && o.kv_target <= 0) ZK_THROW("--kv-rank-weight goes with --kv-target");
    const bool want_plan = o.kv_target > 0 || !o.kv_plan.empty();
    const bool want = o.kv_rate >= 0 || o.kv_eps >= 0;
    if (want_plan) {
        if (o.kv_target > 0 && !o.kv_plan.empty()) ZK_THROW("give either --kv-plan or --kv-target, not both");
        if (want || o.kv_uniform || !o.kv_alloc.empty() || o.kv_key_basis != "auto")
            ZK_THROW("a KV plan sets the ranks: drop --kv-rate/--kv-eps/--kv-uniform/--kv-alloc/--kv-key-basis");
        if (p.kv.bits != 16) ZK_THROW("a KV plan sets the cache precision: drop --kv-bits/-ctk/-ctv");
        if (!m.zack.present)
            ZK_THROW("%s: KV plans need a .zack model; make one with: zack calibrate -m %s -o MODEL.zack",
                     m.file->path().c_str(), m.file->path().c_str());
        // --kv-group with --kv-target: a plan for that group (its bytes and key widths; the
        // losses stay the calibration's); with --kv-plan it must be the plan's
        const kv_plan plan =
            o.kv_plan.empty() ? plan_for_target(m, o.kv_target, o.kv_rank_weight, o.kv_select > 0, o.kv_group)
                               : plan_load(m, o.kv_plan);
        if (o.kv_group > 0 && o.kv_group != plan.group)
            ZK_THROW("--kv-group %d: the KV plan %s is for KIVI groups of %d tokens; drop --kv-group", o.kv_group,
                     o.kv_plan.empty() ? "asked for" : o.kv_plan.c_str(), plan.group);
        if (plan.evict != "none" && o.kv_evict != "none")
            ZK_THROW("the KV plan sets eviction (%s): drop --kv-evict", plan.evict.c_str());
        if (plan.tier > 0 && o.kv_tier > 0 && o.kv_tier != plan.tier)
            ZK_THROW("--kv-tier %d: the KV plan %s sets a tier of %d tokens; drop --kv-tier", o.kv_tier,
                     o.kv_plan.c_str(), plan.tier);
        plan_apply(plan, m, p);
        if (o.verbose) std::fprintf(stderr, "zack: KV plan: %s\n", plan.describe().c_str());
        if (o.kv_select > 0) {
            // selection estimates from KIVI grids: these heads score every slot to choose
            int wide = 0;
            const size_t nh = (size_t)plan.n_layer * plan.n_kv;
            for (size_t h = 0; h < nh; h++) wide += plan.head_bits_k(h) > 4;
            if (wide > 0)
                std::fprintf(stderr,
                             "zack: note: --kv-select: %d of %zu heads of this plan keep 8- or 16-bit keys and score "
                             "every slot to choose (plans for selection: zack calibrate --kv-kivi-keys, or --kv-target "
                             "with --kv-select)\n",
                             wide, nh);
        }
        return;
    }
    if (!want) {
        if (o.kv_uniform) ZK_THROW("--kv-uniform needs --kv-rate");
        if (!o.kv_alloc.empty()) ZK_THROW("--kv-alloc needs --kv-rate");
        if (o.kv_key_basis != "auto") ZK_THROW("--kv-key-basis needs --kv-rate or --kv-eps");
        return;
    }
    if (o.kv_rate >= 0 && o.kv_eps >= 0) ZK_THROW("give either --kv-rate or --kv-eps, not both");
    if (!m.zack.present)
        ZK_THROW("%s: --kv-rate/--kv-eps need a .zack model; make one with: zack calibrate -m %s -o MODEL.zack",
                 m.file->path().c_str(), m.file->path().c_str());
    if (o.kv_uniform && o.kv_eps >= 0) ZK_THROW("--kv-uniform works with --kv-rate, not --kv-eps");
    if (o.kv_uniform && !o.kv_alloc.empty() && o.kv_alloc != "uniform")
        ZK_THROW("--kv-uniform is --kv-alloc uniform; it contradicts --kv-alloc %s", o.kv_alloc.c_str());
    rank_request rq;
    rq.rate = o.kv_rate;
    rq.eps = o.kv_eps;
    if (o.kv_uniform) rq.alloc = rank_alloc::UNIFORM, rq.alloc_set = true;
    if (!o.kv_alloc.empty()) rq.alloc = rank_alloc_from_name(o.kv_alloc), rq.alloc_set = true;
    rq.key_basis = o.kv_key_basis == "auto" ? -1 : (int)key_basis_from_name(o.kv_key_basis);
    const zack_ranks r = ranks_resolve(m, rq);
    p.ranks_k = r.k;
    p.ranks_v = r.v;
    p.kbasis = r.kb;
}

}  // namespace zk
