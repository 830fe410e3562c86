// Subcommand entry points; each returns the process exit code and throws zk::error
// for failures (printed once by main).
#pragma once
#include "main/options.h"

namespace zk {

int cmd_run(const model_opts& mo, const sampler_params& sp, const run_opts& ro);
int cmd_info(const std::string& path, bool json);

}  // namespace zk
