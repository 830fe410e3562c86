// Signals (ggml-like/interrupt.h), in forked children so that the handlers can
// really end a process: SIGINT and SIGTERM remove the registered temporary
// files and exit 130 / 143; SIGPIPE removes them and ends quietly by SIGPIPE;
// and the GGUF writer's file_out registers its temporary, so Ctrl-C in the
// middle of writing a model leaves neither the output nor the temporary.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "ggml-like/gguf.h"
#include "ggml-like/interrupt.h"
#include "ggml-like/threadpool.h"
#include "tests/temp_dir.h"

namespace fs = std::filesystem;

namespace {

class Interrupt : public zk_test::TempDirTest {
protected:
    Interrupt() : TempDirTest("zk_interrupt") {}

    // Runs fn in a child with the handlers installed; returns its wait status
    // and what it wrote on stderr.
    int in_child(const std::function<void()>& fn, std::string* err = nullptr) {
        int fds[2];
        EXPECT_EQ(pipe(fds), 0);
        const pid_t pid = fork();
        if (pid == 0) {
            dup2(fds[1], STDERR_FILENO);
            close(fds[0]);
            zk::interrupt_install();
            fn();
            _exit(0);
        }
        close(fds[1]);
        std::string text;
        char buf[256];
        ssize_t n;
        while ((n = read(fds[0], buf, sizeof buf)) > 0) text.append(buf, (size_t)n);
        close(fds[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        if (err) *err = text;
        return status;
    }
    // In a child: under interrupt_hold (as file_out holds it), creates out.tmp,
    // lets send() deliver a SIGINT, marks reached.txt and registers out.tmp; the
    // signal must wait for the hold's end, then remove the registered file and
    // end the process (exit 130) before after.txt: only reached.txt is left.
    // setup() runs first in the child.
    void expect_held_until_registered(const std::function<void()>& setup, const std::function<void()>& send);
};

void touch(const std::string& p) { std::ofstream(p) << "partial"; }

TEST_F(Interrupt, SigintRemovesRegisteredTemporariesAndExits130) {
    std::string err;
    const int st = in_child(
        [&] {
            touch(path("kept.txt"));
            touch(path("out.tmp"));
            zk::interrupt_temp a(path("out.tmp"));
            { zk::interrupt_temp done(path("kept.txt")); }  // renamed already: no longer registered
            raise(SIGINT);
        },
        &err);
    ASSERT_TRUE(WIFEXITED(st)) << st;
    EXPECT_EQ(WEXITSTATUS(st), 130);
    EXPECT_EQ(files(), std::vector<std::string>{"kept.txt"});
    EXPECT_NE(err.find("zack: interrupted"), std::string::npos) << err;
}

TEST_F(Interrupt, SigtermExits143) {
    const int st = in_child([&] {
        touch(path("out.tmp"));
        zk::interrupt_temp a(path("out.tmp"));
        raise(SIGTERM);
    });
    ASSERT_TRUE(WIFEXITED(st)) << st;
    EXPECT_EQ(WEXITSTATUS(st), 143);
    EXPECT_TRUE(files().empty());
}

// A closed pipe on stdout (`zack ... | head`): no message, the temporary goes,
// and the process ends by SIGPIPE as pipeline stages do.
TEST_F(Interrupt, SigpipeEndsQuietly) {
    std::string err;
    const int st = in_child(
        [&] {
            int p[2];
            if (pipe(p) != 0) _exit(3);
            close(p[0]);
            dup2(p[1], STDOUT_FILENO);
            touch(path("out.tmp"));
            zk::interrupt_temp a(path("out.tmp"));
            const char line[] = "tensor table\n";
            for (int i = 0; i < 100; i++) (void)!write(STDOUT_FILENO, line, sizeof line - 1);
            _exit(4);  // not reached: the first write raises SIGPIPE
        },
        &err);
    ASSERT_TRUE(WIFSIGNALED(st)) << st;
    EXPECT_EQ(WTERMSIG(st), SIGPIPE);
    EXPECT_EQ(err, "");
    EXPECT_TRUE(files().empty());
}

// Ctrl-C while gguf_writer streams a 256 MB tensor: the signal arrives as soon
// as the temporary file shows up, and neither it nor the output remains.
TEST_F(Interrupt, CtrlCWhileWritingAModelLeavesNothing) {
    const int st = in_child([&] {
        std::vector<uint8_t> big((size_t)256 << 20, 1);
        zk::gguf_writer w;
        w.set("general.architecture", zk::gguf_value::make_str("llama"));
        w.add_tensor_ref("t", zk::dtype::F32, {(int64_t)big.size() / 4}, big.data(), big.size());
        std::thread ctrl_c([&] {
            const auto t0 = std::chrono::steady_clock::now();
            for (;;) {
                for (const auto& e : fs::directory_iterator(dir_))
                    if (e.path().filename() != "model.gguf") {  // the temporary (file_out)
                        kill(getpid(), SIGINT);
                        return;
                    }
                if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) _exit(5);
                std::this_thread::sleep_for(std::chrono::microseconds(200));
            }
        });
        w.write(path("model.gguf"));
        ctrl_c.join();
        _exit(6);  // the write finished before the signal landed
    });
    ASSERT_TRUE(WIFEXITED(st)) << st;
    EXPECT_EQ(WEXITSTATUS(st), 130);
    EXPECT_TRUE(files().empty()) << files().size() << " files left, first " << files()[0];
}

}  // namespace

void Interrupt::expect_held_until_registered(const std::function<void()>& setup,
                                             const std::function<void()>& send) {
    std::string err;
    const int st = in_child(
        [&] {
            setup();
            zk::interrupt_temp t;
            {
                const zk::interrupt_hold hold;
                touch(path("out.tmp"));
                send();
                touch(path("reached.txt"));
                t.track(path("out.tmp"));
            }
            touch(path("after.txt"));  // not reached: the held SIGINT ends the process
        },
        &err);
    ASSERT_TRUE(WIFEXITED(st)) << st;
    EXPECT_EQ(WEXITSTATUS(st), 130);
    EXPECT_EQ(files(), std::vector<std::string>{"reached.txt"}) << err;
}

// A Ctrl-C that arrives while a temporary is being created and registered
// waits until the registration is done, then removes the file: nothing is left
// (test_signals.py met this window once in CI, interrupting calibrate as soon
// as its temporary appeared).
TEST_F(Interrupt, SignalDuringCreationWaitsForTheRegistration) {
    expect_held_until_registered([] {}, [] { raise(SIGINT); });  // held back in this thread
}

// The same with other threads running, and the signal sent to the process
// rather than raised in the thread: the kernel delivers it to any thread that
// does not block it (the CI failure of test_signals.py: calibrate -t 2 left its
// scratch file behind). A plain thread that blocks nothing stands for the
// threads OpenBLAS starts before main(); the handler it runs must defer.
TEST_F(Interrupt, ProcessSignalWithOtherThreadsWaitsForTheRegistration) {
    std::unique_ptr<zk::thread_pool> pool;
    expect_held_until_registered(
        [&] {
            pool = std::make_unique<zk::thread_pool>(4);
            pool->run([](int, int) {});
            std::thread([] {
                for (;;) std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }).detach();
        },
        [] {
            kill(getpid(), SIGINT);
            // give a thread that could take it time to run the handler
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        });
}

// Every worker of a pool runs with the three signals blocked. parallel_for
// names the thread (0 is the caller, whose mask is its own); chunks that take
// a while give both workers time to take some.
TEST(InterruptPool, WorkersBlockTheSignals) {
    zk::thread_pool pool(3);
    std::atomic<int> worker_chunks{0}, blocked{0};
    std::atomic<int> seen[3] = {{0}, {0}, {0}};
    for (int rep = 0; rep < 50 && !(seen[1] && seen[2]); rep++)
        pool.parallel_for(12, 1, [&](int64_t, int64_t, int ith) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            seen[ith] = 1;
            if (ith == 0) return;
            worker_chunks++;
            sigset_t cur;
            pthread_sigmask(SIG_BLOCK, nullptr, &cur);
            if (sigismember(&cur, SIGINT) && sigismember(&cur, SIGTERM) && sigismember(&cur, SIGPIPE)) blocked++;
        });
    EXPECT_TRUE(seen[1] && seen[2]) << "both workers took part";
    EXPECT_EQ(blocked.load(), worker_chunks.load());
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, nullptr, &cur);
    EXPECT_FALSE(sigismember(&cur, SIGINT)) << "the creating thread's mask is restored";
}
