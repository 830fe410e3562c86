// Subcommand entry points; each returns the process exit code and throws zk::error
// for failures (printed once by main).
#pragma once
#include <memory>

#include "calib/corpus.h"
#include "main/options.h"

namespace zk {

int cmd_run(const model_opts& mo, const sampler_params& sp, const run_opts& ro);
int cmd_info(const std::string& path, bool json);

// `zack bench` (main/cmd_bench.cpp). List flags are comma-separated.
struct bench_opts {
    std::string model_path;
    // --shape: no model file; a GGUF of this shape with random weights of
    // shape_type is written to a temporary directory and benchmarked
    // (engine/model_synth.h), and every output says so
    std::string shape;
    std::string shape_type = "q4_k";
    std::string prompt = "512";
    std::string gen = "128";
    std::string depth = "0";
    std::string batch = "1";
    std::string threads = "2";
    int reps = 3;
    int64_t n_ctx = 0;
    std::string format = "md";       // md | csv | json | jsonl (llama-bench's -o)
    std::string output_file;         // write the results here (file_out) instead of stdout
    // llama-bench spellings: -ctk/-ctv lists map onto --kv-bits; -ngl/-fa are accepted
    std::string cache_type_k, cache_type_v, n_gpu_layers, flash_attn;
    // KV cache configurations: every combination of these lists is benchmarked
    std::string kv_rate = "-1";     // ZACK overall rate (a .zack model); -1 = uncompressed
    std::string kv_bits = "16";
    std::string kv_evict = "none";
    std::string kv_budget = "0";
    // KV plans (calib/plan.h), each one more configuration: plan specs and targets, comma lists
    std::string kv_plan, kv_target;
    // whether any sweep list above (or -ctk/-ctv) was given: with plans and
    // none, only the plans run (give --kv-bits 16 for the baseline beside them)
    bool kv_sweep_given = false;
    // every other --kv-* flag, one value for all configurations: the table and
    // the checks `zack run` uses (options_add_kv, options_session_params,
    // options_resolve_ranks); its list fields are set per configuration
    model_opts kv;
};
void options_add_bench(CLI::App& app, bench_opts& o);
int cmd_bench(const bench_opts& o);

// `zack calibrate` (main/cmd_calibrate.cpp registers its own options).
struct calibrate_opts {
    std::string model_path, out_path, compare_path, save_corpus;
    std::vector<std::string> corpus;
    int64_t n_tokens = 16384;
    int64_t n_ctx = 1024;
    int n_threads = 0;  // 0 = all hardware threads
    int rank_align = 4;
    uint64_t seed = 20240601;
    // Sampler and sample length of the generated default corpus (calib/corpus.cpp
    // says why these defaults); gen.seed is unused (seed above).
    sampler_params gen = corpus_default_sampling();
    int64_t gen_len = corpus_gen_params{}.max_per_sample;
    int gen_parallel = corpus_gen_params{}.n_parallel;
    double compare_rate = 0.5;
    std::string v_stat = "attn";
    int64_t sens_tokens = 2048;  // sensitivity pass (0 = none)
    std::vector<double> kv_targets;  // plans to record (--kv-target)
    bool kv_kivi_keys = false;       // the plans keep KIVI keys for --kv-select (--kv-kivi-keys)
    int kv_group = 32;               // the KIVI group the losses are measured at and plans made for (--kv-group)
    int sens_stride = 4;
    int64_t vq_rows = 12288;    // value codebooks: training rows a head (0 = none; calib/codebook.h)
    int64_t fit_tokens = 3072;  // the rank-weight fit (calib/rank_fit.h); 0 = none (weight 1)
    // the layer gains (calib/layer_gain.h); 0 = none; -1: 4096 where the file records
    // plans (--kv-target) or --gain-target names one, else none (18 of the 24 minutes
    // of a 16K-token calibration of the 1.5B, for plans the user may never make)
    int64_t gain_tokens = -1;
    static constexpr int64_t gain_tokens_with_plans = 4096;  // what -1 means where plans are recorded
    double gain_target = 0;      // the plan they are measured at; 0 = the least --kv-target, else the fit's
    bool quiet = false;
};
void options_add_calibrate(CLI::App& app, calibrate_opts& o);
int cmd_calibrate(const calibrate_opts& o);

// `zack eval` (main/cmd_eval.cpp registers and keeps its own options).
struct eval_opts;
std::shared_ptr<eval_opts> eval_opts_make();
CLI::App* eval_add_subcommand(CLI::App& app, eval_opts& o);
int cmd_eval(CLI::App& eval, eval_opts& o);

}  // namespace zk
