// file_out (ggml-like/file_out.h): new and existing regular files are replaced
// whole through a temporary file, symlinks are followed and stay links, anything
// else is refused with nothing written, and a failed write leaves the old file
// and no temporary behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ggml-like/error.h"
#include "ggml-like/file_out.h"
#include "tests/temp_dir.h"

namespace {

using zk_test::temp_dir;

std::string slurp(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void spit(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const zk::error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST(file_out, new_file_gets_the_data_and_umask_mode) {
    temp_dir d;
    const mode_t um = umask(022);
    zk::file_out_write(d / "a.txt", "hello\n");
    umask(um);
    EXPECT_EQ(slurp(d / "a.txt"), "hello\n");
    struct stat st;
    ASSERT_EQ(stat((d / "a.txt").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0644u);
    EXPECT_EQ(d.names(), std::vector<std::string>{"a.txt"});
}

TEST(file_out, existing_file_is_replaced_and_keeps_its_mode) {
    temp_dir d;
    spit(d / "a.txt", "old old old");
    chmod((d / "a.txt").c_str(), 0600);
    zk::file_out_write(d / "a.txt", "new");
    EXPECT_EQ(slurp(d / "a.txt"), "new");
    struct stat st;
    ASSERT_EQ(stat((d / "a.txt").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600u);
    EXPECT_EQ(d.names(), std::vector<std::string>{"a.txt"});
}

TEST(file_out, large_streamed_output) {
    temp_dir d;
    std::string want;
    {
        zk::file_out f(d / "big.bin");
        for (int i = 0; i < 3000; i++) {
            const std::string chunk(1000 + i % 7, (char)('a' + i % 26));
            f.write(chunk);
            want += chunk;
        }
        EXPECT_FALSE(std::ifstream(d / "big.bin").good()) << "nothing at the path before commit";
        f.commit();
    }
    EXPECT_EQ(slurp(d / "big.bin"), want);
}

TEST(file_out, symlinks_are_followed_and_stay_links) {
    temp_dir d;
    mkdir((d / "sub").c_str(), 0755);
    spit(d / "sub/target.json", "old");
    ASSERT_EQ(symlink("sub/target.json", (d / "link1").c_str()), 0);  // relative to the link's directory
    ASSERT_EQ(symlink((d / "link1").c_str(), (d / "link2").c_str()), 0);
    EXPECT_EQ(zk::file_out_check(d / "link2"), d.path() + "/sub/target.json");
    zk::file_out_write(d / "link2", "new");
    struct stat st;
    ASSERT_EQ(lstat((d / "link1").c_str(), &st), 0);
    EXPECT_TRUE(S_ISLNK(st.st_mode));
    ASSERT_EQ(lstat((d / "link2").c_str(), &st), 0);
    EXPECT_TRUE(S_ISLNK(st.st_mode));
    EXPECT_EQ(slurp(d / "sub/target.json"), "new");
    // a dangling link: the file it names is created
    ASSERT_EQ(symlink("made.txt", (d / "dangling").c_str()), 0);
    zk::file_out_write(d / "dangling", "x");
    EXPECT_EQ(slurp(d / "made.txt"), "x");
    ASSERT_EQ(lstat((d / "dangling").c_str(), &st), 0);
    EXPECT_TRUE(S_ISLNK(st.st_mode));
    // a loop
    ASSERT_EQ(symlink("loop_b", (d / "loop_a").c_str()), 0);
    ASSERT_EQ(symlink("loop_a", (d / "loop_b").c_str()), 0);
    EXPECT_NE(error_of([&] { zk::file_out_write(d / "loop_a", "x"); }).find("symbolic links"), std::string::npos);
}

TEST(file_out, non_regular_targets_are_refused) {
    temp_dir d;
    mkdir((d / "dir").c_str(), 0755);
    ASSERT_EQ(mkfifo((d / "fifo").c_str(), 0644), 0);
    ASSERT_EQ(symlink("/dev/full", (d / "to_full").c_str()), 0);
    const std::vector<std::string> names_before = d.names();
    struct {
        std::string path, kind;
    } cases[] = {{d / "dir", "directory"},
                 {d / "fifo", "FIFO"},
                 {"/dev/full", "character device"},
                 {"/dev/null", "character device"},
                 {d / "to_full", "character device"}};
    for (const auto& c : cases) {
        const std::string e = error_of([&] { zk::file_out_write(c.path, "data"); });
        EXPECT_NE(e.find(c.kind), std::string::npos) << c.path << ": " << e;
        EXPECT_NE(e.find(c.path), std::string::npos) << e;
        EXPECT_EQ(e.find('\n'), std::string::npos) << "one line";
        EXPECT_THROW(zk::file_out_check(c.path), zk::error);
    }
    struct stat st;
    ASSERT_EQ(stat("/dev/full", &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode)) << "the device is untouched";
    ASSERT_EQ(lstat((d / "to_full").c_str(), &st), 0);
    EXPECT_TRUE(S_ISLNK(st.st_mode));
    EXPECT_EQ(d.names(), names_before) << "no temporary file left";
    EXPECT_NE(error_of([&] { zk::file_out_write(d / "missing/x.txt", "x"); }).find("does not exist"),
              std::string::npos);
    EXPECT_THROW(zk::file_out_check(""), zk::error);
}

// A write that fails half way (the file size limit, EFBIG) leaves the old file
// and no temporary file.
TEST(file_out, failed_write_leaves_the_old_file) {
    temp_dir d;
    spit(d / "out.bin", "precious");
    struct sigaction ign = {}, old = {};
    ign.sa_handler = SIG_IGN;
    sigaction(SIGXFSZ, &ign, &old);
    rlimit saved;
    getrlimit(RLIMIT_FSIZE, &saved);
    rlimit small = saved;
    small.rlim_cur = 4096;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
    const std::string e = error_of([&] { zk::file_out_write(d / "out.bin", std::string(3 << 20, 'z')); });
    setrlimit(RLIMIT_FSIZE, &saved);
    sigaction(SIGXFSZ, &old, nullptr);
    EXPECT_NE(e.find("write failed"), std::string::npos) << e;
    EXPECT_EQ(slurp(d / "out.bin"), "precious");
    EXPECT_EQ(d.names(), std::vector<std::string>{"out.bin"});
}

TEST(file_out, abandoned_writer_leaves_nothing) {
    temp_dir d;
    {
        zk::file_out f(d / "never.txt");
        f.write("partial");
    }
    EXPECT_TRUE(d.names().empty());
}
