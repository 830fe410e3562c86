// `zack eval`: accuracy of compressed KV caches against the uncompressed model on
// the same items (ppl, lastword, mc, passkey, code), sweeps over compression flags and
// the bisection for the largest KV reduction that keeps a target share of the
// baseline.
//
// How a configuration becomes session_params: its flags ("--kv-rate 0.5
// --kv-bits 4 ...") are parsed by a fresh CLI11 app holding the same model option
// table as `zack run` (options_add_model), and options_session_params() turns
// the result into session_params. Every --kv-* flag the option table knows thus
// works in eval configs, sweeps and bisection without a change here; a flag it
// does not know makes that configuration "not available in this build". ZACK
// ranks need the loaded model (its spectra): options_resolve_ranks() turns
// --kv-rate / --kv-eps / --kv-uniform into per-head ranks, as `zack run` does.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include <CLI/CLI.hpp>

#include "calib/plan.h"
#include "calib/ranks.h"  // ranks_rate for the JSON
#include "engine/eval/eval_code.h"
#include "engine/eval/eval_report.h"
#include "engine/eval/eval_sweep.h"
#include "engine/eval/eval_task.h"
#include "engine/model.h"
#include "engine/session.h"
#include "ggml-like/error.h"
#include "ggml-like/file_out.h"
#include "main/commands.h"

namespace zk {

struct eval_opts {
    model_opts mo;
    std::string task;
    std::vector<std::string> data;
    std::string json_path, plot_path, csv_path, on_error = "stop", baseline_model;
    std::string plan_out;  // --plan-out: the smallest configuration >= --target as a plan file
    std::string kld_base;  // --kl-divergence-base FILE
    bool kld = false;      // --kl-divergence: compare with FILE instead of running a baseline
    int64_t limit = 0;
    int64_t ppl_stride = 0;
    int64_t ppl_piece = 32;
    bool sweep = false;
    double target = 0;
    int steps = 5;
    int points = 4;
    std::vector<std::string> methods = {"all"};
    std::vector<std::string> grid;  // "--kv-bits=8,4"
    eval_method_limits lim;
    std::vector<int64_t> pk_lengths = {1024, 2048, 4096, 8192};
    std::vector<double> pk_depths = {0.0, 0.25, 0.5, 0.75, 1.0};
    int pk_trials = 2;
    uint64_t seed = 1234;
    int lw_min_words = 20, lw_max_words = 120;
    std::string code_prompt = "chat";
    int code_max_tokens = 512;
    sandbox_limits code_limits;
    std::string code_python;
    bool quiet = false;
};

std::shared_ptr<eval_opts> eval_opts_make() { return std::make_shared<eval_opts>(); }

namespace {

// A configuration that cannot run in this build or on this model.
struct config_unavailable : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The compression flags the user typed on `zack eval` (every --kv-* option given).
eval_config user_config(const CLI::App& app) {
    eval_config c;
    c.method = "user";
    for (const CLI::Option* o : app.get_options()) {
        if (o->count() == 0) continue;
        const auto& ln = o->get_lnames();
        // zack's --kv-* flags and llama.cpp's --cache-type-k/v, which map onto them
        auto it = std::find_if(ln.begin(), ln.end(), [](const std::string& n) {
            return n.rfind("kv-", 0) == 0 || n.rfind("cache-type-", 0) == 0;
        });
        if (it == ln.end()) continue;
        const std::string flag = "--" + *it;
        if (o->get_items_expected_max() == 0) {  // a flag: no value
            c.flags.push_back({flag, ""});
        } else {
            for (const std::string& v : o->results()) c.flags.push_back({flag, v});
        }
    }
    c.name = c.flags.empty() ? "baseline" : c.cli();
    return c;
}

// Flags that shape every cache of a sweep or a --target search instead of
// moving a family's knob (bench's rule: they apply to every row), so that a
// search with --kv-tier or --kv-sinks searches caches that have them.
bool flag_shared(const std::string& flag) {
    for (const char* f : {"--kv-tier", "--kv-sinks", "--kv-residual", "--kv-group", "--kv-type", "--kv-select",
                          "--kv-select-every"})
        if (flag == f) return true;
    return false;
}

class config_builder {
public:
    config_builder(const model& m, const eval_opts& eo, int64_t n_ctx) : m_(m), eo_(eo), n_ctx_(n_ctx) {}

    session_params params(const eval_config& c) const {
        CLI::App app{"eval configuration"};
        app.allow_windows_style_options(false);
        model_opts mo;
        options_add_model(app, mo);
        std::vector<std::string> args = {"-m", eo_.mo.model_path, "-t", std::to_string(eo_.mo.n_threads),
                                         "-c", std::to_string(n_ctx_), "-b", std::to_string(eo_.mo.n_batch)};
        for (const auto& [f, v] : c.flags) {
            args.push_back(f);
            if (!v.empty()) args.push_back(v);
        }
        std::reverse(args.begin(), args.end());  // CLI11 takes the vector last argument first
        try {
            app.parse(args);
        } catch (const CLI::ParseError& e) {
            throw config_unavailable(std::string("not available in this build: ") + e.what());
        }
        session_params p = options_session_params(mo);
        if ((mo.kv_rate >= 0 || mo.kv_eps >= 0 || mo.kv_target > 0 || !mo.kv_plan.empty()) && !m_.zack.present)
            throw config_unavailable("ZACK ranks need a .zack model (zack calibrate); " + m_.file->path() +
                                     " is a plain GGUF");
        options_resolve_ranks(mo, m_, p);
        return p;
    }

private:
    const model& m_;
    const eval_opts& eo_;
    int64_t n_ctx_;
};

// The parts of session_params that say what ran (for --json).
nlohmann::json session_json(const session_params& p, const model& m) {
    nlohmann::json j = {{"n_ctx", p.n_ctx}, {"threads", p.n_threads}, {"batch", p.n_batch},
                        {"kv_type", dtype_name(p.kv.type)}};
    j["kv_bits"] = p.kv.bits;
    if (!p.kv.bits_k.empty()) j["kv_bits_k"] = p.kv.bits_k, j["kv_bits_v"] = p.kv.bits_v;
    if (p.kv.key_tail > 0) j["kv_key_tail"] = p.kv.key_tail;
    if (!p.kv.tails_k.empty()) j["kv_tails_k"] = p.kv.tails_k;
    if (p.kv.key_zero > 0) j["kv_key_zero"] = p.kv.key_zero;
    if (!p.kv.zeros_k.empty()) j["kv_zeros_k"] = p.kv.zeros_k;
    if (p.kv.key_mid > 0) j["kv_key_mid"] = p.kv.key_mid;
    if (!p.kv.mids_k.empty()) j["kv_mids_k"] = p.kv.mids_k;
    if (p.kv.tier > 0) j["kv_tier"] = p.kv.tier;
    if (p.evict.policy != "none") j["evict"] = {{"policy", p.evict.policy}, {"budget", p.evict.budget}};
    if (!p.ranks_k.empty()) {
        j["ranks_k"] = p.ranks_k;
        if (!p.kbasis.empty()) j["key_basis"] = p.kbasis;
        j["ranks_v"] = p.ranks_v;
        j["zack_rate"] = ranks_rate(p.ranks_k, p.ranks_v, m.hp.head_dim);
    }
    return j;
}

std::vector<std::pair<std::string, std::vector<std::string>>> parse_grid(const std::vector<std::string>& specs) {
    std::vector<std::pair<std::string, std::vector<std::string>>> axes;
    for (const std::string& s : specs) {
        const size_t eq = s.find('=');
        if (eq == std::string::npos || eq == 0 || s.rfind("--kv-", 0) != 0)
            ZK_THROW("--grid wants --kv-FLAG=V1,V2,..., got '%s'", s.c_str());
        std::vector<std::string> vals;
        std::stringstream ss(s.substr(eq + 1));
        std::string v;
        while (std::getline(ss, v, ',')) vals.push_back(v);
        axes.push_back({s.substr(0, eq), vals});
    }
    return axes;
}

std::unique_ptr<eval_task> make_task(const model& m, const eval_opts& eo, int64_t ppl_ctx, bool ctx_set_by_user) {
    const eval_on_error pol = eval_on_error_from_name(eo.on_error);
    if (eo.task == "ppl") {
        eval_ppl_opts po;
        po.n_ctx = ppl_ctx;
        po.stride = eo.ppl_stride;
        po.limit = eo.limit;
        po.piece = eo.ppl_piece;
        po.logits_path = eo.kld_base;
        po.kl_compare = eo.kld;
        po.ctx_set_by_user = ctx_set_by_user;
        return eval_task_ppl(m, eo.data, po, pol);
    }
    if (eo.task == "lastword") return eval_task_lastword(m, eo.data, {eo.lw_min_words, eo.lw_max_words, eo.limit}, pol);
    if (eo.task == "mc") return eval_task_mc(m, eo.data, {eo.limit}, pol);
    if (eo.task == "passkey") {
        if (!eo.data.empty()) ZK_THROW("passkey builds its own items; it takes no --data");
        return eval_task_passkey(m, {eo.pk_lengths, eo.pk_depths, eo.pk_trials, eo.seed, eo.limit}, pol);
    }
    if (eo.task == "code")
        return eval_task_code(m, eo.data,
                              {eo.limit, code_prompt_mode_from_name(eo.code_prompt), eo.code_max_tokens,
                               eo.code_limits, eo.code_python},
                              pol);
    ZK_THROW("unknown task '%s' (ppl, lastword, mc, passkey, code)", eo.task.c_str());
}

}  // namespace

CLI::App* eval_add_subcommand(CLI::App& parent, eval_opts& o) {
    CLI::App* app = parent.add_subcommand(
        "eval", "accuracy against the uncompressed model (ppl, lastword, mc, passkey, code), sweeps and --target bisection");
    app->option_defaults()->always_capture_default();
    options_add_model(*app, o.mo);
    app->add_option("--task", o.task, "ppl | lastword | mc | passkey | code")->required()
        ->check(CLI::IsMember({"ppl", "lastword", "mc", "passkey", "code"}));
    app->add_option("-f,--data,--file", o.data, "data files: text (ppl, lastword) or JSONL (mc, code; README gives the schema)");
    app->add_option("--limit,--chunks", o.limit, "at most this many items (ppl: chunks, as llama-perplexity's --chunks; "
                    "0 = all)")->check(CLI::NonNegativeNumber);
    app->add_option("--on-error", o.on_error, "malformed data: stop at the first problem, or skip the item")
        ->check(CLI::IsMember({"stop", "skip"}));
    app->add_option("--json", o.json_path, "write every number and the exact configurations to this JSON file");
    app->add_option("--plot", o.plot_path, "write an SVG chart of accuracy vs KV size (one curve per method)");
    app->add_option("--csv", o.csv_path, "write one CSV row per configuration (the baseline first)");
    app->add_option("--kl-divergence-base", o.kld_base,
                    "ppl: save the baseline's log-probabilities to this file (llama-perplexity's workflow); with "
                    "--kl-divergence, read them back as the baseline");
    app->add_flag("--kl-divergence", o.kld,
                  "ppl: compare -m (and its KV flags) with the baseline saved in --kl-divergence-base; the tokens "
                  "come from that file, no --data");
    app->add_option("--baseline-model", o.baseline_model,
                    "model for the uncompressed baseline (default: -m with no compression flags)");
    app->add_option("--ppl-stride", o.ppl_stride, "ppl: llama.cpp's strided mode (0 = chunks of -c, second half scored)")
        ->check(CLI::NonNegativeNumber);
    app->add_option("--ppl-piece", o.ppl_piece, "ppl: the scored half of a chunk is fed this many tokens at a time "
                    "(so eviction acts while it is scored)")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
    app->add_flag("--sweep", o.sweep, "evaluate a grid over every method's strength (see --methods, --points)");
    app->add_option("--target", o.target, "find by bisection, per method, the largest KV reduction keeping this share "
                    "of the baseline (e.g. 0.99)")->check(CLI::Range(0.0, 1.0));
    app->add_option("--methods", o.methods, "families for --sweep/--target: zack evict q4 zack+evict zack+q4 "
                    "zack+evict+q4 plan plan+evict plan+tier all (plan: every head's precision, rank and key basis "
                    "chosen together for a byte target from the .zack's curves; plan+evict: plans at each eviction "
                    "level 1/2, 1/4, ... down to --evict-min-keep, searched jointly; plan+tier: plans with a 4-bit "
                    "--kv-tier of 1/4, 1/8 and 1/16 of the context, by name only; the smallest is the one that holds "
                    "least at the task's context)");
    app->add_option("--plan-min", o.lim.plan_min_fraction,
                    "strongest --kv-target of the plan families (a fraction of the f16 cache)")->check(CLI::Range(0.01, 1.0));
    app->add_option("--plan-max", o.lim.plan_max_fraction,
                    "weakest --kv-target of the plan families (default 1: the search starts from the whole f16 "
                    "cache; e.g. 0.2 spends a search's steps between --plan-min and 0.2)")->check(CLI::Range(0.01, 1.0));
    app->add_option("--plan-out", o.plan_out,
                    "--target: write the smallest configuration that keeps the target (over every family) as a "
                    "plan file for --kv-plan");
    app->add_option("--points", o.points, "--sweep: strengths per family (k/points, k = 1..points)")
        ->check(CLI::Range(1, 64));
    app->add_option("--steps", o.steps, "--target: bisection steps (resolution 1/2^steps of the strength)")
        ->check(CLI::Range(0, 20));
    app->add_option("--grid", o.grid, "--sweep: extra grid axis --kv-FLAG=V1,V2,... (repeatable; cartesian product)");
    app->add_option("--zack-max-rate", o.lim.zack_max_rate, "strongest --kv-rate of the zack families")
        ->check(CLI::Range(0.0, 0.999));
    app->add_option("--evict-policy", o.lim.evict_policy, "--kv-evict policy of the eviction families");
    app->add_option("--evict-min-keep", o.lim.evict_min_keep,
                    "strongest eviction: budget = this share of the typical item's tokens")->check(CLI::Range(0.0, 1.0));
    app->add_option("--quant-bits", o.lim.quant_bits, "--kv-bits of the quantized families");
    app->add_option("--passkey-lengths", o.pk_lengths, "passkey: prompt lengths in tokens")->delimiter(',');
    app->add_option("--passkey-depths", o.pk_depths, "passkey: depths of the key, 0 (start) .. 1 (end)")->delimiter(',');
    app->add_option("--passkey-trials", o.pk_trials, "passkey: keys per (length, depth)")->check(CLI::Range(1, 1000));
    app->add_option("--seed", o.seed, "passkey: seed of the keys");
    app->add_option("--min-words", o.lw_min_words, "lastword: shortest passage in words");
    app->add_option("--max-words", o.lw_max_words, "lastword: longer paragraphs are cut to this many words");
    app->add_option("--code-prompt", o.code_prompt, "code: ask through the chat template for a ```python "
                    "block (chat), or continue the prompt text (raw: fewer tokens, for base models)")->check(CLI::IsMember({"raw", "chat"}));
    app->add_option("--code-max-tokens", o.code_max_tokens, "code: generated tokens per problem")
        ->check(CLI::Range(1, 1 << 16));
    app->add_option("--code-timeout", o.code_limits.wall_s, "code: wall-clock seconds per program in the sandbox")
        ->check(CLI::Range(0.1, 3600.0));
    app->add_option("--code-python", o.code_python, "code: absolute path of the python3 run in the sandbox "
                    "(default /usr/bin/python3)");
    app->add_flag("-q,--quiet", o.quiet, "no progress lines");
    return app;
}

int cmd_eval(CLI::App& app, eval_opts& eo) {
    if (eo.kld && eo.kld_base.empty()) ZK_THROW("--kl-divergence needs --kl-divergence-base FILE (the saved baseline)");
    if (!eo.kld_base.empty() && eo.task != "ppl")
        ZK_THROW("--kl-divergence-base works with --task ppl, not %s", eo.task.c_str());
    if (eo.kld && !eo.baseline_model.empty())
        ZK_THROW("--kl-divergence takes its baseline from %s; drop --baseline-model", eo.kld_base.c_str());
    if (eo.task != "passkey" && eo.data.empty() && !eo.kld)
        ZK_THROW("--task %s needs --data FILE ... (or -f FILE)", eo.task.c_str());
    // Outputs are checked before the long work (file_out refuses devices, directories).
    if (!eo.plan_out.empty() && !(eo.target > 0)) ZK_THROW("--plan-out needs --target");
    eval_limits_check(eo.lim);
    for (const std::string* out : {&eo.json_path, &eo.plot_path, &eo.csv_path, &eo.plan_out})
        if (!out->empty()) file_out_check(*out);
    if (!eo.kld_base.empty() && !eo.kld) file_out_check(eo.kld_base);
    // ppl chunks default to llama.cpp's 512 tokens; -c sets them.
    const bool ctx_set = app.get_option("--ctx-size")->count() > 0;
    const int64_t ppl_ctx = ctx_set ? eo.mo.n_ctx : 512;
    const session_params defaults = options_session_params(eo.mo);
    eo.mo.n_threads = defaults.n_threads;

    if (app.count("--flash-attn") > 0 && eo.mo.flash_attn.empty()) eo.mo.flash_attn = "on";  // a bare -fa
    if (eo.mo.verbose)
        for (const std::string& n : options_llama_notes(eo.mo)) std::fprintf(stderr, "note: %s\n", n.c_str());
    auto m = model_load(eo.mo.model_path);
    std::unique_ptr<model> mb;
    if (!eo.baseline_model.empty()) {
        mb = model_load(eo.baseline_model);
        if (mb->hp.n_vocab != m->hp.n_vocab)
            ZK_THROW("--baseline-model has %d tokens in its vocabulary, -m has %d", mb->hp.n_vocab, m->hp.n_vocab);
    }
    std::unique_ptr<eval_task> task = make_task(*m, eo, ppl_ctx, ctx_set);
    const int64_t n_ctx = task->n_ctx_needed();
    eo.lim.n_tokens = task->n_tokens_typical();
    if (eo.mo.kv_group > 0) eo.lim.tier_group = eo.mo.kv_group;
    if (!eo.quiet)
        std::fprintf(stderr, "eval %s: %lld items, context %lld tokens, model %s\n", task->name(),
                     (long long)task->n_items(), (long long)n_ctx, model_describe(*m).c_str());

    const config_builder builder(*m, eo, n_ctx);
    const model& base_model = mb ? *mb : *m;
    // The reference of every KV size: an f16 cache at full head dim, by the cache's own accounting.
    const int nh = m->hp.n_layer * m->hp.n_head_kv;
    const kv_cache ref_cache(m->hp.n_layer, m->hp.n_head_kv, 1, dtype::F16, std::vector<int>(nh, m->hp.head_dim),
                             std::vector<int>(nh, m->hp.head_dim));
    const double ref_bpt = (double)ref_cache.bytes_per_token();
    auto held_fraction = [&](const kv_cache& c) {
        return (double)c.bytes_allocated() / (double)ref_cache.bytes_for_capacity(c.capacity());
    };

    eval_report rep;
    rep.model_path = eo.mo.model_path;
    rep.task = task->name();
    rep.target = eo.target;

    // The configuration given on the command line is resolved before the baseline runs, so
    // that a flag it cannot take (a plan the .zack did not record, ranks on a plain GGUF)
    // fails at once rather than after the baseline's minutes; sweeps and --target keep
    // going past unavailable configurations, so only a lone run is checked.
    const bool strict = !eo.sweep && eo.target <= 0;
    eval_config user = user_config(app);
    // sweeps and --target: the shared flags go to every configuration, the
    // others (if any) remain the user's own configuration
    std::vector<std::pair<std::string, std::string>> shared;
    if (!strict) {
        std::vector<std::pair<std::string, std::string>> own;
        for (const auto& f : user.flags) (flag_shared(f.first) ? shared : own).push_back(f);
        user.flags = own;
        if (!shared.empty()) user.name = user.flags.empty() ? "baseline" : user.cli();
        // (before the baseline's minutes) plan+tier moves the tier itself
        if (std::find(eo.methods.begin(), eo.methods.end(), "plan+tier") != eo.methods.end() &&
            std::any_of(shared.begin(), shared.end(), [](const auto& f) { return f.first == "--kv-tier"; }))
            ZK_THROW("--kv-tier: the plan+tier family searches tiers of its own; drop --kv-tier or plan+tier");
    }
    if (strict && !user.flags.empty()) {
        try {
            builder.params(user);
        } catch (const config_unavailable& e) {
            ZK_THROW("%s: %s", user.cli().c_str(), e.what());
        }
    }

    // Baseline: no compression flags, or the saved one (--kl-divergence).
    if (task->has_stored_baseline()) {
        eval_point& b = rep.baseline;
        b.cfg.name = "baseline";
        b.cfg.method = "baseline";
        b.score = task->stored_baseline();
        b.session = {{"logits_file", eo.kld_base}};
        b.retention = 1;
        b.bytes_per_token = ref_bpt;  // what it ran with is not recorded: counted as an f16 cache
        b.kv_fraction = 1;
    } else {
        eval_point& b = rep.baseline;
        b.cfg.name = "baseline";
        b.cfg.method = "baseline";
        session_params bp = config_builder(base_model, eo, n_ctx).params(b.cfg);
        b.session = session_json(bp, base_model);
        session s(base_model, bp);
        eval_progress prog("baseline", task->n_items(), !eo.quiet);
        b.score = task->run(s, true, prog);
        b.retention = 1;
        b.bytes_per_token = (double)s.cache().bytes_per_token();
        b.kv_fraction = b.bytes_per_token * b.score.tokens_kept / ref_bpt;
        b.kv_held_fraction = held_fraction(s.cache());
    }

    eval_run_cache runs([&](const eval_config& c0) {
        eval_point p;
        eval_config c = c0;
        c.flags.insert(c.flags.end(), shared.begin(), shared.end());
        p.cfg = c;
        try {
            const session_params sp = builder.params(c);
            p.session = session_json(sp, *m);
            session s(*m, sp);
            eval_progress prog(c.name, task->n_items(), !eo.quiet);
            p.score = task->run(s, false, prog);
            p.retention = eval_retention(p.score, rep.baseline.score);
            p.bytes_per_token = (double)s.cache().bytes_per_token();
            p.kv_fraction = p.bytes_per_token * p.score.tokens_kept / ref_bpt;
            p.kv_held_fraction = held_fraction(s.cache());
        } catch (const config_unavailable& e) {
            if (strict) ZK_THROW("%s: %s", c.cli().c_str(), e.what());
            p.error = e.what();
            p.available = false;
        } catch (const error& e) {
            if (strict) throw;
            p.error = options_flag_spelling(e.what());
            std::fprintf(stderr, "warning: %s: %s\n", c.cli().c_str(), p.error.c_str());
        }
        return p;
    });

    if (eo.kld && user.flags.empty() && shared.empty()) {  // the model as given, against the saved baseline
        const size_t sl = eo.mo.model_path.find_last_of('/');
        user.name = "-m " + (sl == std::string::npos ? eo.mo.model_path : eo.mo.model_path.substr(sl + 1));
        runs.get(user);
    }
    if (!user.flags.empty()) runs.get(user);
    const std::vector<eval_method> methods = eval_methods(eo.methods, eo.lim);
    if (eo.sweep) {
        eval_sweep_grid(methods, eo.points, runs);
        if (!eo.grid.empty())
            for (const eval_config& c : eval_grid_configs(parse_grid(eo.grid))) runs.get(c);
    }
    if (eo.target > 0)
        for (const eval_method& mt : methods) rep.targets.push_back(eval_find_target(mt, eo.target, eo.steps, runs));
    rep.runs = runs.all();
    rep.issues = task->issues();

    nlohmann::json& st = rep.settings;
    st["task"] = eo.task;
    st["data"] = eo.data;
    st["n_ctx"] = n_ctx;
    st["threads"] = eo.mo.n_threads;
    st["batch"] = eo.mo.n_batch;
    st["limit"] = eo.limit;
    st["on_error"] = eo.on_error;
    st["baseline_model"] = eo.baseline_model.empty() ? eo.mo.model_path : eo.baseline_model;
    st["user_config"] = user.to_json();
    if (!shared.empty()) {
        eval_config sc;
        sc.flags = shared;
        st["shared_flags"] = sc.cli();  // on every configuration of the sweep or search
    }
    st["reference_f16_bytes_per_token"] = ref_bpt;
    if (eo.task == "ppl") {
        st["ppl"] = {{"chunk", ppl_ctx}, {"stride", eo.ppl_stride}, {"piece", eo.ppl_piece}};
        if (eo.kld) st["ppl"] = {{"window", n_ctx}, {"piece", eo.ppl_piece}};  // chunking from the file
        if (!eo.kld_base.empty())
            st["ppl"]["kl_divergence_base"] = {{"file", eo.kld_base}, {"mode", eo.kld ? "compare" : "save"}};
    }
    if (eo.task == "passkey")
        st["passkey"] = {{"lengths", eo.pk_lengths}, {"depths", eo.pk_depths}, {"trials", eo.pk_trials}, {"seed", eo.seed}};
    if (eo.task == "lastword") st["lastword"] = {{"min_words", eo.lw_min_words}, {"max_words", eo.lw_max_words}};
    if (eo.task == "code")
        st["code"] = {{"prompt", eo.code_prompt}, {"max_tokens", eo.code_max_tokens},
                      {"timeout_s", eo.code_limits.wall_s}, {"python", eo.code_python}};
    if (eo.sweep || eo.target > 0)
        st["methods"] = {{"names", eo.methods}, {"points", eo.points}, {"steps", eo.steps}, {"grid", eo.grid},
                         {"zack_max_rate", eo.lim.zack_max_rate}, {"evict_policy", eo.lim.evict_policy},
                         {"evict_min_keep", eo.lim.evict_min_keep}, {"evict_tokens_typical", eo.lim.n_tokens},
                         {"quant_bits", eo.lim.quant_bits}};

    file_out_stdout(eval_report_table(rep));
    if (!eo.json_path.empty()) file_out_write(eo.json_path, eval_report_json(rep).dump(2) + "\n");
    if (!eo.plot_path.empty()) file_out_write(eo.plot_path, eval_report_svg(rep));
    if (!eo.plan_out.empty()) {
        const int64_t best = eval_smallest_passing(rep.runs, eo.target);
        if (best < 0)
            ZK_THROW("--plan-out %s: no configuration kept %.1f%% of the baseline; nothing written",
                     eo.plan_out.c_str(),
                     100 * eo.target);
        const eval_point& p = rep.runs[best];
        const nlohmann::json& sj = p.session;
        kv_plan pl;
        pl.target = p.kv_fraction;
        pl.kv_fraction = p.bytes_per_token / ref_bpt;
        pl.bits = sj.value("kv_bits", 16);
        pl.bits_k = sj.value("kv_bits_k", std::vector<int>{});
        pl.bits_v = sj.value("kv_bits_v", std::vector<int>{});
        pl.tails_k = sj.value("kv_tails_k", std::vector<int>{});
        if (pl.tails_k.empty() && sj.value("kv_key_tail", 0) > 0)  // one tail: on every 4- or 2-bit key side
            for (size_t h = 0; h < (size_t)m->hp.n_layer * m->hp.n_head_kv; h++)
                pl.tails_k.push_back(pl.head_bits_k(h) <= 4 ? std::min(sj.value("kv_key_tail", 0), m->hp.head_dim) : 0);
        pl.zeros_k = sj.value("kv_zeros_k", std::vector<int>{});
        if (pl.zeros_k.empty() && sj.value("kv_key_zero", 0) > 0)  // likewise 0-bit channels
            for (size_t h = 0; h < (size_t)m->hp.n_layer * m->hp.n_head_kv; h++)
                pl.zeros_k.push_back(pl.head_bits_k(h) <= 4 ? std::min(sj.value("kv_key_zero", 0), m->hp.head_dim) : 0);
        pl.mids_k = sj.value("kv_mids_k", std::vector<int>{});
        if (pl.mids_k.empty() && sj.value("kv_key_mid", 0) > 0)  // 2-bit channels: 4-bit key sides only
            for (size_t h = 0; h < (size_t)m->hp.n_layer * m->hp.n_head_kv; h++)
                pl.mids_k.push_back(pl.head_bits_k(h) == 4 ? std::min(sj.value("kv_key_mid", 0), m->hp.head_dim) : 0);
        pl.ranks_k = sj.value("ranks_k", std::vector<int>{});
        pl.ranks_v = sj.value("ranks_v", std::vector<int>{});
        pl.kbasis = sj.value("key_basis", std::vector<int>{});
        pl.rate = sj.value("zack_rate", 0.0);
        pl.tier = sj.value("kv_tier", 0);
        if (sj.contains("evict")) {
            pl.evict = sj["evict"]["policy"].get<std::string>();
            pl.budget = sj["evict"]["budget"].get<int64_t>();
        }
        pl.source = "zack eval --task " + eo.task + " --target " + std::to_string(eo.target) + ": " + p.cfg.cli() +
                    " kept " + std::to_string(100 * p.retention) + "% of the baseline";
        pl.source_sha256 = m->file->get_str("zack.source.sha256", "");
        pl.n_layer = m->hp.n_layer, pl.n_kv = m->hp.n_head_kv, pl.head_dim = m->hp.head_dim;
        file_out_write(eo.plan_out, pl.to_json().dump(2) + "\n");
        std::fprintf(stderr, "eval: wrote %s (%s)\n", eo.plan_out.c_str(), p.cfg.cli().c_str());
    }
    if (!eo.csv_path.empty()) file_out_write(eo.csv_path, eval_report_csv(rep));
    return 0;
}

}  // namespace zk
