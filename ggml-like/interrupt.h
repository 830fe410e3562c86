// Interruption: Ctrl-C (SIGINT), SIGTERM, and a reader that closes zack's
// standard output (SIGPIPE, e.g. `zack info M.gguf | head`).
//
// Every output file is written under a temporary name in its directory and
// renamed when complete. While such a temporary exists its path is registered
// here (interrupt_temp), so that a signal ending the process removes it: an
// interrupted calibrate, eval or bench leaves no partial output file behind.
//
// interrupt_install() (main() calls it before running a subcommand):
//   SIGINT, SIGTERM  remove the registered temporaries, print "zack: interrupted"
//                    on stderr and exit with 128 + the signal (130, 143)
//   SIGPIPE          remove the registered temporaries and end quietly, killed
//                    by SIGPIPE as a shell pipeline expects (status 141, no message)
// `zack run` replaces the SIGINT handler with its own (Ctrl-C stops a reply);
// when it exits on Ctrl-C it calls interrupt_remove_temps() first.
// Everything a handler does is async-signal-safe (unlink, write, _exit).
#pragma once
#include <signal.h>

#include <string>

namespace zk {

void interrupt_install();

// Removes every registered temporary file, then every registered directory
// that is empty by then (a temporary directory whose files were registered
// too: bench --shape's synthetic model); async-signal-safe.
void interrupt_remove_temps();

// Registers a path for removal on a signal while it is tracked: from just
// after the temporary file is created until after its rename (or its removal on
// failure). file_out (ggml-like/file_out.h) tracks its temporary this way. At
// most 16 at a time and paths under 4 KiB; beyond that a path is simply not
// registered.
class interrupt_temp {
public:
    interrupt_temp() = default;
    explicit interrupt_temp(const std::string& path) { track(path); }
    ~interrupt_temp() { release(); }
    void track(const std::string& path);  // replaces the path tracked before, if any
    void release();                       // no longer removed on a signal
    interrupt_temp(const interrupt_temp&) = delete;
    interrupt_temp& operator=(const interrupt_temp&) = delete;

private:
    int slot_ = -1;
};

// Holds back SIGINT, SIGTERM and SIGPIPE for its lifetime; one that arrives
// meanwhile ends the process when the hold ends. In this thread the signals are
// blocked; a SIGINT/SIGTERM that another thread takes (a pool worker, an
// OpenBLAS thread) is deferred by the handler until the last open hold ends.
// file_out holds them from creating its temporary until the path is
// registered: a Ctrl-C in between would otherwise leave the new temporary
// behind.
class interrupt_hold {
public:
    interrupt_hold();
    ~interrupt_hold();
    interrupt_hold(const interrupt_hold&) = delete;
    interrupt_hold& operator=(const interrupt_hold&) = delete;

private:
    sigset_t old_;
};

}  // namespace zk
