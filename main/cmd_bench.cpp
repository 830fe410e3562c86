// `zack bench`: llama-bench-style throughput and latency. Every combination of
// the comma lists given becomes one row: prefill ("pp", time to first token for
// a prompt of P tokens on top of a context of depth D) and decode ("tg", time
// between tokens for N tokens generated at depth D), each as the mean and
// standard deviation over -r repetitions, with KV bytes and peak memory.
// Batch sizes (-b) apply to decode: a tg row at batch B prefills B sequences to
// depth D one by one, then times N steps that decode the B sequences together
// (engine/batch.h); tokens/s counts all of them (B x N / time) and ms is the
// time per step. Prompts are prefilled one sequence at a time, so pp rows are
// batch 1. KV bytes per token are per sequence; KV bytes allocated and used
// are totals over the row's B sequences.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include <CLI/CLI.hpp>

#include "engine/batch.h"
#include "engine/model.h"
#include "engine/model_synth.h"
#include "engine/session.h"
#include "ggml-like/error.h"
#include "ggml-like/file_out.h"
#include "ggml-like/interrupt.h"
#include "main/commands.h"

namespace zk {

namespace {

std::vector<int64_t> parse_list(const std::string& s, const char* flag, int64_t min_value) {
    std::vector<int64_t> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        size_t used = 0;
        long long v = 0;
        try {
            v = std::stoll(item, &used);
        } catch (...) {
            used = 0;
        }
        if (item.empty() || used != item.size())
            ZK_THROW("%s: '%s' is not a comma-separated list of integers", flag, s.c_str());
        if (v < min_value) ZK_THROW("%s: %lld is below the minimum %lld", flag, v, (long long)min_value);
        out.push_back(v);
    }
    if (out.empty()) ZK_THROW("%s: empty list", flag);
    return out;
}

struct bench_row {
    std::string test;     // "pp512" or "tg64"
    int64_t n_tokens = 0;
    int64_t depth = 0;
    int64_t batch = 1;
    int threads = 0;
    std::string kv;       // cache description
    std::string device;   // where it ran (--device auto/cuda may run on the CPU)
    double mean_tps = 0, std_tps = 0;   // tokens per second
    double mean_ms = 0, std_ms = 0;     // TTFT (pp) or time per token (tg), milliseconds
    size_t kv_bytes_per_token = 0;  // one sequence's cache
    size_t kv_bytes = 0;       // bytes allocated for the caches of the row's sequences
    size_t kv_bytes_used = 0;  // bytes per token x tokens held at the end of the test, all sequences
    size_t peak_rss = 0;
};

size_t peak_rss_bytes() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return (size_t)ru.ru_maxrss * 1024;
}

// Deterministic "random" ordinary tokens, as llama-bench feeds random ids.
std::vector<int32_t> bench_tokens(const model& m, int64_t n, uint64_t seed) {
    std::vector<int32_t> t(n);
    uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int64_t i = 0; i < n; i++) {
        int32_t id;
        do {
            x ^= x >> 33;
            x *= 0xff51afd7ed558ccdull;
            x ^= x >> 29;
            id = (int32_t)(x % (uint64_t)m.voc->n_tokens());
        } while (m.voc->is_control(id));
        t[i] = id;
    }
    return t;
}

std::vector<std::string> split_list(const std::string& s, const char* flag) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (item.empty()) ZK_THROW("%s: empty item in '%s'", flag, s.c_str());
        out.push_back(item);
    }
    if (out.empty()) ZK_THROW("%s: empty list", flag);
    return out;
}

void mean_std(const std::vector<double>& v, double& mean, double& sd) {
    mean = 0;
    for (double x : v) mean += x;
    mean /= (double)v.size();
    sd = 0;
    for (double x : v) sd += (x - mean) * (x - mean);
    sd = v.size() > 1 ? std::sqrt(sd / (double)(v.size() - 1)) : 0.0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

nlohmann::json row_json(const bench_row& r) {
    return {{"test", r.test}, {"n_tokens", r.n_tokens}, {"depth", r.depth}, {"batch", r.batch},
            {"threads", r.threads}, {"kv", r.kv}, {"device", r.device}, {"tokens_per_s", r.mean_tps}, {"tokens_per_s_std", r.std_tps},
            {"ms", r.mean_ms}, {"ms_std", r.std_ms},
            {"ms_meaning", r.test.rfind("pp", 0) == 0 ? "time to first token" : "time per decode step (batch tokens)"},
            {"kv_bytes_per_token", r.kv_bytes_per_token}, {"kv_bytes_allocated", r.kv_bytes},
            {"kv_bytes_used", r.kv_bytes_used},
            {"kv_bytes_meaning", "per_token: one sequence; allocated, used: all batch sequences"},
            {"peak_rss_bytes", r.peak_rss}};
}

// -ctk/-ctv lists (llama-bench) as a --kv-bits list; "" when neither is given.
std::string bench_bits_from_cache_types(const bench_opts& o) {
    if (o.cache_type_k.empty() && o.cache_type_v.empty()) return "";
    const std::vector<std::string> k = split_list(o.cache_type_k.empty() ? "f16" : o.cache_type_k, "-ctk");
    const std::vector<std::string> v = split_list(o.cache_type_v.empty() ? "f16" : o.cache_type_v, "-ctv");
    if (k != v)
        ZK_THROW("-ctk %s and -ctv %s differ: zack stores K and V at one precision; give both the same list",
                 o.cache_type_k.c_str(), o.cache_type_v.c_str());
    std::string bits;
    for (const std::string& t : k) {
        std::string type = o.kv.kv_type;
        int b = 16;
        options_cache_type(t, "-ctk", &type, &b);
        if (type != o.kv.kv_type)
            ZK_THROW("-ctk %s: bench takes one element type; use --kv-type %s", t.c_str(), t.c_str());
        bits += (bits.empty() ? "" : ",") + std::to_string(b);
    }
    return bits;
}

std::string fmt_bytes(size_t b) {
    if (b >= (size_t)1 << 20) return strfmt("%.2f MiB", b / 1048576.0);
    if (b >= 1024) return strfmt("%.1f KiB", b / 1024.0);
    return strfmt("%zu B", b);
}

// --shape: a synthetic model (engine/model_synth.h) written to a new
// directory under $TMPDIR (else /tmp) and loaded. The file and the directory
// are removed as soon as the model is mapped (the mapping outlives the name),
// and on every way out before that: an error (the destructor) or a signal
// (interrupt_temp).
class synth_model_file {
public:
    explicit synth_model_file(const std::string& shape_name) {
        const char* tmp = std::getenv("TMPDIR");
        std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/zack-shape-XXXXXX";
        {
            interrupt_hold hold;  // no signal between creating the directory and registering it
            if (!mkdtemp(&tmpl[0]))
                ZK_THROW("--shape: cannot create a temporary directory %s (%s); set TMPDIR", tmpl.c_str(),
                         std::strerror(errno));
            dir_ = tmpl;
            on_signal_dir_.track(dir_);
        }
        path_ = dir_ + "/" + shape_name + ".gguf";
        on_signal_file_.track(path_);
    }
    ~synth_model_file() { remove(); }
    synth_model_file(const synth_model_file&) = delete;
    synth_model_file& operator=(const synth_model_file&) = delete;
    const std::string& path() const { return path_; }
    void remove() {
        if (dir_.empty()) return;
        ::unlink(path_.c_str());
        ::rmdir(dir_.c_str());
        on_signal_file_.release();
        on_signal_dir_.release();
        dir_.clear();
    }

private:
    std::string dir_, path_;
    interrupt_temp on_signal_dir_, on_signal_file_;
};

constexpr uint64_t k_shape_seed = 1;

}  // namespace

void options_add_bench(CLI::App& app, bench_opts& o) {
    CLI::Option* model = app.add_option("-m,--model", o.model_path, "model file (.gguf or .zack); or --shape");
    CLI::Option* shape =
        app.add_option("--shape", o.shape,
                       "no model file: benchmark random weights of this shape (" + synth_shape_names() + ")")
            ->excludes(model);
    app.add_option("--shape-type", o.shape_type, "--shape's weight type (" + synth_weight_type_names() + ")")
        ->needs(shape);
    app.add_option("-p,--n-prompt", o.prompt, "prompt lengths to prefill, comma list (0 = skip)");
    app.add_option("-n,--n-gen", o.gen, "tokens to generate, comma list (0 = skip)");
    app.add_option("-d,--depth", o.depth, "context depths (tokens already in the cache), comma list");
    app.add_option("-b,--batch", o.batch,
                   "sequences decoded together in tg tests, comma list (each prefilled to the depth alone)");
    app.add_option("-t,--threads", o.threads, "thread counts, comma list");
    options_add_device(app, o.kv);
    app.add_option("-r,--repetitions", o.reps, "repetitions per test")->check(CLI::Range(1, 1000));
    app.add_option("-c,--ctx-size", o.n_ctx, "context size (0 = just enough for the largest test)")
        ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
    CLI::Option* fmt =
        app.add_option("-o,--output", o.format, "output format (jsonl: one JSON object per test, printed as it ends)")
            ->check(CLI::IsMember({"md", "csv", "json", "jsonl"}));
    // the spelling eval and info take for machine-readable output
    app.add_flag_callback("--json", [&o] { o.format = "json"; }, "print the results as JSON (the same as -o json)")
        ->excludes(fmt);
    app.add_option("--output-file", o.output_file, "write the results to this file instead of stdout");
    const char* g = k_group_kv;
    app.add_option("--kv-rate", o.kv_rate, "ZACK compression rates, comma list (-1 = uncompressed; needs a .zack)")
        ->group(g);
    app.add_option("--kv-bits", o.kv_bits, "KV precisions, comma list of 16, 8, 4, 2")->group(g);
    app.add_option("--kv-evict", o.kv_evict, "eviction policies, comma list")->group(g);
    app.add_option("--kv-budget", o.kv_budget, "eviction budgets in tokens, comma list (0 = none)")->group(g);
    app.add_option("--kv-plan", o.kv_plan,
                   "KV plans, comma list: plan files or targets of plans the .zack recorded (each one more "
                   "configuration; without a sweep list such as --kv-bits 16, only the plans run)")->group(g);
    app.add_option("--kv-target", o.kv_target,
                   "KV plans predicted for these fractions of the f16 cache, comma list (each one more configuration)")
        ->group(g);
    // the rest, one value each, as `zack run` takes them (--kv-gear applies to the 4- and 2-bit configurations)
    options_add_kv(app, o.kv, true);
    g = k_group_llama;
    app.add_option("--cache-type-k", o.cache_type_k, "-ctk: comma list of f16, q8_0, q4_0 (-> --kv-bits 16, 8, 4)")
        ->group(g);
    app.add_option("--cache-type-v", o.cache_type_v, "-ctv: the same list as -ctk (K and V share one precision)")
        ->group(g);
    app.add_option("--n-gpu-layers,--gpu-layers", o.n_gpu_layers, "-ngl: accepted; no effect in a CPU build")
        ->group(g);
    app.add_option("--flash-attn", o.flash_attn, "-fa: accepted; zack's attention is always one fused pass")
        ->expected(0, 1)->group(g);
}

int cmd_bench(const bench_opts& o) {
    const auto prompts = parse_list(o.prompt, "--n-prompt", 0);
    const auto gens = parse_list(o.gen, "--n-gen", 0);
    const auto depths = parse_list(o.depth, "--depth", 0);
    const auto batches = parse_list(o.batch, "--batch", 1);
    std::vector<int64_t> threads = parse_list(o.threads, "--threads", 0);
    for (int64_t& t : threads)  // 0 = all hardware threads, as in zack run
        if (t == 0) t = std::max(1u, std::thread::hardware_concurrency());
    std::string kv_bits_list = o.kv_bits;
    const std::string ct_bits = bench_bits_from_cache_types(o);
    if (!ct_bits.empty()) {
        if (o.kv_bits != "16") ZK_THROW("give --kv-bits or -ctk/-ctv, not both");
        kv_bits_list = ct_bits;
    }
    // --shape: random weights; what needs a calibrated model measures nothing on them
    const synth_shape* shape = o.shape.empty() ? nullptr : &synth_shape_find(o.shape);
    const dtype shape_type = shape ? synth_weight_type_from_name(o.shape_type) : dtype::F32;
    if (shape) {
        const char* zack_only = nullptr;
        for (const std::string& r : split_list(o.kv_rate, "--kv-rate"))
            if (std::strtod(r.c_str(), nullptr) >= 0) zack_only = "--kv-rate";  // -1: uncompressed
        if (o.kv.kv_eps >= 0) zack_only = "--kv-eps";
        if (!o.kv_plan.empty()) zack_only = "--kv-plan";
        if (!o.kv_target.empty()) zack_only = "--kv-target";
        if (zack_only)
            ZK_THROW("%s needs a calibrated .zack model; --shape benchmarks a plain GGUF with random weights, which "
                     "has none (its precisions, eviction and batch sizes do apply)", zack_only);
    }
    if (!o.output_file.empty()) file_out_check(o.output_file);

    std::unique_ptr<model> m;
    std::string model_name = o.model_path;  // "model" in the outputs
    if (shape) {
        model_name = model_synth_label(*shape, shape_type);
        synth_model_file tmp(shape->name);
        model_synth_write(*shape, shape_type, k_shape_seed, tmp.path(), true);
        m = model_load(tmp.path());
        tmp.remove();
    } else {
        m = model_load(o.model_path);
    }
    // llama-bench's jsonl: one object per test, with the model in every line
    auto jsonl_line = [&](const bench_row& r) {
        nlohmann::json j = row_json(r);
        j["model"] = model_name;
        j["model_desc"] = model_describe(*m);
        if (shape) j["random_weights"] = {{"shape", shape->name}, {"type", dtype_name(shape_type)}};
        return j.dump();
    };
    int64_t need = 1;
    for (int64_t d : depths) {
        for (int64_t p : prompts) need = std::max(need, d + p);
        for (int64_t g : gens) need = std::max(need, d + g);
    }
    const int64_t n_ctx = o.n_ctx > 0 ? o.n_ctx : need;
    if (need > n_ctx)
        ZK_THROW("a test needs %lld tokens of context (depth + length) but the context is %lld; raise -c",
                 (long long)need, (long long)n_ctx);
    if (need > (int64_t)m->hp.n_ctx_train)
        std::fprintf(stderr, "bench: note: tests reach %lld tokens, beyond the model's trained context %d\n",
                     (long long)need, m->hp.n_ctx_train);

    // KV configurations: the product of the --kv-* lists, each turned into
    // session parameters the way `zack run` turns its flags
    struct kv_config {
        session_params sp;
        std::string desc;
    };
    std::vector<kv_config> kv_configs;
    if (o.kv.kv_rank_weight != -1 && o.kv_target.empty()) ZK_THROW("--kv-rank-weight goes with --kv-target");
    model_opts base = o.kv;
    base.n_ctx = n_ctx;
    base.n_batch = 512;
    base.n_threads = 1;  // set per row group
    // what the shared flags change from their defaults, in every description
    std::string common;
    const model_opts dflt;
    if (base.kv_group != dflt.kv_group) common += strfmt(" g%d", base.kv_group);
    if (base.kv_residual != dflt.kv_residual) common += strfmt(" res%d", base.kv_residual);
    if (base.kv_tier != dflt.kv_tier) common += strfmt(" tier%d", base.kv_tier);
    if (base.kv_sinks != dflt.kv_sinks) common += strfmt(" sinks%d", base.kv_sinks);
    if (base.kv_select > 0) common += strfmt(" select%lld", (long long)base.kv_select);
    if (base.kv_select > 0 && base.kv_select_every != dflt.kv_select_every)
        common += strfmt("/%d", base.kv_select_every);
    if (base.kv_recent != dflt.kv_recent) common += strfmt(" recent%lld", (long long)base.kv_recent);
    if (base.kv_crush > 0) common += strfmt(" crush%g/%s", base.kv_crush, base.kv_crush_anchor.c_str());
    // and what shapes the ranks, on the configurations that have ranks
    std::string rank_desc;
    if (!base.kv_alloc.empty()) rank_desc += " " + base.kv_alloc;
    if (base.kv_uniform) rank_desc += " uniform";
    if (base.kv_key_basis != dflt.kv_key_basis) rank_desc += " keys:" + base.kv_key_basis;
    auto add_config = [&](const model_opts& mo, std::string desc) {
        kv_config c;
        c.sp = options_session_params(mo);
        options_resolve_ranks(mo, *m, c.sp);
        c.desc = desc + common;
        if (c.sp.kv.tier != mo.kv_tier) c.desc += strfmt(" tier%d", c.sp.kv.tier);  // a plan file's own
        kv_configs.push_back(c);
    };
    auto number = [](const std::string& s, const char* flag) {
        size_t used = 0;
        double v = 0;
        try {
            v = std::stod(s, &used);
        } catch (...) {
            used = 0;
        }
        if (used != s.size()) ZK_THROW("%s: '%s' is not a number", flag, s.c_str());
        return v;
    };
    std::vector<double> rates;
    for (const std::string& rate_s : split_list(o.kv_rate, "--kv-rate")) rates.push_back(number(rate_s, "--kv-rate"));
    // with a rate in the list, the configurations without one (-1) are the
    // uncompressed baselines and drop the flags that shape ranks; with none,
    // options_resolve_ranks says what such a flag needs
    const bool some_rate = base.kv_eps >= 0 || *std::max_element(rates.begin(), rates.end()) >= 0;
    const bool plans = !o.kv_plan.empty() || !o.kv_target.empty();
    if (plans && !o.kv_sweep_given) rates.clear();  // the plans alone
    for (double rate : rates)
        for (int64_t bits : parse_list(kv_bits_list, "--kv-bits", 2))
            for (const std::string& policy : split_list(o.kv_evict, "--kv-evict"))
                for (int64_t budget : parse_list(o.kv_budget, "--kv-budget", 0)) {
                    model_opts mo = base;
                    mo.kv_rank_weight = -1;  // the plans' (below)
                    mo.kv_bits = (int)bits;
                    mo.kv_gear = base.kv_gear && (bits == 4 || bits == 2);
                    mo.kv_evict = policy;
                    mo.kv_budget = policy == "none" ? -1 : budget;
                    mo.kv_rate = rate;
                    std::string desc =
                        bits == 16 ? mo.kv_type : strfmt("q%lld%s", (long long)bits, mo.kv_gear ? "+gear" : "");
                    if (mo.kv_rate >= 0) desc += strfmt(" zack%.2f", mo.kv_rate);
                    if (mo.kv_eps >= 0) desc += strfmt(" eps%.2f", mo.kv_eps);
                    if (mo.kv_rate >= 0 || mo.kv_eps >= 0) {
                        desc += rank_desc;
                    } else if (some_rate) {
                        mo.kv_uniform = false;
                        mo.kv_alloc.clear();
                        mo.kv_key_basis = dflt.kv_key_basis;
                    }
                    if (policy != "none") desc += strfmt(" %s%lld", policy.c_str(), (long long)budget);
                    add_config(mo, desc);
                }
    // KV plans: one configuration each, with the precision, ranks and eviction they set
    auto plan_opts = [&]() {
        model_opts mo = base;  // without the flags that shape the --kv-rate configurations
        mo.kv_gear = false;
        mo.kv_eps = -1;
        mo.kv_uniform = false;
        mo.kv_alloc.clear();
        mo.kv_key_basis = dflt.kv_key_basis;
        return mo;
    };
    if (!o.kv_plan.empty())
        for (const std::string& spec : split_list(o.kv_plan, "--kv-plan")) {
            model_opts mo = plan_opts();
            mo.kv_rank_weight = -1;  // a recorded plan has its ranks already
            mo.kv_plan = spec;
            add_config(mo, "plan " + spec);
        }
    if (!o.kv_target.empty())
        for (const std::string& t : split_list(o.kv_target, "--kv-target")) {
            model_opts mo = plan_opts();
            mo.kv_target = number(t, "--kv-target");
            add_config(mo, "plan t" + t);
        }

    std::vector<bench_row> rows;
    // one row group per (threads, KV configuration)
    std::vector<std::pair<int64_t, const kv_config*>> runs;
    for (int64_t nt : threads)
        for (const kv_config& kc : kv_configs) runs.push_back({nt, &kc});
    for (const auto& run : runs) {
        const int64_t nt = run.first;
        const kv_config& kc = *run.second;
        session_params sp = kc.sp;
        sp.n_threads = (int)nt;
        // Sequence 0 serves every batch-1 row; the others are made when a
        // batched row first needs them.
        std::vector<std::unique_ptr<session>> seqs;
        seqs.push_back(std::make_unique<session>(*m, sp));
        session& s = *seqs[0];
        const std::string kv_desc = kc.desc;
        for (int64_t d : depths) {
            // each sequence's context, different for each
            auto ctx_tokens = [&](int64_t i) { return bench_tokens(*m, d, 1 + d + 7919 * i); };
            auto run_test = [&](bool prefill, int64_t len, int64_t batch) {
                bench_row row;
                row.test = strfmt("%s%lld", prefill ? "pp" : "tg", (long long)len);
                row.n_tokens = len;
                row.depth = d;
                row.batch = batch;
                row.threads = (int)nt;
                row.kv = kv_desc;
                row.device = backend_device_name(s.params().device);
                while ((int64_t)seqs.size() < batch) seqs.push_back(std::make_unique<session>(*m, sp));
                std::vector<session*> ptrs;
                std::vector<std::vector<int32_t>> ctx, toks;
                for (int64_t i = 0; i < batch; i++) {
                    ptrs.push_back(seqs[i].get());
                    if (d > 0) ctx.push_back(ctx_tokens(i));
                    toks.push_back(bench_tokens(*m, len, 7 + len + 7919 * i));
                }
                std::unique_ptr<batch_decoder> bd;
                if (batch > 1) bd = std::make_unique<batch_decoder>(ptrs, (int)nt);
                std::vector<int32_t> step_tokens(batch);
                std::vector<double> tps, ms;
                // a warm-up run at depth 0; at a depth, prefilling it warms everything up
                for (int rep = d > 0 ? 0 : -1; rep < o.reps; rep++) {
                    for (int64_t i = 0; i < batch; i++) {
                        ptrs[i]->reset();
                        // A long depth takes a while: say how far the prefill is.
                        for (int64_t at = 0; at < d; at += 512) {
                            if (d > 512)
                                std::fprintf(stderr, "\rbench: %s depth %lld: prefilling sequence %lld, %lld/%lld tokens   ",
                                             row.test.c_str(), (long long)d, (long long)i, (long long)at, (long long)d);
                            ptrs[i]->decode(ctx[i].data() + at, std::min<int64_t>(512, d - at));
                        }
                    }
                    std::fprintf(stderr, "\rbench: %s depth %lld batch %lld threads %lld rep %d/%d   ",
                                 row.test.c_str(), (long long)d, (long long)batch, (long long)nt, rep + 1, o.reps);
                    const auto t0 = std::chrono::steady_clock::now();
                    if (prefill) {
                        s.decode(toks[0].data(), len);
                    } else if (!bd) {
                        for (int64_t i = 0; i < len; i++) s.decode(&toks[0][i], 1);
                    } else {
                        for (int64_t t = 0; t < len; t++) {
                            for (int64_t i = 0; i < batch; i++) step_tokens[i] = toks[i][t];
                            bd->step(step_tokens.data());
                        }
                    }
                    const double sec = seconds_since(t0);
                    if (rep < 0) continue;
                    tps.push_back(batch * len / sec);
                    ms.push_back(prefill ? sec * 1e3 : sec * 1e3 / len);
                }
                mean_std(tps, row.mean_tps, row.std_tps);
                mean_std(ms, row.mean_ms, row.std_ms);
                row.kv_bytes_per_token = s.cache().bytes_per_token();
                for (session* q : ptrs) {
                    row.kv_bytes += q->cache().bytes_allocated();
                    row.kv_bytes_used += q->cache().bytes_per_token() * (size_t)q->n_past();
                }
                row.peak_rss = peak_rss_bytes();
                rows.push_back(row);
                if (o.format == "jsonl" && o.output_file.empty()) {
                    std::fprintf(stderr, "\r%100s\r", "");
                    file_out_stdout(jsonl_line(row) + "\n");
                }
            };
            for (int64_t p : prompts)
                if (p > 0) run_test(true, p, 1);
            for (int64_t g : gens)
                if (g > 0)
                    for (int64_t b : batches) run_test(false, g, b);
        }
    }
    std::fprintf(stderr, "\r%100s\r", "");

    std::string out;
    if (o.format == "json") {
        nlohmann::json j;
        j["model"] = model_name;
        j["model_desc"] = model_describe(*m);
        if (shape) j["random_weights"] = {{"shape", shape->name}, {"type", dtype_name(shape_type)}};
        j["n_ctx"] = n_ctx;
        j["results"] = nlohmann::json::array();
        for (const auto& r : rows) j["results"].push_back(row_json(r));
        out = j.dump(2) + "\n";
    } else if (o.format == "jsonl") {
        for (const auto& r : rows) out += jsonl_line(r) + "\n";
    } else if (o.format == "csv") {
        out = "test,n_tokens,depth,batch,threads,kv,tokens_per_s,tokens_per_s_std,ms,ms_std,kv_bytes_per_token,"
              "kv_bytes_allocated,kv_bytes_used,peak_rss_bytes\n";
        for (const auto& r : rows)
            out += strfmt("%s,%lld,%lld,%lld,%d,%s,%.3f,%.3f,%.4f,%.4f,%zu,%zu,%zu,%zu\n", r.test.c_str(),
                          (long long)r.n_tokens, (long long)r.depth, (long long)r.batch, r.threads, r.kv.c_str(),
                          r.mean_tps, r.std_tps, r.mean_ms, r.std_ms, r.kv_bytes_per_token, r.kv_bytes,
                          r.kv_bytes_used, r.peak_rss);
    } else {
        out = "model: " + (shape ? model_name + " (not a real model): " : "") + model_describe(*m) + "\n\n";
        out += "| test | depth | batch | threads | kv | tokens/s (all seqs) | ms (TTFT or per step) | KV bytes/token (per seq) | KV bytes used (all seqs) | peak RSS |\n";
        out += "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|\n";
        for (const auto& r : rows)
            out += strfmt("| %s | %lld | %lld | %d | %s | %.2f ± %.2f | %.3f ± %.3f | %zu | %s | %s |\n", r.test.c_str(),
                          (long long)r.depth, (long long)r.batch, r.threads,
                          (r.device == "cpu" ? r.kv : r.kv + " [" + r.device + "]").c_str(), r.mean_tps, r.std_tps,
                          r.mean_ms, r.std_ms, r.kv_bytes_per_token, fmt_bytes(r.kv_bytes_used).c_str(),
                          fmt_bytes(r.peak_rss).c_str());
    }
    if (!o.output_file.empty()) {
        file_out_write(o.output_file, out);
        std::fprintf(stderr, "bench: wrote %s\n", o.output_file.c_str());
    } else if (o.format != "jsonl") {  // jsonl rows went out as they finished
        file_out_stdout(out);
    }
    return 0;
}

}  // namespace zk
