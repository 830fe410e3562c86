// The SIMT harness's view of device memory, apart from the CUDA names simt.h
// defines: buffers registered at allocation, and gptr<T>, the pointer type a
// kernel's global-memory parameters have in a harness build (the host code that
// fills kernel argument structs sees this header only).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace simt {

// ---------------------------------------------------------------- errors

// What a launch throws when a check fails (the first violation of the launch).
struct violation : std::runtime_error {
    explicit violation(const std::string& what) : std::runtime_error(what) {}
};

// Inside a kernel: records the violation (with thread, block and location) and
// ends the launch. Outside one: throws violation directly.
[[noreturn]] void fail(const char* file, int line, const std::string& msg);

// An index with the source location of the expression that used it (the
// default arguments are evaluated where the conversion happens).
struct index {
    int64_t i;
    const char* file;
    int line;
    template <class I, typename std::enable_if<std::is_integral<I>::value, int>::type = 0>
    index(I v, const char* f = __builtin_FILE(), int l = __builtin_LINE()) : i((int64_t)v), file(f), line(l) {}
};

// ---------------------------------------------------------------- device buffers

struct buffer {
    const char* base;
    size_t size;
    uint64_t id;
    bool live;
    char name[48];
};

// Allocates (zero-filled) and registers a device buffer; the record outlives
// the memory, so a stale pointer reports "freed".
void* device_alloc(size_t bytes, const char* name = "buffer");
void device_free(void* p);
// The live or freed buffer that contains p (p may be one past its end), or
// nullptr.
const buffer* buffer_find(const void* p);
// Counts accesses checked (tests report it).
uint64_t checked_accesses();

// The checks of one global access: the slow path (a violation) out of line.
// Inline because the real-model tests make ~10^9 of them; the count is a plain
// load and store, not a locked add (it is a report, and launches run on one
// thread at a time).
[[noreturn]] void check_global_fail(const buffer* b, const void* p, size_t n, size_t align, const char* file,
                                    int line);
extern std::atomic<uint64_t> g_checked;
inline void check_global(const buffer* b, const void* p, size_t n, size_t align, const char* file, int line) {
    const uintptr_t a = (uintptr_t)p;
    if (!b || !b->live || a < (uintptr_t)b->base || a - (uintptr_t)b->base + n > b->size || a % align != 0)
        check_global_fail(b, p, n, align, file, line);
    g_checked.store(g_checked.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

// A pointer to global memory bound to the buffer it points into.
template <class T>
class gptr {
public:
    gptr() = default;
    gptr(std::nullptr_t) {}
    gptr(T* p) : p_(p), b_(p ? find(p) : nullptr) {}
    template <class U, typename std::enable_if<std::is_convertible<U*, T*>::value && !std::is_same<U, T>::value,
                                               int>::type = 0>
    gptr(const gptr<U>& o) : p_(o.get()), b_(o.buf()) {}
    // a void pointer's buffer, viewed as T (explicit, like a static_cast)
    template <class U, typename std::enable_if<std::is_void<U>::value && !std::is_same<U, T>::value, int>::type = 0>
    explicit gptr(const gptr<U>& o) : p_((T*)o.get()), b_(o.buf()) {}

    // (void: the return type is void and the body never instantiated)
    typename std::add_lvalue_reference<T>::type operator[](index i) const {
        T* q = p_ + i.i;
        check_global(b_, q, sizeof(T), alignof(T), i.file, i.line);
        return *q;
    }
    typename std::add_lvalue_reference<T>::type operator*() const { return (*this)[0]; }
    T* operator->() const { return &(*this)[0]; }
    gptr operator+(int64_t d) const { return gptr(p_ + d, b_); }
    gptr operator-(int64_t d) const { return gptr(p_ - d, b_); }
    gptr& operator+=(int64_t d) { p_ += d; return *this; }
    gptr& operator-=(int64_t d) { p_ -= d; return *this; }
    gptr& operator++() { ++p_; return *this; }
    int64_t operator-(const gptr& o) const { return p_ - o.p_; }
    explicit operator bool() const { return p_ != nullptr; }
    bool operator==(std::nullptr_t) const { return p_ == nullptr; }
    bool operator!=(std::nullptr_t) const { return p_ != nullptr; }

    T* get() const { return p_; }
    const buffer* buf() const { return b_; }
    gptr(T* p, const buffer* b) : p_(p), b_(b) {}

private:
    static const buffer* find(const void* p) {
        const buffer* b = buffer_find(p);
        if (!b) fail(__FILE__, __LINE__, "pointer is not in any device buffer (simt::device_alloc)");
        return b;
    }
    T* p_ = nullptr;
    const buffer* b_ = nullptr;
};

}  // namespace simt
