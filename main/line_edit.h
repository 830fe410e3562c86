// The chat's input line: a small line editor on termios (no library), with a
// history kept in a file, and multi-line entries.
//
// On a terminal (stdin and stderr both TTYs) the terminal is put in raw mode
// only while a line is being read, and restored before read() returns, so that
// Ctrl-C during a reply still arrives as SIGINT. Keys:
//   Left/Right, Ctrl-B/Ctrl-F     move by one character (UTF-8 code point)
//   Home/End, Ctrl-A/Ctrl-E       start / end of the line
//   Backspace, Delete             delete before / under the cursor
//   Ctrl-K, Ctrl-U, Ctrl-W        delete to the end / to the start / the word before
//   Up/Down, Ctrl-P/Ctrl-N        previous / next history entry
//   Ctrl-L                        clear the screen
//   Ctrl-D                        end of input on an empty line, else Delete
//   Ctrl-C                        clears a non-empty line; on an empty one, INTERRUPT
//   Enter                         ends the entry, unless the line ends with '\'
// Multi-line entries, on a terminal or not: a line ending with a backslash
// continues on the next line (the backslash becomes a newline); a line starting
// with """ opens a block that ends at a line ending with """ (Ollama's way); a
// bracketed paste (the terminal marks it) is inserted whole, newlines included,
// shown as "↵" on the one-line display.
// Not on a terminal (a pipe, a file): lines are read as they are, with the same
// multi-line rules, and nothing is echoed.
//
// History: entries in order, one per line in the file, a newline inside an
// entry written as "\n" and a backslash as "\\"; the newest max_entries are kept.
// The file is rewritten through file_out (ggml-like/file_out.h) after each entry;
// if that fails, one warning is printed and the session goes on without saving.
#pragma once
#include <string>
#include <vector>

namespace zk {

enum class line_status { LINE, END, INTERRUPT };

class line_editor {
public:
    // history_path "" = no history file (entries are still recalled in this session).
    line_editor(std::string history_path, size_t max_entries = 1000);
    ~line_editor();

    // Reads one entry (possibly several lines) into *out, without the final newline.
    // prompt: shown before the first line; cont_prompt: before continuation lines.
    // color: an SGR sequence ("\x1b[32m") for the typed text, "" for none.
    line_status read(const std::string& prompt, const std::string& cont_prompt, const std::string& color,
                     std::string* out);

    void history_add(const std::string& entry);
    const std::vector<std::string>& history() const { return history_; }
    bool on_terminal() const { return tty_; }

private:
    line_status read_tty_line(const std::string& prompt, const std::string& color, std::string* line);
    line_status read_plain_line(std::string* line);
    void history_load();
    void history_save();

    std::string history_path_;
    size_t max_entries_;
    std::vector<std::string> history_;
    bool tty_ = false;
    bool save_failed_ = false;
};

// Escaping of one history entry for the file, and back.
std::string line_history_escape(const std::string& entry);
std::string line_history_unescape(const std::string& line);

}  // namespace zk
