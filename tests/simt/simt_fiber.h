// User-space fibers for the SIMT harness: one per CUDA thread of a block, so a
// block of 1024 threads costs 1024 small stacks and a context switch is a few
// register moves (x86-64: hand-written; elsewhere ucontext, ~50x slower since
// swapcontext saves the signal mask with a system call).
//
// A fiber runs `entry(arg)` on its own stack and gives the CPU back with
// fiber_switch; the scheduler (the launching thread's own stack, a
// fiber_context with no stack) switches to it again. Stacks come from one
// mmap per pool with a PROT_NONE guard page below each, so a kernel whose
// locals overflow its stack faults instead of corrupting a neighbour.
// AddressSanitizer is told about every switch (its fiber API), and a stack is
// unpoisoned when reused: a fiber abandoned mid-kernel (a harness error ends
// the block) leaves redzones behind.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__x86_64__)
#define SIMT_FIBER_ASM 1
#else
#include <ucontext.h>
#endif

namespace simt {

struct fiber_context {
#if SIMT_FIBER_ASM
    void* sp = nullptr;  // saved stack pointer (callee-saved registers above it)
#else
    ucontext_t uc;
#endif
    char* stack = nullptr;  // lowest usable address (nullptr: the scheduler's own stack)
    size_t stack_size = 0;
    // AddressSanitizer bookkeeping (unused otherwise)
    void* asan_fake = nullptr;
    const void* asan_bottom = nullptr;
    size_t asan_size = 0;
};

using fiber_entry = void (*)(void* arg);

// n stacks of `size` bytes (rounded up to pages), each with a guard page.
class fiber_stack_pool {
public:
    fiber_stack_pool() = default;
    fiber_stack_pool(const fiber_stack_pool&) = delete;
    fiber_stack_pool& operator=(const fiber_stack_pool&) = delete;
    ~fiber_stack_pool();
    // Makes room for at least n stacks (keeps the existing ones when enough).
    void reserve(int n, size_t size);
    char* stack(int i) const { return base_ + (size_t)i * (stride_) + page_; }
    size_t stack_size() const { return stride_ - page_; }

private:
    char* base_ = nullptr;
    size_t bytes_ = 0, stride_ = 0, page_ = 0;
    int n_ = 0;
};

// Prepares f to start entry(arg) on [stack, stack + size) at its first switch.
void fiber_init(fiber_context& f, char* stack, size_t size, fiber_entry entry, void* arg);
// Saves the current context in from and resumes to. `to_done`: the calling
// fiber will never be resumed (AddressSanitizer frees its fake stack).
void fiber_switch(fiber_context& from, fiber_context& to, bool from_done = false);
// The first thing a fiber's entry calls (AddressSanitizer: completes the switch
// that started it; `from` learns the scheduler's stack bounds).
void fiber_started(fiber_context& from);

}  // namespace simt
