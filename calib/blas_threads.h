// OpenBLAS (Debian's pthread build) runs each call on its own threads. The
// calibration observers call BLAS from inside the engine's pool workers, two at
// a time, and the nested threads oversubscribe the cores: on the sensitivity
// pass of SmolLM2-135M (1024 tokens, 2 cores) 48 s wall with 16 s of system
// time, against 34 s and 0.1 s single-threaded. This scope runs BLAS on the
// calling thread only and restores the previous setting on exit. With a BLAS
// that is not OpenBLAS the symbols are absent (weak) and it does nothing.
#pragma once

extern "C" {
void openblas_set_num_threads(int) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
}

namespace zk {

class blas_single_thread {
public:
    blas_single_thread() {
        if (openblas_get_num_threads && openblas_set_num_threads) {
            prev_ = openblas_get_num_threads();
            openblas_set_num_threads(1);
        }
    }
    ~blas_single_thread() {
        if (prev_ > 0) openblas_set_num_threads(prev_);
    }
    blas_single_thread(const blas_single_thread&) = delete;
    blas_single_thread& operator=(const blas_single_thread&) = delete;

private:
    int prev_ = 0;
};

}  // namespace zk
