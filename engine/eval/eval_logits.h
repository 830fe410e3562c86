// The baseline logits file of `zack eval --task ppl`: llama-perplexity's
// --kl-divergence-base workflow. A first run saves the baseline's next-token
// distributions at every scored position (--kl-divergence-base FILE); later runs
// (--kl-divergence-base FILE --kl-divergence) read the tokens and chunking from
// the file, run only the model and flags being tested, and compare with the
// saved distributions (KLD, top-1 agreement, RMS dp: eval_stats.h), without the
// baseline model in memory. zack's own format, not llama.cpp's.
//
// Format, version 1, little-endian, no padding between fields:
//   char[8]  magic "ZKLOGITS"
//   u32      version = 1
//   u32      n_vocab
//   u64      vocab_hash   FNV-1a 64 over every token's text, each followed by a 0 byte
//   i64      window       tokens fed per chunk (the context of each chunk)
//   i64      stride       0 = llama.cpp's chunks of -c; > 0 = its strided mode
//   i64      step         tokens between the starts of two chunks
//   i64      first        first scored position in a chunk (its logits score token first + 1)
//   i64      per_chunk    scored positions per chunk = window - 1 - first
//   i64      n_chunks
//   i32      bos          token written over the first of each chunk, -1 = none
//   u32      model_len, then model_len bytes: the baseline's model (path and description, UTF-8)
//   i64      n_tokens, then i32[n_tokens]: the tokenized text
//   zero bytes up to the next multiple of 64 from the start of the file
//   f16      log_softmax[n_chunks][per_chunk][n_vocab]: the baseline's
//            log-probabilities, chunk by chunk, position by position
// The file size must be exactly the data offset plus the log-probabilities.
// Precision: f16 keeps log-probabilities to 2^-11 relative; a row is
// renormalized when read (log-sum-exp shifted to 0), so comparing a model with
// its own saved baseline gives KLD below 1e-5 (tests/test_eval_cli.py).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/vocab.h"

namespace zk {

struct eval_logits_header {
    uint32_t n_vocab = 0;
    uint64_t vocab_hash = 0;
    int64_t window = 0, stride = 0, step = 0, first = 0, per_chunk = 0, n_chunks = 0;
    int32_t bos = -1;
    std::string model;
};

uint64_t eval_vocab_hash(const vocab& v);

// Writes the file through file_out. lp: [n_chunks x per_chunk x n_vocab] f32
// log-probabilities, stored as f16.
void eval_logits_write(const std::string& path, const eval_logits_header& h, const std::vector<int32_t>& tokens,
                       const float* lp);

// A saved baseline, mapped read-only; the constructor validates the header and
// the size and throws zk::error with the path for anything else.
class eval_logits_file {
public:
    explicit eval_logits_file(const std::string& path);
    ~eval_logits_file();
    eval_logits_file(const eval_logits_file&) = delete;
    eval_logits_file& operator=(const eval_logits_file&) = delete;

    const eval_logits_header& header() const { return h_; }
    const std::vector<int32_t>& tokens() const { return tokens_; }
    const std::string& path() const { return path_; }
    // out[n_vocab] <- the renormalized log-probabilities of chunk `chunk`, scored position j.
    void row(int64_t chunk, int64_t j, float* out) const;

private:
    std::string path_;
    eval_logits_header h_;
    std::vector<int32_t> tokens_;
    const uint8_t* map_ = nullptr;
    size_t size_ = 0;
    size_t data_off_ = 0;
};

}  // namespace zk
