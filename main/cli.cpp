#include "main/cli.h"

#include <cstdio>

namespace zk {

cli_app::cli_app() {
    app.option_defaults()->always_capture_default();
    app.require_subcommand(1);
    app.set_help_all_flag("--help-all", "help for every subcommand");

    run_cmd = app.add_subcommand("run", "chat with a model, or answer one prompt (-p)");
    run_cmd->option_defaults()->always_capture_default();
    options_add_model(*run_cmd, mo);
    options_add_run(*run_cmd, ro);
    options_add_sampling(*run_cmd, sp);

    bench_cmd = app.add_subcommand("bench", "measure prefill and decode speed (llama-bench style)");
    bench_cmd->option_defaults()->always_capture_default();
    options_add_bench(*bench_cmd, bo);

    info_cmd = app.add_subcommand("info", "show a model file's metadata and tensors");
    info_cmd->add_option("file", info_path, "a .gguf or .zack file")->required();
    info_cmd->add_flag("--json", info_json, "print JSON instead of tables");

    calibrate_cmd = app.add_subcommand("calibrate", "build a .zack (rotations, spectra, folded weights) from a GGUF model");
    calibrate_cmd->option_defaults()->always_capture_default();
    options_add_calibrate(*calibrate_cmd, co);

    eval_cmd = eval_add_subcommand(app);
}

int cli_app::parse(int argc, const char* const* argv) {
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
    return -1;
}

int cli_app::run() {
    if (run_cmd->parsed()) {
        ro.has_prompt = run_cmd->count("--prompt") > 0;
        return cmd_run(mo, sp, ro);
    }
    if (info_cmd->parsed()) return cmd_info(info_path, info_json);
    if (bench_cmd->parsed()) return cmd_bench(bo);
    if (calibrate_cmd->parsed()) return cmd_calibrate(co);
    if (eval_cmd->parsed()) return cmd_eval(*eval_cmd);
    return 0;
}

}  // namespace zk
