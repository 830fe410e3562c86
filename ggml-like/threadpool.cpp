// thread_pool: the caller is worker 0, workers 1..n-1 wait for a new
// "generation" (one per run) by spinning for a short while and then sleeping on
// a condition variable. Decode issues a few hundred parallel loops per token a
// few microseconds apart, so a worker that has just finished one loop almost
// always finds the next one while still spinning; a sleeping worker costs a
// futex wake-up (~5-50 us), which is fine after an idle pause.
#include "ggml-like/threadpool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "ggml-like/error.h"
#include "ggml-like/interrupt.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace zk {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#else
    std::this_thread::yield();
#endif
}

// How long an idle worker spins before it sleeps.
constexpr auto k_spin_time = std::chrono::microseconds(50);

}  // namespace

struct thread_pool::impl {
    int n = 1;
    std::vector<std::thread> threads;

    // The job of the current generation: either fn (run) or the parallel_for
    // fields. Written by the caller before the generation is published.
    const std::function<void(int, int)>* fn = nullptr;
    const std::function<void(int64_t, int64_t, int)>* pfor_fn = nullptr;
    int64_t pfor_n = 0;
    int64_t pfor_chunk = 1;
    std::atomic<int64_t> pfor_next{0};

    std::atomic<uint64_t> generation{0};
    std::atomic<int> pending{0};   // workers (not the caller) still running this generation
    std::atomic<int> sleeping{0};  // workers blocked on cv
    std::atomic<bool> stop{false};
    // A run is in progress. Set by the caller before it writes the job fields
    // below, so that a job calling run/parallel_for on its own pool (from any
    // worker) is refused before it could overwrite the job the others are running.
    std::atomic<bool> busy{false};

    // Claims the pool for one dispatch; throws for a re-entrant call.
    void claim() {
        if (busy.exchange(true, std::memory_order_acq_rel))
            ZK_THROW("thread_pool: run/parallel_for called from inside a running job");
    }

    std::mutex mu;
    std::condition_variable cv;

    std::mutex err_mu;
    std::exception_ptr err;

    void execute(int ith) {
        try {
            if (fn) {
                (*fn)(ith, n);
            } else {
                for (;;) {
                    const int64_t b = pfor_next.fetch_add(pfor_chunk, std::memory_order_relaxed);
                    if (b >= pfor_n) break;
                    (*pfor_fn)(b, std::min(pfor_n, b + pfor_chunk), ith);
                }
            }
        } catch (...) {
            std::lock_guard<std::mutex> lk(err_mu);
            if (!err) err = std::current_exception();
        }
    }

    void worker_main(int ith) {
        uint64_t seen = 0;
        for (;;) {
            uint64_t g = generation.load(std::memory_order_acquire);
            if (g == seen) {
                const auto t0 = std::chrono::steady_clock::now();
                int spins = 0;
                while ((g = generation.load(std::memory_order_acquire)) == seen) {
                    cpu_relax();
                    if (++spins % 64 == 0 && std::chrono::steady_clock::now() - t0 > k_spin_time) {
                        std::unique_lock<std::mutex> lk(mu);
                        sleeping.fetch_add(1, std::memory_order_seq_cst);
                        while ((g = generation.load(std::memory_order_seq_cst)) == seen) cv.wait(lk);
                        sleeping.fetch_sub(1, std::memory_order_relaxed);
                        break;
                    }
                }
            }
            seen = g;
            if (stop.load(std::memory_order_acquire)) return;
            execute(ith);
            pending.fetch_sub(1, std::memory_order_acq_rel);
        }
    }

    void shutdown() {
        stop.store(true, std::memory_order_release);
        generation.fetch_add(1, std::memory_order_seq_cst);
        {
            std::lock_guard<std::mutex> lk(mu);
            cv.notify_all();
        }
        for (auto& t : threads) t.join();
    }

    // Publishes the job set up by the caller, runs worker 0, waits for the rest.
    void dispatch() {
        err = nullptr;
        pending.store(n - 1, std::memory_order_relaxed);
        generation.fetch_add(1, std::memory_order_seq_cst);
        // A worker increments `sleeping` under mu before re-checking the
        // generation, so either it sees the new generation or we see it asleep.
        if (sleeping.load(std::memory_order_seq_cst) > 0) {
            std::lock_guard<std::mutex> lk(mu);
            cv.notify_all();
        }
        execute(0);
        int spins = 0;
        while (pending.load(std::memory_order_acquire) != 0) {
            cpu_relax();
            // Another process may own the core a worker needs (shared machines).
            if (++spins > 4096) std::this_thread::yield();
        }
        fn = nullptr;
        pfor_fn = nullptr;
        busy.store(false, std::memory_order_release);
        if (err) {
            std::exception_ptr e = err;
            err = nullptr;
            std::rethrow_exception(e);
        }
    }
};

thread_pool::thread_pool(int n_threads) : p_(nullptr) {
    if (n_threads < 1) ZK_THROW("thread_pool: n_threads must be >= 1, got %d", n_threads);
    p_ = new impl;
    p_->n = n_threads;
    // Workers start with SIGINT, SIGTERM and SIGPIPE blocked (a new thread
    // inherits its creator's mask) and keep them blocked: they never run a
    // handler, so a Ctrl-C goes to the main thread (or to a thread the pool does
    // not own, such as OpenBLAS's, where the handler defers to any open
    // interrupt_hold; interrupt.cpp). test_signals.py once saw a worker take
    // the signal while calibrate -t 2 was creating a file.
    const interrupt_hold workers_ignore_signals;
    try {
        for (int i = 1; i < n_threads; i++) {
            impl* p = p_;
            p_->threads.emplace_back([p, i] { p->worker_main(i); });
        }
    } catch (...) {  // could not start a thread: stop the ones that did
        p_->shutdown();
        delete p_;
        throw;
    }
}

thread_pool::~thread_pool() {
    p_->shutdown();
    delete p_;
}

int thread_pool::size() const { return p_->n; }

void thread_pool::run(const std::function<void(int ith, int nth)>& fn) {
    if (p_->n == 1) {
        fn(0, 1);
        return;
    }
    p_->claim();
    p_->fn = &fn;
    p_->pfor_fn = nullptr;
    p_->dispatch();
}

void thread_pool::parallel_for(int64_t n, int64_t grain,
                               const std::function<void(int64_t, int64_t, int)>& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(1, grain);
    // About 4 chunks per thread balances uneven progress (other processes on
    // the core) against the cost of the shared counter.
    const int64_t chunk = std::max(grain, (n + 4 * p_->n - 1) / (4 * p_->n));
    if (p_->n == 1 || n <= chunk) {
        fn(0, n, 0);
        return;
    }
    p_->claim();
    p_->fn = nullptr;
    p_->pfor_fn = &fn;
    p_->pfor_n = n;
    p_->pfor_chunk = chunk;
    p_->pfor_next.store(0, std::memory_order_relaxed);
    p_->dispatch();
}

}  // namespace zk
