#include "engine/eval/eval_task.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "engine/unicode.h"
#include "ggml-like/error.h"

namespace zk {

eval_on_error eval_on_error_from_name(const std::string& s) {
    if (s == "stop") return eval_on_error::STOP;
    if (s == "skip") return eval_on_error::SKIP;
    ZK_THROW_PARAM("eval.on_error", "eval.on_error must be stop or skip, got '%s'", s.c_str());
}

std::string eval_data_issue::describe() const {
    if (line > 0) return file + ":" + std::to_string(line) + ": " + what;
    return file + ": " + what;
}

void eval_issues::report(const std::string& file, int64_t line, const std::string& what) {
    eval_data_issue is{file, line, what};
    if (policy_ == eval_on_error::STOP)
        ZK_THROW("%s (eval.on_error skip leaves such items out)", is.describe().c_str());
    std::fprintf(stderr, "warning: %s (skipped)\n", is.describe().c_str());
    issues_.push_back(std::move(is));
}

eval_progress::eval_progress(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)), total_(total), enabled_(enabled) {
    t0_ = last_ = std::chrono::steady_clock::now();
}

void eval_progress::update(int64_t done, const std::string& running) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    const bool last = done >= total_;
    if (!last && std::chrono::duration<double>(now - last_).count() < 0.5) return;
    last_ = now;
    const double el = std::chrono::duration<double>(now - t0_).count();
    const double eta = done > 0 ? el / done * (double)(total_ - done) : 0;
    std::fprintf(stderr, "\r[%s] %lld/%lld items, %.0f s elapsed, ETA %.0f s, %s   ", label_.c_str(),
                 (long long)done, (long long)total_, el, eta, running.c_str());
    if (last) std::fprintf(stderr, "\n");
    std::fflush(stderr);
}

double eval_retention(const eval_score& s, const eval_score& base) {
    if (s.higher_is_better && base.value == 0) return 1.0;  // nothing to lose
    if (base.value == 0 || !std::isfinite(base.value) || !std::isfinite(s.value))
        return std::numeric_limits<double>::quiet_NaN();
    if (s.higher_is_better) return s.value / base.value;
    if (s.value == 0) return std::numeric_limits<double>::quiet_NaN();
    return base.value / s.value;
}

void eval_cache_meter::note(const session& s) {
    const kv_cache& c = s.cache();
    if (s.n_past() <= 0) return;
    double held = 0;
    for (int l = 0; l < c.n_layer(); l++)
        for (int h = 0; h < c.n_head_kv(); h++) held += (double)c.block(l, h).n_used;
    held /= (double)c.n_layer() * c.n_head_kv();
    sum += held / (double)s.n_past();
    n++;
}

double eval_log_prob(const float* logits, int n_vocab, int32_t tok) {
    float mx = logits[0];
    for (int i = 1; i < n_vocab; i++) mx = std::max(mx, logits[i]);
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += std::exp((double)logits[i] - mx);
    return (double)logits[tok] - mx - std::log(sum);
}

int32_t eval_argmax(const float* logits, int n_vocab) {
    int32_t best = 0;
    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

std::string eval_read_text(const std::string& path, eval_issues& issues) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        issues.report(path, 0, "cannot open the file");
        return "";
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    bool blank = true;
    for (char c : text)
        if (!std::isspace((unsigned char)c)) {
            blank = false;
            break;
        }
    if (blank) {
        issues.report(path, 0, "the file is empty");
        return "";
    }
    // A binary file would otherwise tokenize to nonsense and a huge perplexity.
    size_t bad = unicode_utf8_invalid_at(text);
    const size_t nul = text.find('\0');
    if (nul < bad) bad = nul;
    if (bad != std::string::npos) {
        const int64_t line = 1 + (int64_t)std::count(text.begin(), text.begin() + (long)bad, '\n');
        issues.report(path, line, strfmt("not UTF-8 text: byte 0x%02x at offset %zu (a binary file?)",
                                         (unsigned)(unsigned char)text[bad], bad));
        return "";
    }
    return text;
}

std::string eval_greedy(session& s, const float* logits, int max_tokens, bool (*stop)(const std::string& text)) {
    const vocab& voc = *s.mdl().voc;
    const int n_vocab = s.mdl().hp.n_vocab;
    std::string text;
    for (int i = 0; i < max_tokens; i++) {
        const int32_t tok = eval_argmax(logits, n_vocab);
        if (voc.is_eog(tok)) break;
        text += voc.token_to_piece(tok);
        if (stop && stop(text)) break;
        if (i + 1 == max_tokens || s.n_past() >= s.n_ctx()) break;
        logits = s.decode(&tok, 1);
    }
    return text;
}

eval_score eval_accuracy_score(int64_t correct, int64_t n_items, double tokens_kept) {
    eval_score r;
    r.metric = "acc";
    r.higher_is_better = true;
    r.n_items = n_items;
    r.value = n_items > 0 ? (double)correct / (double)n_items : 0.0;
    r.tokens_kept = tokens_kept;
    r.detail["acc"] = r.value;
    return r;
}

}  // namespace zk
