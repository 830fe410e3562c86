// Fuzz target "eval": the eval data parsers (mc JSONL, ppl and lastword text
// files) and the passkey generator with arbitrary options, on the tiny test
// model (tests/tiny_model.h), and then the task itself run twice (baseline and
// comparison) when its items are short, so that option combinations that parse
// but index past the tokens are caught too.
// Input: byte 0 picks the task, the --on-error policy and whether to run; the
// next 8 bytes are the task's numeric options; the rest is the data file.
// Seeds: the files of tests/data/eval.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include "engine/eval/eval_task.h"
#include "engine/model.h"
#include "engine/session.h"
#include "ggml-like/error.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/tiny_model.h"

namespace zk_fuzz {

namespace {

// Tasks whose longest item needs more context than this are built but not run.
constexpr int64_t k_max_run_ctx = 160;

std::unique_ptr<zk::model>& tiny() {
    static std::unique_ptr<zk::model> m;
    return m;
}

float float_of(uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

}  // namespace

void fuzz_eval_init() {
    if (tiny()) return;
    const std::string path = fuzz_scratch_dir() + "/eval_tiny.gguf";
    zk_test::tiny_model_params p;
    p.n_layer = 1, p.n_embd = 64, p.n_head = 1, p.n_head_kv = 1, p.n_ff = 64;
    zk_test::tiny_model_write(path, p);
    tiny() = zk::model_load(path);
}

void fuzz_eval_one(const uint8_t* data, size_t size) {
    fuzz_eval_init();
    const zk::model& m = *tiny();
    fuzz_reader in(data, size);
    const uint8_t sel = in.byte();
    uint8_t opt[8];
    for (uint8_t& b : opt) b = in.byte();
    const std::string& file = fuzz_file_set(data + std::min<size_t>(size, 9), size - std::min<size_t>(size, 9));
    const zk::eval_on_error policy = (sel & 4) ? zk::eval_on_error::SKIP : zk::eval_on_error::STOP;
    std::unique_ptr<zk::eval_task> task;
    try {
        switch (sel & 3) {
            case 0: {
                zk::eval_mc_opts o;
                o.limit = opt[0] % 4;
                task = zk::eval_task_mc(m, {file}, o, policy);
                break;
            }
            case 1: {
                zk::eval_ppl_opts o;
                o.n_ctx = (int64_t)(int8_t)opt[0];
                o.stride = (int64_t)(int8_t)opt[1];
                o.limit = opt[2] % 3;
                o.piece = (int64_t)(int8_t)opt[3];
                task = zk::eval_task_ppl(m, {file}, o, policy);
                break;
            }
            case 2: {
                zk::eval_lastword_opts o;
                o.min_words = (int8_t)opt[0];
                o.max_words = (int8_t)opt[1];
                o.limit = opt[2] % 3;
                task = zk::eval_task_lastword(m, {file}, o, policy);
                break;
            }
            default: {
                zk::eval_passkey_opts o;
                o.lengths = {(int64_t)opt[0] * 2};
                if (opt[1] & 1) o.lengths.push_back((int64_t)(int8_t)opt[2] * 4);
                o.depths = {(double)float_of((uint32_t)opt[3] | (uint32_t)opt[4] << 8 | (uint32_t)opt[5] << 16 |
                                             (uint32_t)opt[6] << 24)};
                o.trials = (int8_t)opt[7] % 3;
                o.limit = 2;
                task = zk::eval_task_passkey(m, o, policy);
                break;
            }
        }
    } catch (const zk::error&) {
        return;
    }
    (void)task->n_items(), (void)task->n_tokens_typical();
    for (const zk::eval_data_issue& i : task->issues()) (void)i.describe();
    if (!(sel & 8) || task->n_ctx_needed() > k_max_run_ctx || task->n_items() > 4) return;
    zk::session_params sp;
    sp.n_ctx = std::max<int64_t>(task->n_ctx_needed(), 1);
    sp.n_threads = 1;
    zk::session s(m, sp);
    zk::eval_progress prog("fuzz", task->n_items(), false);
    try {
        const zk::eval_score base = task->run(s, true, prog);
        const zk::eval_score again = task->run(s, false, prog);
        (void)zk::eval_retention(again, base);
    } catch (const zk::error&) {
    }
}

std::vector<std::pair<std::string, std::string>> fuzz_eval_seeds() {
    std::vector<std::pair<std::string, std::string>> out;
    const std::string dir = std::string(ZACK_SOURCE_DIR) + "/tests/data/eval";
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
        if (e.path().extension() == ".md") continue;
        std::ifstream f(e.path(), std::ios::binary);
        const std::string text(std::istreambuf_iterator<char>(f), {});
        const bool jsonl = e.path().extension() == ".jsonl";
        const std::string stem = e.path().stem().string();
        // sel: task | run (8); options: ctx 16, stride 0, limit 1, piece 8 / min 3 words, max 40
        if (jsonl) {
            out.push_back({stem + "_mc", std::string("\x08\x02\0\0\0\0\0\0\0", 9) + text});
            out.push_back({stem + "_mc_skip", std::string("\x0c\x00\0\0\0\0\0\0\0", 9) + text});
        } else {
            out.push_back({stem + "_ppl", std::string("\x09\x10\x00\x01\x08\0\0\0\0", 9) + text});
            out.push_back({stem + "_ppl_stride", std::string("\x09\x10\x08\x01\x04\0\0\0\0", 9) + text});
            out.push_back({stem + "_lastword", std::string("\x0a\x03\x28\x01\0\0\0\0\0", 9) + text});
        }
    }
    // passkey: length 2 x 50, depth 0.5f, one trial
    out.push_back({"passkey", std::string("\x0b\x32\x00\x00\x00\x00\x00\x3f\x01", 9)});
    return out;
}

}  // namespace zk_fuzz
