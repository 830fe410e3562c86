// libFuzzer entry points of one target, chosen at compile time by
// ZACK_FUZZ_TARGET (tests/fuzz/CMakeLists.txt builds fuzz_<name> per target).
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "tests/fuzz/fuzz_targets.h"

namespace {

const zk_fuzz::fuzz_target& target() {
    static const zk_fuzz::fuzz_target& t = zk_fuzz::fuzz_target_get(ZACK_FUZZ_TARGET);
    return t;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    try {
        target().init();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "fuzz_%s: cannot start: %s\n", ZACK_FUZZ_TARGET, e.what());
        std::exit(1);
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    target().one(data, size);
    return 0;
}
