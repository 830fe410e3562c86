// OpenBLAS kernel choice; see blas_core.h.
#include "ggml-like/blas_core.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <strings.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

// Weak: null where the BLAS linked is not OpenBLAS.
extern "C" char* openblas_get_corename(void) __attribute__((weak));

namespace zk {

blas_cpu blas_cpu_detect() {
    blas_cpu c;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a = 0, b = 0, c1 = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c1, &d) || __get_cpuid_max(0, nullptr) < 7) return c;
    const bool fma = (c1 >> 12) & 1u, osxsave = (c1 >> 27) & 1u, avx = (c1 >> 28) & 1u;
    unsigned b7 = 0, c7 = 0, d7 = 0;
    __cpuid_count(7, 0, a, b7, c7, d7);
    // the OS must save the vector state it would use (XCR0: SSE, AVX, and the AVX-512 opmask and upper registers)
    unsigned xlo = 0, xhi = 0;
    if (osxsave) __asm__("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    const bool os_avx = (xlo & 0x6u) == 0x6u, os_avx512 = (xlo & 0xe6u) == 0xe6u;
    auto bit = [](unsigned r, int i) { return ((r >> i) & 1u) != 0; };
    c.avx2_fma = os_avx && avx && fma && bit(b7, 5);
    c.avx512 = c.avx2_fma && os_avx512 && bit(b7, 16) && bit(b7, 17) && bit(b7, 28) && bit(b7, 30) && bit(b7, 31);
#endif
    return c;
}

std::string blas_core_override(const std::string& core, const blas_cpu& cpu) {
    // OpenBLAS's x86 kernel sets older than Haswell (the names openblas_get_corename gives)
    static const char* const pre_avx2[] = {"Prescott",  "Core2",     "Penryn",       "Dunnington", "Nehalem",
                                           "Atom",      "Sandybridge", "Katmai",     "Coppermine", "Northwood",
                                           "Banias",    "Opteron",   "Opteron_SSE3", "Barcelona",  "Bobcat",
                                           "Bulldozer", "Piledriver", "Steamroller", "Nano"};
    bool old = false;
    for (const char* n : pre_avx2)
        if (strcasecmp(core.c_str(), n) == 0) old = true;
    if (!old || !cpu.avx2_fma) return "";
    return cpu.avx512 ? "SkylakeX" : "Haswell";
}

std::string blas_core_name() {
    if (!openblas_get_corename) return "";
    const char* n = openblas_get_corename();
    return n ? n : "";
}

void blas_core_reexec(char** argv) {
    if (std::getenv("OPENBLAS_CORETYPE")) return;  // the user's choice, or this process already re-executed
    const std::string want = blas_core_override(blas_core_name(), blas_cpu_detect());
    if (want.empty()) return;
    if (setenv("OPENBLAS_CORETYPE", want.c_str(), 1) == 0) execv("/proc/self/exe", argv);
    // still here: the exec failed; the run goes on with the slow kernels
    std::fprintf(stderr, "zack: note: OpenBLAS chose its %s kernels for this CPU and re-running with "
                 "OPENBLAS_CORETYPE=%s failed (%s); set it by hand for faster calibration\n",
                 blas_core_name().c_str(), want.c_str(), std::strerror(errno));
    unsetenv("OPENBLAS_CORETYPE");
}

}  // namespace zk
