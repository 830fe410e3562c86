// Fuzz target "cli": the command line of every subcommand (main/cli.h: the
// option tables and CLI11's parsing), then the checks that need no file: the
// sampler's and the session's parameter validation and the chat template name.
// Input: the arguments after "zack", separated by NUL bytes. Run with
// -close_fd_mask=3 (scripts/fuzz.sh does): help and error lines go to stdout/stderr.
// Seeds: command lines from the README.
#include <CLI/CLI.hpp>

#include "engine/chat.h"
#include "engine/sampler.h"
#include "ggml-like/error.h"
#include "main/cli.h"
#include "tests/fuzz/fuzz_targets.h"

namespace zk_fuzz {

void fuzz_cli_init() {}

void fuzz_cli_one(const uint8_t* data, size_t size) {
    fuzz_reader in(data, size);
    std::vector<std::string> args = {"zack"};
    while (!in.done() && args.size() < 64) args.push_back(in.until('\0'));
    std::vector<const char*> argv;
    for (const std::string& a : args) argv.push_back(a.c_str());
    zk::cli_app cli;
    if (cli.parse((int)argv.size(), argv.data()) >= 0) return;
    try {
        if (cli.run_cmd->parsed()) {
            zk::sampler_validate_params(cli.sp);
            (void)zk::options_session_params(cli.mo);
            if (!cli.ro.chat_template.empty()) (void)zk::chat_template_from_name(cli.ro.chat_template);
        }
    } catch (const zk::error&) {
    }
}

std::vector<std::pair<std::string, std::string>> fuzz_cli_seeds() {
    const char* lines[] = {
        "run -m M.gguf",
        "run -m M.gguf -p What is a KV cache? -n 64 --temp 0",
        "run -m M.gguf -p The capital of France is --raw -n 16",
        "run -m M.zack --kv-rate 0.3 --kv-bits 4 --kv-evict h2o --kv-budget 1024 -v",
        "run -m M.gguf -c 512 -t 2 --top-k 40 --top-p 0.9 --min-p 0.05 --repeat-penalty 1.1 -s 7 --kv-evict snapkv --kv-budget 128 --kv-crush 0.25 --kv-sinks 2 --chat-template llama3",
        "info M.gguf --json",
        "calibrate -m M.gguf -o M.zack --tokens 4096 --ctx 512 --rank-align 8",
        "bench -m M.zack -p 512 -n 64 -d 0,2048 --kv-rate -1,0.5 --kv-bits 16,4",
        "eval -m M.zack --task ppl --data F -c 512 --kv-rate 0.2",
        "eval -m M.gguf --task passkey --passkey-lengths 256,512 --passkey-depths 0,0.5,1",
        "eval -m M.gguf --task mc --data F --sweep --methods zack q4 --points 3 --grid --kv-bits=8,4",
    };
    std::vector<std::pair<std::string, std::string>> out;
    int k = 0;
    for (const char* l : lines) {
        std::string s(l);
        for (char& c : s)
            if (c == ' ') c = '\0';
        out.push_back({"argv" + std::to_string(k++), s});
    }
    return out;
}

}  // namespace zk_fuzz
