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

// Turns model options into session parameters (validates thread count etc.).
session_params options_session_params(const model_opts& o);

}  // namespace zk
