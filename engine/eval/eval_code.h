// The code task (`zack eval --task code`): function-completion problems with unit
// tests, HumanEval-style. The model completes each problem greedily, the completed
// program runs with the problem's asserts in the sandbox (engine/eval/sandbox.h),
// and the score is pass@1: the share of problems whose tests pass.
//
// Data: JSONL, one problem per line (blank lines ignored), fields
//   id          string, unique within the files
//   prompt      string: imports, the signature and a docstring, ending in a newline,
//               so that the next line a model writes is the indented body
//   entry_point string: the function's name (the prompt must contain "def NAME(")
//   tests       string: Python statements (asserts) calling the function by name
//   canonical_solution, wrong_solution  optional bodies, used by the tests of the
//               data set itself (tests/data/code/README.md), ignored by the task
//
// Two ways to ask (--code-prompt):
//   raw   the prompt text itself is continued (no chat template); generation
//         stops at the first line that starts at column 0 (the function has
//         ended: a new def, a test, a fence) and the body is what came before.
//   chat  the model's chat template (tokenizer.chat_template) asks for the function in a ```python block,
//         with the prompt inside one; generation stops when the block closes. If
//         the block defines the entry point it is the solution (after the
//         prompt's lines above its def, for the imports), else it is taken as
//         the body that continues the prompt.
// chat is the default: on Qwen2.5-Coder-1.5B-Instruct it passes 53% against raw's
// 45%, and some of raw's failures are the format's, not the model's (a helper it
// defines after the function is cut by the column-0 stop, an import it would
// write is missing); tests/data/code/README.md has the measurement. raw
// generates about 2.5 times fewer tokens.
//
// A problem passes when the program (solution, then the tests, then a line
// printing a random per-run marker) exits 0 and its stdout ends with the marker.
// Everything a program can do wrong (syntax error, exception, hang, crash, junk,
// calling exit(0) early) is a failure of that problem, never an error of zack.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/eval/eval_task.h"
#include "engine/eval/sandbox.h"

namespace zk {

struct code_problem {
    std::string id, prompt, entry_point, tests;
    std::string canonical_solution, wrong_solution;  // "" when absent
    std::string where;                               // "FILE:LINE"
};

// Reads problems from a JSONL file; malformed lines go to `issues` (file and line).
std::vector<code_problem> code_load_problems(const std::string& file, eval_issues& issues);

enum class code_prompt_mode { RAW, CHAT };
code_prompt_mode code_prompt_mode_from_name(const std::string& s);  // "raw" | "chat"

// raw: true once the text has a line starting at column 0 (the function has ended).
bool code_raw_done(const std::string& text);
// raw: the body, i.e. the text up to (not including) that line.
std::string code_raw_body(const std::string& text);
// chat: true once the first ``` fence has been closed by a second one.
bool code_fence_done(const std::string& text);
// chat: the content of the first fenced block (the whole text after an unclosed
// opening fence; the whole text when there is no fence).
std::string code_fence_content(const std::string& text);

// The user message of chat mode for a problem.
std::string code_chat_request(const code_problem& p);
// The source that defines the function: prompt + body (raw), or as above (chat).
std::string code_solution_source(const code_problem& p, const std::string& generated, code_prompt_mode mode);

struct code_verdict {
    bool passed = false;
    std::string result;  // "passed", "AssertionError", "SyntaxError: ...", "wall time limit (10.0 s)", ...
    double wall_s = 0;
};
// Runs solution + tests in the sandbox and judges them.
code_verdict code_run_tests(const sandbox& sb, const code_problem& p, const std::string& solution_source);

struct eval_code_opts {
    int64_t limit = 0;
    code_prompt_mode mode = code_prompt_mode::CHAT;
    int max_tokens = 512;  // generated tokens per problem
    sandbox_limits limits;
    std::string python;  // "" = the sandbox's default interpreter
};
std::unique_ptr<eval_task> eval_task_code(const model& m, const std::vector<std::string>& files,
                                          const eval_code_opts& o, eval_on_error policy);

}  // namespace zk
