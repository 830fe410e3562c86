#include "engine/eval/sandbox.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "ggml-like/error.h"

namespace zk {

namespace {

// The child's file descriptors: stdin, stdout, stderr, the program (read by
// bwrap's --file) and bwrap's JSON status; everything above is closed.
constexpr int k_fd_program = 3, k_fd_status = 4, k_fd_first_free = 5;

std::string find_on_path(const std::string& name) {
    const char* path = std::getenv("PATH");
    std::stringstream ss(path ? path : "/usr/local/bin:/usr/bin:/bin");
    std::string dir;
    while (std::getline(ss, dir, ':')) {
        if (dir.empty()) continue;
        const std::string p = dir + "/" + name;
        if (p.find('\'') == std::string::npos && ::access(p.c_str(), X_OK) == 0) return p;
    }
    return "";
}

std::string real_path(const std::string& p) {
    char buf[PATH_MAX];
    return ::realpath(p.c_str(), buf) ? std::string(buf) : p;
}

// Tasks (processes and threads, which is what RLIMIT_NPROC counts) whose real uid is `uid`.
int64_t count_tasks_of(unsigned uid) {
    DIR* d = ::opendir("/proc");
    if (!d) return 0;
    int64_t n = 0;
    while (dirent* e = ::readdir(d)) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        std::ifstream st(std::string("/proc/") + e->d_name + "/status");
        std::string line;
        long real_uid = -1, threads = 0;
        while (std::getline(st, line)) {
            if (line.rfind("Uid:", 0) == 0) real_uid = std::strtol(line.c_str() + 4, nullptr, 10);
            if (line.rfind("Threads:", 0) == 0) threads = std::strtol(line.c_str() + 8, nullptr, 10);
        }
        if (real_uid == (long)uid) n += std::max(threads, 1L);
    }
    ::closedir(d);
    return n;
}

const char* signal_name(int sig) {
    switch (sig) {
        case SIGKILL: return "SIGKILL";
        case SIGXCPU: return "SIGXCPU";
        case SIGXFSZ: return "SIGXFSZ";
        case SIGSEGV: return "SIGSEGV";
        case SIGABRT: return "SIGABRT";
        case SIGBUS: return "SIGBUS";
        case SIGTERM: return "SIGTERM";
        default: return nullptr;
    }
}

// A file descriptor that closes itself.
struct fd_owner {
    int fd = -1;
    fd_owner() = default;
    explicit fd_owner(int f) : fd(f) {}
    fd_owner(const fd_owner&) = delete;
    fd_owner& operator=(const fd_owner&) = delete;
    ~fd_owner() { reset(); }
    void reset(int f = -1) {
        if (fd >= 0) ::close(fd);
        fd = f;
    }
};

// A pipe whose ends sit at fd numbers >= k_fd_first_free (so the child's dup2 onto
// 0..4 never overwrites one it still needs), close-on-exec.
void make_pipe(fd_owner& r, fd_owner& w) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) ZK_THROW("sandbox: pipe failed: %s", std::strerror(errno));
    r.reset(::fcntl(p[0], F_DUPFD_CLOEXEC, k_fd_first_free));
    w.reset(::fcntl(p[1], F_DUPFD_CLOEXEC, k_fd_first_free));
    ::close(p[0]);
    ::close(p[1]);
    if (r.fd < 0 || w.fd < 0) ZK_THROW("sandbox: fcntl failed: %s", std::strerror(errno));
}

// Keeps the first `cap` bytes of a stream, and optionally its last `tail_cap`.
struct capture {
    std::string head, tail;
    int64_t total = 0, cap = 0, tail_cap = 0;
    void add(const char* p, size_t n) {
        total += (int64_t)n;
        if ((int64_t)head.size() < cap) head.append(p, std::min<size_t>(n, (size_t)(cap - (int64_t)head.size())));
        if (tail_cap > 0) {
            tail.append(p, n);
            if ((int64_t)tail.size() > 2 * tail_cap) tail.erase(0, tail.size() - (size_t)tail_cap);
        }
    }
    std::string tail_part() const {
        return (int64_t)tail.size() > tail_cap ? tail.substr(tail.size() - (size_t)tail_cap) : tail;
    }
};

}  // namespace

bool sandbox_result::truncated() const {
    return out_total > (int64_t)out.size() || err_total > (int64_t)err.size();
}

std::string sandbox_result::describe() const {
    if (timed_out) return strfmt("wall time limit (%.1f s)", wall_s);
    if (exit_code > 128 && exit_code < 128 + 65) {
        const int sig = exit_code - 128;
        const char* n = signal_name(sig);
        std::string s = n ? strfmt("killed by %s", n) : strfmt("killed by signal %d", sig);
        if (sig == SIGXCPU) s += " (CPU time limit)";
        if (sig == SIGXFSZ) s += " (file size limit)";
        return s;
    }
    return strfmt("exit %d", exit_code);
}

sandbox::sandbox(const sandbox_limits& lim, const std::string& python) : lim_(lim) {
    if (!(lim.wall_s > 0) || lim.cpu_s < 1 || lim.mem_bytes < (int64_t(32) << 20) || lim.nproc < 1 ||
        lim.output_bytes < 1 || lim.scratch_bytes < 4096)
        ZK_THROW("sandbox: limits out of range (wall %g s, cpu %d s, memory %lld bytes, %d processes, "
                 "output %lld bytes, scratch %lld bytes)", lim.wall_s, lim.cpu_s, (long long)lim.mem_bytes,
                 lim.nproc, (long long)lim.output_bytes, (long long)lim.scratch_bytes);
    bwrap_ = find_on_path("bwrap");
    if (bwrap_.empty())
        ZK_THROW("the code task runs generated programs only inside bubblewrap, and bwrap is not on PATH "
                 "(apt-get install bubblewrap, or scripts/setup.sh)");
    if (!python.empty()) {
        python_ = python;
    } else if (::access("/usr/bin/python3", X_OK) == 0) {
        python_ = "/usr/bin/python3";  // the system's, readable by any user (a pyenv shim under /root is not)
    } else {
        python_ = find_on_path("python3");
    }
    if (python_.empty() || python_[0] != '/' || ::access(python_.c_str(), X_OK) != 0)
        ZK_THROW("sandbox: no python3 interpreter at '%s' (give an absolute path to an executable)",
                 python_.c_str());
    python_ = real_path(python_);  // a symlink may point where the sandbox user can follow it anyway
    if (::geteuid() == 0) {
        // A uid (and gid) of no account, different for every sandbox of this process and
        // of concurrent processes: RLIMIT_NPROC then counts this sandbox's tasks alone.
        static std::atomic<unsigned> instance{0};
        drop_root_ = true;
        uid_ = gid_ = k_sandbox_uid_base + ((unsigned)::getpid() % 1000000u) * 16u + instance++ % 16u;
    } else {
        uid_ = ::getuid();
        gid_ = ::getgid();
    }
    {
        std::string out;
        FILE* f = ::popen(("'" + bwrap_ + "' --version 2>&1").c_str(), "r");  // a PATH entry, no quote in it
        if (f) {
            char buf[128];
            while (std::fgets(buf, sizeof buf, f)) out += buf;
            ::pclose(f);
        }
        while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
        version_ = out.empty() ? "bwrap" : out;
    }
    // Probe: the sandbox must run a program and return its output, or nothing runs.
    const sandbox_result r = run_python("import sys\nprint(sum(range(10)))\nsys.exit(3)\n");
    if (r.exit_code != 3 || r.out != "45\n") {
        std::string why = r.err.substr(0, r.err.find('\n'));
        if (why.empty()) why = r.describe();
        ZK_THROW("sandbox does not work (%s, %s as uid %u): %s", version_.c_str(), python_.c_str(), uid_,
                 why.c_str());
    }
}

std::string sandbox::describe() const {
    return strfmt("%s (%s), %s as uid %u; limits: wall %.1f s, CPU %d s, address space %lld MiB, %d tasks, "
                  "output %lld KiB, scratch %lld MiB",
                  version_.c_str(), bwrap_.c_str(), python_.c_str(), uid_, lim_.wall_s, lim_.cpu_s,
                  (long long)(lim_.mem_bytes >> 20), lim_.nproc, (long long)(lim_.output_bytes >> 10),
                  (long long)(lim_.scratch_bytes >> 20));
}

sandbox_result sandbox::run_python(const std::string& program) const {
    // ---- everything the child needs is built before fork (it may only make syscalls) ----
    fd_owner prog(::memfd_create("zack-sandbox-program", MFD_CLOEXEC));
    if (prog.fd < 0) ZK_THROW("sandbox: memfd_create failed: %s", std::strerror(errno));
    prog.reset(::fcntl(prog.fd, F_DUPFD_CLOEXEC, k_fd_first_free));
    for (size_t off = 0; off < program.size();) {
        const ssize_t w = ::write(prog.fd, program.data() + off, program.size() - off);
        if (w <= 0) ZK_THROW("sandbox: cannot write the program: %s", std::strerror(errno));
        off += (size_t)w;
    }
    ::lseek(prog.fd, 0, SEEK_SET);
    fd_owner null_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (null_fd.fd < 0) ZK_THROW("sandbox: cannot open /dev/null: %s", std::strerror(errno));
    null_fd.reset(::fcntl(null_fd.fd, F_DUPFD_CLOEXEC, k_fd_first_free));
    fd_owner out_r, out_w, err_r, err_w, st_r, st_w;
    make_pipe(out_r, out_w);
    make_pipe(err_r, err_w);
    make_pipe(st_r, st_w);

    const std::vector<std::string> args = {
        bwrap_, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
        "--hostname", "sandbox", "--ro-bind", "/", "/", "--dev", "/dev", "--remount-ro", "/dev", "--proc", "/proc",
        "--size", std::to_string(lim_.scratch_bytes), "--perms", "0700", "--tmpfs", "/tmp",
        "--file", std::to_string(k_fd_program), "/tmp/main.py", "--chdir", "/tmp",
        "--json-status-fd", std::to_string(k_fd_status), "--", python_, "-I", "-B", "/tmp/main.py"};
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const char* envp[] = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8", nullptr};

    // RLIMIT_NPROC counts every task of the user, inside the sandbox or not.
    const int64_t nproc = count_tasks_of(uid_) + lim_.nproc;
    const rlimit r_cpu = {(rlim_t)lim_.cpu_s, (rlim_t)lim_.cpu_s + 1};
    const rlimit r_as = {(rlim_t)lim_.mem_bytes, (rlim_t)lim_.mem_bytes};
    const rlimit r_nproc = {(rlim_t)nproc, (rlim_t)nproc};
    const rlimit r_fsize = {(rlim_t)lim_.scratch_bytes, (rlim_t)lim_.scratch_bytes};
    const rlimit r_nofile = {256, 256};
    const rlimit r_core = {0, 0};
    const bool drop = drop_root_;
    const unsigned uid = uid_, gid = gid_;
    const int fds[5] = {null_fd.fd, out_w.fd, err_w.fd, prog.fd, st_w.fd};

    const auto t0 = std::chrono::steady_clock::now();
    const pid_t pid = ::fork();
    if (pid < 0) ZK_THROW("sandbox: fork failed: %s", std::strerror(errno));
    if (pid == 0) {
        // Child: async-signal-safe calls only (zack's worker threads do not exist here).
        ::setsid();  // its own process group, so the parent can kill the whole group
        for (int i = 0; i < 5; i++)
            if (::dup2(fds[i], i) < 0) ::_exit(125);
#ifdef SYS_close_range
        if (::syscall(SYS_close_range, k_fd_first_free, ~0U, 0) != 0)
#endif
            for (int f = k_fd_first_free; f < 65536; f++) ::close(f);
        if (::setrlimit(RLIMIT_CPU, &r_cpu) || ::setrlimit(RLIMIT_AS, &r_as) || ::setrlimit(RLIMIT_FSIZE, &r_fsize) ||
            ::setrlimit(RLIMIT_NOFILE, &r_nofile) || ::setrlimit(RLIMIT_CORE, &r_core))
            ::_exit(125);
        if (drop) {
            // Raw syscalls: glibc's setuid() broadcasts to threads, which a forked child must not rely on.
            if (::syscall(SYS_setgroups, 0, nullptr) || ::syscall(SYS_setresgid, gid, gid, gid) ||
                ::syscall(SYS_setresuid, uid, uid, uid))
                ::_exit(125);
        }
        if (::setrlimit(RLIMIT_NPROC, &r_nproc)) ::_exit(125);
        if (::chdir("/") != 0) ::_exit(125);
        ::execve(argv[0], argv.data(), const_cast<char**>(envp));
        ::_exit(127);
    }
    // ---- parent ----
    out_w.reset();
    err_w.reset();
    st_w.reset();
    prog.reset();
    null_fd.reset();

    capture out, err, status;
    out.cap = lim_.output_bytes;
    out.tail_cap = k_sandbox_tail;
    err.cap = lim_.output_bytes;
    status.cap = 1 << 16;
    sandbox_result res;
    const auto deadline = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>(lim_.wall_s));
    bool killed = false;
    std::chrono::steady_clock::time_point kill_time;
    char buf[65536];
    while (out_r.fd >= 0 || err_r.fd >= 0 || st_r.fd >= 0) {
        const auto now = std::chrono::steady_clock::now();
        if (!killed && now >= deadline) {
            ::kill(-pid, SIGKILL);  // bwrap and its pid 1; the PID namespace goes with them
            ::kill(pid, SIGKILL);
            killed = true;
            res.timed_out = true;
            kill_time = now;
        }
        // After a kill, give the pipes a moment to reach EOF, then stop reading.
        if (killed && now - kill_time > std::chrono::seconds(2)) break;
        const auto until = killed ? kill_time + std::chrono::seconds(2) : deadline;
        const int wait_ms = (int)std::max<int64_t>(
            1, std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count());
        pollfd p[3];
        capture* sink[3];
        fd_owner* owner[3];
        int n = 0;
        for (auto [o, c] : {std::pair{&out_r, &out}, std::pair{&err_r, &err}, std::pair{&st_r, &status}}) {
            if (o->fd < 0) continue;
            p[n] = {o->fd, POLLIN, 0};
            sink[n] = c;
            owner[n] = o;
            n++;
        }
        const int pr = ::poll(p, (nfds_t)n, wait_ms);
        if (pr < 0 && errno != EINTR) {
            ::kill(-pid, SIGKILL);
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
            ZK_THROW("sandbox: poll failed: %s", std::strerror(errno));
        }
        for (int i = 0; i < n && pr > 0; i++) {
            if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            const ssize_t k = ::read(p[i].fd, buf, sizeof buf);
            if (k > 0) sink[i]->add(buf, (size_t)k);
            else if (k == 0 || (errno != EINTR && errno != EAGAIN)) owner[i]->reset();
        }
    }
    int wst = 0;
    while (::waitpid(pid, &wst, 0) < 0 && errno == EINTR) {
    }
    res.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    res.out = std::move(out.head);
    res.out_tail = out.tail_part();
    res.out_total = out.total;
    res.err = std::move(err.head);
    res.err_total = err.total;
    if (WIFEXITED(wst)) res.exit_code = WEXITSTATUS(wst);
    else if (WIFSIGNALED(wst)) res.exit_code = 128 + WTERMSIG(wst);

    // bwrap reports {"child-pid": N} once the sandbox is set up and the program
    // started, and {"exit-code": N} when it ends: without the first, it was the
    // sandbox that failed, not the program.
    bool started = false;
    std::stringstream ls(status.head);
    std::string line;
    while (std::getline(ls, line)) {
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (!j.is_object()) continue;
        if (j.contains("child-pid")) started = true;
        if (j.contains("exit-code") && j["exit-code"].is_number_integer()) res.exit_code = j["exit-code"].get<int>();
    }
    if (!started && !res.timed_out) {
        if (res.exit_code == 125) ZK_THROW("sandbox: setting limits or dropping to uid %u failed", uid_);
        if (res.exit_code == 127) ZK_THROW("sandbox: cannot execute %s", bwrap_.c_str());
        std::string why = res.err.substr(0, res.err.find('\n'));
        ZK_THROW("sandbox: bwrap could not start the program (%s): %s", res.describe().c_str(),
                 why.empty() ? "no message" : why.c_str());
    }
    return res;
}

}  // namespace zk
