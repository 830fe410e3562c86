// The real default model for the C++ tests, loaded once per test binary.
// tests/CMakeLists.txt fetches it before any test runs (a missing model fails
// the fetch, it never skips); ZACK_MODEL points the tests at another GGUF.
#pragma once
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "calib/calibrate.h"
#include "calib/corpus.h"
#include "calib/gram.h"
#include "calib/zack_file.h"
#include "engine/model.h"

namespace zk_test {

inline std::string model_path() {
    const char* e = std::getenv("ZACK_MODEL");
    return e && *e ? e : ZACK_DEFAULT_MODEL;
}

// Throws zk::error naming the path when the model cannot be loaded.
inline const zk::model& source_model() {
    static std::unique_ptr<zk::model> m = zk::model_load(model_path());
    return *m;
}

// Tokens of a real text shipped with the tests (Apache-2.0, about 2.4K tokens).
inline const std::vector<int32_t>& corpus_tokens() {
    static const std::vector<int32_t> ids = zk::corpus_tokenize(
        source_model(),
        zk::corpus_read_files({std::string(ZACK_SOURCE_DIR) + "/tests/data/calib/apache-2.0.txt"}))[0];
    return ids;
}

// A calibration of the default model in memory from the first n_text tokens of
// the shared text, n_tokens of them in windows of n_ctx (the rotations depend on
// the weights, not on how much text: a few hundred tokens give usable spectra).
inline zk::zack_calibration small_calibration(int64_t n_tokens, int64_t n_ctx, int64_t n_text, const char* label) {
    const zk::model& m = source_model();
    zk::calib_params cp;
    cp.n_tokens = n_tokens;
    cp.n_ctx = n_ctx;
    cp.progress = false;
    zk::gram_accumulator acc(m.hp);
    const std::vector<int32_t>& ids = corpus_tokens();
    calib_collect(m, {std::vector<int32_t>(ids.begin(), ids.begin() + std::min<int64_t>(n_text, (int64_t)ids.size()))},
                  cp, acc);
    zk::zack_calibration c = calib_decompose(m, acc);
    c.n_ctx = cp.n_ctx;
    c.corpus = label;
    return c;
}

}  // namespace zk_test
