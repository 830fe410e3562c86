// The zack command line: every subcommand with its option table (main/options.h
// and the cmd_*.cpp files), parsed into the option structs. main() parses and
// runs the subcommand; the CLI fuzz target (tests/fuzz/fuzz_cli.cpp) parses only.
#pragma once
#include <memory>
#include <string>

#include "main/commands.h"

namespace zk {

struct cli_app {
    cli_app();
    ~cli_app();
    cli_app(const cli_app&) = delete;
    cli_app& operator=(const cli_app&) = delete;

    // Parses argv (llama.cpp spellings expanded first). Returns -1 when a
    // subcommand is ready to run, else the exit code: 0 after printing help or
    // --version, 1 or 2 after printing a one-line error.
    int parse(int argc, const char* const* argv);
    // Runs the parsed subcommand, then checks that stdout took every byte;
    // throws zk::error (main prints it).
    int run();

    std::unique_ptr<CLI::App> app;
    model_opts mo;
    sampler_params sp;
    run_opts ro;
    bench_opts bo;
    std::shared_ptr<eval_opts> eo = eval_opts_make();  // defined with its table in main/cmd_eval.cpp
    calibrate_opts co;
    std::string info_path;
    bool info_json = false;
    CLI::App* run_cmd = nullptr;
    CLI::App* bench_cmd = nullptr;
    CLI::App* info_cmd = nullptr;
    CLI::App* calibrate_cmd = nullptr;
    CLI::App* eval_cmd = nullptr;
};

}  // namespace zk
