// Every fuzz target on its seeds and on every input a fuzzer once found
// (tests/data/fuzz/<target>/, each a minimised regression case of a fixed bug,
// listed in tests/data/fuzz/README.md), in whatever build runs the tests: the
// plain one and the ASan + UBSan one. A crash, a sanitizer report or an
// escaping exception fails the run; the valid seed files must also load.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "engine/model.h"
#include "ggml-like/error.h"
#include "ggml-like/gguf.h"
#include "tests/fuzz/fuzz_targets.h"

namespace fs = std::filesystem;

namespace {

std::vector<std::string> target_names() {
    std::vector<std::string> n;
    for (const auto& t : zk_fuzz::fuzz_target_list()) n.push_back(t.name);
    return n;
}

void run_input(const zk_fuzz::fuzz_target& t, const std::string& bytes) {
    t.one((const uint8_t*)bytes.data(), bytes.size());
}

class FuzzRegress : public ::testing::TestWithParam<std::string> {};

TEST_P(FuzzRegress, SeedsRun) {
    const zk_fuzz::fuzz_target& t = zk_fuzz::fuzz_target_get(GetParam());
    t.init();
    const auto seeds = t.seeds();
    ASSERT_FALSE(seeds.empty());
    for (const auto& [name, bytes] : seeds) {
        SCOPED_TRACE(name);
        run_input(t, bytes);
    }
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzRegress, ::testing::ValuesIn(target_names()),
                         [](const auto& info) { return info.param; });

// Every kept finding, through the target it was found by.
TEST(FuzzFindings, AllRun) {
    const fs::path root = fs::path(ZACK_SOURCE_DIR) / "tests/data/fuzz";
    size_t n = 0;
    for (const auto& t : zk_fuzz::fuzz_target_list()) {
        const fs::path dir = root / t.name;
        if (!fs::exists(dir)) continue;
        t.init();
        for (const auto& e : fs::directory_iterator(dir)) {
            SCOPED_TRACE(e.path().string());
            std::ifstream f(e.path(), std::ios::binary);
            run_input(t, std::string(std::istreambuf_iterator<char>(f), {}));
            n++;
        }
    }
    EXPECT_GT(n, 0u) << "no findings under " << root;
}

// The model seeds are files the readers accept: fuzzing starts from valid input.
TEST(FuzzSeeds, ModelSeedsLoad) {
    const std::string dir = zk_fuzz::fuzz_scratch_dir();
    for (const char* target : {"gguf", "zack"}) {
        for (const auto& [name, bytes] : zk_fuzz::fuzz_target_get(target).seeds()) {
            SCOPED_TRACE(name);
            const std::string p = dir + "/check_" + name;
            std::ofstream(p, std::ios::binary).write(bytes.data(), (std::streamsize)bytes.size());
            if (name.rfind("tiny_", 0) == 0) {
                const auto m = zk::model_load(p);
                EXPECT_EQ(m->zack.present, name.size() > 5 && name.substr(name.size() - 5) == ".zack");
            } else {
                EXPECT_NO_THROW(zk::gguf_file::open(p));
            }
        }
    }
}

}  // namespace
