#include "main/cli.h"

#include <algorithm>
#include <cstdio>

#include <CLI/CLI.hpp>

#include "ggml-like/error.h"
#include "ggml-like/file_out.h"
#include "main/version.h"

namespace zk {

namespace {

// A bare "-fa" / "--color" (an option with an optional value) means "on".
void cli_bare_means_on(const CLI::App& app, const char* name, std::string& value) {
    if (app.count(name) > 0 && value.empty()) value = "on";
}

int cli_parse_error(const char* sub, const std::string& what) {
    std::fprintf(stderr, "zack: error: %s (see zack%s%s --help)\n", what.c_str(), sub ? " " : "", sub ? sub : "");
    return 2;
}

}  // namespace

cli_app::cli_app()
    : app(std::make_unique<CLI::App>("zack: LLM inference with a compressed KV cache (GGUF models)", "zack")) {
    app->option_defaults()->always_capture_default();
    app->require_subcommand(1);
    app->set_help_all_flag("--help-all", "help for every subcommand");
    app->set_version_flag("--version", "", "print the version, git commit, CPU features and CUDA support");

    run_cmd = app->add_subcommand("run", "chat with a model, or answer one prompt (-p)");
    run_cmd->option_defaults()->always_capture_default();
    options_add_model(*run_cmd, mo);
    options_add_run(*run_cmd, ro);
    options_add_sampling(*run_cmd, sp);

    bench_cmd = app->add_subcommand("bench", "measure prefill and decode speed (llama-bench style)");
    bench_cmd->option_defaults()->always_capture_default();
    options_add_bench(*bench_cmd, bo);

    info_cmd = app->add_subcommand("info", "show a model file's metadata and tensors");
    info_cmd->add_option("file", info_path, "a .gguf or .zack file")->required();
    info_cmd->add_flag("--json", info_json, "print JSON instead of tables");

    calibrate_cmd = app->add_subcommand("calibrate", "build a .zack (rotations, spectra, folded weights) from a GGUF model");
    calibrate_cmd->option_defaults()->always_capture_default();
    options_add_calibrate(*calibrate_cmd, co);

    eval_cmd = eval_add_subcommand(*app, *eo);
}

cli_app::~cli_app() = default;

int cli_app::parse(int argc, const char* const* argv) {
    // CLI11 would only say "a subcommand is required"; name the word it did not know.
    const char* sub = nullptr;
    for (const CLI::App* sc : app->get_subcommands([](const CLI::App*) { return true; }))
        if (argc > 1 && sc->get_name() == argv[1]) sub = argv[1];
    if (argc > 1 && argv[1][0] != '-' && !sub) {
        std::fprintf(stderr, "zack: error: unknown subcommand '%s' (see zack --help)\n", argv[1]);
        return 2;
    }
    try {
        std::vector<std::string> args = options_expand_aliases(argc, argv);
        std::reverse(args.begin(), args.end());  // CLI11 takes the vector last argument first
        app->parse(args);
    } catch (const CLI::CallForHelp& e) {
        return app->exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app->exit(e);
    } catch (const CLI::CallForVersion&) {
        try {
            file_out_stdout(version_text());
        } catch (const error& e) {
            std::fprintf(stderr, "zack: error: %s\n", e.what());
            return 1;
        }
        return 0;
    } catch (const CLI::ParseError& e) {
        return cli_parse_error(sub, e.what());  // one line, like every other error
    }
    return -1;
}

int cli_app::run() {
    int rc = 0;
    if (run_cmd->parsed()) {
        ro.has_prompt = run_cmd->count("--prompt") > 0;
        cli_bare_means_on(*run_cmd, "--color", ro.color);
        cli_bare_means_on(*run_cmd, "--flash-attn", mo.flash_attn);
        rc = cmd_run(mo, sp, ro);
    } else if (info_cmd->parsed()) {
        rc = cmd_info(info_path, info_json);
    } else if (bench_cmd->parsed()) {
        cli_bare_means_on(*bench_cmd, "--flash-attn", bo.flash_attn);
        if (bo.model_path.empty() && bo.shape.empty())
            return cli_parse_error("bench", "a model is needed: -m FILE, or --shape NAME for random weights");
        for (const char* f : {"--kv-rate", "--kv-bits", "--kv-evict", "--kv-budget", "--cache-type-k", "--cache-type-v"})
            bo.kv_sweep_given = bo.kv_sweep_given || bench_cmd->count(f) > 0;
        rc = cmd_bench(bo);
    } else if (calibrate_cmd->parsed()) {
        rc = cmd_calibrate(co);
    } else if (eval_cmd->parsed()) {
        rc = cmd_eval(*eval_cmd, *eo);  // its bare -fa is only reported (options_llama_notes)
    }
    file_out_stdout_finish();  // a failed write to stdout (> /dev/full) is an error too
    return rc;
}

}  // namespace zk
