// Passkey retrieval: a 5-digit number hidden at a chosen depth in filler text of
// a chosen length; the model is asked to repeat it and answers greedily. Items
// are (length, depth, trial); the key of each comes from a seeded generator, so
// runs are reproducible and never depend on the model. The prompt is assembled
// from separately tokenized pieces (intro, filler blocks, key sentence, question)
// so its length in tokens is exactly the requested one (the last filler block is
// cut short to fit).
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>

#include "engine/eval/eval_task.h"
#include "engine/model.h"
#include "ggml-like/error.h"

namespace zk {

namespace {

const char* const k_intro =
    "There is an important number hidden inside a lot of irrelevant text. Find it and remember it, "
    "I will ask you for it at the end.";
const char* const k_filler =
    " The river runs past the old mill. The hills are quiet in the evening. A light wind moves the grass."
    " The road goes on and comes back again.";
const char* const k_question = "\nWhat is the pass key? The pass key is";

uint64_t splitmix64(uint64_t& s) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

bool digits_done(const std::string& t) {
    size_t i = 0;
    while (i < t.size() && !std::isdigit((unsigned char)t[i])) i++;
    size_t j = i;
    while (j < t.size() && std::isdigit((unsigned char)t[j])) j++;
    return j > i && j < t.size();
}

std::string first_number(const std::string& t) {
    size_t i = 0;
    while (i < t.size() && std::isspace((unsigned char)t[i])) i++;
    std::string n;
    while (i < t.size() && std::isdigit((unsigned char)t[i])) n += t[i++];
    return n;
}

struct pk_item {
    int64_t length = 0;  // requested
    double depth = 0;
    std::string key;
    std::vector<int32_t> tokens;
};

class passkey_task final : public eval_task {
public:
    passkey_task(const model& m, const eval_passkey_opts& o, eval_on_error policy) : eval_task(policy), o_(o) {
        if (o.lengths.empty() || o.depths.empty()) ZK_THROW("passkey: need at least one length and one depth");
        if (o.trials < 1) ZK_THROW("passkey: trials must be >= 1, got %d", o.trials);
        const vocab& voc = *m.voc;
        const std::vector<int32_t> intro = voc.encode(k_intro, false, false);
        const std::vector<int32_t> filler = voc.encode(k_filler, false, false);
        const std::vector<int32_t> question = voc.encode(k_question, false, false);
        if (filler.empty())  // a vocabulary that drops every byte of it: nothing to fill with
            ZK_THROW("passkey: the filler text tokenizes to nothing with this model's vocabulary");
        uint64_t rng = o.seed;
        for (int64_t len : o.lengths) {
            for (double d : o.depths) {
                if (!(d >= 0 && d <= 1)) ZK_THROW("passkey: depth %g is outside 0..1", d);  // NaN too
                for (int t = 0; t < o.trials; t++) {
                    pk_item it;
                    it.length = len;
                    it.depth = d;
                    it.key = std::to_string(10000 + splitmix64(rng) % 90000);
                    const std::string key_text =
                        " The pass key is " + it.key + ". Remember it. " + it.key + " is the pass key.";
                    const std::vector<int32_t> key = voc.encode(key_text, false, false);
                    const int64_t fixed = (int64_t)(intro.size() + key.size() + question.size()) + (voc.add_bos() ? 1 : 0);
                    if (len < fixed)
                        ZK_THROW("passkey: length %lld is too short (at least %lld tokens)", (long long)len,
                                 (long long)fixed);
                    const int64_t n_fill = (len - fixed) / (int64_t)filler.size();
                    const int64_t at = (int64_t)std::llround(d * (double)n_fill);
                    if (voc.add_bos()) it.tokens.push_back(voc.bos());
                    it.tokens.insert(it.tokens.end(), intro.begin(), intro.end());
                    for (int64_t b = 0; b <= n_fill; b++) {
                        if (b == at) it.tokens.insert(it.tokens.end(), key.begin(), key.end());
                        if (b < n_fill) it.tokens.insert(it.tokens.end(), filler.begin(), filler.end());
                    }
                    // Pad with the start of one more block so the prompt has exactly `len` tokens.
                    const int64_t rem = len - fixed - n_fill * (int64_t)filler.size();
                    it.tokens.insert(it.tokens.end(), filler.begin(), filler.begin() + rem);
                    it.tokens.insert(it.tokens.end(), question.begin(), question.end());
                    max_len_ = std::max<int64_t>(max_len_, (int64_t)it.tokens.size() + 8);
                    sum_len_ += (int64_t)it.tokens.size();
                    items_.push_back(std::move(it));
                }
            }
        }
        if (o.limit > 0 && (int64_t)items_.size() > o.limit) items_.resize(o.limit);
    }

    const char* name() const override { return "passkey"; }
    int64_t n_items() const override { return (int64_t)items_.size(); }
    int64_t n_ctx_needed() const override { return max_len_; }
    int64_t n_tokens_typical() const override { return sum_len_ / (int64_t)items_.size(); }

    eval_score run(session& s, bool is_baseline, eval_progress& prog) override {
        eval_cache_meter meter;
        int64_t correct = 0;
        // [length][depth] -> {correct, total}
        std::map<int64_t, std::map<double, std::pair<int, int>>> cells;
        nlohmann::json answers = nlohmann::json::array();
        for (size_t i = 0; i < items_.size(); i++) {
            const pk_item& it = items_[i];
            s.reset();
            const float* logits = s.decode(it.tokens.data(), (int64_t)it.tokens.size());
            meter.note(s);
            const std::string ans = first_number(eval_greedy(s, logits, 8, digits_done));
            const bool ok = ans == it.key;
            correct += ok;
            auto& cell = cells[it.length][it.depth];
            cell.first += ok;
            cell.second++;
            answers.push_back({{"length", it.length}, {"tokens", (int64_t)it.tokens.size()}, {"depth", it.depth},
                               {"key", it.key}, {"answer", ans}});
            char run[64];
            std::snprintf(run, sizeof run, "acc %.2f%%", 100.0 * correct / (double)(i + 1));
            prog.update((int64_t)i + 1, run);
        }
        eval_score r = eval_accuracy_score(correct, (int64_t)items_.size(), meter.mean());
        nlohmann::json table = nlohmann::json::array();
        for (const auto& [len, row] : cells)
            for (const auto& [d, c] : row)
                table.push_back({{"length", len}, {"depth", d}, {"acc", (double)c.first / c.second}, {"n", c.second}});
        r.detail["by_length_depth"] = table;
        r.detail["answers"] = answers;
        return r;
    }

private:
    eval_passkey_opts o_;
    std::vector<pk_item> items_;
    int64_t max_len_ = 0, sum_len_ = 0;
};

}  // namespace

std::unique_ptr<eval_task> eval_task_passkey(const model& m, const eval_passkey_opts& o, eval_on_error policy) {
    return std::make_unique<passkey_task>(m, o, policy);
}

}  // namespace zk
