// Sliding-window layers holding only their window (session_params::window_cache,
// session::window_drop) on the real Gemma 3 270M (15 of 18 layers local, a
// 512-token window): a prompt and decode steps well past the window give
// logits bit-identical to the same session keeping every token behind the mask,
// for an f16 and a 4-bit (KIVI, whole groups dropped) cache, while the local
// layers' blocks never hold more than their own capacity and the cache
// allocates less. With eviction the two differ by design: kept behind the
// mask, slots the window has left still take part of a local layer's budget
// (H2O keeps them for the scores they earned while visible); dropped, the
// budget goes to visible ones. There the test checks the capacities only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "calib/corpus.h"
#include "engine/model.h"
#include "engine/session.h"

using namespace zk;

namespace {

const model& gemma() {
    static std::unique_ptr<model> m = model_load(ZACK_GEMMA_MODEL);
    return *m;
}

const std::vector<int32_t>& text_tokens() {
    static const std::vector<int32_t> ids = corpus_tokenize(
        gemma(), corpus_read_files({std::string(ZACK_SOURCE_DIR) + "/tests/data/calib/apache-2.0.txt"}))[0];
    return ids;
}

struct config {
    const char* name;  // also the test's suffix
    int bits;
    const char* evict;
    int64_t budget;
    bool same_logits;
};

const config k_configs[] = {{"f16", 16, "none", 0, true},
                            {"q4", 4, "none", 0, true},
                            {"q4_h2o", 4, "h2o", 700, false}};

class WindowCache : public ::testing::TestWithParam<config> {};

}  // namespace

// One test per cache kind (.ci/sanitize.sh runs the 4-bit one under ASan).
TEST_P(WindowCache, SameLogitsAsKeepingEveryToken) {
    const model& m = gemma();
    const model_hparams& hp = m.hp;
    ASSERT_GT(hp.n_swa, 0) << "Gemma 3 has sliding-window layers";
    const std::vector<int32_t>& ids = text_tokens();
    const int64_t n_prompt = 2 * hp.n_swa - 100, n_steps = 40;  // steps > n_batch: drops while decoding
    ASSERT_GE((int64_t)ids.size(), n_prompt + n_steps);
    const config& c = GetParam();
    session_params sp;
    sp.n_ctx = n_prompt + n_steps + 8;
    sp.n_threads = 2;
    sp.n_batch = 32;
    sp.kv.bits = c.bits;
    sp.evict.policy = c.evict;
    sp.evict.budget = c.budget;
    sp.evict.chunk = 16;
    session_params every = sp;
    every.window_cache = false;
    session win(m, sp), all(m, every);
    EXPECT_LT(win.cache().bytes_allocated(), all.cache().bytes_allocated()) << c.name;
    auto same = [&](const float* a, const float* b, const char* when) {
        if (c.same_logits) {
            ASSERT_EQ(std::memcmp(a, b, sizeof(float) * hp.n_vocab), 0) << c.name << ": logits differ " << when;
        }
        for (int64_t i = 0; i < hp.n_vocab; i++) ASSERT_TRUE(std::isfinite(a[i])) << c.name << " " << when;
    };
    same(win.decode(ids.data(), n_prompt), all.decode(ids.data(), n_prompt), "after the prompt");
    for (int64_t t = 0; t < n_steps; t++)
        same(win.decode(&ids[n_prompt + t], 1), all.decode(&ids[n_prompt + t], 1), "in a decode step");
    int64_t local_max = 0, local_cap = 0;
    for (int il = 0; il < hp.n_layer; il++)
        for (int g = 0; g < hp.n_head_kv; g++) {
            const kv_block& b = win.cache().block(il, g);
            EXPECT_LE(b.n_used, b.capacity) << c.name << " layer " << il;
            if (hp.layer_is_swa(il)) local_max = std::max(local_max, b.n_used), local_cap = b.capacity;
        }
    // the local layers dropped what their window left: fewer slots than tokens seen
    EXPECT_LT(local_cap, win.cache().capacity()) << c.name;
    EXPECT_LT(local_max, n_prompt + n_steps) << c.name;
    EXPECT_GE(local_max, hp.n_swa - 1) << c.name << ": the whole window is still there";
}

INSTANTIATE_TEST_SUITE_P(Kinds, WindowCache, ::testing::ValuesIn(k_configs),
                         [](const ::testing::TestParamInfo<config>& i) { return std::string(i.param.name); });
