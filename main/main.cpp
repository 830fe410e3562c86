// zack: a llama.cpp-style inference tool with a compressed KV cache.
// Subcommands are declared here; errors from anywhere below are caught once and
// printed as one line.
#include <cstdio>
#include <cstring>
#include <exception>

#include <CLI/CLI.hpp>

#include "ggml-like/error.h"
#include "ggml-like/file_out.h"
#include "main/commands.h"
#include "main/version.h"

namespace {

// A bare "-fa" / "--color" (an option with an optional value) means "on".
void main_bare_means_on(const CLI::App& app, const char* name, std::string& value) {
    if (app.count(name) > 0 && value.empty()) value = "on";
}

int main_parse_error(const char* sub, const std::string& what) {
    std::fprintf(stderr, "zack: error: %s (see zack%s%s --help)\n", what.c_str(), sub ? " " : "", sub ? sub : "");
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"zack: LLM inference with a compressed KV cache (GGUF models)", "zack"};
    app.option_defaults()->always_capture_default();
    app.require_subcommand(1);
    app.set_help_all_flag("--help-all", "help for every subcommand");
    app.set_version_flag("--version", "", "print the version, git commit, CPU features and CUDA support");

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
    const char* sub = nullptr;
    for (const CLI::App* sc : app.get_subcommands([](const CLI::App*) { return true; }))
        if (argc > 1 && sc->get_name() == argv[1]) sub = argv[1];
    if (argc > 1 && argv[1][0] != '-' && !sub) {
        std::fprintf(stderr, "zack: error: unknown subcommand '%s' (see zack --help)\n", argv[1]);
        return 2;
    }
    try {
        std::vector<std::string> args = zk::options_expand_aliases(argc, argv);
        std::reverse(args.begin(), args.end());  // CLI11 takes the vector last argument first
        app.parse(args);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion&) {
        try {
            zk::file_out_stdout(zk::version_text());
        } catch (const zk::error& e) {
            std::fprintf(stderr, "zack: error: %s\n", e.what());
            return 1;
        }
        return 0;
    } catch (const CLI::ParseError& e) {
        return main_parse_error(sub, e.what());  // one line, like every other error
    }

    try {
        int rc = 0;
        if (run->parsed()) {
            ro.has_prompt = run->count("--prompt") > 0;
            main_bare_means_on(*run, "--color", ro.color);
            main_bare_means_on(*run, "--flash-attn", mo.flash_attn);
            rc = zk::cmd_run(mo, sp, ro);
        } else if (info->parsed()) {
            rc = zk::cmd_info(info_path, info_json);
        } else if (bench->parsed()) {
            main_bare_means_on(*bench, "--flash-attn", bo.flash_attn);
            rc = zk::cmd_bench(bo);
        } else if (calibrate->parsed()) {
            rc = zk::cmd_calibrate(co);
        } else if (eval->parsed()) {
            rc = zk::cmd_eval(*eval);  // its bare -fa is only reported (options_llama_notes)
        }
        zk::file_out_stdout_finish();  // a failed write to stdout (> /dev/full) is an error too
        return rc;
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
}
