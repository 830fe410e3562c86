// Perplexity, chunked as llama.cpp's perplexity tool does:
//   tokens = tokenize(all text, with BOS if the model adds one); at least 2 x c needed
//   default: chunk i = tokens[i c, (i+1) c), its first token replaced by BOS when the
//            model adds BOS; the logits at positions c/2 .. c-2 score the next token,
//            so c - 1 - c/2 tokens per chunk, floor(n / c) chunks
//   stride S > 0: windows of w = c + S/2 tokens starting every S tokens, no BOS
//            substitution, the last S positions' next tokens scored,
//            (n - w + S - 1) / S windows
// The last token of a window is never fed (nothing scores it), so it holds
// window - 1 tokens at the end.
//   PPL = exp(mean nll), uncertainty PPL * sqrt((mean nll^2 - mean^2) / (count - 1))
// Against the baseline the same positions give the statistics of eval_stats.h.
// The baseline's log-probabilities of the scored positions are kept in memory
// as f32: [scored tokens x n_vocab], and saved to a file with
// --kl-divergence-base; with --kl-divergence they are read back from that file
// row by row instead (eval_logits.h), tokens and chunking included.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/eval/eval_logits.h"
#include "engine/eval/eval_stats.h"
#include "engine/eval/eval_task.h"
#include "engine/model.h"
#include "ggml-like/error.h"

namespace zk {

namespace {

class ppl_task final : public eval_task {
public:
    ppl_task(const model& m, const std::vector<std::string>& files, const eval_ppl_opts& o, eval_on_error policy)
        : eval_task(policy), o_(o), n_vocab_(m.hp.n_vocab) {
        if (o.n_ctx < 4) ZK_THROW("ppl: context size %lld is too small (at least 4)", (long long)o.n_ctx);
        if (o.piece < 1) ZK_THROW("ppl: piece size must be >= 1, got %lld", (long long)o.piece);
        if (o.stride < 0) ZK_THROW("ppl: stride must be >= 0, got %lld", (long long)o.stride);
        header_.n_vocab = (uint32_t)n_vocab_;
        header_.vocab_hash = eval_vocab_hash(*m.voc);
        header_.model = m.file->path() + " (" + model_describe(m) + ")";
        if (o.kl_compare) {
            load_baseline(m, files);
            return;
        }
        if (files.empty())
            ZK_THROW_PARAM("eval.data", "ppl: no text files given (eval.data FILE ... or eval.file FILE)");
        std::string text;
        for (const std::string& f : files) {
            const std::string t = eval_read_text(f, issues_);
            if (t.empty()) continue;
            if (!text.empty()) text += "\n\n";
            text += t;
        }
        if (text.empty()) ZK_THROW("ppl: no usable text in the data files");
        const vocab& voc = *m.voc;
        tokens_ = voc.encode(text, true, false);
        bos_ = voc.add_bos() ? voc.bos() : -1;
        const int64_t n = (int64_t)tokens_.size(), c = o.n_ctx;
        if (o.stride == 0) {
            window_ = c;
            if (n < 2 * c)
                ZK_THROW("ppl: the text tokenizes to %lld tokens; a context of %lld needs at least %lld "
                         "(lower -c or add text)", (long long)n, (long long)c, (long long)(2 * c));
            n_chunks_ = n / c;
            first_ = c / 2;
            step_ = c;
        } else {
            // The scored tail of a window is its last `stride` tokens: it must fit
            // after the first token (first_ >= 0 below).
            if (o.stride > 2 * c - 2)
                ZK_THROW("ppl: stride %lld is too large for a context of %lld (at most %lld)", (long long)o.stride,
                         (long long)c, (long long)(2 * c - 2));
            window_ = c + o.stride / 2;
            if (n <= window_)
                ZK_THROW("ppl: the text tokenizes to %lld tokens, not enough for a window of %lld", (long long)n,
                         (long long)window_);
            n_chunks_ = (n - window_ + o.stride - 1) / o.stride;
            first_ = window_ - o.stride - 1;
            step_ = o.stride;
            bos_ = -1;  // the strided mode of llama.cpp evaluates the tokens as they are
        }
        if (o.limit > 0) n_chunks_ = std::min(n_chunks_, o.limit);
        per_chunk_ = window_ - 1 - first_;
        const double bytes = (double)n_chunks_ * per_chunk_ * n_vocab_ * sizeof(float);
        if (bytes > 8e9)
            ZK_THROW("ppl: keeping the baseline's log-probabilities would need %.1f GB; use eval.limit to evaluate "
                     "fewer chunks", bytes / 1e9);
    }

    // --kl-divergence: tokens, chunking and the baseline from the logits file.
    void load_baseline(const model& m, const std::vector<std::string>& files) {
        if (!files.empty())
            ZK_THROW("ppl: eval.kl_divergence reads the tokens from %s; give no eval.data/eval.file",
                     o_.logits_path.c_str());
        file_ = std::make_unique<eval_logits_file>(o_.logits_path);
        const eval_logits_header& h = file_->header();
        const char* path = o_.logits_path.c_str();
        if ((int)h.n_vocab != n_vocab_ || h.vocab_hash != header_.vocab_hash)
            ZK_THROW("%s: saved with another vocabulary (%u tokens) than -m %s (%d tokens): the token ids do not "
                     "match", path, h.n_vocab, m.file->path().c_str(), n_vocab_);
        const int64_t c = h.stride == 0 ? h.window : h.window - h.stride / 2;
        if (o_.ctx_set_by_user && o_.n_ctx != c)
            ZK_THROW("%s was saved with -c %lld; drop -c or give the same", path, (long long)c);
        if (o_.stride != 0 && o_.stride != h.stride)
            ZK_THROW("%s was saved with eval.ppl_stride %lld; drop it or give the same", path, (long long)h.stride);
        tokens_ = file_->tokens();
        window_ = h.window;
        first_ = h.first;
        step_ = h.step;
        per_chunk_ = h.per_chunk;
        n_chunks_ = h.n_chunks;
        bos_ = h.bos;
        o_.n_ctx = c;
        o_.stride = h.stride;
        if (o_.limit > 0) n_chunks_ = std::min(n_chunks_, o_.limit);
        row_.resize((size_t)n_vocab_);
    }

    bool has_stored_baseline() const override { return file_ != nullptr; }

    // The saved baseline's own figures, from its log-probabilities of the right tokens.
    eval_score stored_baseline() override {
        ZK_ASSERT(file_);
        double nll = 0, nll2 = 0;
        int64_t count = 0;
        for (int64_t i = 0; i < n_chunks_; i++)
            for (int64_t j = 0; j < per_chunk_; j++) {
                file_->row(i, j, row_.data());
                const double v = -(double)row_[(size_t)tokens_[i * step_ + first_ + j + 1]];
                nll += v;
                nll2 += v * v;
                count++;
            }
        eval_score r = score(nll, nll2, count, 1.0);
        r.detail["logits_file"] = o_.logits_path;
        r.detail["logits_model"] = file_->header().model;
        return r;
    }

    const char* name() const override { return "ppl"; }
    int64_t n_items() const override { return n_chunks_; }
    int64_t n_ctx_needed() const override { return window_; }
    int64_t n_tokens_typical() const override { return window_; }

    eval_score run(session& s, bool is_baseline, eval_progress& prog) override {
        if (is_baseline && file_) ZK_THROW("ppl: the baseline comes from %s", o_.logits_path.c_str());
        if (is_baseline) base_lp_.assign((size_t)n_chunks_ * per_chunk_ * n_vocab_, 0.0f);
        else if (base_lp_.empty() && !file_) ZK_THROW("ppl: the baseline must run first");
        eval_kl_stats kl;
        eval_cache_meter meter;
        double nll = 0, nll2 = 0;
        int64_t count = 0;
        std::vector<int32_t> chunk((size_t)window_);
        for (int64_t i = 0; i < n_chunks_; i++) {
            const int64_t start = i * step_;
            for (int64_t t = 0; t < window_; t++) chunk[t] = tokens_[start + t];
            if (bos_ >= 0) chunk[0] = bos_;
            s.reset();
            // The unscored prefix is one prefill; the scored part follows in pieces
            // of o_.piece tokens, so an evicting cache is in effect while it is scored.
            if (first_ > 0) s.decode(chunk.data(), first_);
            const float* logits = nullptr;
            int64_t piece_at = 0;
            for (int64_t j = first_; j < window_ - 1; j++) {
                if (logits == nullptr || j - piece_at >= o_.piece) {
                    const int64_t n = std::min<int64_t>(o_.piece, window_ - 1 - j);
                    logits = s.decode(chunk.data() + j, n, true);
                    piece_at = j;
                }
                const float* row = logits + (size_t)(j - piece_at) * n_vocab_;
                const int32_t next = tokens_[start + j + 1];
                float* blp = row_.data();
                if (file_) file_->row(i, j - first_, blp);
                else blp = base_lp_.data() + ((size_t)i * per_chunk_ + (j - first_)) * n_vocab_;
                if (is_baseline) eval_log_softmax(row, n_vocab_, blp);
                else kl.add(blp, row, n_vocab_, next);
                const double v = -eval_log_prob(row, n_vocab_, next);
                nll += v;
                nll2 += v * v;
                count++;
            }
            meter.note(s);
            char run[96];
            std::snprintf(run, sizeof run, "ppl %.4f", std::exp(nll / count));
            if (!is_baseline) std::snprintf(run, sizeof run, "ppl %.4f, KLD %.5f, same top %.2f%%",
                                            std::exp(nll / count), kl.kld_mean(), 100 * kl.same_top());
            prog.update(i + 1, run);
        }
        eval_score r = score(nll, nll2, count, meter.mean());
        if (!is_baseline) r.detail["vs_baseline"] = kl.summary();
        if (is_baseline && !o_.logits_path.empty()) save_baseline();
        return r;
    }

private:
    eval_score score(double nll, double nll2, int64_t count, double tokens_kept) const {
        eval_score r;
        r.metric = "ppl";
        r.higher_is_better = false;
        r.n_items = n_chunks_;
        r.tokens_kept = tokens_kept;
        const double m = nll / count;
        double var = nll2 / count - m * m;
        r.value = std::exp(m);
        r.detail["ppl"] = r.value;
        r.detail["ppl_unc"] = var > 0 && count > 1 ? r.value * std::sqrt(var / (count - 1)) : 0.0;
        r.detail["n_tokens_scored"] = count;
        r.detail["n_chunks"] = n_chunks_;
        r.detail["n_tokens_text"] = (int64_t)tokens_.size();
        r.detail["window"] = window_;
        r.detail["stride"] = o_.stride;
        return r;
    }

    void save_baseline() {
        eval_logits_header h = header_;
        h.window = window_;
        h.stride = o_.stride;
        h.step = step_;
        h.first = first_;
        h.per_chunk = per_chunk_;
        h.n_chunks = n_chunks_;
        h.bos = bos_;
        eval_logits_write(o_.logits_path, h, tokens_, base_lp_.data());
    }

    eval_ppl_opts o_;
    int n_vocab_;
    std::vector<int32_t> tokens_;
    int32_t bos_ = -1;
    int64_t window_ = 0, n_chunks_ = 0, first_ = 0, step_ = 0, per_chunk_ = 0;
    std::vector<float> base_lp_;  // [n_chunks x per_chunk x n_vocab]
    eval_logits_header header_;   // vocabulary and model of -m, for the saved file
    std::unique_ptr<eval_logits_file> file_;  // --kl-divergence: the saved baseline
    std::vector<float> row_;      // [n_vocab] one saved row, converted
};

}  // namespace

std::unique_ptr<eval_task> eval_task_ppl(const model& m, const std::vector<std::string>& files,
                                         const eval_ppl_opts& o, eval_on_error policy) {
    return std::make_unique<ppl_task>(m, files, o, policy);
}

}  // namespace zk
