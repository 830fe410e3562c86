// One-line progress on stderr for the long calibration passes: done/total,
// tokens per second and time left. Redraws in place on a terminal; elsewhere
// (logs, CI) prints a line every 10%.
#pragma once
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace zk {

class calib_progress {
public:
    calib_progress(std::string what, int64_t total, bool enabled)
        : what_(std::move(what)), total_(total), enabled_(enabled), tty_(isatty(STDERR_FILENO)),
          t0_(std::chrono::steady_clock::now()) {}

    void update(int64_t done) {
        if (!enabled_ || total_ <= 0) return;
        const int decile = (int)(10 * done / total_);
        if (!tty_ && decile == last_decile_ && done < total_) return;
        last_decile_ = decile;
        const double s = seconds();
        const double rate = s > 0 ? done / s : 0;
        const double eta = rate > 0 ? (total_ - done) / rate : 0;
        std::fprintf(stderr, "%s[%s] %lld/%lld tokens, %.1f tok/s, %.0f s elapsed, ETA %.0f s%s",
                     tty_ ? "\r" : "", what_.c_str(), (long long)done, (long long)total_, rate, s,
                     eta > 0 ? eta : 0.0, tty_ ? "   " : "\n");
        std::fflush(stderr);
    }
    void finish(int64_t done) {
        if (!enabled_) return;
        if (tty_) std::fprintf(stderr, "\n");
        std::fprintf(stderr, "[%s] done: %lld tokens in %.1f s (%.1f tok/s)\n", what_.c_str(), (long long)done,
                     seconds(), done / std::max(seconds(), 1e-9));
    }
    double seconds() const {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    }

private:
    std::string what_;
    int64_t total_;
    bool enabled_, tty_;
    int last_decile_ = -1;
    std::chrono::steady_clock::time_point t0_;
};

}  // namespace zk
