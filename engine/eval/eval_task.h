// Accuracy evaluation (`zack eval`): the task interface shared by ppl, lastword,
// mc and passkey, the data-problem policy (--on-error) and the progress line.
//
// A task prepares its items once (tokenized), then is run on one session per
// compression configuration. The first run is the baseline (the uncompressed
// model): the task keeps what later comparisons need (per-token log-probabilities
// for ppl, per-item answers for the others), and every later run reports its
// figures against it on exactly the same items.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/session.h"

namespace zk {

// ---- data problems ----

enum class eval_on_error { STOP, SKIP };
eval_on_error eval_on_error_from_name(const std::string& s);  // "stop" | "skip"

struct eval_data_issue {
    std::string file;
    int64_t line = 0;  // 1-based; 0 = the file as a whole
    std::string what;
    std::string describe() const;  // "FILE:LINE: what"
};

// Collects problems in user data. STOP throws zk::error "FILE:LINE: what" at the
// first one; SKIP records it, warns on stderr and lets the caller drop the item.
class eval_issues {
public:
    explicit eval_issues(eval_on_error policy) : policy_(policy) {}
    void report(const std::string& file, int64_t line, const std::string& what);
    const std::vector<eval_data_issue>& all() const { return issues_; }
    eval_on_error policy() const { return policy_; }

private:
    eval_on_error policy_;
    std::vector<eval_data_issue> issues_;
};

// ---- progress on stderr: items done, ETA, running score ----

class eval_progress {
public:
    eval_progress(std::string label, int64_t total, bool enabled);
    // Prints at most a few times a second (and always for the last item).
    void update(int64_t done, const std::string& running);

private:
    std::string label_;
    int64_t total_;
    bool enabled_;
    std::chrono::steady_clock::time_point t0_, last_;
};

// ---- results ----

struct eval_score {
    std::string metric;           // the primary figure: "ppl", "acc", "acc_norm"
    double value = 0;
    bool higher_is_better = true;
    int64_t n_items = 0;          // items scored
    double tokens_kept = 1;       // mean over items of cached / fed tokens at the item's end (eviction)
    nlohmann::json detail = nlohmann::json::object();  // every other figure
};

// An accuracy score: `correct` of n_items right, with the cache's mean share kept.
eval_score eval_accuracy_score(int64_t correct, int64_t n_items, double tokens_kept);

// Share of the baseline kept: value/base for higher-is-better figures, base/value
// otherwise; 1 = no loss. A higher-is-better baseline of 0 has nothing to lose: 1.
double eval_retention(const eval_score& s, const eval_score& base);

// Tracks what share of the tokens fed to a session its cache still holds.
struct eval_cache_meter {
    double sum = 0;
    int64_t n = 0;
    void note(const session& s);  // call at the end of an item
    double mean() const { return n ? sum / n : 1.0; }
};

class eval_task {
public:
    virtual ~eval_task() = default;
    virtual const char* name() const = 0;
    virtual int64_t n_items() const = 0;
    // Context the longest item needs, in tokens (the session's n_ctx).
    virtual int64_t n_ctx_needed() const = 0;
    // Typical item length in tokens: eviction budgets are given relative to it.
    virtual int64_t n_tokens_typical() const = 0;
    // Runs every item. The first call must be the baseline (is_baseline = true).
    virtual eval_score run(session& s, bool is_baseline, eval_progress& prog) = 0;
    // Data problems met while preparing items (with --on-error skip).
    const std::vector<eval_data_issue>& issues() const { return issues_.all(); }
    // A baseline read from a file (ppl with --kl-divergence): run() is then only
    // called for comparisons, and stored_baseline() gives the baseline's score.
    virtual bool has_stored_baseline() const { return false; }
    virtual eval_score stored_baseline() { return {}; }

protected:
    explicit eval_task(eval_on_error policy) : issues_(policy) {}
    eval_issues issues_;
};

// ---- the tasks (one file each) ----

struct eval_ppl_opts {
    int64_t n_ctx = 512;  // tokens per chunk (-c)
    int64_t stride = 0;   // 0: llama.cpp's default chunking; > 0: its strided mode
    int64_t limit = 0;    // max chunks (0 = all)
    int64_t piece = 32;   // the scored part of a chunk is fed this many tokens at a time
    // llama-perplexity's --kl-divergence-base FILE (eval_logits.h): without
    // kl_compare the baseline run saves its log-probabilities there; with it, the
    // tokens, chunking and baseline come from FILE (files must be empty, and
    // n_ctx / stride, when set_by_user, must match the file).
    std::string logits_path;
    bool kl_compare = false;
    bool ctx_set_by_user = false;
};
// Perplexity over the concatenated files; against the baseline also KL divergence,
// top-1 agreement and RMS of the probability change (eval_ppl.cpp gives the definitions).
std::unique_ptr<eval_task> eval_task_ppl(const model& m, const std::vector<std::string>& files,
                                         const eval_ppl_opts& o, eval_on_error policy);

struct eval_lastword_opts {
    int min_words = 20;   // passages shorter than this are not used
    int max_words = 120;  // longer paragraphs are cut to this many words
    int64_t limit = 0;    // max passages (0 = all)
};
std::unique_ptr<eval_task> eval_task_lastword(const model& m, const std::vector<std::string>& files,
                                              const eval_lastword_opts& o, eval_on_error policy);

struct eval_mc_opts {
    int64_t limit = 0;
};
std::unique_ptr<eval_task> eval_task_mc(const model& m, const std::vector<std::string>& files,
                                        const eval_mc_opts& o, eval_on_error policy);

struct eval_passkey_opts {
    std::vector<int64_t> lengths = {1024, 2048, 4096, 8192};  // prompt lengths in tokens
    std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0}; // where the key sits (0 = start)
    int trials = 2;                                            // keys per (length, depth)
    uint64_t seed = 1234;
    int64_t limit = 0;
};
std::unique_ptr<eval_task> eval_task_passkey(const model& m, const eval_passkey_opts& o, eval_on_error policy);

// ---- helpers shared by the tasks ----

// log p(tok) under logits[n_vocab], in double.
double eval_log_prob(const float* logits, int n_vocab, int32_t tok);
// Index of the largest logit (the first on ties).
int32_t eval_argmax(const float* logits, int n_vocab);
// Reads a whole file; reports (and returns "") when it cannot be read or is empty.
std::string eval_read_text(const std::string& path, eval_issues& issues);
// Greedy continuation of what is in the session: up to max_tokens tokens
// (stops early at end of generation or when `stop` says so), as text.
std::string eval_greedy(session& s, const float* logits, int max_tokens,
                        bool (*stop)(const std::string& text));

}  // namespace zk
