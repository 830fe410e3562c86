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

// A bad value of an engine parameter. The engine names parameters as its
// structs do ("kv.bits", "evict.budget": struct prefix, field), never as a
// front end spells them; main/ rewrites those names into its flags
// (options_flag_spelling) when it prints the one line.
struct param_error : error {
    param_error(const std::string& param_, const std::string& msg) : error(msg), param(param_) {}
    std::string param;
};
[[noreturn]] inline void throw_param_error(const char* param, const std::string& msg) {
    throw param_error(param, msg);
}

}  // namespace zk

#define ZK_THROW(...) ::zk::throw_error(::zk::strfmt(__VA_ARGS__))
// ZK_THROW_PARAM("kv.bits", "kv.bits must be %s, got %d", ...): the message names the parameter.
#define ZK_THROW_PARAM(param, ...) ::zk::throw_param_error(param, ::zk::strfmt(__VA_ARGS__))
#define ZK_ASSERT(cond)                                                                   \
    do {                                                                                  \
        if (!(cond)) ZK_THROW("internal error: %s failed at %s:%d", #cond, __FILE__, __LINE__); \
    } while (0)
