#include "tests/simt/simt_fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <new>
#include <stdexcept>

#if defined(__SANITIZE_ADDRESS__)
#define SIMT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIMT_ASAN 1
#endif
#endif
#if SIMT_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace simt {

// ---- stacks ----

fiber_stack_pool::~fiber_stack_pool() {
    if (base_) munmap(base_, bytes_);
}

void fiber_stack_pool::reserve(int n, size_t size) {
    page_ = (size_t)sysconf(_SC_PAGESIZE);
    size = (size + page_ - 1) / page_ * page_;
    if (n <= n_ && size + page_ <= stride_) return;
    if (base_) munmap(base_, bytes_);
    stride_ = size + page_;
    bytes_ = stride_ * (size_t)n;
    // MAP_NORESERVE: a stack costs only the pages a kernel touches
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    base_ = (char*)p;
    n_ = n;
    for (int i = 0; i < n; i++) mprotect(base_ + (size_t)i * stride_, page_, PROT_NONE);  // guard below each stack
}

// ---- context switch ----

#if SIMT_FIBER_ASM
// simt_ctx_switch(void** save_sp, void* load_sp): pushes the callee-saved
// registers (System V: rbx, rbp, r12-r15, MXCSR and the x87 control word) on
// the current stack, stores rsp in *save_sp, loads load_sp and pops the other
// context's registers; `ret` resumes it. A new fiber's stack is laid out as if
// it had been switched away from simt_fiber_trampoline, with its argument in
// rbx.
extern "C" void simt_ctx_switch(void** save_sp, void* load_sp);
extern "C" void simt_fiber_trampoline();
extern "C" void simt_fiber_run(void (*entry)(void*), void* arg);

asm(R"(
    .text
    .globl simt_ctx_switch
    .type simt_ctx_switch, @function
simt_ctx_switch:
    .cfi_startproc
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .cfi_endproc
    .size simt_ctx_switch, .-simt_ctx_switch

    .globl simt_fiber_trampoline
    .type simt_fiber_trampoline, @function
simt_fiber_trampoline:
    .cfi_startproc
    .cfi_undefined rip
    movq %rbx, %rdi
    movq %r12, %rsi
    call simt_fiber_run
    ud2
    .cfi_endproc
    .size simt_fiber_trampoline, .-simt_fiber_trampoline
)");

extern "C" void simt_fiber_run(void (*entry)(void*), void* arg) { entry(arg); }

void fiber_init(fiber_context& f, char* stack, size_t size, fiber_entry entry, void* arg) {
    f.stack = stack;
    f.stack_size = size;
    f.asan_fake = nullptr;
#if SIMT_ASAN
    __asan_unpoison_memory_region(stack, size);
#endif
    // top 16-aligned; after `ret` into the trampoline rsp = top - 16 (aligned,
    // so its `call` enters simt_fiber_run with the ABI's alignment)
    uintptr_t top = ((uintptr_t)stack + size) & ~(uintptr_t)15;
    uint64_t* s = (uint64_t*)top;
    s[-2] = 0;                                   // (above the return address: unused)
    s[-3] = (uint64_t)(uintptr_t)&simt_fiber_trampoline;  // return address
    s[-4] = 0;                                   // rbp
    s[-5] = (uint64_t)(uintptr_t)entry;          // rbx
    s[-6] = (uint64_t)(uintptr_t)arg;            // r12
    s[-7] = 0;                                   // r13
    s[-8] = 0;                                   // r14
    s[-9] = 0;                                   // r15
    s[-10] = 0x1F80u | ((uint64_t)0x037Fu << 32);  // MXCSR default, x87 control word default
    f.sp = &s[-10];
}

static void raw_switch(fiber_context& from, fiber_context& to) { simt_ctx_switch(&from.sp, to.sp); }
#else
namespace {
struct start_args {
    fiber_entry entry;
    void* arg;
};
void uc_start(unsigned hi, unsigned lo) {
    start_args* a = (start_args*)(((uintptr_t)hi << 32) | lo);
    a->entry(a->arg);
    __builtin_trap();
}
}  // namespace

void fiber_init(fiber_context& f, char* stack, size_t size, fiber_entry entry, void* arg) {
    f.stack = stack;
    f.stack_size = size;
    f.asan_fake = nullptr;
#if SIMT_ASAN
    __asan_unpoison_memory_region(stack, size);
#endif
    // the start arguments live at the bottom of the fiber's own stack
    start_args* a = new (stack) start_args{entry, arg};
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = stack + 64;
    f.uc.uc_stack.ss_size = size - 64;
    f.uc.uc_link = nullptr;
    const uintptr_t p = (uintptr_t)a;
    makecontext(&f.uc, (void (*)())uc_start, 2, (unsigned)(p >> 32), (unsigned)p);
}

static void raw_switch(fiber_context& from, fiber_context& to) { swapcontext(&from.uc, &to.uc); }
#endif

void fiber_switch(fiber_context& from, fiber_context& to, bool from_done) {
#if SIMT_ASAN
    const void* bottom = to.stack ? to.stack : to.asan_bottom;
    const size_t size = to.stack ? to.stack_size : to.asan_size;
    __sanitizer_start_switch_fiber(from_done ? nullptr : &from.asan_fake, bottom, size);
#else
    (void)from_done;
#endif
    raw_switch(from, to);
#if SIMT_ASAN
    const void* ob;
    size_t os;
    __sanitizer_finish_switch_fiber(from.asan_fake, &ob, &os);
#endif
}

void fiber_started(fiber_context& from) {
#if SIMT_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &from.asan_bottom, &from.asan_size);
#else
    (void)from;
#endif
}

}  // namespace simt
