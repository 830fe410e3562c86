// zack: a llama.cpp-style inference tool with a compressed KV cache.
// Subcommands are declared here; errors from anywhere below are caught once and
// printed as one line.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "ggml-like/error.h"
#include "main/commands.h"

int main(int argc, char** argv) {
    CLI::App app{"zack: LLM inference with a compressed KV cache (GGUF models)", "zack"};
    app.option_defaults()->always_capture_default();
    app.require_subcommand(1);
    app.set_help_all_flag("--help-all", "help for every subcommand");

    zk::model_opts mo;
    zk::sampler_params sp;
    zk::run_opts ro;
    CLI::App* run = app.add_subcommand("run", "chat with a model, or answer one prompt (-p)");
    run->option_defaults()->always_capture_default();
    zk::options_add_model(*run, mo);
    zk::options_add_run(*run, ro);
    zk::options_add_sampling(*run, sp);

    zk::bench_opts bo;
    CLI::App* bench = app.add_subcommand("bench", "measure prefill and decode speed (llama-bench style)");
    bench->option_defaults()->always_capture_default();
    zk::options_add_bench(*bench, bo);

    std::string info_path;
    bool info_json = false;
    CLI::App* info = app.add_subcommand("info", "show a model file's metadata and tensors");
    info->add_option("file", info_path, "a .gguf or .zack file")->required();
    info->add_flag("--json", info_json, "print JSON instead of tables");

    zk::calibrate_opts co;
    CLI::App* calibrate = app.add_subcommand("calibrate", "build a .zack (rotations, spectra, folded weights) from a GGUF model");
    calibrate->option_defaults()->always_capture_default();
    zk::options_add_calibrate(*calibrate, co);

    CLI::App* eval = zk::eval_add_subcommand(app);

    // CLI11 would only say "a subcommand is required"; name the word it did not know.
    bool known = false;
    for (const CLI::App* sc : app.get_subcommands([](const CLI::App*) { return true; }))
        known = known || (argc > 1 && sc->get_name() == argv[1]);
    if (argc > 1 && argv[1][0] != '-' && !known) {
        std::fprintf(stderr, "zack: error: unknown subcommand '%s' (see zack --help)\n", argv[1]);
        return 2;
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        // one line, like every other error
        std::fprintf(stderr, "zack: error: %s (see zack --help)\n", e.what());
        return 2;
    }

    try {
        if (run->parsed()) {
            ro.has_prompt = run->count("--prompt") > 0;
            return zk::cmd_run(mo, sp, ro);
        }
        if (info->parsed()) return zk::cmd_info(info_path, info_json);
        if (bench->parsed()) return zk::cmd_bench(bo);
        if (calibrate->parsed()) return zk::cmd_calibrate(co);
        if (eval->parsed()) return zk::cmd_eval(*eval);
    } catch (const zk::error& e) {
        std::fprintf(stderr, "zack: error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "zack: error: out of memory\n");
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "zack: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
