// thread_pool: the caller is worker 0, workers 1..n-1 wait for a new
// "generation" (one per run) by spinning for a short while and then sleeping on
// a condition variable. Decode issues a few hundred parallel loops per token a
// few microseconds apart, so a worker that has just finished one loop almost
// always finds the next one while still spinning; a sleeping worker costs a
// futex wake-up (~5-50 us), which is fine after an idle pause.
// A loop ends when its chunks are done, whoever ran them: on a busy machine
// (ctest -j2, two zack processes on two cores) a worker is often descheduled,
// and waiting for it to check in left each of two concurrent 2-thread decodes
// at a third of its speed alone, where sharing the cores allows a half (which
// this scheme reaches; bench/RESULTS.md).
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

    // One dispatch is a job of n_chunks chunks: chunk k of a run() calls
    // fn(k, n); chunk k of a parallel_for covers [k*chunk, min(n_items, (k+1)*chunk)).
    // Two slots, used by generation parity: the caller fills the slot of
    // generation g+1 while a worker that woke late may still be reading the slot
    // of generation g (it then fails to claim a chunk, see claim_chunk). The
    // fields are atomics because such a late read may overlap a write.
    struct job {
        std::atomic<const std::function<void(int, int)>*> fn{nullptr};
        std::atomic<const std::function<void(int64_t, int64_t, int)>*> pfor_fn{nullptr};
        std::atomic<int64_t> n_items{0};
        std::atomic<int64_t> chunk{1};
        std::atomic<uint32_t> n_chunks{0};
    };
    job slots[2];

    // Chunks are handed out through one 64-bit ticket: the generation's low 32
    // bits above the index of the next unclaimed chunk. A claim is a
    // compare-exchange that keeps the tag, so a worker still holding generation
    // g after the caller has moved on can never take a chunk of a later job.
    // The dispatch ends when `done` reaches n_chunks, not when every worker has
    // checked in: a worker that the OS has descheduled (another process on the
    // core) does not hold up the caller, who takes the chunks left over itself.
    std::atomic<uint64_t> ticket{0};
    std::atomic<uint32_t> done{0};  // chunks of the current generation finished

    std::atomic<uint64_t> generation{0};
    std::atomic<int> sleeping{0};  // workers blocked on cv
    std::atomic<bool> stop{false};
    // A run is in progress. Set by the caller before it writes the job, so that
    // a job calling run/parallel_for on its own pool (from any worker) is
    // refused before it could overwrite the job the others are running.
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

    static uint64_t tag_of(uint64_t gen) { return (gen & 0xffffffffu) << 32; }

    // Takes the next chunk of generation `gen`; false when none is left or the
    // pool has moved on to a later generation. The slot is read before the
    // claim: if the caller has since refilled it for generation gen+2, it set
    // the ticket to a later tag first (release, and the slot stores are
    // release), so the compare-exchange below fails and the stale read is unused.
    bool claim_chunk(uint64_t gen, uint32_t* k) {
        const uint64_t tag = tag_of(gen);
        const job& j = slots[gen & 1];
        uint64_t t = ticket.load(std::memory_order_acquire);
        for (;;) {
            if ((t & ~uint64_t(0xffffffffu)) != tag) return false;
            const uint32_t next = (uint32_t)t;
            if (next >= j.n_chunks.load(std::memory_order_acquire)) return false;
            if (ticket.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
                *k = next;
                return true;
            }
        }
    }

    // Runs chunks of generation `gen` until none is left; `ith` is the thread.
    void execute(uint64_t gen, int ith) {
        const job& j = slots[gen & 1];
        uint32_t k = 0;
        while (claim_chunk(gen, &k)) {
            // The job cannot change under a claimed chunk: the next dispatch
            // waits for this chunk's `done`, and the one after writes the other slot.
            try {
                if (const auto* fn = j.fn.load(std::memory_order_relaxed)) {
                    (*fn)((int)k, n);
                } else {
                    const int64_t items = j.n_items.load(std::memory_order_relaxed);
                    const int64_t chunk = j.chunk.load(std::memory_order_relaxed);
                    const int64_t b = (int64_t)k * chunk;
                    (*j.pfor_fn.load(std::memory_order_relaxed))(b, std::min(items, b + chunk), ith);
                }
            } catch (...) {
                std::lock_guard<std::mutex> lk(err_mu);
                if (!err) err = std::current_exception();
            }
            done.fetch_add(1, std::memory_order_acq_rel);
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
            execute(g, ith);
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

    // Publishes a job of n_chunks chunks (fn for run, else pfor_fn), takes part
    // as thread 0 and waits until every chunk is done.
    void dispatch(const std::function<void(int, int)>* fn, const std::function<void(int64_t, int64_t, int)>* pfor_fn,
                  int64_t n_items, int64_t chunk, uint32_t n_chunks) {
        err = nullptr;
        const uint64_t gen = generation.load(std::memory_order_relaxed) + 1;
        job& j = slots[gen & 1];
        j.fn.store(fn, std::memory_order_release);
        j.pfor_fn.store(pfor_fn, std::memory_order_release);
        j.n_items.store(n_items, std::memory_order_release);
        j.chunk.store(chunk, std::memory_order_release);
        j.n_chunks.store(n_chunks, std::memory_order_release);
        done.store(0, std::memory_order_relaxed);
        ticket.store(tag_of(gen), std::memory_order_release);
        generation.store(gen, std::memory_order_seq_cst);
        // A worker increments `sleeping` under mu before re-checking the
        // generation, so either it sees the new generation or we see it asleep.
        if (sleeping.load(std::memory_order_seq_cst) > 0) {
            std::lock_guard<std::mutex> lk(mu);
            cv.notify_all();
        }
        execute(gen, 0);
        int spins = 0;
        while (done.load(std::memory_order_acquire) != n_chunks) {
            cpu_relax();
            // A worker holding a chunk may have lost its core to another process.
            if (++spins > 4096) std::this_thread::yield();
        }
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
    p_->dispatch(&fn, nullptr, 0, 1, (uint32_t)p_->n);
}

void thread_pool::parallel_for(int64_t n, int64_t grain,
                               const std::function<void(int64_t, int64_t, int)>& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(1, grain);
    // About 4 chunks per thread balances uneven progress (other processes on
    // the core) against the cost of the shared ticket.
    const int64_t chunk = std::max(grain, (n + 4 * p_->n - 1) / (4 * p_->n));
    if (p_->n == 1 || n <= chunk) {
        fn(0, n, 0);
        return;
    }
    p_->claim();
    p_->dispatch(nullptr, &fn, n, chunk, (uint32_t)((n + chunk - 1) / chunk));
}

void pool_parallel_for(thread_pool* pool, int64_t n, int64_t grain,
                       const std::function<void(int64_t begin, int64_t end, int ith)>& fn) {
    if (pool && pool->size() > 1) pool->parallel_for(n, grain, fn);
    else if (n > 0) fn(0, n, 0);
}

}  // namespace zk
