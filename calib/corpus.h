// Calibration corpora: user text files, or the offline default.
//
// The default corpus is text the model itself writes from varied seed prompts
// (the paper's synthetic corpus, section 4.3: coherent text with enough distinct
// tokens; the rotation depends on the weights, not on the text), sampled at
// temperature 1 (corpus_default_sampling says why). It needs no
// download and no shipped data, and a fixed sampler seed per prompt makes it
// reproducible. It is produced as TEXT through the engine's generation loop
// (generate_run) and then goes through the same tokenize-and-window path as
// user files, so both kinds of corpus are treated alike and the text can be saved.
// The samples are joined into ONE text (corpus_join) before windowing, so that the
// statistics windows are full --ctx windows, as with long real files: calibrated
// on separate 256-token samples, keys at positions the samples never reach come
// out poorly (KL at rate 0.1 / 0.3 at positions 960-1008: 0.238 / 1.016 separate,
// 0.081 / 0.431 joined; 0.123 / 0.621 for 8K tokens of licence texts).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/sampler.h"

namespace zk {

// Reads each file whole; throws zk::error for a missing, unreadable or empty
// (or whitespace-only) file.
std::vector<std::string> corpus_read_files(const std::vector<std::string>& paths);

// The default sampler of the generated corpus (see corpus.cpp for why).
sampler_params corpus_default_sampling();

struct corpus_gen_params {
    int64_t n_tokens = 16384;       // stop once prompts + generated text reach this many tokens
    int64_t max_per_sample = 256;   // generated tokens per seed prompt at most (64 x 256 = 16K)
    uint64_t seed = 20240601;       // sampler seed of sample i is seed + i
    sampler_params sampling = corpus_default_sampling();  // .seed is ignored (see seed)
    int n_parallel = 8;             // samples decoded together (engine/batch.h)
    int n_threads = 2;
    bool progress = true;
};

// The 64 seed prompts (varied genres: narrative, science, how-to, dialogue, legal,
// manuals, mail, code in several languages, data, ...).
const std::vector<std::string>& corpus_seed_prompts();

// Generates the default corpus; each returned document is prompt + continuation.
std::vector<std::string> corpus_generate(const model& m, const corpus_gen_params& p);

// One line for zack.calib.corpus: the sampler, seed and sample count that made the corpus.
std::string corpus_describe_generation(const corpus_gen_params& p, size_t n_samples);

// The samples as one text, each followed by a blank line: the default corpus as
// calibrated and as --save-corpus writes it (so --corpus on that file reproduces it).
std::string corpus_join(const std::vector<std::string>& samples);

// Tokenizes documents without BOS/EOS (the statistics pass adds BOS per window).
std::vector<std::vector<int32_t>> corpus_tokenize(const model& m, const std::vector<std::string>& docs);

// Removes the last n tokens of the documents (whole documents from the end,
// then the end of the one they stop in) and returns them as documents of their
// own, in order: text a later step can measure on that the statistics never saw.
std::vector<std::vector<int32_t>> corpus_take_tail(std::vector<std::vector<int32_t>>& docs, int64_t n);

}  // namespace zk
