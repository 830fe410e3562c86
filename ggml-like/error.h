// One error policy for the whole project: code throws zk::error with context
// (what, which file/tensor, expected vs actual); main/ catches it once, prints one
// line and exits non-zero. ZK_ASSERT is an always-on invariant check.
#pragma once
#include <cstdarg>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace zk {

struct error : std::runtime_error {
    explicit error(const std::string& what) : std::runtime_error(what) {}
};

// printf-style message builder for error texts.
inline std::string strfmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string strfmt(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[512];
    va_list ap2;
    va_copy(ap2, ap);
    int n = std::vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    std::string out;
    if (n < (int)sizeof small) {
        out.assign(small, n < 0 ? 0 : n);
    } else {
        out.resize(n);
        std::vsnprintf(&out[0], n + 1, fmt, ap2);
    }
    va_end(ap2);
    return out;
}

[[noreturn]] inline void throw_error(const std::string& msg) { throw error(msg); }

}  // namespace zk

#define ZK_THROW(...) ::zk::throw_error(::zk::strfmt(__VA_ARGS__))
#define ZK_ASSERT(cond)                                                                   \
    do {                                                                                  \
        if (!(cond)) ZK_THROW("internal error: %s failed at %s:%d", #cond, __FILE__, __LINE__); \
    } while (0)
