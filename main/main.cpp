// zack: a llama.cpp-style inference tool with a compressed KV cache.
// Subcommands are declared in main/cli.cpp; errors from anywhere below are
// caught once and printed as one line.
#include <cstdio>
#include <exception>
#include <new>

#include "ggml-like/blas_core.h"
#include "ggml-like/error.h"
#include "ggml-like/interrupt.h"
#include "main/cli.h"
#include "main/options.h"

int main(int argc, char** argv) {
    zk::blas_core_reexec(argv);  // OpenBLAS's kernels for this CPU, before any BLAS call
    zk::cli_app cli;
    const int rc = cli.parse(argc, argv);
    if (rc >= 0) return rc;
    zk::interrupt_install();  // Ctrl-C / SIGTERM / a closed stdout: no partial output file
    try {
        return cli.run();
    } catch (const zk::error& e) {
        // engine parameters named as this CLI's flags
        std::fprintf(stderr, "zack: error: %s\n", zk::options_flag_spelling(e.what()).c_str());
        return 1;
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "zack: error: out of memory\n");
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "zack: error: %s\n", e.what());
        return 1;
    }
}
