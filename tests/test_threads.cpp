// The threaded parts of the engine, small enough to run under ThreadSanitizer
// (.ci/sanitize.sh builds this test with -fsanitize=thread): the thread pool
// (run, parallel_for, exceptions, workers falling asleep between jobs), batched
// decoding (engine/batch.h: several sessions in one pass on a pool of its own),
// KV heads appended at once, and the attention scheduler (slot ranges of
// different lengths and heads of different ranks shared out longest first,
// with eviction observing attention and the calibration statistics gathered
// on the session's pool). Everything but the KV heads runs on the tiny random
// model (tests/tiny_model.h).
//
// Besides the sanitizer, each test checks a result that a race would disturb:
// sums over the pool, batched logits bit-identical to each sequence decoded
// alone, heads appended at once bit-identical to one at a time, and two runs
// with the same thread count bit-identical.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "calib/ranks.h"
#include "engine/batch.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/session.h"
#include "ggml-like/error.h"
#include "ggml-like/threadpool.h"
#include "tests/tiny_model.h"

using namespace zk;

namespace {

// The tiny model and its .zack, written once per process.
struct tiny_models {
    std::unique_ptr<model> plain, zack;
};

const tiny_models& models() {
    static tiny_models t = [] {
        char tmpl[] = "/tmp/zk_threads_XXXXXX";
        if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
        const std::string dir = tmpl;
        zk_test::tiny_model_params p;  // 2 layers, 4 query / 2 KV heads of 64
        zk_test::tiny_model_write(dir + "/m.gguf", p);
        zk_test::tiny_zack_write(dir + "/m.gguf", dir + "/m.zack", 256);
        tiny_models out;
        out.plain = model_load(dir + "/m.gguf");  // mmapped: the files can go
        out.zack = model_load(dir + "/m.zack");
        std::filesystem::remove_all(dir);
        return out;
    }();
    return t;
}

std::vector<int32_t> prompt(int n, uint32_t seed) {
    std::vector<int32_t> t(n);
    for (int i = 0; i < n; i++) t[i] = 3 + (int32_t)((seed * 2654435761u + (uint32_t)i * 40503u) % 270u);
    return t;
}

int32_t argmax(const float* x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

// Greedy decoding of `steps` tokens after the prompt: every step's logits.
std::vector<float> run_alone(const model& m, const session_params& sp, const std::vector<int32_t>& pr, int steps) {
    const int64_t V = m.hp.n_vocab;
    session s(m, sp);
    const float* lg = s.decode(pr.data(), (int64_t)pr.size());
    std::vector<float> out;
    for (int i = 0; i < steps; i++) {
        const int32_t t = argmax(lg, V);
        lg = s.decode(&t, 1);
        out.insert(out.end(), lg, lg + V);
    }
    return out;
}

session_params params(int threads) {
    session_params sp;
    sp.n_ctx = 640;
    sp.n_threads = threads;
    sp.n_batch = 64;
    return sp;
}

// Heads of different ranks (adaptive ranks at rate 0.4), for the scheduler.
session_params zack_params(int threads, int bits) {
    session_params sp = params(threads);
    const model& z = *models().zack;
    const zack_ranks r = ranks_for_rate(zack_spectra::from_model(z), 0.4, z.zack.rank_align);
    sp.ranks_k = r.k;
    sp.ranks_v = r.v;
    sp.kv.bits = bits;
    return sp;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(ThreadPool, RunAndParallelForUnderLoad) {
    for (int n : {2, 3, 4}) {
        thread_pool pool(n);
        std::vector<int64_t> slot(n);
        for (int rep = 0; rep < 200; rep++) {
            pool.run([&](int ith, int nth) { slot[ith] += ith + nth; });
            std::vector<int64_t> out(1000);
            pool.parallel_for(1000, 7, [&](int64_t b, int64_t e, int) {
                for (int64_t i = b; i < e; i++) out[i] = i * rep;
            });
            int64_t sum = 0;
            for (int64_t v : out) sum += v;
            ASSERT_EQ(sum, 999 * 1000 / 2 * (int64_t)rep) << n << " threads, rep " << rep;
            // Now and then let the workers fall asleep, so wake-ups race with new jobs.
            if (rep % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        for (int i = 0; i < n; i++) EXPECT_EQ(slot[i], 200 * (i + n)) << n << " threads";
    }
}

TEST(ThreadPool, ExceptionsAndReentryAreReported) {
    thread_pool pool(3);
    for (int rep = 0; rep < 20; rep++) {
        EXPECT_THROW(pool.run([&](int ith, int) {
            if (ith == 2) ZK_THROW("worker %d failed", ith);
        }), zk::error);
        EXPECT_THROW(pool.parallel_for(100, 1, [&](int64_t, int64_t, int) { pool.run([](int, int) {}); }),
                     zk::error);
        std::atomic<int> hits{0};
        pool.run([&](int, int) { hits++; });  // the pool still works afterwards
        EXPECT_EQ(hits.load(), 3);
    }
}

// Several pools at once on this 2-core machine: their 12 threads outnumber
// the cores, so workers are often descheduled in the middle of a job or wake
// up after the caller has finished it and published the next. A dispatch must
// still run every chunk exactly once, never hand a late worker a chunk of the
// next job, and not wait for workers that have nothing left to do.
TEST(ThreadPool, OversubscribedPoolsRunEveryChunkOnce) {
    constexpr int k_pools = 4, k_threads = 3, k_reps = 1500;
    std::atomic<int> bad{0};
    std::vector<std::thread> callers;
    for (int c = 0; c < k_pools; c++)
        callers.emplace_back([&, c] {
            thread_pool pool(k_threads);
            std::vector<std::atomic<int>> hits(257);
            std::vector<std::atomic<int>> calls(k_threads);
            for (int rep = 0; rep < k_reps && bad.load() == 0; rep++) {
                const int64_t n = 1 + (rep * 37 + c * 11) % 257;  // 1..257 items: 1..12 chunks of different sizes (n = 1 runs inline)
                for (auto& h : hits) h = 0;
                pool.parallel_for(n, 1, [&](int64_t b, int64_t e, int ith) {
                    if (b < 0 || e > n || b >= e || ith < 0 || ith >= k_threads) bad++;
                    for (int64_t i = b; i < e && i < 257; i++) hits[(size_t)i]++;
                });
                for (int64_t i = 0; i < 257; i++)
                    if (hits[(size_t)i].load() != (i < n ? 1 : 0)) bad++;
                for (auto& h : calls) h = 0;
                pool.run([&](int ith, int nth) {
                    if (nth != k_threads || ith < 0 || ith >= k_threads) bad++;
                    else calls[(size_t)ith]++;
                });
                for (auto& h : calls)
                    if (h.load() != 1) bad++;
            }
        });
    for (auto& t : callers) t.join();
    EXPECT_EQ(bad.load(), 0);
}

// Four sequences with different caches (f16, 4-bit, ZACK ranks with 8-bit,
// ZACK with H2O eviction) decoded together on a pool of 3, against each alone:
// bit-identical (tests/test_batch.cpp explains why they must be).
TEST(Threads, BatchedDecodingMatchesAlone) {
    const tiny_models& t = models();
    const int steps = 12;
    std::vector<session_params> sps = {params(2), params(2), zack_params(2, 8), zack_params(3, 16)};
    sps[1].kv.bits = 4;
    sps[3].evict.policy = "h2o";
    sps[3].evict.budget = 48;
    sps[3].evict.chunk = 8;
    const std::vector<const model*> ms = {t.zack.get(), t.zack.get(), t.zack.get(), t.zack.get()};
    const std::vector<std::vector<int32_t>> prompts = {prompt(5, 1), prompt(70, 2), prompt(150, 3), prompt(260, 4)};
    const int64_t V = t.zack->hp.n_vocab;

    std::vector<std::unique_ptr<session>> ss;
    std::vector<session*> ptrs;
    std::vector<int32_t> next(prompts.size());
    for (size_t i = 0; i < prompts.size(); i++) {
        ss.push_back(std::make_unique<session>(*ms[i], sps[i]));
        ptrs.push_back(ss.back().get());
        next[i] = argmax(ss.back()->decode(prompts[i].data(), (int64_t)prompts[i].size()), V);
    }
    batch_decoder bd(ptrs, 3);
    std::vector<std::vector<float>> batched(prompts.size());
    for (int step = 0; step < steps; step++) {
        const float* lg = bd.step(next.data());
        for (size_t i = 0; i < prompts.size(); i++) {
            batched[i].insert(batched[i].end(), lg + i * V, lg + (i + 1) * V);
            next[i] = argmax(lg + i * V, V);
        }
    }
    for (size_t i = 0; i < prompts.size(); i++)
        EXPECT_TRUE(same_bits(batched[i], run_alone(*ms[i], sps[i], prompts[i], steps))) << "sequence " << i;
}

// The attention scheduler on 3 threads: long and short slot ranges, heads of
// different ranks, a 4-bit cache, prefill chunks with an attention-observing
// policy (snapkv) and decode steps with H2O. Two runs must agree to the bit.
TEST(Threads, AttentionSchedulerIsDeterministic) {
    const model& z = *models().zack;
    for (const char* policy : {"none", "snapkv", "h2o"}) {
        session_params sp = zack_params(3, 4);
        sp.evict.policy = policy;
        sp.evict.budget = std::string(policy) == "none" ? 0 : 96;
        sp.evict.chunk = 16;
        const std::vector<int32_t> pr = prompt(300, 9);
        const std::vector<float> a = run_alone(z, sp, pr, 24);
        const std::vector<float> b = run_alone(z, sp, pr, 24);
        EXPECT_TRUE(same_bits(a, b)) << policy;
    }
}

// Calibration statistics are gathered on the session's pool (gram_accumulator
// spreads heads over threads): 1 and 3 threads give the same spectra.
TEST(Threads, CalibrationOnThePoolMatchesOneThread) {
    const model& m = *models().plain;
    auto spectra = [&](int threads) {
        calib_params cp;
        cp.n_tokens = 200;
        cp.n_ctx = 100;
        cp.n_threads = threads;
        cp.progress = false;
        gram_accumulator acc(m.hp);
        calib_collect(m, {prompt(200, 5)}, cp, acc);
        const zack_calibration c = calib_decompose(m, acc);
        std::vector<double> s = c.sigma_k;
        s.insert(s.end(), c.sigma_v.begin(), c.sigma_v.end());
        return s;
    };
    const std::vector<double> one = spectra(1), three = spectra(3);
    ASSERT_EQ(one.size(), three.size());
    for (size_t i = 0; i < one.size(); i++) EXPECT_NEAR(one[i], three[i], 1e-6 * (1 + std::fabs(one[i]))) << i;
}

// The KV heads of a layer take their appends at once on the decode pool when
// a residual window fills (backend_cpu::kv_append): each head re-packs its
// group in its own scratch. Heads appended on 3 threads (4-bit values, 4- or
// 2-bit keys, all KIVI with GEAR's correction, in chunks that flush 0, 1 or
// several groups) read back bit-identical to the same heads appended one
// after another.
TEST(Threads, KvHeadsAppendAtOnce) {
    const int n_head = 4, r = 64, n = 300;
    kv_cache_params p;
    p.bits = 4;
    p.bits_k = {4, 2, 4, 2};
    p.residual = 32;
    p.gear = true;
    std::mt19937 g(17);
    std::normal_distribution<float> N(0, 1);
    std::vector<float> K((size_t)n_head * n * r), V(K.size());
    for (auto& x : K) x = N(g);
    for (auto& x : V) x = N(g);
    std::vector<int32_t> pos(n);
    for (int t = 0; t < n; t++) pos[t] = t;
    auto fill = [&](kv_cache& c, int head) {
        const float *k = K.data() + (size_t)head * n * r, *v = V.data() + (size_t)head * n * r;
        for (int t = 0, step = 1; t < n; t += step, step = step % 70 + 13)
            c.append(0, head, std::min(step, n - t), k + (size_t)t * r, r, v + (size_t)t * r, r, &pos[t]);
    };
    const std::vector<int> ranks(n_head, r);
    kv_cache one(1, n_head, n, p, ranks, ranks), many(1, n_head, n, p, ranks, ranks);
    for (int h = 0; h < n_head; h++) fill(one, h);
    thread_pool pool(3);
    pool.parallel_for(n_head, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t h = b; h < e; h++) fill(many, (int)h);
    });
    std::vector<float> k1(r), v1(r), k2(r), v2(r);
    for (int h = 0; h < n_head; h++) {
        ASSERT_EQ(one.view(0, h).n_groups, many.view(0, h).n_groups);
        ASSERT_GT(one.view(0, h).n_groups, 4);
        for (int s = 0; s < n; s++) {
            one.read_slot(0, h, s, k1.data(), v1.data());
            many.read_slot(0, h, s, k2.data(), v2.data());
            ASSERT_EQ(0, std::memcmp(k1.data(), k2.data(), sizeof(float) * r)) << "head " << h << " slot " << s;
            ASSERT_EQ(0, std::memcmp(v1.data(), v2.data(), sizeof(float) * r)) << "head " << h << " slot " << s;
        }
    }
}
