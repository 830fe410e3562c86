// The SIMT harness's run time: buffer registry, block scheduler over fibers,
// barriers, warp collectives and the shared-memory tracker (simt.h).
#include "tests/simt/simt.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "tests/simt/simt_fiber.h"

namespace simt {

thread_local thread_ctx* g_cur = nullptr;

namespace {

// ---------------------------------------------------------------- buffers

struct registry {
    std::mutex mu;
    std::map<uintptr_t, std::unique_ptr<buffer>> by_base;  // live buffers by address
    std::vector<std::unique_ptr<buffer>> freed;            // records of freed ones: pointers made before still name them
    uint64_t next_id = 1;
};
registry& reg() {
    static registry r;
    return r;
}
std::atomic<uint64_t> g_launches{0};

// ---------------------------------------------------------------- block state

constexpr size_t k_smem_static_max = 48 * 1024;
constexpr size_t k_smem_max = 227 * 1024;  // per block, sm_90 with the opt-in attribute
constexpr size_t k_stack = 256 * 1024;

enum thread_status : int { RUNNABLE, AT_BARRIER, AT_WARP, EXITED };

struct thread_state : thread_ctx {
    fiber_context fib;
    thread_status status = RUNNABLE;
    const char* wait_file = nullptr;
    int wait_line = 0;
    uint32_t seq = 0;           // sequence number of the last warp collective this thread completed
    uint32_t seq_with[32] = {};  // ... and of the last one it completed together with each lane
    uint64_t result = 0;        // its value from the last collective
};

struct warp_state {
    bool pending = false;
    coll_kind kind = COLL_SYNCWARP;
    unsigned mask = 0, arrived = 0;
    int width = 32;
    const char* file = nullptr;
    int line = 0;
    uint64_t value[32];
    int arg[32];
};

// One byte of shared memory: who wrote it last, in which barrier phase and
// after which warp collective; who read it in the current phase.
struct shadow {
    uint32_t gen = 0;  // block generation: entries of an older block are empty
    int16_t writer = -1;
    int16_t reader = -1;  // a reader of phase r_epoch; -2: several warps read it
    uint8_t atomic = 0;   // the last write was an atomic
    uint32_t w_epoch = 0, w_seq = 0;
    uint32_t r_epoch = 0, r_seq = 0, r_mask = 0;
    int w_line = 0;
    const char* w_file = nullptr;
};

struct block_run {
    const char* kernel = nullptr;
    const std::function<void()>* body = nullptr;
    dim3 grid, block;
    uint3 bid{};
    int n_threads = 0, n_live = 0, n_exited = 0, n_barrier = 0;
    const char* bar_file = nullptr;
    int bar_line = 0;
    uint32_t epoch = 1;  // barrier phase
    uint32_t seq = 0;    // warp collectives completed in the block
    std::vector<thread_state> th;
    std::vector<warp_state> warps;
    fiber_context sched;
    fiber_stack_pool stacks;
    // shared memory
    std::vector<char> smem;
    std::vector<shadow> shadow_of;
    uint32_t gen = 0;
    size_t dyn_size = 0, static_used = 0;
    std::vector<std::pair<const shared_site*, size_t>> sites;
    // the first violation
    bool failed = false;
    std::string error;
};
thread_local block_run* g_run = nullptr;

block_run& run() {
    if (!g_run) fail(__FILE__, __LINE__, "a device-only operation outside a kernel");
    return *g_run;
}

struct abort_kernel {};

std::string where_str(const char* file, int line) {
    if (!file) return "?";
    const char* s = std::strrchr(file, '/');
    return std::string(s ? s + 1 : file) + ":" + std::to_string(line);
}

std::string thread_str(const thread_ctx& t) {
    char b[128];
    std::snprintf(b, sizeof b, "block (%u,%u,%u) thread (%u,%u,%u)", t.bid.x, t.bid.y, t.bid.z, t.tid.x, t.tid.y,
                  t.tid.z);
    return b;
}

thread_state& me() { return *static_cast<thread_state*>(g_cur); }

void yield_to_scheduler() {
    block_run& r = run();
    thread_state& t = me();
    fiber_switch(t.fib, r.sched);
    g_cur = &t;
    if (r.failed) throw abort_kernel{};
}

const char* coll_name(coll_kind k) {
    switch (k) {
        case COLL_SYNCWARP: return "__syncwarp";
        case COLL_SHFL_IDX: return "__shfl_sync";
        case COLL_SHFL_XOR: return "__shfl_xor_sync";
        case COLL_SHFL_DOWN: return "__shfl_down_sync";
        case COLL_SHFL_UP: return "__shfl_up_sync";
        case COLL_BALLOT: return "__ballot_sync";
        case COLL_ANY: return "__any_sync";
        case COLL_ALL: return "__all_sync";
    }
    return "?";
}

// Lanes that exist in warp w of the block (the last warp may be partial).
unsigned warp_lanes(const block_run& r, int w) {
    const int n = std::min(32, r.n_threads - 32 * w);
    return n >= 32 ? 0xffffffffu : ((1u << n) - 1);
}

void thread_main(void* arg) {
    thread_state& t = *(thread_state*)arg;
    block_run& r = *g_run;
    fiber_started(r.sched);
    g_cur = &t;
    try {
        (*r.body)();
    } catch (const abort_kernel&) {
    } catch (const std::exception& e) {
        if (!r.failed) r.failed = true, r.error = thread_str(t) + ": " + e.what();
    } catch (...) {
        if (!r.failed) r.failed = true, r.error = thread_str(t) + ": unknown exception";
    }
    t.status = EXITED;
    r.n_live--;
    r.n_exited++;
    if (!r.failed) {
        if (r.n_barrier > 0) {
            r.failed = true;
            r.error = thread_str(t) + " exited while " + std::to_string(r.n_barrier) +
                      " threads wait at __syncthreads (" + where_str(r.bar_file, r.bar_line) +
                      "): a barrier in divergent code";
        }
        warp_state& w = r.warps[t.warp];
        if (!r.failed && w.pending && (w.mask >> t.lane & 1) && !(w.arrived >> t.lane & 1)) {
            r.failed = true;
            r.error = thread_str(t) + " exited while lanes of its warp wait at " + coll_name(w.kind) + " (" +
                      where_str(w.file, w.line) + ") with it in the mask";
        }
    }
    g_cur = nullptr;
    fiber_switch(t.fib, r.sched, true);
    __builtin_trap();  // never resumed
}

std::string deadlock_report(const block_run& r) {
    std::string s = "deadlock in block (" + std::to_string(r.bid.x) + "," + std::to_string(r.bid.y) + "," +
                    std::to_string(r.bid.z) + "): no thread can run;";
    int shown = 0;
    for (const thread_state& t : r.th) {
        if (t.status == EXITED || shown >= 6) continue;
        s += " thread " + std::to_string(t.linear) + " waits at " +
             (t.status == AT_BARRIER ? std::string("__syncthreads") : std::string(coll_name(r.warps[t.warp].kind))) +
             " (" + where_str(t.wait_file, t.wait_line) + ");";
        shown++;
    }
    return s + " " + std::to_string(r.n_exited) + " exited";
}

}  // namespace

// ---------------------------------------------------------------- errors

void fail(const char* file, int line, const std::string& msg) {
    if (g_cur && g_run) {
        block_run& r = *g_run;
        if (!r.failed) {
            r.failed = true;
            r.error = thread_str(*g_cur) + " at " + where_str(file, line) + ": " + msg;
        }
        throw abort_kernel{};
    }
    throw violation(where_str(file, line) + ": " + msg);
}

// ---------------------------------------------------------------- buffers

void* device_alloc(size_t bytes, const char* name) {
    registry& g = reg();
    // at least one byte, so that distinct buffers never share an address
    char* p = (char*)std::calloc(bytes ? bytes : 1, 1);
    if (!p) throw std::bad_alloc();
    auto b = std::make_unique<buffer>();
    b->base = p;
    b->size = bytes;
    b->live = true;
    std::snprintf(b->name, sizeof b->name, "%s", name ? name : "buffer");
    std::lock_guard<std::mutex> lk(g.mu);
    b->id = g.next_id++;
    g.by_base[(uintptr_t)p] = std::move(b);
    return p;
}

void device_free(void* p) {
    if (!p) return;
    registry& g = reg();
    std::lock_guard<std::mutex> lk(g.mu);
    auto it = g.by_base.find((uintptr_t)p);
    if (it == g.by_base.end() || !it->second->live) throw violation("device_free of a pointer that is not a live buffer");
    it->second->live = false;
    std::free(p);
    // the record stays (gptrs made before report "freed"); the address may be reused
    g.freed.push_back(std::move(it->second));
    g.by_base.erase(it);
}

const buffer* buffer_find(const void* p) {
    registry& g = reg();
    std::lock_guard<std::mutex> lk(g.mu);
    auto it = g.by_base.upper_bound((uintptr_t)p);
    if (it == g.by_base.begin()) return nullptr;
    --it;
    const buffer* b = it->second.get();
    if ((uintptr_t)p <= (uintptr_t)b->base + b->size) return b;
    return nullptr;
}

std::atomic<uint64_t> g_checked{0};
uint64_t checked_accesses() { return g_checked.load(); }
uint64_t launches_run() { return g_launches.load(); }

void check_global_fail(const buffer* b, const void* p, size_t n, size_t align, const char* file, int line) {
    if (!b) fail(file, line, "access through a null device pointer");
    if (!b->live) fail(file, line, std::string("access to freed buffer '") + b->name + "'");
    const intptr_t off = (intptr_t)p - (intptr_t)b->base;
    if (off < 0 || (size_t)off + n > b->size) {
        char m[256];
        std::snprintf(m, sizeof m, "out-of-bounds access to buffer '%s': byte offset %lld, %zu bytes, buffer holds %zu",
                      b->name, (long long)off, n, b->size);
        fail(file, line, m);
    }
    if ((uintptr_t)p % align != 0) {
        char m[200];
        std::snprintf(m, sizeof m, "misaligned access to buffer '%s' at byte offset %lld (needs %zu-byte alignment)",
                      b->name, (long long)off, align);
        fail(file, line, m);
    }
    fail(file, line, "invalid global access");  // not reached: the inline check found one of the above
}

// ---------------------------------------------------------------- barriers

void sync_threads(const char* file, int line) {
    block_run& r = run();
    thread_state& t = me();
    if (r.n_exited > 0)
        fail(file, line, "__syncthreads after " + std::to_string(r.n_exited) +
                             " threads of the block exited: a barrier in divergent code");
    if (r.n_barrier == 0) {
        r.bar_file = file;
        r.bar_line = line;
    } else if (r.bar_line != line || std::strcmp(r.bar_file, file) != 0) {
        fail(file, line, "threads wait at different __syncthreads: here and at " + where_str(r.bar_file, r.bar_line));
    }
    r.n_barrier++;
    if (r.n_barrier == r.n_live) {  // the last one releases everybody
        r.n_barrier = 0;
        r.epoch++;
        for (thread_state& o : r.th)
            if (o.status == AT_BARRIER) o.status = RUNNABLE;
        return;
    }
    t.status = AT_BARRIER;
    t.wait_file = file;
    t.wait_line = line;
    yield_to_scheduler();
}

// ---------------------------------------------------------------- warp collectives

uint64_t warp_collective(coll_kind kind, unsigned mask, uint64_t value, int arg, int width, const char* file,
                         int line) {
    block_run& r = run();
    thread_state& t = me();
    warp_state& w = r.warps[t.warp];
    const unsigned bit = 1u << t.lane;
    if (!(mask & bit)) fail(file, line, std::string(coll_name(kind)) + " called by a lane not in its mask");
    if (mask & ~warp_lanes(r, t.warp))
        fail(file, line, std::string(coll_name(kind)) + " mask names lanes the block does not have");
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail(file, line, std::string(coll_name(kind)) + " width must be a power of two <= 32");
    for (int l = 0; l < 32; l++)
        if ((mask >> l & 1) && r.th[32 * t.warp + l].status == EXITED)
            fail(file, line, std::string(coll_name(kind)) + " mask names lane " + std::to_string(l) + ", which exited");
    if (!w.pending) {
        w.pending = true;
        w.kind = kind;
        w.mask = mask;
        w.arrived = 0;
        w.width = width;
        w.file = file;
        w.line = line;
    } else if (w.kind != kind || w.mask != mask || w.width != width || w.line != line ||
               std::strcmp(w.file, file) != 0) {
        char m[64];
        std::snprintf(m, sizeof m, " (mask %08x)", w.mask);
        fail(file, line, std::string("divergent warp collective: ") + coll_name(kind) + " here while lanes wait at " +
                             coll_name(w.kind) + " " + where_str(w.file, w.line) + m);
    }
    w.value[t.lane] = value;
    w.arg[t.lane] = arg;
    w.arrived |= bit;
    if (w.arrived != w.mask) {
        t.status = AT_WARP;
        t.wait_file = file;
        t.wait_line = line;
        yield_to_scheduler();
        return t.result;
    }
    // the last lane computes every lane's result
    const uint32_t seq = ++r.seq;
    unsigned ballot = 0;
    for (int l = 0; l < 32; l++)
        if ((mask >> l & 1) && w.value[l]) ballot |= 1u << l;
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1)) continue;
        thread_state& o = r.th[32 * t.warp + l];
        const int seg = l & ~(w.width - 1), a = w.arg[l];
        int src = l;
        switch (kind) {
            case COLL_SHFL_IDX: src = seg + (a & (w.width - 1)); break;
            case COLL_SHFL_XOR: src = (l ^ a) < seg + w.width ? (l ^ a) : l; break;
            case COLL_SHFL_DOWN: src = l + a < seg + w.width ? l + a : l; break;
            case COLL_SHFL_UP: src = l - a >= seg ? l - a : l; break;
            default: break;
        }
        if (kind >= COLL_SHFL_IDX && kind <= COLL_SHFL_UP && !(mask >> src & 1))
            fail(file, line, std::string(coll_name(kind)) + ": lane " + std::to_string(l) + " reads lane " +
                                 std::to_string(src) + ", which is not in the mask (undefined value)");
        switch (kind) {
            case COLL_BALLOT: o.result = ballot; break;
            case COLL_ANY: o.result = ballot != 0; break;
            case COLL_ALL: o.result = ballot == mask; break;
            case COLL_SYNCWARP: o.result = 0; break;
            default: o.result = w.value[src]; break;
        }
        o.seq = seq;
        for (int q = 0; q < 32; q++)
            if (mask >> q & 1) o.seq_with[q] = seq;
        if (&o != &t) o.status = RUNNABLE;
    }
    w.pending = false;
    return t.result;
}

// ---------------------------------------------------------------- shared memory

namespace {

// Whether thread b's current access is ordered after an access thread a made
// when its last completed collective was a_seq: same thread, or a later warp
// collective of both (a barrier is checked through the phases).
bool warp_ordered(const block_run& r, int a, uint32_t a_seq, const thread_state& b) {
    if (a == b.linear) return true;
    if (a / 32 != b.warp) return false;
    return b.seq_with[a % 32] > a_seq;
}

void shared_violation(const char* file, int line, const char* name, size_t off, const std::string& what) {
    char m[96];
    std::snprintf(m, sizeof m, "shared '%s' byte %zu: ", name, off);
    fail(file, line, m + what);
}

}  // namespace

void shared_check(const void* p, size_t n, shared_access_kind kind, const char* lo, const char* hi, const char* name,
                  const char* file, int line) {
    block_run& r = run();
    const thread_state& t = me();
    const char* c = (const char*)p;
    if (c < lo || c + n > hi) {
        char m[200];
        std::snprintf(m, sizeof m, "out-of-bounds shared access to '%s': byte offset %lld, %zu bytes, array holds %lld",
                      name, (long long)(c - lo), n, (long long)(hi - lo));
        fail(file, line, m);
    }
    if ((uintptr_t)c % n != 0 && n <= 16) fail(file, line, std::string("misaligned shared access to '") + name + "'");
    g_checked.store(g_checked.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    const size_t base = (size_t)(c - r.smem.data());
    for (size_t i = 0; i < n; i++) {
        shadow& s = r.shadow_of[base + i];
        if (s.gen != r.gen) s = shadow{}, s.gen = r.gen;
        const size_t off = (size_t)(c - lo) + i;
        const bool same_phase_write = s.writer >= 0 && s.w_epoch == r.epoch;
        if (kind == SHARED_READ || kind == SHARED_ATOMIC) {
            if (s.writer < 0 && kind == SHARED_READ)
                shared_violation(file, line, name, off, "read before any write (uninitialized shared memory)");
            if (same_phase_write && !(kind == SHARED_ATOMIC && s.atomic) && !warp_ordered(r, s.writer, s.w_seq, t))
                shared_violation(file, line, name, off,
                                 "read of a value thread " + std::to_string(s.writer) + " wrote at " +
                                     where_str(s.w_file, s.w_line) +
                                     " in the same phase (no __syncthreads between: missing barrier)");
        }
        if (kind == SHARED_WRITE || kind == SHARED_ATOMIC) {
            if (kind == SHARED_WRITE && same_phase_write && !warp_ordered(r, s.writer, s.w_seq, t))
                shared_violation(file, line, name, off,
                                 "write conflicts with thread " + std::to_string(s.writer) + "'s write at " +
                                     where_str(s.w_file, s.w_line) + " in the same phase");
            if (s.r_epoch == r.epoch && s.reader != -1 && !(kind == SHARED_ATOMIC && s.atomic)) {
                bool ordered;
                if (s.reader == -2) {
                    ordered = false;
                } else {
                    ordered = true;
                    for (int l = 0; l < 32 && ordered; l++)
                        if ((s.r_mask >> l & 1) && 32 * (s.reader / 32) + l != t.linear)
                            ordered = warp_ordered(r, 32 * (s.reader / 32) + l, s.r_seq, t);
                }
                if (!ordered)
                    shared_violation(file, line, name, off,
                                     "write of a value other threads read in the same phase (thread " +
                                         std::to_string(s.reader == -2 ? -1 : s.reader) +
                                         "; no __syncthreads between: missing barrier)");
            }
            s.writer = (int16_t)t.linear;
            s.w_epoch = r.epoch;
            s.w_seq = t.seq;
            s.w_file = file;
            s.w_line = line;
            s.atomic = kind == SHARED_ATOMIC;
            s.reader = -1;
            s.r_epoch = 0;
            s.r_mask = 0;
        } else {
            if (s.r_epoch != r.epoch || s.reader == -1) {
                s.r_epoch = r.epoch;
                s.reader = (int16_t)t.linear;
                s.r_mask = 1u << t.lane;
                s.r_seq = t.seq;
            } else if (s.reader >= 0 && s.reader / 32 == t.warp) {
                s.r_mask |= 1u << t.lane;
                s.r_seq = std::max(s.r_seq, t.seq);
            } else if (s.reader >= 0) {
                s.reader = -2;
            }
        }
    }
}

char* shared_static_bytes(const shared_site& s) {
    block_run& r = run();
    for (const auto& e : r.sites)
        if (e.first == &s) return r.smem.data() + e.second;
    size_t off = (r.dyn_size + r.static_used + s.align - 1) / s.align * s.align;
    r.static_used = off + s.bytes - r.dyn_size;
    if (r.static_used > k_smem_static_max)
        fail(__FILE__, __LINE__, std::string("static shared memory above 48 KiB at '") + s.name + "'");
    if (r.dyn_size + r.static_used > k_smem_max)
        fail(__FILE__, __LINE__, "shared memory above the per-block limit");
    r.sites.push_back({&s, off});
    return r.smem.data() + off;
}

char* shared_dynamic_bytes(size_t* size) {
    block_run& r = run();
    *size = r.dyn_size;
    return r.smem.data();
}

// ---------------------------------------------------------------- launch

namespace {
std::map<const void*, size_t>& optin_table() {
    static std::map<const void*, size_t> t;
    return t;
}
std::mutex& optin_mu() {
    static std::mutex m;
    return m;
}
}  // namespace

void func_set_max_dynamic_smem(const void* fn, size_t bytes) {
    if (bytes > k_smem_max) throw violation("cudaFuncSetAttribute: dynamic shared memory above 227 KiB");
    std::lock_guard<std::mutex> lk(optin_mu());
    optin_table()[fn] = bytes;
}

void launch_impl(const char* name, const void* fn, dim3 grid, dim3 block, size_t smem,
                 const std::function<void()>& body) {
    const uint64_t n_threads = (uint64_t)block.x * block.y * block.z;
    auto bad = [&](const std::string& m) { throw violation(std::string("launch of ") + name + ": " + m); };
    if (n_threads == 0 || n_threads > 1024 || block.z > 64) bad("block of " + std::to_string(n_threads) + " threads");
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535) bad("empty or oversized grid");
    if (smem > 48 * 1024) {
        std::lock_guard<std::mutex> lk(optin_mu());
        auto it = optin_table().find(fn);
        if (it == optin_table().end() || it->second < smem)
            bad(std::to_string(smem) + " bytes of dynamic shared memory without cudaFuncSetAttribute opt-in");
    }
    if (smem > k_smem_max) bad("dynamic shared memory above 227 KiB");
    g_launches.fetch_add(1);

    static thread_local std::unique_ptr<block_run> keep;
    if (!keep) keep = std::make_unique<block_run>();
    block_run& r = *keep;
    if (g_run) bad("launch from inside a kernel");
    r.kernel = name;
    r.body = &body;
    r.grid = grid;
    r.block = block;
    r.n_threads = (int)n_threads;
    r.dyn_size = smem;
    if (r.smem.empty()) {
        r.smem.resize(k_smem_max + 64);
        r.shadow_of.resize(r.smem.size());
    }
    r.stacks.reserve((int)n_threads, k_stack);
    r.th.assign(n_threads, thread_state{});
    r.warps.assign((n_threads + 31) / 32, warp_state{});
    r.failed = false;
    r.error.clear();
    g_run = &r;
    struct reset {
        ~reset() { g_run = nullptr, g_cur = nullptr; }
    } reset_on_exit;

    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                r.bid = uint3{bx, by, bz};
                r.gen++;
                r.epoch = 1;
                r.seq = 0;
                r.n_live = r.n_threads;
                r.n_exited = r.n_barrier = 0;
                r.static_used = 0;
                r.sites.clear();
                // garbage in shared memory, as on a device (the tracker flags reads of it)
                std::memset(r.smem.data(), 0xA5, std::min(r.smem.size(), smem + k_smem_static_max + 64));
                for (warp_state& w : r.warps) w = warp_state{};
                for (int i = 0; i < r.n_threads; i++) {
                    thread_state& t = r.th[i];
                    t = thread_state{};
                    t.tid = uint3{(unsigned)(i % block.x), (unsigned)(i / block.x % block.y),
                                  (unsigned)(i / (block.x * block.y))};
                    t.bid = r.bid;
                    t.bdim = block;
                    t.gdim = grid;
                    t.linear = i;
                    t.warp = i / 32;
                    t.lane = i % 32;
                    fiber_init(t.fib, r.stacks.stack(i), r.stacks.stack_size(), &thread_main, &t);
                }
                while (r.n_live > 0 && !r.failed) {
                    bool ran = false;
                    for (thread_state& t : r.th) {
                        if (t.status != RUNNABLE) continue;
                        g_cur = &t;
                        fiber_switch(r.sched, t.fib);
                        g_cur = nullptr;
                        ran = true;
                        if (r.failed) break;
                    }
                    if (!ran && !r.failed) {
                        r.failed = true;
                        r.error = deadlock_report(r);
                    }
                }
                if (r.failed) throw violation(std::string("kernel ") + name + ": " + r.error);
            }
}

}  // namespace simt

// ---------------------------------------------------------------- half precision

namespace simt {

namespace {
float f16_to_f32_compute(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    float v;
    if (e == 0) {
        v = std::ldexp((float)m, -24);  // zero and subnormals
    } else if (e == 31) {
        const uint32_t u = 0x7F800000u | (m << 13);
        std::memcpy(&v, &u, 4);
    } else {
        const uint32_t u = ((e + 112) << 23) | (m << 13);
        std::memcpy(&v, &u, 4);
    }
    uint32_t u;
    std::memcpy(&u, &v, 4);
    u |= sign;
    std::memcpy(&v, &u, 4);
    return v;
}
}  // namespace

// Every half's value, computed once: the gemm stand-in and the kernels'
// __half2float convert ~10^8 values in the real-model tests.
float f16_to_f32(uint16_t h) {
    static const std::vector<float> table = [] {
        std::vector<float> t(65536);
        for (uint32_t i = 0; i < 65536; i++) t[i] = f16_to_f32_compute((uint16_t)i);
        return t;
    }();
    return table[h];
}

uint16_t f32_to_f16_rn(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return sign | 0x7E00;     // NaN
    if (ax >= 0x477FF000u) return sign | 0x7C00;    // >= 65520 rounds to infinity
    if (ax < 0x38800000u) {                         // below 2^-14: a subnormal half (or zero)
        float a;
        std::memcpy(&a, &ax, 4);
        return sign | (uint16_t)std::nearbyint(a * 16777216.0f);  // exact scaling, then ties to even
    }
    uint32_t h = ((((ax >> 23) - 127 + 15) << 10) | ((ax & 0x7FFFFF) >> 13));
    const uint32_t rest = ax & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;  // a carry into the exponent is right
    return sign | (uint16_t)h;
}

}  // namespace simt
