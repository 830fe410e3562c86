// Soak tests on the tiny random model (tests/tiny_model.h), with the heap
// watched (tests/alloc_tracker.h) and the resident set read from /proc:
//
// Soak.ChatStaysFlat: the real `zack run` chat loop (main/cli.h, in process,
//   stdin and stderr on pipes) for ZACK_SOAK_TOKENS generated tokens (default
//   10,000) with a small context (-c 512), H2O eviction (budget 128) and
//   whatever context management the chat does; when it reports a full context
//   the user types /clear. Between turns the test records tokens, allocations,
//   heap bytes and RSS; after a warm-up fifth it checks that the heap and RSS
//   stay flat and that allocations per generated token do not grow.
// Soak.EveryLayoutStaysInItsBudget: every cache layout (f32, f16, 8-bit,
//   4-bit, 2-bit, GEAR, per-head mixed precision, ZACK ranks, each eviction
//   policy, KVCrush, decode-time selection) decodes
//   ZACK_SOAK_LAYOUT_TOKENS tokens (default 5,000) one at a time; after every
//   token the accounted bytes never exceed the budget: bytes allocated equal
//   the capacity's accounting (no growth), slots in use stay within the
//   capacity (with eviction: budget + chunk), and a decode step allocates nothing.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "calib/ranks.h"
#include "engine/model.h"
#include "engine/session.h"
#include "main/cli.h"
#include "tests/alloc_tracker.h"
#include "tests/tiny_model.h"

using namespace zk;
namespace fs = std::filesystem;

namespace {

int64_t env_int(const char* name, int64_t dflt) {
    const char* e = std::getenv(name);
    return e && *e ? std::atoll(e) : dflt;
}

size_t rss_bytes() {
    std::ifstream f("/proc/self/statm");
    size_t pages = 0, resident = 0;
    f >> pages >> resident;
    return resident * (size_t)sysconf(_SC_PAGESIZE);
}

struct tiny_files {
    std::string dir, gguf, zack;
};

const tiny_files& files() {
    // The atexit handler reads this buffer, not the strings below, which static
    // destruction has freed by the time it runs.
    static char dir[32] = "/tmp/zk_soak_XXXXXX";
    static tiny_files t = [] {
        if (!mkdtemp(dir)) throw std::runtime_error("mkdtemp failed");
        tiny_files f{dir, std::string(dir) + "/m.gguf", std::string(dir) + "/m.zack"};
        zk_test::tiny_model_write(f.gguf, zk_test::tiny_model_params{});
        zk_test::tiny_zack_write(f.gguf, f.zack, 256);
        std::atexit([] { fs::remove_all(dir); });
        return f;
    }();
    return t;
}

// One point between two chat turns.
struct sample {
    int64_t tokens;  // generated so far
    size_t allocs, live, rss;
};

}  // namespace

TEST(Soak, ChatStaysFlat) {
    const int64_t target = env_int("ZACK_SOAK_TOKENS", 10000);
    const std::string model = files().gguf;

    // stdin and stderr of the chat on pipes; stdout (the replies) to /dev/null.
    int in_pipe[2], err_pipe[2];
    ASSERT_EQ(pipe(in_pipe), 0);
    ASSERT_EQ(pipe(err_pipe), 0);
    const int saved_in = dup(STDIN_FILENO), saved_out = dup(STDOUT_FILENO), saved_err = dup(STDERR_FILENO);
    std::fflush(stdout);
    const int devnull = open("/dev/null", O_WRONLY);
    dup2(in_pipe[0], STDIN_FILENO);
    dup2(devnull, STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    close(in_pipe[0]), close(err_pipe[1]), close(devnull);

    // The user: answers every "> " prompt, reads the -v statistics line of each
    // turn, types /clear when the chat says the context is full, /exit at the end.
    std::vector<sample> samples;
    int64_t generated = 0, clears = 0, turns = 0;
    std::string log_tail;
    std::thread user([&] {
        FILE* to_chat = fdopen(in_pipe[1], "w");
        std::string buf;
        bool full = false;
        char chunk[4096];
        ssize_t n;
        while ((n = read(err_pipe[0], chunk, sizeof chunk)) > 0) {
            buf.append(chunk, (size_t)n);
            size_t at;
            while ((at = buf.find("generated: ")) != std::string::npos && buf.find(" tokens", at) != std::string::npos) {
                generated += std::atoll(buf.c_str() + at + 11);
                buf.erase(0, buf.find(" tokens", at));
            }
            if (buf.find("context is full") != std::string::npos) full = true;
            if (buf.size() < 2 || buf.compare(buf.size() - 2, 2, "> ") != 0) continue;
            log_tail = buf.substr(buf.size() > 300 ? buf.size() - 300 : 0);
            buf.clear();
            samples.push_back({generated, zk_test::allocs().count.load(), zk_test::allocs().live.load(), rss_bytes()});
            std::string line;
            if (generated >= target) {
                line = "/exit";
            } else if (full) {
                line = "/clear";
                clears++;
                full = false;
            } else {
                line = "Tell me about turn " + std::to_string(turns++) + ", in detail please.";
            }
            std::fprintf(to_chat, "%s\n", line.c_str());
            std::fflush(to_chat);
            if (line == "/exit") break;
        }
        std::fclose(to_chat);
        while (read(err_pipe[0], chunk, sizeof chunk) > 0) {
        }
    });

    int rc = -1;
    {
        zk::cli_app cli;
        const std::vector<std::string> args = {"zack", "run", "-m", model, "-c", "512", "-n", "120", "-t", "2",
                                               "--temp", "1", "-s", "7", "--kv-evict", "h2o", "--kv-budget", "128",
                                               "-v"};
        std::vector<const char*> argv;
        for (const std::string& a : args) argv.push_back(a.c_str());
        if (cli.parse((int)argv.size(), argv.data()) < 0) rc = cli.run();
    }
    std::fflush(stderr);
    dup2(saved_err, STDERR_FILENO);  // ends the user's reads
    dup2(saved_out, STDOUT_FILENO);
    dup2(saved_in, STDIN_FILENO);
    close(saved_err), close(saved_out), close(saved_in);
    user.join();
    close(err_pipe[0]);

    ASSERT_EQ(rc, 0);
    ASSERT_GE(generated, target) << log_tail;
    ASSERT_GE(samples.size(), 10u);
    // After the first fifth of the tokens: the warm-up (buffers sized, caches filled).
    size_t w = 0;
    while (w < samples.size() && samples[w].tokens < target / 5) w++;
    const sample& base = samples[w];
    size_t live_max = 0, rss_max = 0;
    for (size_t i = w; i < samples.size(); i++) {
        live_max = std::max(live_max, samples[i].live);
        rss_max = std::max(rss_max, samples[i].rss);
    }
    // Allocations per generated token, second fifth vs last fifth.
    auto rate = [&](double from, double to) {
        size_t a = 0, b = 0;
        for (size_t i = 0; i < samples.size(); i++) {
            if (!a && samples[i].tokens >= from * target) a = i;
            if (samples[i].tokens <= to * target) b = i;
        }
        return (double)(samples[b].allocs - samples[a].allocs) / (double)std::max<int64_t>(1, samples[b].tokens - samples[a].tokens);
    };
    const double early = rate(0.2, 0.4), late = rate(0.8, 1.0);
    std::printf("chat soak: %lld tokens in %lld turns (%lld /clear), heap after warm-up %zu..%zu bytes, RSS %.1f..%.1f MiB, "
                "allocations per generated token %.2f (20-40%%) vs %.2f (80-100%%)\n",
                (long long)generated, (long long)turns, (long long)clears, base.live, live_max, base.rss / 1048576.0,
                rss_max / 1048576.0, early, late);
    // A chat keeps its history text (a few KB between /clears): the heap may move
    // by that much, not by anything that grows with the tokens.
    EXPECT_LE(live_max, base.live + (256u << 10));
    EXPECT_LE(rss_max, base.rss + (4u << 20));
    EXPECT_LE(late, early * 1.25 + 0.5);
}

namespace {

struct layout {
    const char* name;
    bool zack;
    session_params p;
};

std::vector<layout> layouts() {
    auto base = [] {
        session_params p;
        p.n_ctx = 8192;
        p.n_threads = 1;  // the layouts, not the scheduler (test_threads has that)
        p.n_batch = 64;
        return p;
    };
    std::vector<layout> out;
    auto add = [&](const char* name, bool zack, auto edit) {
        session_params p = base();
        edit(p);
        out.push_back({name, zack, p});
    };
    add("f32", false, [](session_params& p) { p.kv.type = dtype::F32; });
    add("f16", false, [](session_params&) {});
    add("q8", false, [](session_params& p) { p.kv.bits = 8; });
    add("q4", false, [](session_params& p) { p.kv.bits = 4; });
    add("q4 gear", false, [](session_params& p) { p.kv.bits = 4, p.kv.gear = true; });
    add("zack f16", true, [](session_params&) {});
    add("zack q4", true, [](session_params& p) { p.kv.bits = 4; });
    for (const char* pol : {"streaming", "h2o", "snapkv", "keyformer"})
        add(pol, false, [&](session_params& p) { p.evict.policy = pol, p.evict.budget = 256, p.evict.chunk = 32; });
    add("h2o q4", false, [](session_params& p) { p.kv.bits = 4, p.evict.policy = "h2o", p.evict.budget = 256; });
    add("snapkv kvcrush q8", false,
        [](session_params& p) {
            p.kv.bits = 8, p.evict.policy = "snapkv", p.evict.budget = 256, p.evict.crush = 0.25f;
        });
    add("q2", false, [](session_params& p) { p.kv.bits = 2; });
    add("q2 gear", false, [](session_params& p) { p.kv.bits = 2, p.kv.gear = true; });
    // per head and side (2 layers x 2 KV heads): every layout as keys and as values
    add("mixed per head", false, [](session_params& p) { p.kv.bits_k = {16, 8, 4, 2}, p.kv.bits_v = {2, 4, 8, 16}; });
    add("zack mixed h2o gear", true, [](session_params& p) {
        p.kv.bits_k = {4, 2, 8, 4}, p.kv.bits_v = {2, 2, 4, 16}, p.kv.gear = true;
        p.evict.policy = "h2o", p.evict.budget = 192, p.evict.chunk = 16;
    });
    add("zack h2o q4 gear", true, [](session_params& p) {
        p.kv.bits = 4, p.kv.gear = true, p.evict.policy = "h2o", p.evict.budget = 192, p.evict.chunk = 16;
    });
    // decode-time selection (engine/kv_select.h): KIVI groups chosen every
    // step or kept for 4, and pages of 8-bit keys
    add("q4 select", false, [](session_params& p) { p.kv.bits = 4, p.kv.select = 256; });
    add("zack q4 select/1", true, [](session_params& p) { p.kv.bits = 4, p.kv.select = 256, p.kv.select_every = 1; });
    add("q8 select", false, [](session_params& p) { p.kv.bits = 8, p.kv.select = 256; });
    return out;
}

}  // namespace

TEST(Soak, EveryLayoutStaysInItsBudget) {
    const int64_t n_tokens = env_int("ZACK_SOAK_LAYOUT_TOKENS", 5000);
    const std::unique_ptr<model> plain = model_load(files().gguf), zack = model_load(files().zack);
    const zack_ranks ranks = ranks_for_rate(zack_spectra::from_model(*zack), 0.4, zack->zack.rank_align);
    for (layout l : layouts()) {
        SCOPED_TRACE(l.name);
        const model& m = l.zack ? *zack : *plain;
        if (l.zack) l.p.ranks_k = ranks.k, l.p.ranks_v = ranks.v;
        l.p.n_ctx = std::max<int64_t>(l.p.n_ctx, n_tokens + 64);
        session s(m, l.p);
        const kv_cache& c = s.cache();
        const size_t accounted = c.bytes_for_capacity(c.capacity());
        const size_t allocated = c.bytes_allocated();
        EXPECT_LE(allocated, accounted);
        const int64_t slot_limit = l.p.evict.policy == "none" ? c.capacity() : l.p.evict.budget + l.p.evict.chunk;
        std::vector<int32_t> pr(48);
        for (size_t i = 0; i < pr.size(); i++) pr[i] = 3 + (int32_t)(i * 37 % 270);
        const float* lg = s.decode(pr.data(), (int64_t)pr.size());
        uint64_t rng = 12345;
        // Allocations inside decode steps, in the first and the second half after warm-up.
        const int64_t warm = 2 * (int64_t)pr.size() + 256, mid = (warm + n_tokens) / 2;
        size_t allocs_first = 0, allocs_second = 0, worst_step = 0;
        int64_t max_used = 0;
        for (int64_t t = (int64_t)pr.size(); t < n_tokens; t++) {
            // Sampled, so that the text (and the attention pattern) keeps changing.
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int32_t tok = 3 + (int32_t)((rng >> 33) % 270);
            if ((rng >> 20) % 4 == 0) tok = (int32_t)(std::max_element(lg, lg + m.hp.n_vocab) - lg);
            const size_t a0 = zk_test::allocs().count.load();
            lg = s.decode(&tok, 1);
            const size_t da = zk_test::allocs().count.load() - a0;
            if (t >= warm) (t < mid ? allocs_first : allocs_second) += da, worst_step = std::max(worst_step, da);
            max_used = std::max(max_used, c.n_used_max());
            ASSERT_EQ(c.bytes_allocated(), allocated) << "token " << t;
            ASSERT_LE(c.n_used_max(), slot_limit) << "token " << t;
        }
        std::printf("%-18s %lld tokens: %zu of %zu accounted bytes allocated, %.1f bytes/token, at most %lld of %lld "
                    "slots used, allocations in decode steps after warm-up %zu + %zu (worst step %zu)\n",
                    l.name, (long long)n_tokens, allocated, accounted, c.bytes_per_token_exact(),
                    (long long)max_used, (long long)slot_limit, allocs_first, allocs_second, worst_step);
        // A decode step allocates nothing; an eviction (every `chunk` tokens) allocates
        // its selection lists (one per (layer, head) and a few more), the same number
        // each time: no growth from the first half to the second.
        if (l.p.evict.policy == "none") {
            EXPECT_EQ(allocs_first + allocs_second, 0u) << "decode steps allocate";
        } else {
            EXPECT_LE(worst_step, (size_t)(4 * m.hp.n_layer * m.hp.n_head_kv + 16));
            EXPECT_LE(allocs_second, allocs_first + allocs_first / 8 + 64);
        }
    }
}
