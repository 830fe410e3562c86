// Calibration corpora: user text files, or the offline default.
//
// The default corpus is text the model itself writes from varied seed prompts
// (the paper's synthetic corpus, section 4.3: coherent text with enough distinct
// tokens; the rotation depends on the weights, not on the text). It needs no
// download and no shipped data, and a fixed sampler seed per prompt makes it
// reproducible. It is produced as TEXT through the engine's generation loop
// (generate_run) and then goes through the same tokenize-and-window path as
// user files, so both kinds of corpus are treated alike and the text can be saved.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model.h"

namespace zk {

// Reads each file whole; throws zk::error for a missing, unreadable or empty
// (or whitespace-only) file.
std::vector<std::string> corpus_read_files(const std::vector<std::string>& paths);

struct corpus_gen_params {
    int64_t n_tokens = 16384;       // stop once prompts + generated text reach this many tokens
    int64_t max_per_sample = 512;   // generated tokens per seed prompt at most
    uint64_t seed = 20240601;       // sampler seed of sample i is seed + i
    int n_threads = 2;
    bool progress = true;
};

// The seed prompts (varied genres: narrative, science, how-to, dialogue, code, ...).
const std::vector<std::string>& corpus_seed_prompts();

// Generates the default corpus; each returned document is prompt + continuation.
std::vector<std::string> corpus_generate(const model& m, const corpus_gen_params& p);

// Tokenizes documents without BOS/EOS (the statistics pass adds BOS per window).
std::vector<std::vector<int32_t>> corpus_tokenize(const model& m, const std::vector<std::string>& docs);

}  // namespace zk
