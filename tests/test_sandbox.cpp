// The sandbox of the code task against programs that misbehave on purpose: each
// attempt is contained (a write outside the scratch directory fails and nothing
// appears on the host, no connection reaches a listener on the host's loopback,
// a fork bomb meets the process limit, memory, CPU and wall-time limits end the
// program, megabytes of output are cut) and the outcome is a result, never an
// exception. Every test also checks the premise that makes it meaningful (the
// host can write where the sandbox cannot, the listener does accept the host).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>

#include "engine/eval/sandbox.h"
#include "ggml-like/error.h"

namespace zk {
namespace {

sandbox_limits quick_limits() {
    sandbox_limits l;
    l.wall_s = 5;
    l.cpu_s = 2;
    l.mem_bytes = int64_t(256) << 20;
    l.nproc = 16;
    l.output_bytes = 4096;
    l.scratch_bytes = 4 << 20;
    return l;
}

const sandbox& shared_sandbox() {
    static sandbox sb(quick_limits());
    return sb;
}

bool exists(const std::string& p) {
    struct stat st;
    return ::lstat(p.c_str(), &st) == 0;
}

// The sandbox user's uid, from the description ("... as uid N; ...").
unsigned sandbox_uid(const sandbox& sb) {
    const std::string d = sb.describe();
    const size_t at = d.find(" as uid ");
    EXPECT_NE(at, std::string::npos) << d;
    return (unsigned)std::strtoul(d.c_str() + at + 8, nullptr, 10);
}

// Processes on the host whose real uid is `uid`.
int processes_of(unsigned uid) {
    DIR* d = ::opendir("/proc");
    int n = 0;
    while (dirent* e = d ? ::readdir(d) : nullptr) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        std::ifstream st(std::string("/proc/") + e->d_name + "/status");
        std::string line;
        while (std::getline(st, line))
            if (line.rfind("Uid:", 0) == 0) {
                if (std::strtoul(line.c_str() + 4, nullptr, 10) == uid) n++;
                break;
            }
    }
    if (d) ::closedir(d);
    return n;
}

TEST(Sandbox, RunsAProgramAndReportsItsOutcome) {
    const sandbox_result r = shared_sandbox().run_python(
        "import sys, os\nprint('out', os.getcwd())\nprint('err', file=sys.stderr)\nsys.exit(7)\n");
    EXPECT_EQ(r.exit_code, 7);
    EXPECT_FALSE(r.timed_out);
    EXPECT_EQ(r.out, "out /tmp\n");
    EXPECT_EQ(r.out_tail, "out /tmp\n");
    EXPECT_EQ(r.err, "err\n");
    EXPECT_FALSE(r.truncated());
    EXPECT_EQ(r.describe(), "exit 7");

    const sandbox_result e = shared_sandbox().run_python("def f(:\n");
    EXPECT_EQ(e.exit_code, 1);
    EXPECT_NE(e.err.find("SyntaxError"), std::string::npos) << e.err;
}

TEST(Sandbox, ScratchIsTheOnlyWritablePlaceAndIsFresh) {
    // The scratch directory holds only the program, takes writes, and starts empty each run.
    const std::string name = "zack_sandbox_scratch_" + std::to_string(::getpid());
    const sandbox_result a = shared_sandbox().run_python(
        "import os\nprint(sorted(os.listdir('.')))\nopen('" + name + "', 'w').write('x')\n"
        "print(open('/tmp/" + name + "').read())\n");
    EXPECT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(a.out, "['main.py']\nx\n");
    EXPECT_FALSE(exists("/tmp/" + name)) << "a scratch file appeared in the host's /tmp";
    const sandbox_result b = shared_sandbox().run_python("import os\nprint(sorted(os.listdir('/tmp')))\n");
    EXPECT_EQ(b.out, "['main.py']\n") << "the scratch directory is not fresh";
}

TEST(Sandbox, WritesOutsideTheScratchDirectoryFail) {
    // A world-writable directory on the host (so only the sandbox's read-only view
    // can stop the write), in the test's working directory, not under /tmp.
    char tmpl[] = "zack_sandbox_probe_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    char cwd[4096];
    ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
    const std::string open_dir = std::string(cwd) + "/" + tmpl;
    ASSERT_EQ(::chmod(open_dir.c_str(), 0777), 0);
    {  // premise: the host can write there
        std::ofstream f(open_dir + "/premise");
        ASSERT_TRUE(f.good());
    }
    ::unlink((open_dir + "/premise").c_str());
    const char* home = std::getenv("HOME");
    const std::vector<std::string> targets = {open_dir + "/evil", std::string(home && *home ? home : "/root") + "/evil",
                                              std::string(ZACK_SOURCE_DIR) + "/evil", "/var/tmp/evil",
                                              "/dev/shm/evil", "/etc/evil", "/dev/evil"};
    std::string prog = "import os\n";
    for (const std::string& t : targets)
        prog += "try:\n    open('" + t + "', 'w').write('x')\n    print('WROTE " + t +
                "')\nexcept OSError as e:\n    print('denied', e.errno)\n";
    prog += "try:\n    os.mkdir('" + open_dir + "/evil_dir')\n    print('WROTE dir')\n"
            "except OSError as e:\n    print('denied', e.errno)\n";
    const sandbox_result r = shared_sandbox().run_python(prog);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.find("WROTE"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("denied"), 0u) << r.out;
    for (const std::string& t : targets) EXPECT_FALSE(exists(t)) << t << " appeared on the host";
    EXPECT_FALSE(exists(open_dir + "/evil_dir"));
    ::rmdir(open_dir.c_str());
}

TEST(Sandbox, NoNetworkNotEvenTheHostLoopback) {
    // A listener on the host's 127.0.0.1 that the host itself can reach.
    const int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(ls, 0);
    sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(ls, (sockaddr*)&a, sizeof a), 0);
    ASSERT_EQ(::listen(ls, 8), 0);
    socklen_t len = sizeof a;
    ASSERT_EQ(::getsockname(ls, (sockaddr*)&a, &len), 0);
    const int port = ntohs(a.sin_port);
    {  // premise: the host connects
        const int c = ::socket(AF_INET, SOCK_STREAM, 0);
        ASSERT_EQ(::connect(c, (sockaddr*)&a, sizeof a), 0);
        ::close(c);
        usleep(20000);
        const int got = ::accept(ls, nullptr, nullptr);
        ASSERT_GE(got, 0) << "the host's own connection did not arrive";
        ::close(got);
    }
    const sandbox_result r = shared_sandbox().run_python(
        "import socket\n"
        "try:\n    s = socket.create_connection(('127.0.0.1', " + std::to_string(port) + "), timeout=2)\n"
        "    print('CONNECTED')\nexcept OSError as e:\n    print('connect failed', e.errno)\n"
        "try:\n    socket.getaddrinfo('example.com', 80)\n    print('RESOLVED')\n"
        "except OSError as e:\n    print('resolve failed')\n"
        "try:\n    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "    u.sendto(b'x', ('8.8.8.8', 53))\n    print('SENT')\nexcept OSError as e:\n    print('send failed', e.errno)\n");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.find("CONNECTED"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("RESOLVED"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("SENT"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("connect failed"), std::string::npos) << r.out;
    usleep(20000);
    EXPECT_LT(::accept(ls, nullptr, nullptr), 0) << "a connection from the sandbox reached the host";
    ::close(ls);
}

TEST(Sandbox, ForkBombMeetsTheProcessLimitAndLeavesNothingBehind) {
    const sandbox& sb = shared_sandbox();
    const unsigned uid = sandbox_uid(sb);
    const int before = processes_of(uid);
    // Counting forks until the limit bites: children sleep, so they are all alive at once.
    const sandbox_result c = sb.run_python(
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30)\n"
        "            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('limit after', n, e.errno)\n");
    EXPECT_EQ(c.exit_code, 0) << c.err;
    ASSERT_EQ(c.out.rfind("limit after ", 0), 0u) << c.out;
    const int forks = std::atoi(c.out.c_str() + 12);
    EXPECT_GT(forks, 0);
    EXPECT_LT(forks, quick_limits().nproc) << c.out;
    EXPECT_NE(c.out.find(" 11\n"), std::string::npos) << "EAGAIN expected: " << c.out;
    EXPECT_LT(c.wall_s, 3.0) << "the sleeping children must die with the program";

    // The real thing: every process forks forever and ignores the failures.
    sandbox_limits l = quick_limits();
    l.wall_s = 2;
    const sandbox bomb_sb(l);
    const sandbox_result r =
        bomb_sb.run_python("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n");
    EXPECT_TRUE(r.timed_out || r.exit_code > 128) << r.describe();
    EXPECT_LT(r.wall_s, 5.0);
    usleep(200000);
    EXPECT_LE(processes_of(uid), before) << "processes of the sandbox user outlived it";
}

TEST(Sandbox, MemoryCpuAndWallLimitsEndTheProgram) {
    const sandbox& sb = shared_sandbox();
    const sandbox_result m =
        sb.run_python("x = []\nwhile True:\n    x.append(bytearray(16 << 20))\n");
    EXPECT_FALSE(m.timed_out);
    EXPECT_EQ(m.exit_code, 1);
    EXPECT_NE(m.err.find("MemoryError"), std::string::npos) << m.err;

    sandbox_limits l = quick_limits();
    l.cpu_s = 1;
    l.wall_s = 20;
    const sandbox cpu_sb(l);
    const sandbox_result c = cpu_sb.run_python("while True:\n    pass\n");
    EXPECT_FALSE(c.timed_out) << "the CPU limit should act before the wall time";
    EXPECT_TRUE(c.exit_code == 128 + SIGXCPU || c.exit_code == 128 + SIGKILL) << c.describe();
    EXPECT_LT(c.wall_s, 15.0);

    l = quick_limits();
    l.wall_s = 1;
    const sandbox wall_sb(l);
    const sandbox_result w = wall_sb.run_python("import time\nprint('start', flush=True)\ntime.sleep(600)\n");
    EXPECT_TRUE(w.timed_out);
    EXPECT_EQ(w.out, "start\n");
    EXPECT_GE(w.wall_s, 1.0);
    EXPECT_LT(w.wall_s, 4.0);
    EXPECT_NE(w.describe().find("wall time"), std::string::npos);
}

TEST(Sandbox, OutputIsTruncatedAndTheTailKept) {
    const sandbox_result r = shared_sandbox().run_python(
        "import sys\nfor i in range(50000):\n    sys.stdout.write('junk %07d ' % i * 10 + '\\n')\n"
        "    sys.stderr.write('noise ' * 20 + '\\n')\nprint('THE END')\n");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ((int64_t)r.out.size(), quick_limits().output_bytes);
    EXPECT_EQ((int64_t)r.err.size(), quick_limits().output_bytes);
    EXPECT_GT(r.out_total, int64_t(5) << 20);
    EXPECT_EQ(r.err_total, int64_t(50000) * 121);
    EXPECT_TRUE(r.truncated());
    EXPECT_EQ((int64_t)r.out_tail.size(), k_sandbox_tail);
    EXPECT_EQ(r.out_tail.substr(r.out_tail.size() - 8), "THE END\n");
}

TEST(Sandbox, ScratchSpaceIsBounded) {
    const sandbox_result r = shared_sandbox().run_python(
        "try:\n    with open('big', 'wb') as f:\n        for _ in range(64):\n            f.write(b'x' * (1 << 20))\n"
        "    print('WROTE 64 MiB')\nexcept OSError as e:\n    print('full', e.errno)\n");
    EXPECT_EQ(r.out.find("WROTE"), std::string::npos) << r.out;
    EXPECT_TRUE(r.out.rfind("full", 0) == 0 || r.exit_code == 128 + SIGXFSZ) << r.describe() << " " << r.out;
}

TEST(Sandbox, SeesNoSecretsOfTheCaller) {
    ::setenv("ZACK_SANDBOX_SECRET", "hunter2", 1);
    const sandbox_result r = shared_sandbox().run_python(
        "import os\nprint(sorted(os.environ))\nprint(os.getuid())\nprint(sorted(os.listdir('/proc/self/fd')))\n");
    ::unsetenv("ZACK_SANDBOX_SECRET");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.find("hunter2"), std::string::npos);
    EXPECT_EQ(r.out.find("ZACK_SANDBOX_SECRET"), std::string::npos) << r.out;
    const unsigned uid = sandbox_uid(shared_sandbox());
    EXPECT_NE(r.out.find("\n" + std::to_string(uid) + "\n"), std::string::npos) << r.out;
    if (::geteuid() == 0) {
        EXPECT_GE(uid, k_sandbox_uid_base) << "under root the sandbox must not run as root";
    }
    // stdin, stdout, stderr and the directory listing itself: no descriptor of zack leaks in.
    EXPECT_NE(r.out.find("['0', '1', '2', '3']"), std::string::npos) << r.out;
}

TEST(Sandbox, RefusesBadLimitsAndAMissingInterpreter) {
    sandbox_limits l = quick_limits();
    l.nproc = 0;
    EXPECT_THROW(sandbox{l}, error);
    l = quick_limits();
    l.mem_bytes = 1 << 20;
    EXPECT_THROW(sandbox{l}, error);
    EXPECT_THROW(sandbox(quick_limits(), "/nonexistent/python3"), error);
    EXPECT_THROW(sandbox(quick_limits(), "python3"), error);  // not an absolute path
}

TEST(Sandbox, RefusesToRunWithoutBubblewrap) {
    const char* old = std::getenv("PATH");
    const std::string saved = old ? old : "";
    ::setenv("PATH", "/nonexistent", 1);
    try {
        sandbox sb(quick_limits());
        ::setenv("PATH", saved.c_str(), 1);
        FAIL() << "a sandbox without bwrap was created";
    } catch (const error& e) {
        ::setenv("PATH", saved.c_str(), 1);
        EXPECT_NE(std::string(e.what()).find("bwrap"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace zk
