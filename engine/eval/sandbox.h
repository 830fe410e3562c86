// A sandbox for running untrusted Python (the programs a model writes in the code
// task): Debian's bubblewrap (bwrap) with every namespace unshared and
// rlimits set before it starts.
//
// What the program sees and may do
// - The whole file system read-only (bind of /), its own /proc and a minimal
//   read-only /dev; /tmp is a fresh tmpfs of scratch_bytes holding only
//   /tmp/main.py, the working directory and the ONLY writable place. It vanishes
//   with the sandbox, so there is nothing to clean and nothing left behind.
// - No network (a private network namespace with only its own loopback), its own
//   PID, IPC, UTS and cgroup namespaces, a new session (no terminal), no further
//   user namespaces (--disable-userns), an environment of PATH, HOME=/tmp and LANG.
// - Limits: wall time (the whole process tree is SIGKILLed: bwrap's pid 1 dies with
//   its parent, and with it the PID namespace), CPU seconds, address space and open
//   files per process, and the number of processes/threads (RLIMIT_NPROC). stdout
//   and stderr are read to the end but only the first output_bytes of each (and
//   the last k_sandbox_tail bytes of stdout) are kept.
// - When zack runs as root the sandbox runs as a uid and gid of no account
//   (k_sandbox_uid_base + pid * 16 + n, its own for every sandbox object): the
//   kernel does not enforce RLIMIT_NPROC on uid 0 (a fork bomb would not be
//   stopped), RLIMIT_NPROC counts all tasks of a uid (with a uid of its own, those
//   of this sandbox alone), and such a uid cannot read root's private files.
//   Run as another user, the sandbox keeps that user, and the process limit is
//   added to the tasks the user already has.
//
// A sandbox that cannot start (no bwrap, user namespaces disabled, python missing)
// throws zk::error at construction, after a probe run: callers never fall back to
// running a program unsandboxed. What the program does (crash, hang, junk, a
// syntax error) is never an error: it is in sandbox_result.
#pragma once
#include <cstdint>
#include <string>

namespace zk {

struct sandbox_limits {
    double wall_s = 10;                    // the whole run, then SIGKILL
    int cpu_s = 5;                         // RLIMIT_CPU of each process (SIGXCPU, SIGKILL a second later)
    int64_t mem_bytes = int64_t(512) << 20;  // RLIMIT_AS of each process
    int nproc = 16;                        // processes + threads the sandbox may have at once
    int64_t output_bytes = 64 << 10;       // kept of stdout and of stderr, each
    int64_t scratch_bytes = 16 << 20;      // size of the writable /tmp
};

constexpr int64_t k_sandbox_tail = 4096;         // bytes of the end of stdout kept
constexpr unsigned k_sandbox_uid_base = 1000000000;  // sandbox uids under root: base .. base + 16e6

struct sandbox_result {
    int exit_code = -1;      // the program's exit status; 128 + N when signal N ended it
    bool timed_out = false;  // killed at the wall-time limit
    std::string out, err;    // the first output_bytes of stdout and of stderr
    std::string out_tail;    // the last k_sandbox_tail bytes of stdout
    int64_t out_total = 0, err_total = 0;  // bytes written, kept or not
    double wall_s = 0;
    bool truncated() const;
    // "exit 0", "exit 1", "killed by SIGXCPU (CPU time limit)", "wall time limit (10 s)", ...
    std::string describe() const;
};

class sandbox {
public:
    // python: the interpreter's absolute path; "" = /usr/bin/python3, else python3
    // on PATH. Finds bwrap on PATH and runs a probe program; throws zk::error (one
    // line, saying what to install or enable) when either is missing or the probe
    // does not print what it should.
    explicit sandbox(const sandbox_limits& lim, const std::string& python = "");

    // Runs `python3 -I -B /tmp/main.py` with `program` as main.py in a fresh sandbox.
    // Throws zk::error only when the sandbox itself could not be set up.
    sandbox_result run_python(const std::string& program) const;

    const sandbox_limits& limits() const { return lim_; }
    // "bubblewrap 0.8.0 (/usr/bin/bwrap), /usr/bin/python3 as uid 65534, ..." for reports.
    std::string describe() const;

private:
    sandbox_limits lim_;
    std::string bwrap_, python_, version_;
    bool drop_root_ = false;
    unsigned uid_ = 0, gid_ = 0;  // the user the sandbox runs as
};

}  // namespace zk
