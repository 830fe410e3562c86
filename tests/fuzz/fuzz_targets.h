// Fuzz targets for everything zack reads from strangers: GGUF files, .zack
// files (through the engine's own model_load), the tokenizer, chat templates,
// eval data files and the command line. Each target takes one input and must
// never crash, hang (> 1 s), leak or trip a sanitizer; a clean rejection is a
// zk::error, which the target catches. Any other exception escapes and is a
// finding (libFuzzer reports it as a crash).
//
// The same functions run in three places:
//   tests/fuzz/fuzz_main.cpp       one libFuzzer binary per target (ZACK_FUZZ=ON, clang)
//   tests/fuzz/test_fuzz_regress   GoogleTest: every seed and every kept finding
//                                  (tests/data/fuzz/<target>/) through every build
//   tests/fuzz/fuzz_seeds.cpp      writes the seed corpora (small real files)
// scripts/fuzz.sh runs them; tests/fuzz/README.md says how to add a target.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zk_fuzz {

struct fuzz_target {
    const char* name;
    void (*init)();                                 // once per process: loads what the target needs
    void (*one)(const uint8_t* data, size_t size);  // one input
    // Seed inputs: small real files, written as (name, bytes) pairs.
    std::vector<std::pair<std::string, std::string>> (*seeds)();
};

// Every target, in a fixed order.
const std::vector<fuzz_target>& fuzz_target_list();
// Throws std::runtime_error for an unknown name.
const fuzz_target& fuzz_target_get(const std::string& name);

// The input as a file that the readers open by path: one in-memory file
// (memfd) per process, reached as /proc/self/fd/N, rewritten per input.
const std::string& fuzz_file_set(const uint8_t* data, size_t size);

// The default model (ZACK_MODEL, else the build's default path); init()
// functions that need it fail loudly when it is missing.
std::string fuzz_model_path();
// A scratch directory for the process, removed at exit.
const std::string& fuzz_scratch_dir();

// Reads successive fields out of an input (a small deterministic decoder).
class fuzz_reader {
public:
    fuzz_reader(const uint8_t* d, size_t n) : d_(d), n_(n) {}
    uint8_t byte() { return pos_ < n_ ? d_[pos_++] : 0; }
    uint32_t u32() {
        uint32_t v = 0;
        for (int k = 0; k < 4; k++) v |= (uint32_t)byte() << (8 * k);
        return v;
    }
    // Bytes up to the next `sep` (consumed) or the end.
    std::string until(char sep) {
        const size_t b = pos_;
        while (pos_ < n_ && d_[pos_] != (uint8_t)sep) pos_++;
        std::string s((const char*)d_ + b, pos_ - b);
        if (pos_ < n_) pos_++;
        return s;
    }
    std::string rest() {
        std::string s((const char*)d_ + pos_, n_ - pos_);
        pos_ = n_;
        return s;
    }
    bool done() const { return pos_ >= n_; }

private:
    const uint8_t* d_;
    size_t n_;
    size_t pos_ = 0;
};

// The targets (one file each).
void fuzz_gguf_init();
void fuzz_gguf_one(const uint8_t* data, size_t size);
std::vector<std::pair<std::string, std::string>> fuzz_gguf_seeds();

void fuzz_zack_init();
void fuzz_zack_one(const uint8_t* data, size_t size);
std::vector<std::pair<std::string, std::string>> fuzz_zack_seeds();

void fuzz_tokenizer_init();
void fuzz_tokenizer_one(const uint8_t* data, size_t size);
std::vector<std::pair<std::string, std::string>> fuzz_tokenizer_seeds();

void fuzz_chat_init();
void fuzz_chat_one(const uint8_t* data, size_t size);
std::vector<std::pair<std::string, std::string>> fuzz_chat_seeds();

void fuzz_eval_init();
void fuzz_eval_one(const uint8_t* data, size_t size);
std::vector<std::pair<std::string, std::string>> fuzz_eval_seeds();

void fuzz_cli_init();
void fuzz_cli_one(const uint8_t* data, size_t size);
std::vector<std::pair<std::string, std::string>> fuzz_cli_seeds();

}  // namespace zk_fuzz
