// A prefill chunk attends to its own keys and values at full precision, then
// they are quantized (kv_cache::append with hold, kv_cache::view_attend), on
// the real default model: a 200-token prompt in one chunk over a 4-bit cache
// (a 128-token window, so the append quantizes three groups of the chunk
// itself) gives the f16 cache's logits bit for bit (both caches without exact
// sinks, whose f32 rows differ from f16 ones by rounding that the 8-bit
// activations grow to a few percent of a logit), while the same prompt fed as
// 4-token decode segments, whose queries see quantized groups, does not
// (measured max |dlogit| / max |logit|: printed). The kernel-level check of
// what a chunk reads is tests/test_kv_quant.cpp (KvHold).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "engine/session.h"
#include "tests/model_fixture.h"

using namespace zk;

namespace {

// Logits of every prompt position, fed in pieces of `piece` tokens.
std::vector<float> prompt_logits(const model& m, int bits, const std::vector<int32_t>& ids, int64_t piece,
                                 bool tiled = false) {
    session_params sp;
    sp.n_ctx = 512;
    sp.n_batch = 256;
    sp.kv.bits = bits;
    sp.prefill_tiled = tiled;  // off: one attention arithmetic for both caches
    sp.evict.n_sink = 0;
    session s(m, sp);
    const int64_t V = m.hp.n_vocab, n = (int64_t)ids.size();
    std::vector<float> out;
    for (int64_t at = 0; at < n; at += piece) {
        const int64_t c = std::min(piece, n - at);
        const float* lg = s.decode(ids.data() + at, c, true);
        out.insert(out.end(), lg, lg + c * V);
    }
    return out;
}

// max |a - b| over max |b|
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0, mag = 0;
    for (size_t i = 0; i < a.size(); i++) {
        d = std::max(d, (double)std::fabs(a[i] - b[i]));
        mag = std::max(mag, (double)std::fabs(b[i]));
    }
    return d / mag;
}

}  // namespace

TEST(PrefillHold, ChunkAttendsToItsOwnRowsExactly) {
    const model& m = zk_test::source_model();
    const std::vector<int32_t> ids(zk_test::corpus_tokens().begin(), zk_test::corpus_tokens().begin() + 200);
    const std::vector<float> f16 = prompt_logits(m, 16, ids, 200);
    const std::vector<float> chunk = prompt_logits(m, 4, ids, 200);
    const std::vector<float> steps = prompt_logits(m, 4, ids, 4);
    const double e_chunk = rel_diff(chunk, f16), e_steps = rel_diff(steps, f16);
    std::printf("[ measured ] 4-bit cache against f16, max |dlogit| / max |logit|: one 200-token chunk %.2e, "
                "4-token pieces %.2e\n", e_chunk, e_steps);
    EXPECT_EQ(e_chunk, 0.0);
    EXPECT_GT(e_steps, 1e-2);
}

// With the tiled kernel on, a chunk over a 4-bit cache that already holds
// quantized groups (a 150-token chunk, then 150 more: the second's queries
// read 128 slots of 4-bit codes) takes its row tail (the residual window and
// its own rows) through the tiled kernel as partials merged with the per-token
// kernel's over the codes (backend_cpu::attention_prefill_tails). Same
// attention, other summation order: it must differ from the per-token path no
// more than the f16 cache's tiled path differs from its per-token path (the
// yardstick of float order grown by 8-bit activations, measured here).
TEST(PrefillHold, TiledRowTailsAreTheSameAttention) {
    const model& m = zk_test::source_model();
    const std::vector<int32_t> ids(zk_test::corpus_tokens().begin(), zk_test::corpus_tokens().begin() + 300);
    const double e16 = rel_diff(prompt_logits(m, 16, ids, 150, true), prompt_logits(m, 16, ids, 150, false));
    const std::vector<float> tiled = prompt_logits(m, 4, ids, 150, true), flat = prompt_logits(m, 4, ids, 150, false);
    const double e4 = rel_diff(tiled, flat);
    std::printf("[ measured ] tiled against per-token prefill, max |dlogit| / max |logit|: f16 cache %.2e, 4-bit "
                "cache (row tails) %.2e\n", e16, e4);
    EXPECT_GT(e4, 0.0);  // the tails did run
    EXPECT_LE(e4, std::max(2 * e16, 1e-3));
}
