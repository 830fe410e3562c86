// A kernel with a bug injected by hand must be caught. CMake (zack_cuda_mutant
// in tests/simt/CMakeLists.txt) rewrites one line of the kernel's own .cu and
// links this test (compiled once for all mutants) with the result instead of
// the real kernel; the test's environment names the mutant (ZK_MUTANT_NAME)
// and how it must be caught. The test passes when the bug is detected:
//   ZK_MUTANT_CHECK set and not empty: by a harness check, whose report must
//   contain it;
//   otherwise: by the comparison with the reference (the error must exceed the
//   decode tests' tolerance, 2e-6, by far, in at least one of the layouts: a
//   bug in a KIVI or GEAR path leaves the f16 rows exact).
// The report is printed, so the log shows how each bug was caught.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/simt/attention_decode_fixture.h"
#include "tests/simt/simt.h"

using namespace zk;
using namespace zk::cuda_test;

TEST(Mutant, IsCaught) {
    const char* name = std::getenv("ZK_MUTANT_NAME");
    const char* check_env = std::getenv("ZK_MUTANT_CHECK");
    ASSERT_TRUE(name && *name) << "ZK_MUTANT_NAME is not set: run the mutants through ctest (-R test_mutant_)";
    const std::string check = check_env ? check_env : "";
    std::printf("mutant %s\n", name);
    double worst_all = 0;  // over the layouts (caught by the comparison)
    for (const layout lay : {layout{16, 16}, layout{4, 2}}) {  // f16 rows; 4-bit keys, 2-bit values
        // the generic kernel's batch (logits asked), then the fast kernel's
        std::string v;
        double worst = 0;
        for (const bool fast : {false, true}) {
            const std::vector<item_spec> specs = fast ? fast_batch_specs() : decode_batch_specs();
            std::vector<test_item> items;
            for (size_t i = 0; i < specs.size(); i++)
                items.push_back(build_item(specs[i], lay, 1000 + 17 * (uint32_t)i));
            std::vector<test_item*> ptrs;
            for (auto& t : items) ptrs.push_back(&t);
            gpu_result r;
            try {
                r = run_gpu(ptrs, 40, 8, !fast);
            } catch (const simt::violation& e) {
                if (v.empty()) v = std::string(fast ? "fast kernel: " : "generic kernel: ") + e.what();
                continue;
            }
            for (size_t i = 0; i < items.size(); i++) worst = std::max(worst, rel_err(r.out[i], reference(items[i])));
        }
        if (!check.empty()) {
            std::printf("  %s: harness: %s\n", lay.name().c_str(), v.c_str());
            EXPECT_NE(v.find(check), std::string::npos) << "expected a harness report containing '" << check
                                                        << "', got: '" << v << "'";
        } else {
            ASSERT_EQ(v, "") << "expected no harness report (the comparison catches this one)";
            std::printf("  %s: no harness report; max error vs reference %.3g (tolerance 2e-6)\n",
                        lay.name().c_str(), worst);
            worst_all = std::max(worst_all, worst);
        }
    }
    if (check.empty()) {
        EXPECT_GT(worst_all, 1e-3);
    }
}
