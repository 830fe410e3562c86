// Which kernels OpenBLAS runs on this CPU, and a correction where it guesses wrong.
//
// Debian's OpenBLAS (0.3.21, DYNAMIC_ARCH) picks its kernels from the CPU model
// when it is loaded. A model it does not know falls back to "Prescott", SSE3
// kernels: on an Emerald Rapids Xeon (family 6, model 207) sgemm then runs at
// half the speed of the SkylakeX kernels, and the calibration's sensitivity pass,
// which is mostly sgemm, takes 2.1x as long (104 s against 49 s on 1,024 tokens
// of Qwen2.5-Coder-1.5B). The library reads OPENBLAS_CORETYPE only while it is
// loaded, before main() runs, so the correction sets that variable and executes
// the program again (same arguments, environment and open files).
#pragma once
#include <string>

namespace zk {

struct blas_cpu {
    bool avx2_fma = false;  // AVX2 and FMA
    bool avx512 = false;    // AVX-512 F, CD, BW, DQ and VL (what OpenBLAS's SkylakeX kernels use)
};

// This CPU's flags (cpuid; all false off x86).
blas_cpu blas_cpu_detect();

// The OPENBLAS_CORETYPE to ask for when OpenBLAS chose `core` on a CPU with
// `cpu`'s flags: "SkylakeX" or "Haswell" when `core` is a pre-AVX2 kernel set
// the CPU outgrows, else "" (leave the choice alone: a name it does not list,
// such as a newer or non-x86 core, is taken as right).
std::string blas_core_override(const std::string& core, const blas_cpu& cpu);

// The kernel set the loaded OpenBLAS uses ("" when the BLAS is not OpenBLAS).
std::string blas_core_name();

// Called first in main(): when OPENBLAS_CORETYPE is unset and blas_core_override
// names a better kernel set, sets the variable and re-executes /proc/self/exe
// with argv. Returns where nothing is to be done, and where the exec fails (one
// line on stderr says which kernels to ask for by hand).
void blas_core_reexec(char** argv);

}  // namespace zk
