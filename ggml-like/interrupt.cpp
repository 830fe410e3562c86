// Signal handlers and the registry of temporary output files (interrupt.h).
// The registry is a fixed table so that a signal handler can walk it without
// locks or allocation: a slot is claimed (FREE -> WRITING), filled, published
// (-> ACTIVE); the handler only reads ACTIVE slots.
#include "ggml-like/interrupt.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace zk {

namespace {

constexpr int k_slots = 16;
constexpr size_t k_max_path = 4096;
enum : int { FREE = 0, WRITING = 1, ACTIVE = 2 };

struct temp_slot {
    std::atomic<int> state{FREE};
    char path[k_max_path];
};

temp_slot g_slots[k_slots];

// interrupt_hold sections open in any thread, and a SIGINT/SIGTERM that arrived
// in one of them. Blocking the signal in the holding thread is not enough: the
// kernel hands a process-directed signal to any thread that does not block it,
// and OpenBLAS starts its own threads before main() runs. The handler, in
// whichever thread, therefore defers while a hold is open, and the last hold to
// close ends the process. Lock-free atomics are async-signal-safe.
std::atomic<int> g_hold_depth{0};
std::atomic<int> g_pending{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs lock-free atomics");

void write_stderr(const char* s) { (void)!write(STDERR_FILENO, s, std::strlen(s)); }

[[noreturn]] void terminate_now(int sig) {
    interrupt_remove_temps();
    write_stderr("\nzack: interrupted\n");
    _exit(128 + sig);
}

void on_terminate(int sig) {
    if (g_hold_depth.load() > 0) {
        // Store, then look at the depth again; the closing hold lowers the depth,
        // then takes the pending signal. With sequentially consistent operations at
        // least one of the two sees the other, and the exchange lets only one act.
        g_pending.store(sig);
        if (g_hold_depth.load() > 0) return;
        sig = g_pending.exchange(0);
        if (sig == 0) return;  // the closing hold took it
    }
    terminate_now(sig);
}

// Installed with SA_RESETHAND | SA_NODEFER: the default action is back and the
// signal unblocked, so raising it again ends the process by SIGPIPE, as a
// pipeline stage normally ends.
void on_sigpipe(int sig) {
    interrupt_remove_temps();
    raise(sig);
    _exit(128 + sig);  // not reached
}

void install(int sig, void (*fn)(int), int flags) {
    struct sigaction sa = {};
    sa.sa_handler = fn;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
}

}  // namespace

void interrupt_install() {
    install(SIGINT, on_terminate, 0);
    install(SIGTERM, on_terminate, 0);
    install(SIGPIPE, on_sigpipe, SA_RESETHAND | SA_NODEFER);
}

void interrupt_remove_temps() {
    for (temp_slot& s : g_slots)
        if (s.state.load(std::memory_order_acquire) == ACTIVE) unlink(s.path);
    // then the registered directories, emptied by the pass above (rmdir of a
    // file path fails harmlessly)
    for (temp_slot& s : g_slots)
        if (s.state.load(std::memory_order_acquire) == ACTIVE) rmdir(s.path);
}

interrupt_hold::interrupt_hold() {
    sigset_t hold;
    sigemptyset(&hold);
    sigaddset(&hold, SIGINT);
    sigaddset(&hold, SIGTERM);
    sigaddset(&hold, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &hold, &old_);
    g_hold_depth.fetch_add(1);
}

interrupt_hold::~interrupt_hold() {
    // Deferred by a handler in another thread: end the process now, as the
    // handler would have. A signal held back in this thread arrives when the mask
    // is restored, after the depth has dropped, and ends it the same way.
    if (g_hold_depth.fetch_sub(1) == 1) {
        const int sig = g_pending.exchange(0);
        if (sig != 0) terminate_now(sig);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

void interrupt_temp::track(const std::string& path) {
    release();
    if (path.size() >= k_max_path) return;
    for (int i = 0; i < k_slots; i++) {
        int expect = FREE;
        if (!g_slots[i].state.compare_exchange_strong(expect, WRITING, std::memory_order_acq_rel)) continue;
        std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
        g_slots[i].state.store(ACTIVE, std::memory_order_release);
        slot_ = i;
        return;
    }
}

void interrupt_temp::release() {
    if (slot_ >= 0) g_slots[slot_].state.store(FREE, std::memory_order_release);
    slot_ = -1;
}

}  // namespace zk
