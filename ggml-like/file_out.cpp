// Output files that never clobber; the rules are in file_out.h.
#include "ggml-like/file_out.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "ggml-like/error.h"

namespace zk {

namespace {

constexpr size_t k_file_out_buffer = 1 << 20;
constexpr int k_file_out_max_links = 40;  // as the kernel's ELOOP limit

std::string file_out_dirname(const std::string& p) {
    const size_t s = p.find_last_of('/');
    if (s == std::string::npos) return ".";
    return s == 0 ? "/" : p.substr(0, s);
}

std::string file_out_basename(const std::string& p) {
    const size_t s = p.find_last_of('/');
    return s == std::string::npos ? p : p.substr(s + 1);
}

const char* file_out_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

// "PATH" or "PATH -> TARGET" for messages.
std::string file_out_name(const std::string& path, const std::string& target) {
    return target == path ? path : path + " -> " + target;
}

// Follows a chain of symlinks from `path`; returns the final path (which may not
// exist) and, in *st / *exists, what is there.
std::string file_out_resolve(const std::string& path, struct stat* st, bool* exists) {
    std::string p = path;
    for (int hop = 0; hop <= k_file_out_max_links; hop++) {
        if (lstat(p.c_str(), st) != 0) {
            if (errno != ENOENT) ZK_THROW("%s: cannot write: %s", file_out_name(path, p).c_str(), std::strerror(errno));
            *exists = false;
            return p;
        }
        if (!S_ISLNK(st->st_mode)) {
            *exists = true;
            return p;
        }
        std::vector<char> buf((size_t)st->st_size + 2 > 256 ? (size_t)st->st_size + 2 : 256);
        const ssize_t n = readlink(p.c_str(), buf.data(), buf.size() - 1);
        if (n < 0) ZK_THROW("%s: cannot read the symbolic link: %s", p.c_str(), std::strerror(errno));
        std::string link(buf.data(), (size_t)n);
        p = link[0] == '/' ? link : file_out_dirname(p) + "/" + link;
    }
    ZK_THROW("%s: too many levels of symbolic links", path.c_str());
}

}  // namespace

std::string file_out_check(const std::string& path) {
    if (path.empty()) ZK_THROW("empty output path");
    struct stat st;
    bool exists = false;
    const std::string target = file_out_resolve(path, &st, &exists);
    if (exists && !S_ISREG(st.st_mode))
        ZK_THROW("%s: is %s, not a regular file; zack writes outputs only to regular files (nothing written)",
                 file_out_name(path, target).c_str(), file_out_kind(st.st_mode));
    const std::string dir = file_out_dirname(target);
    struct stat ds;
    if (stat(dir.c_str(), &ds) != 0 || !S_ISDIR(ds.st_mode))
        ZK_THROW("%s: the directory '%s' does not exist", file_out_name(path, target).c_str(), dir.c_str());
    if (access(dir.c_str(), W_OK) != 0)
        ZK_THROW("%s: cannot create files in '%s': %s", file_out_name(path, target).c_str(), dir.c_str(),
                 std::strerror(errno));
    return target;
}

file_out::file_out(const std::string& path) : path_(path) {
    target_ = file_out_check(path);
    struct stat st;
    mode_t mode;
    if (stat(target_.c_str(), &st) == 0) {
        mode = st.st_mode & 07777;
    } else {
        const mode_t um = umask(0);
        umask(um);
        mode = 0666 & ~um;
    }
    tmp_ = file_out_dirname(target_) + "/." + file_out_basename(target_) + ".XXXXXX";
    std::vector<char> name(tmp_.begin(), tmp_.end());
    name.push_back('\0');
    {
        const interrupt_hold hold;  // a Ctrl-C now waits until the temporary is registered
        fd_ = mkostemp(name.data(), O_CLOEXEC);
        if (fd_ >= 0) on_signal_.track(name.data());
    }
    if (fd_ < 0) {
        const int err = errno;
        tmp_.clear();
        ZK_THROW("%s: cannot create a temporary file in '%s': %s", file_out_name(path_, target_).c_str(),
                 file_out_dirname(target_).c_str(), std::strerror(err));
    }
    tmp_ = name.data();
    if (fchmod(fd_, mode) != 0) fail("chmod", errno);
    buf_.reserve(k_file_out_buffer);
}

file_out::~file_out() {
    if (fd_ >= 0) close(fd_);
    if (!tmp_.empty()) unlink(tmp_.c_str());
}

void file_out::fail(const char* what, int err) {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    if (!tmp_.empty()) unlink(tmp_.c_str());
    tmp_.clear();
    on_signal_.release();
    ZK_THROW("%s: %s failed: %s (nothing written)", file_out_name(path_, target_).c_str(), what, std::strerror(err));
}

void file_out::flush_buffer() {
    size_t done = 0;
    while (done < buf_.size()) {
        const ssize_t n = ::write(fd_, buf_.data() + done, buf_.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fail("write", n < 0 ? errno : EIO);
        done += (size_t)n;
    }
    buf_.clear();
}

void file_out::write(const void* data, size_t n) {
    if (fd_ < 0) ZK_THROW("%s: write after commit", path_.c_str());
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        const size_t take = std::min(n, k_file_out_buffer - buf_.size());
        buf_.append(p, take);
        p += take;
        n -= take;
        if (buf_.size() == k_file_out_buffer) flush_buffer();
    }
}

void file_out::commit() {
    if (fd_ < 0) ZK_THROW("%s: committed twice", path_.c_str());
    flush_buffer();
    if (fsync(fd_) != 0) fail("fsync", errno);
    const int fd = fd_;
    fd_ = -1;
    if (close(fd) != 0) fail("close", errno);
    if (rename(tmp_.c_str(), target_.c_str()) != 0) fail("rename", errno);
    tmp_.clear();
    on_signal_.release();
}

file_scratch::file_scratch(const std::string& target, const char* tag) {
    const std::string dir = file_out_dirname(target);
    std::string pat = dir + "/." + file_out_basename(target) + "." + tag + ".XXXXXX";
    std::vector<char> name(pat.begin(), pat.end());
    name.push_back('\0');
    int fd;
    {
        const interrupt_hold hold;  // registered before a Ctrl-C can end the process
        fd = mkostemp(name.data(), O_CLOEXEC);
        if (fd >= 0) on_signal_.track(name.data());
    }
    if (fd < 0)
        ZK_THROW("%s: cannot create a scratch file in '%s': %s", target.c_str(), dir.c_str(), std::strerror(errno));
    close(fd);
    path_ = name.data();
}

file_scratch::~file_scratch() {
    unlink(path_.c_str());
    on_signal_.release();
}

void file_out_write(const std::string& path, const std::string& data) {
    file_out f(path);
    f.write(data);
    f.commit();
}

// ---------------------------------------------------------------------------
// Standard output
// ---------------------------------------------------------------------------

static void file_out_stdout_error(int err) {
    ZK_THROW("writing to standard output: %s", std::strerror(err ? err : EIO));
}

void file_out_stdout(const std::string& text) {
    if (!text.empty() && std::fwrite(text.data(), 1, text.size(), stdout) != text.size())
        file_out_stdout_error(errno);
    if (std::fflush(stdout) != 0) file_out_stdout_error(errno);
}

void file_out_stdout_finish() {
    errno = 0;
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) file_out_stdout_error(errno);
}

}  // namespace zk
