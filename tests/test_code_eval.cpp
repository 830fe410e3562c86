// The code task's harness and its data set: every reference solution in
// tests/data/code/problems.jsonl passes its tests in the sandbox, every problem's
// wrong solution (a plausible near miss) and an empty body fail them, so the tests
// discriminate; completions that misbehave (syntax errors, hangs, junk, an early
// exit) are failures of their problem, never errors; where a completion ends in
// raw and chat mode; malformed problem files are named by file and line.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "engine/eval/eval_code.h"
#include "ggml-like/error.h"

namespace zk {
namespace {

const std::string k_problems = std::string(ZACK_SOURCE_DIR) + "/tests/data/code/problems.jsonl";

const sandbox& test_sandbox() {
    static sandbox sb([] {
        sandbox_limits l;
        l.wall_s = 3;
        l.cpu_s = 2;
        return l;
    }());
    return sb;
}

const std::vector<code_problem>& problems() {
    static const std::vector<code_problem> ps = [] {
        eval_issues issues(eval_on_error::STOP);
        return code_load_problems(k_problems, issues);
    }();
    return ps;
}

const code_problem& problem(const std::string& entry) {
    for (const code_problem& p : problems())
        if (p.entry_point == entry) return p;
    throw error("no problem " + entry);
}

TEST(CodeData, AtLeastFortyWellFormedProblems) {
    const auto& ps = problems();
    EXPECT_GE(ps.size(), 40u);
    std::set<std::string> ids, entries;
    for (const code_problem& p : ps) {
        EXPECT_TRUE(ids.insert(p.id).second) << p.id;
        EXPECT_TRUE(entries.insert(p.entry_point).second) << p.entry_point;
        EXPECT_FALSE(p.canonical_solution.empty()) << p.id;
        EXPECT_FALSE(p.wrong_solution.empty()) << p.id;
        EXPECT_NE(p.canonical_solution, p.wrong_solution) << p.id;
        EXPECT_NE(p.prompt.find("\"\"\""), std::string::npos) << p.id << ": no docstring";
        EXPECT_NE(p.tests.find("assert "), std::string::npos) << p.id;
    }
}

TEST(CodeData, EveryReferenceSolutionPassesInTheSandbox) {
    for (const code_problem& p : problems()) {
        const code_verdict v = code_run_tests(test_sandbox(), p, p.prompt + p.canonical_solution);
        EXPECT_TRUE(v.passed) << p.id << ": " << v.result;
        EXPECT_EQ(v.result, "passed") << p.id;
    }
}

TEST(CodeData, WrongSolutionsAndEmptyBodiesFail) {
    for (const code_problem& p : problems()) {
        const code_verdict w = code_run_tests(test_sandbox(), p, p.prompt + p.wrong_solution);
        EXPECT_FALSE(w.passed) << p.id << ": the tests do not catch its wrong solution";
        // The docstring alone is a valid function that returns None.
        const code_verdict e = code_run_tests(test_sandbox(), p, p.prompt);
        EXPECT_FALSE(e.passed) << p.id << ": an empty body passes";
    }
}

// ---- misbehaving completions: failures, not errors ----

TEST(CodeHarness, MisbehavingCompletionsFailTheirProblem) {
    const code_problem& p = problem("count_vowels");
    struct bad {
        std::string body, expect;
    };
    const std::vector<bad> cases = {
        {"    return sum(1 for c in text if c in 'aeiou'\n", "SyntaxError"},
        {"    while True:\n        pass\n", "wall time limit"},
        {"    import time\n    time.sleep(60)\n", "wall time limit"},
        {"    raise RuntimeError('boom')\n", "RuntimeError: boom"},
        {"    import sys\n    sys.exit(0)\n", "exit 0 before the tests finished"},
        {"    import os\n    os._exit(0)\n", "exit 0 before the tests finished"},
        {"    print('junk ' * 100000)\n    return -1\n", "AssertionError: assert count_vowels"},
        {"    import os\n    os.kill(os.getpid(), 9)\n", "killed by SIGKILL"},
        {"    x = 'x' * (1 << 40)\n", "MemoryError"},
        {"    open('/etc/passwd', 'a').write('x')\n", "[Errno "},  // EACCES or EROFS
        {"    return 3\ndef helper(:\n", "SyntaxError"},
        {"    return undefined_name\n", "NameError"},
        {"\xff\xfe garbage \x01\n", "SyntaxError"},
    };
    for (const bad& b : cases) {
        code_verdict v;
        ASSERT_NO_THROW(v = code_run_tests(test_sandbox(), p, p.prompt + b.body)) << b.body;
        EXPECT_FALSE(v.passed) << b.body;
        EXPECT_NE(v.result.find(b.expect), std::string::npos) << b.body << " -> " << v.result;
    }
    // A correct body that also prints megabytes still passes: output is not judged.
    const code_verdict ok = code_run_tests(
        test_sandbox(), p, p.prompt + "    print('noise' * 200000)\n    return sum(c in 'aeiouAEIOU' for c in text)\n");
    EXPECT_TRUE(ok.passed) << ok.result;
}

TEST(CodeHarness, AFailedAssertIsNamed) {
    const code_problem& p = problem("is_prime");
    const code_verdict v = code_run_tests(test_sandbox(), p, p.prompt + "    return n % 2 == 1 or n == 2\n");
    EXPECT_FALSE(v.passed);
    EXPECT_EQ(v.result, "AssertionError: assert is_prime(9) is False") << v.result;
}

// ---- where a completion ends ----

TEST(CodeHarness, RawCompletionEndsAtTheFirstTopLevelLine) {
    EXPECT_FALSE(code_raw_done("    x = 1\n\n    return x\n"));
    EXPECT_TRUE(code_raw_done("    return 1\n\ndef other():\n"));
    EXPECT_TRUE(code_raw_done("    return 1\nprint(f())"));
    EXPECT_TRUE(code_raw_done("```"));  // column 0 right after the prompt: nothing was written
    EXPECT_EQ(code_raw_body("    return 1\n\n\nif __name__ == '__main__':\n    f()\n"), "    return 1\n\n\n");
    EXPECT_EQ(code_raw_body("    s = '''\nnot code'''\n"), "    s = '''\n");  // a column-0 line inside a string ends it too
    EXPECT_EQ(code_raw_body("    return 1"), "    return 1");
    EXPECT_EQ(code_raw_body("def g(): pass\n"), "");
}

TEST(CodeHarness, ChatCompletionIsTheFirstFencedBlock) {
    const std::string reply = "Here it is:\n```python\ndef f(x):\n    return x\n```\nThat's all.\n```\nmore\n```";
    EXPECT_FALSE(code_fence_done("Sure.\n```python\ndef f(x):\n"));
    EXPECT_FALSE(code_fence_done("```python"));
    EXPECT_TRUE(code_fence_done("```python\ndef f(x):\n    return x\n```"));
    EXPECT_EQ(code_fence_content(reply), "def f(x):\n    return x\n");
    EXPECT_EQ(code_fence_content("```python\ndef f(x):\n    return"), "def f(x):\n    return");
    EXPECT_EQ(code_fence_content("    return 2\n"), "    return 2\n");

    const code_problem& p = problem("gcd_all");
    const std::string body = "    import math\n    g = 0\n    for x in nums:\n        g = math.gcd(g, x)\n    return g\n";
    // The whole function: it replaces the prompt's.
    const std::string whole = code_solution_source(
        p, "```python\ndef gcd_all(nums):\n" + body + "```\n", code_prompt_mode::CHAT);
    EXPECT_EQ(whole, "def gcd_all(nums):\n" + body);
    EXPECT_TRUE(code_run_tests(test_sandbox(), p, whole).passed);
    // Only a body: it continues the prompt.
    const std::string cont = code_solution_source(p, "```python\n" + body + "```", code_prompt_mode::CHAT);
    EXPECT_EQ(cont, p.prompt + body);
    EXPECT_TRUE(code_run_tests(test_sandbox(), p, cont).passed);
    EXPECT_EQ(code_solution_source(p, body + "\ndef main():\n", code_prompt_mode::RAW), p.prompt + body + "\n");
    EXPECT_NE(code_chat_request(p).find("```python\n" + p.prompt + "```"), std::string::npos);
}

// ---- malformed problem files ----

TEST(CodeData, MalformedLinesAreNamedByFileAndLine) {
    const std::string path = ::testing::TempDir() + "code_malformed.jsonl";
    {
        std::ofstream f(path);
        f << R"({"id": "a", "prompt": "def f(x):\n    \"\"\"doc\"\"\"\n", "entry_point": "f", "tests": "assert f(1) is None\n"})" "\n"
          << "\n"
          << R"({"id": "b", "prompt": "def g(x):\n", "entry_point": "f", "tests": "assert 1\n"})" "\n"
          << "{not json\n"
          << R"({"id": "c", "prompt": "def h(x):\n", "entry_point": "h"})" "\n"
          << R"({"id": "d", "prompt": "def h(x):", "entry_point": "h", "tests": "assert 1\n"})" "\n"
          << R"({"id": "e", "prompt": "def h(x):\n", "entry_point": "h x", "tests": "assert 1\n"})" "\n";
    }
    eval_issues skip(eval_on_error::SKIP);
    const auto ps = code_load_problems(path, skip);
    ASSERT_EQ(ps.size(), 1u);
    EXPECT_EQ(ps[0].id, "a");
    EXPECT_EQ(ps[0].where, path + ":1");
    ASSERT_EQ(skip.all().size(), 5u);
    const std::vector<std::pair<int64_t, std::string>> want = {
        {3, "does not define 'f'"}, {4, "not a JSON object"}, {5, "no field 'tests'"},
        {6, "must end with a newline"}, {7, "not a Python identifier"}};
    for (size_t i = 0; i < want.size(); i++) {
        EXPECT_EQ(skip.all()[i].line, want[i].first);
        EXPECT_NE(skip.all()[i].what.find(want[i].second), std::string::npos) << skip.all()[i].describe();
    }
    eval_issues stop(eval_on_error::STOP);
    try {
        code_load_problems(path, stop);
        FAIL() << "no error at the first malformed line";
    } catch (const error& e) {
        EXPECT_NE(std::string(e.what()).find(path + ":3:"), std::string::npos) << e.what();
    }
    std::remove(path.c_str());
}

}  // namespace
}  // namespace zk
