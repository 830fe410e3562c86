// The CLI option table: every flag is registered here once, with its help text
// and default, by group; each subcommand adds the groups that apply to it.
#pragma once
#include <string>

#include <CLI/CLI.hpp>

#include "engine/sampler.h"
#include "engine/session.h"

namespace zk {

struct model_opts {
    std::string model_path;
    int n_threads = 0;  // 0 = all hardware threads
    int64_t n_ctx = 4096;
    int64_t n_batch = 256;
    std::string kv_type = "f16";
    // KV cache precision and eviction (engine/kv_cache.h, engine/evict/evict.h)
    int kv_bits = 16;
    int kv_group = 32;
    int kv_residual = 0;
    bool kv_gear = false;
    int kv_gear_rank = 2;
    float kv_gear_outliers = 0.02f;
    std::string kv_evict = "none";
    int64_t kv_budget = 0;
    int kv_sinks = 4;
    int64_t kv_recent = -1;
    float kv_crush = 0.0f;
    std::string kv_crush_anchor = "mean";
    // ZACK compressed attention (a .zack model): overall rate, or removal rate eps
    double kv_rate = -1;   // < 0: not set
    double kv_eps = -1;    // < 0: not set
    bool kv_uniform = false;
    bool verbose = false;
};

struct run_opts {
    std::string prompt;
    bool has_prompt = false;
    int64_t n_predict = -1;
    bool raw = false;
    std::string system;
    std::string chat_template;
};

void options_add_model(CLI::App& app, model_opts& o);
void options_add_sampling(CLI::App& app, sampler_params& p);
void options_add_run(CLI::App& app, run_opts& o);

// Resolves --kv-rate / --kv-eps / --kv-uniform into per-head ranks for model m
// (a .zack file); leaves p.ranks_* empty when none is set. Throws for a plain
// GGUF given a rate, or values out of range.
void options_resolve_ranks(const model_opts& o, const model& m, session_params& p);

// Turns model options into session parameters (validates thread count etc.).
session_params options_session_params(const model_opts& o);

// Writes text to PATH.tmp and renames it over PATH, so an interrupted or failed
// write never leaves a half-written PATH. Throws with the path on failure.
void options_write_file(const std::string& path, const std::string& text);

}  // namespace zk
