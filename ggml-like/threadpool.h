// A small fixed thread pool for data-parallel loops. The calling thread takes
// part as worker 0; workers spin briefly before sleeping, because decode issues
// hundreds of short parallel loops per token and a condvar wake-up per loop
// would cost more than the loop.
#pragma once
#include <cstdint>
#include <functional>

namespace zk {

class thread_pool {
public:
    explicit thread_pool(int n_threads);  // n_threads >= 1, total including the caller
    ~thread_pool();
    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;

    int size() const;
    // Calls fn(ith, nth) once for each ith in [0, nth), nth = size(), and waits
    // for all. The calls run on the pool's threads, but not one per thread: a
    // thread that is late (descheduled) leaves its share to the others, so fn
    // must not wait for another call (no barriers inside fn). Exceptions are
    // caught on the thread that threw and rethrown here.
    void run(const std::function<void(int ith, int nth)>& fn);
    // Splits [0, n) into contiguous chunks of at least `grain` items, handed out
    // dynamically; calls fn(begin, end, ith) where ith < size() names the
    // calling thread (0 is the caller), so fn may index per-thread scratch by it.
    void parallel_for(int64_t n, int64_t grain,
                      const std::function<void(int64_t begin, int64_t end, int ith)>& fn);

private:
    struct impl;
    impl* p_;
};

// pool->parallel_for(n, grain, fn) where there is a pool of more than one
// thread; otherwise fn(0, n, 0) on the calling thread.
void pool_parallel_for(thread_pool* pool, int64_t n, int64_t grain,
                       const std::function<void(int64_t begin, int64_t end, int ith)>& fn);

}  // namespace zk
