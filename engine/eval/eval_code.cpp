// The code task: see eval_code.h for the data format, the two prompt modes and
// what counts as a pass.
#include "engine/eval/eval_code.h"

#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>

#include "engine/chat.h"
#include "engine/model.h"
#include "ggml-like/error.h"

namespace zk {

namespace {

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

// Position of the first line of `text` that starts at column 0 with something other
// than white space (npos if none). The text follows a prompt that ends in a newline,
// so position 0 is a line start too.
size_t first_top_level_line(const std::string& text) {
    for (size_t i = 0; i < text.size(); i++)
        if ((i == 0 || text[i - 1] == '\n') && !is_blank(text[i])) return i;
    return std::string::npos;
}

bool is_identifier(const std::string& s) {
    if (s.empty() || std::isdigit((unsigned char)s[0])) return false;
    for (char c : s)
        if (!std::isalnum((unsigned char)c) && c != '_') return false;
    return true;
}

std::string last_line(const std::string& s) {
    size_t e = s.size();
    while (e > 0 && is_blank(s[e - 1])) e--;
    const size_t b = s.rfind('\n', e == 0 ? 0 : e - 1);
    return s.substr(b == std::string::npos ? 0 : b + 1, e - (b == std::string::npos ? 0 : b + 1));
}

std::string clip(std::string s, size_t n) {
    if (s.size() > n) s = s.substr(0, n) + "...";
    return s;
}

std::string random_marker() {
    std::random_device rd;
    char b[64];
    std::snprintf(b, sizeof b, "zack-code-pass-%08x%08x", rd(), rd());
    return b;
}

}  // namespace

// ---- data ----

std::vector<code_problem> code_load_problems(const std::string& file, eval_issues& issues) {
    std::vector<code_problem> out;
    std::ifstream in(file, std::ios::binary);
    if (!in) {
        issues.report(file, 0, "cannot open the file");
        return out;
    }
    std::string line;
    int64_t ln = 0;
    bool any = false;
    while (std::getline(in, line)) {
        ln++;
        bool blank = true;
        for (char c : line) blank &= is_blank(c);
        if (blank) continue;
        any = true;
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (!j.is_object()) {
            issues.report(file, ln, "not a JSON object");
            continue;
        }
        auto str = [&](const char* k, bool required, std::string& dst) {
            auto it = j.find(k);
            if (it == j.end()) {
                if (required) issues.report(file, ln, std::string("no field '") + k + "'");
                return !required;
            }
            if (!it->is_string() || (required && it->get<std::string>().empty())) {
                issues.report(file, ln, std::string("field '") + k + "' must be a non-empty string");
                return false;
            }
            dst = it->get<std::string>();
            return true;
        };
        code_problem p;
        if (!str("id", true, p.id) || !str("prompt", true, p.prompt) || !str("entry_point", true, p.entry_point) ||
            !str("tests", true, p.tests) || !str("canonical_solution", false, p.canonical_solution) ||
            !str("wrong_solution", false, p.wrong_solution))
            continue;
        if (!is_identifier(p.entry_point)) {
            issues.report(file, ln, "entry_point '" + p.entry_point + "' is not a Python identifier");
            continue;
        }
        if (p.prompt.find("def " + p.entry_point + "(") == std::string::npos) {
            issues.report(file, ln, "the prompt does not define '" + p.entry_point + "'");
            continue;
        }
        if (p.prompt.back() != '\n') {
            issues.report(file, ln, "the prompt must end with a newline (the body starts on the next line)");
            continue;
        }
        p.where = file + ":" + std::to_string(ln);
        out.push_back(std::move(p));
    }
    if (!any) issues.report(file, 0, "the file is empty (no JSON lines)");
    return out;
}

code_prompt_mode code_prompt_mode_from_name(const std::string& s) {
    if (s == "raw") return code_prompt_mode::RAW;
    if (s == "chat") return code_prompt_mode::CHAT;
    ZK_THROW_PARAM("eval.code_prompt", "eval.code_prompt must be raw or chat, got '%s'", s.c_str());
}

// ---- where a completion ends ----

bool code_raw_done(const std::string& text) { return first_top_level_line(text) != std::string::npos; }

std::string code_raw_body(const std::string& text) {
    const size_t e = first_top_level_line(text);
    return e == std::string::npos ? text : text.substr(0, e);
}

bool code_fence_done(const std::string& text) {
    const size_t a = text.find("```");
    if (a == std::string::npos) return false;
    const size_t nl = text.find('\n', a);
    return nl != std::string::npos && text.find("```", nl) != std::string::npos;
}

std::string code_fence_content(const std::string& text) {
    const size_t a = text.find("```");
    if (a == std::string::npos) return text;
    const size_t nl = text.find('\n', a);
    if (nl == std::string::npos) return "";
    const size_t b = text.find("```", nl);
    return text.substr(nl + 1, b == std::string::npos ? std::string::npos : b - nl - 1);
}

std::string code_chat_request(const code_problem& p) {
    return "Complete the following Python function. Reply with the whole function, signature included, in one "
           "```python code block.\n\n```python\n" + p.prompt + "```";
}

std::string code_solution_source(const code_problem& p, const std::string& generated, code_prompt_mode mode) {
    if (mode == code_prompt_mode::RAW) return p.prompt + code_raw_body(generated);
    const std::string code = code_fence_content(generated);
    const std::string def = "def " + p.entry_point + "(";
    if (code.find(def) == std::string::npos) return p.prompt + code;  // only the body
    // The prompt's lines above its def (imports, helpers) then the model's function.
    return p.prompt.substr(0, p.prompt.find(def)) + code;
}

// ---- running the tests ----

code_verdict code_run_tests(const sandbox& sb, const code_problem& p, const std::string& solution_source) {
    const std::string marker = random_marker();
    std::string prog = solution_source;
    if (!prog.empty() && prog.back() != '\n') prog += '\n';
    prog += "\n\n" + p.tests;
    if (prog.back() != '\n') prog += '\n';
    prog += "print(\"" + marker + "\", flush=True)\n";
    const sandbox_result r = sb.run_python(prog);
    code_verdict v;
    v.wall_s = r.wall_s;
    if (!r.timed_out && r.exit_code == 0 && last_line(r.out_tail) == marker) {
        v.passed = true;
        v.result = "passed";
    } else if (r.timed_out || r.exit_code > 128) {
        v.result = r.describe();
    } else if (r.exit_code != 0) {
        std::string last = last_line(r.err);
        if (last.empty()) last = r.describe();
        if (last.rfind("AssertionError", 0) == 0) {
            // Name the failing assert: the traceback shows its source line above.
            size_t e = r.err.size();
            while (e > 0) {
                const size_t b = r.err.rfind('\n', e - 1);
                std::string l = r.err.substr(b == std::string::npos ? 0 : b + 1, e - (b == std::string::npos ? 0 : b + 1));
                const size_t s = l.find_first_not_of(" \t");
                if (s != std::string::npos && l.compare(s, 7, "assert ") == 0) {
                    last += ": " + l.substr(s);
                    break;
                }
                if (b == std::string::npos) break;
                e = b;
            }
        }
        v.result = clip(last, 300);
    } else {
        v.result = "exit 0 before the tests finished";
    }
    return v;
}

// ---- the task ----

namespace {

struct code_item {
    code_problem p;
    std::vector<int32_t> tokens;
};

class code_task final : public eval_task {
public:
    code_task(const model& m, const std::vector<std::string>& files, const eval_code_opts& o, eval_on_error policy)
        : eval_task(policy), o_(o) {
        if (files.empty()) ZK_THROW_PARAM("eval.data", "code: no JSONL files given (eval.data FILE ...)");
        if (o.max_tokens < 1)
            ZK_THROW_PARAM("eval.code_max_tokens", "code: eval.code_max_tokens must be >= 1, got %d", o.max_tokens);
        std::set<std::string> ids;
        for (const std::string& f : files)
            for (code_problem& p : code_load_problems(f, issues_)) {
                if (!ids.insert(p.id).second) {
                    issues_.report(f, std::stoll(p.where.substr(p.where.rfind(':') + 1)),
                                   "id '" + p.id + "' appears twice");
                    continue;
                }
                items_.push_back({std::move(p), {}});
            }
        if (o.limit > 0 && (int64_t)items_.size() > o.limit) items_.resize(o.limit);
        if (items_.empty()) ZK_THROW("code: no usable problems in the data files");
        // The sandbox is checked before any generation: without it nothing runs.
        sb_ = std::make_unique<sandbox>(o.limits, o.python);
        const vocab& voc = *m.voc;
        const chat_template tpl = model_chat_template(m);
        for (code_item& it : items_) {
            if (o.mode == code_prompt_mode::RAW) {
                it.tokens = voc.encode(it.p.prompt, true, false);
            } else {
                const std::string text = chat_apply(tpl, {{"user", code_chat_request(it.p)}}, true);
                it.tokens = voc.encode(text, true, true);
            }
            max_len_ = std::max<int64_t>(max_len_, (int64_t)it.tokens.size() + o.max_tokens + 1);
            sum_len_ += (int64_t)it.tokens.size() + o.max_tokens / 4;
        }
    }

    const char* name() const override { return "code"; }
    int64_t n_items() const override { return (int64_t)items_.size(); }
    int64_t n_ctx_needed() const override { return max_len_; }
    int64_t n_tokens_typical() const override { return sum_len_ / (int64_t)items_.size(); }

    eval_score run(session& s, bool is_baseline, eval_progress& prog) override {
        eval_cache_meter meter;
        const bool raw = o_.mode == code_prompt_mode::RAW;
        int64_t passed = 0, same_verdict = 0, same_text = 0;
        double gen_s = 0, run_s = 0;
        std::vector<std::string> texts(items_.size());
        std::vector<bool> verdicts(items_.size());
        nlohmann::json problems = nlohmann::json::array();
        for (size_t i = 0; i < items_.size(); i++) {
            const code_item& it = items_[i];
            const auto t0 = std::chrono::steady_clock::now();
            s.reset();
            const float* logits = s.decode(it.tokens.data(), (int64_t)it.tokens.size());
            texts[i] = eval_greedy(s, logits, o_.max_tokens, raw ? code_raw_done : code_fence_done);
            const int64_t n_gen = s.n_past() - (int64_t)it.tokens.size() + 1;
            meter.note(s);
            const auto t1 = std::chrono::steady_clock::now();
            const code_verdict v = code_run_tests(*sb_, it.p, code_solution_source(it.p, texts[i], o_.mode));
            gen_s += std::chrono::duration<double>(t1 - t0).count();
            run_s += v.wall_s;
            verdicts[i] = v.passed;
            passed += v.passed;
            nlohmann::json pj = {{"id", it.p.id},
                                 {"passed", v.passed},
                                 {"result", v.result},
                                 {"generated_tokens", n_gen},
                                 {"completion", raw ? code_raw_body(texts[i]) : texts[i]}};
            if (!is_baseline) {
                same_verdict += v.passed == base_verdicts_[i];
                same_text += texts[i] == base_texts_[i];
                pj["same_completion_as_baseline"] = texts[i] == base_texts_[i];
            }
            problems.push_back(std::move(pj));
            char run[64];
            std::snprintf(run, sizeof run, "pass@1 %.2f%%", 100.0 * passed / (double)(i + 1));
            prog.update((int64_t)i + 1, run);
        }
        const double n = (double)items_.size();
        eval_score r;
        r.metric = "pass@1";
        r.higher_is_better = true;
        r.n_items = (int64_t)items_.size();
        r.value = passed / n;
        r.tokens_kept = meter.mean();
        r.detail["pass@1"] = r.value;
        r.detail["n_passed"] = passed;
        r.detail["n_items"] = r.n_items;
        r.detail["prompt"] = raw ? "raw" : "chat";
        r.detail["max_tokens"] = o_.max_tokens;
        r.detail["generate_s"] = gen_s;
        r.detail["sandbox_s"] = run_s;
        r.detail["sandbox"] = sb_->describe();
        if (!is_baseline) {
            r.detail["same_verdict_as_baseline"] = same_verdict / n;
            r.detail["same_completion_as_baseline"] = same_text / n;
        } else {
            base_texts_ = texts;
            base_verdicts_ = verdicts;
        }
        r.detail["problems"] = problems;
        return r;
    }

private:
    eval_code_opts o_;
    std::vector<code_item> items_;
    std::unique_ptr<sandbox> sb_;
    std::vector<std::string> base_texts_;
    std::vector<bool> base_verdicts_;
    int64_t max_len_ = 0, sum_len_ = 0;
};

}  // namespace

std::unique_ptr<eval_task> eval_task_code(const model& m, const std::vector<std::string>& files,
                                          const eval_code_opts& o, eval_on_error policy) {
    return std::make_unique<code_task>(m, files, o, policy);
}

}  // namespace zk
