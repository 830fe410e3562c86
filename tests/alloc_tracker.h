// Counts the heap traffic of a test binary: it replaces the global operator new
// and delete (every C++ allocation: containers, strings, make_unique) with
// versions that keep the number of allocations, the bytes live, the peak and
// the largest single request. Include it from exactly ONE source file of a test
// executable (the replacement functions are defined here, not declared).
// Works under ASan too (ASan's malloc stays underneath).
#pragma once
#include <malloc.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace zk_test {

struct alloc_stats {
    std::atomic<size_t> count{0};    // allocations since start
    std::atomic<size_t> live{0};     // bytes currently allocated (usable sizes)
    std::atomic<size_t> peak{0};     // highest `live` since the last reset_peak()
    std::atomic<size_t> largest{0};  // largest single request since the last reset_peak()

    void reset_peak() {
        peak.store(live.load());
        largest.store(0);
    }
};

inline alloc_stats& allocs() {
    static alloc_stats s;
    return s;
}

namespace detail {

inline void note_alloc(void* p, size_t request) {
    alloc_stats& s = allocs();
    const size_t n = malloc_usable_size(p);
    s.count.fetch_add(1, std::memory_order_relaxed);
    const size_t live = s.live.fetch_add(n, std::memory_order_relaxed) + n;
    size_t pk = s.peak.load(std::memory_order_relaxed);
    while (live > pk && !s.peak.compare_exchange_weak(pk, live, std::memory_order_relaxed)) {
    }
    size_t lg = s.largest.load(std::memory_order_relaxed);
    while (request > lg && !s.largest.compare_exchange_weak(lg, request, std::memory_order_relaxed)) {
    }
}

inline void* alloc(size_t n, size_t align) {
    void* p = align <= alignof(std::max_align_t) ? std::malloc(n ? n : 1)
                                                  : std::aligned_alloc(align, (n + align - 1) / align * align);
    if (!p) throw std::bad_alloc();
    note_alloc(p, n);
    return p;
}

inline void release(void* p) {
    if (!p) return;
    allocs().live.fetch_sub(malloc_usable_size(p), std::memory_order_relaxed);
    std::free(p);
}

}  // namespace detail
}  // namespace zk_test

void* operator new(size_t n) { return zk_test::detail::alloc(n, 0); }
void* operator new[](size_t n) { return zk_test::detail::alloc(n, 0); }
void* operator new(size_t n, std::align_val_t a) { return zk_test::detail::alloc(n, (size_t)a); }
void* operator new[](size_t n, std::align_val_t a) { return zk_test::detail::alloc(n, (size_t)a); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
    try {
        return zk_test::detail::alloc(n, 0);
    } catch (...) {
        return nullptr;
    }
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
    try {
        return zk_test::detail::alloc(n, 0);
    } catch (...) {
        return nullptr;
    }
}
void operator delete(void* p) noexcept { zk_test::detail::release(p); }
void operator delete[](void* p) noexcept { zk_test::detail::release(p); }
void operator delete(void* p, size_t) noexcept { zk_test::detail::release(p); }
void operator delete[](void* p, size_t) noexcept { zk_test::detail::release(p); }
void operator delete(void* p, std::align_val_t) noexcept { zk_test::detail::release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { zk_test::detail::release(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { zk_test::detail::release(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { zk_test::detail::release(p); }
