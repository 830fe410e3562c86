// The real default model for the C++ tests, loaded once per test binary.
// tests/CMakeLists.txt fetches it before any test runs (a missing model fails
// the fetch, it never skips); ZACK_MODEL points the tests at another GGUF.
#pragma once
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "calib/corpus.h"
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

}  // namespace zk_test
