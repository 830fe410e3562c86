// Output files that never clobber: every file zack writes (calibrate's .zack,
// eval --json/--plot/--csv and its logits file, bench --output-file, saved
// corpora and chats, the chat history) goes through this one module, and so does
// text on stdout.
//
// The rules, for an output path P:
// - P is a regular file, or does not exist: the data goes to a temporary file
//   in P's directory (".NAME.XXXXXX", created with mkstemp), every write, the
//   flush, fsync and close are checked, and only then is it renamed over P. A
//   failure anywhere removes the temporary file and leaves P as it was.
// - P is a symbolic link: the link is followed (a chain of them, relative links
//   against the link's own directory) and the file it points to is what gets
//   replaced, by the rule above, in the target's directory; the link stays.
// - P (or the file a link points to) exists and is not a regular file (a
//   directory, a character or block device such as /dev/full, a FIFO, a socket):
//   refused with one line, nothing written.
// - The new file gets the mode of the file it replaces, or 0666 minus the umask
//   for a new one. (A replaced file with other hard links is unlinked from P only:
//   rename() gives P a new inode.)
//
// Errors are zk::error with the path and strerror text; main/ prints them once.
#pragma once
#include <cstddef>
#include <string>

#include "ggml-like/interrupt.h"

namespace zk {

// Checks, before any long computation, that `path` can be written by the rules
// above (the target's kind, and that its directory exists and is writable).
// Returns the path that will be replaced: the end of a symlink chain, else `path`.
std::string file_out_check(const std::string& path);

// A streaming writer for large outputs (a .zack model, a logits file).
// Nothing appears at the path until commit(); a file_out destroyed without
// commit() (an exception on the way) removes its temporary file.
class file_out {
public:
    explicit file_out(const std::string& path);  // file_out_check + creates the temporary file
    ~file_out();
    file_out(const file_out&) = delete;
    file_out& operator=(const file_out&) = delete;

    void write(const void* data, size_t n);  // buffered; throws on a write error
    void write(const std::string& s) { write(s.data(), s.size()); }
    // Flushes, fsyncs, closes and renames over the target; throws on any failure.
    void commit();

    const std::string& path() const { return path_; }      // as given
    const std::string& target() const { return target_; }  // what is replaced

private:
    void flush_buffer();
    void fail(const char* what, int err);  // removes the temporary file and throws

    std::string path_, target_, tmp_;
    interrupt_temp on_signal_;  // tmp_, removed if Ctrl-C / SIGTERM / SIGPIPE ends the process
    int fd_ = -1;
    std::string buf_;  // pending bytes, flushed at k_file_out_buffer
};

// The whole file at once: file_out + write + commit.
void file_out_write(const std::string& path, const std::string& data);

// An intermediate file next to an output (".NAME.TAG.XXXXXX" in the
// directory of `target`, created empty): a step that must write and read a
// whole file before the real output exists (calibrate's rank-weight fit). It is
// removed when this object ends, and by Ctrl-C / SIGTERM / SIGPIPE meanwhile.
class file_scratch {
public:
    file_scratch(const std::string& target, const char* tag);
    ~file_scratch();
    file_scratch(const file_scratch&) = delete;
    file_scratch& operator=(const file_scratch&) = delete;
    const std::string& path() const { return path_; }

private:
    std::string path_;
    interrupt_temp on_signal_;
};

// ---- standard output ----
// Writes to stdout and flushes; throws zk::error("writing to standard output:
// ...") when the stream reports an error (a full disk, a closed pipe when
// SIGPIPE is ignored), so that `zack ... > /dev/full` exits non-zero.
void file_out_stdout(const std::string& text);
// Flushes stdout and throws the same error if any earlier write failed; main()
// calls this before exiting 0.
void file_out_stdout_finish();

}  // namespace zk
