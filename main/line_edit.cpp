// The chat's line editor; keys, multi-line rules and the history format are in
// line_edit.h.
#include "main/line_edit.h"

#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "ggml-like/error.h"
#include "ggml-like/file_out.h"

namespace zk {

namespace {

constexpr int k_in = STDIN_FILENO;
constexpr int k_out = STDERR_FILENO;  // prompts and echo: stdout carries only replies

void term_write(const std::string& s) {
    size_t done = 0;
    while (done < s.size()) {
        const ssize_t n = ::write(k_out, s.data() + done, s.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;  // the terminal went away: nothing useful to report
        done += (size_t)n;
    }
}

// Raw mode for the lifetime of the object (restored on every way out).
class raw_mode {
public:
    raw_mode() {
        if (tcgetattr(k_in, &saved_) != 0) return;
        termios t = saved_;
        t.c_iflag &= ~(tcflag_t)(BRKINT | ICRNL | INPCK | ISTRIP | IXON);
        t.c_lflag &= ~(tcflag_t)(ECHO | ICANON | IEXTEN | ISIG);  // Ctrl-C is a key while typing
        t.c_cflag |= CS8;
        t.c_cc[VMIN] = 1;
        t.c_cc[VTIME] = 0;
        // TCSADRAIN, not TCSAFLUSH: keys typed ahead (while a reply streamed, or
        // between two prompts) stay queued instead of being thrown away.
        ok_ = tcsetattr(k_in, TCSADRAIN, &t) == 0;
        if (ok_) term_write("\x1b[?2004h");  // bracketed paste on
    }
    ~raw_mode() {
        if (!ok_) return;
        term_write("\x1b[?2004l");
        tcsetattr(k_in, TCSADRAIN, &saved_);
    }
    bool ok() const { return ok_; }

private:
    termios saved_{};
    bool ok_ = false;
};

// -1 at end of input or on an error.
int read_byte() {
    unsigned char c;
    for (;;) {
        const ssize_t n = ::read(k_in, &c, 1);
        if (n == 1) return c;
        if (n < 0 && errno == EINTR) continue;
        return -1;
    }
}

int term_columns() {
    winsize ws{};
    if (ioctl(k_out, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
    return 80;
}

bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

size_t prev_cp(const std::string& s, size_t i) {
    if (i == 0) return 0;
    do i--;
    while (i > 0 && is_cont((unsigned char)s[i]));
    return i;
}

size_t next_cp(const std::string& s, size_t i) {
    if (i >= s.size()) return s.size();
    do i++;
    while (i < s.size() && is_cont((unsigned char)s[i]));
    return i;
}

// The buffer as display cells (one column each): byte offset and text.
struct cell {
    size_t at;
    std::string text;
};

std::vector<cell> to_cells(const std::string& s) {
    std::vector<cell> out;
    for (size_t i = 0; i < s.size();) {
        const size_t j = next_cp(s, i);
        const unsigned char c = (unsigned char)s[i];
        std::string t = s.substr(i, j - i);
        if (c == '\n') t = "\xe2\x86\xb5";  // ↵
        else if (c < 0x20 || c == 0x7f) t = c == '\t' ? " " : "?";
        out.push_back({i, t});
        i = j;
    }
    return out;
}

size_t visible_width(const std::string& s) {
    size_t n = 0;
    for (size_t i = 0; i < s.size(); i++) {
        if (s[i] == '\x1b') {  // skip an SGR sequence
            while (i < s.size() && s[i] != 'm') i++;
            continue;
        }
        if (!is_cont((unsigned char)s[i])) n++;
    }
    return n;
}

bool ends_with(const std::string& s, const std::string& t) {
    return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

}  // namespace

// ---------------------------------------------------------------------------
// History file
// ---------------------------------------------------------------------------

std::string line_history_escape(const std::string& entry) {
    std::string out;
    for (char c : entry) {
        if (c == '\\') out += "\\\\";
        else if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else out += c;
    }
    return out;
}

std::string line_history_unescape(const std::string& line) {
    std::string out;
    for (size_t i = 0; i < line.size(); i++) {
        if (line[i] != '\\' || i + 1 >= line.size()) {
            out += line[i];
            continue;
        }
        const char e = line[++i];
        out += e == 'n' ? '\n' : e == 'r' ? '\r' : e;
    }
    return out;
}

line_editor::line_editor(std::string history_path, size_t max_entries)
    : history_path_(std::move(history_path)), max_entries_(max_entries) {
    tty_ = isatty(k_in) && isatty(k_out);
    history_load();
}

line_editor::~line_editor() = default;

void line_editor::history_load() {
    if (history_path_.empty()) return;
    std::ifstream in(history_path_, std::ios::binary);
    std::string line;
    while (in && std::getline(in, line))
        if (!line.empty()) history_.push_back(line_history_unescape(line));
    if (history_.size() > max_entries_) history_.erase(history_.begin(), history_.end() - (long)max_entries_);
}

void line_editor::history_save() {
    if (history_path_.empty() || save_failed_) return;
    std::string text;
    for (const std::string& e : history_) text += line_history_escape(e) + "\n";
    try {
        file_out_write(history_path_, text);
    } catch (const error& e) {
        save_failed_ = true;
        std::fprintf(stderr, "[history not saved: %s]\n", e.what());
    }
}

void line_editor::history_add(const std::string& entry) {
    if (entry.empty() || (!history_.empty() && history_.back() == entry)) return;
    history_.push_back(entry);
    if (history_.size() > max_entries_) history_.erase(history_.begin());
    history_save();
}

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

line_status line_editor::read_plain_line(std::string* line) {
    if (!std::getline(std::cin, *line)) {
        if (line->empty()) return line_status::END;
        return line_status::LINE;  // a last line without a newline
    }
    if (!line->empty() && line->back() == '\r') line->pop_back();
    return line_status::LINE;
}

line_status line_editor::read_tty_line(const std::string& prompt, const std::string& color, std::string* line) {
    raw_mode raw;
    if (!raw.ok()) return read_plain_line(line);
    std::string buf;
    size_t pos = 0;            // byte offset of the cursor, on a code point boundary
    size_t scroll = 0;         // first visible cell
    size_t hist = history_.size();
    std::string pending;       // the line being typed while browsing the history
    const size_t pw = visible_width(prompt);

    auto refresh = [&]() {
        const std::vector<cell> cells = to_cells(buf);
        size_t cur = cells.size();
        for (size_t k = 0; k < cells.size(); k++)
            if (cells[k].at == pos) cur = k;
        const int cols = term_columns();
        const size_t avail = (size_t)std::max(1, cols - (int)pw - 1);
        if (cur < scroll) scroll = cur;
        if (cur >= scroll + avail) scroll = cur - avail + 1;
        std::string s = "\r" + prompt + color;
        for (size_t k = scroll; k < cells.size() && k < scroll + avail; k++) s += cells[k].text;
        if (!color.empty()) s += "\x1b[0m";
        s += "\x1b[K\r";
        const size_t col = pw + cur - scroll;
        if (col > 0) s += "\x1b[" + std::to_string(col) + "C";
        term_write(s);
    };
    auto insert = [&](const std::string& t) {
        buf.insert(pos, t);
        pos += t.size();
    };
    auto set_buf = [&](const std::string& t) {
        buf = t;
        pos = buf.size();
    };

    refresh();
    for (;;) {
        const int c = read_byte();
        if (c < 0) {
            term_write("\r\n");
            if (buf.empty()) return line_status::END;
            *line = buf;
            return line_status::LINE;
        }
        switch (c) {
            case '\r':
            case '\n':
                pos = buf.size();
                refresh();
                term_write("\r\n");
                *line = buf;
                return line_status::LINE;
            case 3:  // Ctrl-C
                if (buf.empty()) {
                    term_write("\r\n");
                    return line_status::INTERRUPT;
                }
                set_buf("");
                break;
            case 4:  // Ctrl-D
                if (buf.empty()) {
                    term_write("\r\n");
                    return line_status::END;
                }
                if (pos < buf.size()) buf.erase(pos, next_cp(buf, pos) - pos);
                break;
            case 1: pos = 0; break;                               // Ctrl-A
            case 5: pos = buf.size(); break;                      // Ctrl-E
            case 2: pos = prev_cp(buf, pos); break;               // Ctrl-B
            case 6: pos = next_cp(buf, pos); break;               // Ctrl-F
            case 11: buf.erase(pos); break;                       // Ctrl-K
            case 21: buf.erase(0, pos), pos = 0; break;           // Ctrl-U
            case 12: term_write("\x1b[H\x1b[2J"); break;          // Ctrl-L
            case 23: {                                            // Ctrl-W
                size_t p = pos;
                while (p > 0 && buf[p - 1] == ' ') p--;
                while (p > 0 && buf[p - 1] != ' ') p--;
                buf.erase(p, pos - p);
                pos = p;
                break;
            }
            case 127:
            case 8:  // Backspace
                if (pos > 0) {
                    const size_t p = prev_cp(buf, pos);
                    buf.erase(p, pos - p);
                    pos = p;
                }
                break;
            case 16:  // Ctrl-P
            case 14:  // Ctrl-N
            case 27: {
                int key = c;  // 'A' up, 'B' down, 'C' right, 'D' left, 'H' home, 'F' end, '3' delete
                std::string seq;
                if (c == 27) {
                    const int c1 = read_byte();
                    if (c1 == '[' || c1 == 'O') {
                        int b = read_byte();
                        while (b >= 0 && !(b >= 0x40 && b <= 0x7e)) seq += (char)b, b = read_byte();
                        if (b < 0) break;
                        key = b;
                    } else {
                        break;  // Alt-key: ignored
                    }
                } else {
                    key = c == 16 ? 'A' : 'B';
                }
                if (key == '~') {
                    if (seq == "200") {  // bracketed paste: insert everything up to ESC[201~
                        std::string paste;
                        for (int b = read_byte(); b >= 0; b = read_byte()) {
                            paste += (char)b;
                            if (ends_with(paste, "\x1b[201~")) {
                                paste.resize(paste.size() - 6);
                                break;
                            }
                        }
                        std::string norm;
                        for (size_t k = 0; k < paste.size(); k++) {
                            if (paste[k] == '\r') {
                                norm += '\n';
                                if (k + 1 < paste.size() && paste[k + 1] == '\n') k++;
                            } else {
                                norm += paste[k];
                            }
                        }
                        insert(norm);
                        break;
                    }
                    key = seq == "1" || seq == "7" ? 'H' : seq == "4" || seq == "8" ? 'F' : seq == "3" ? '3' : 0;
                }
                if (key == 'A' || key == 'B') {
                    if (key == 'A' && hist > 0) {
                        if (hist == history_.size()) pending = buf;
                        set_buf(history_[--hist]);
                    } else if (key == 'B' && hist < history_.size()) {
                        hist++;
                        set_buf(hist == history_.size() ? pending : history_[hist]);
                    }
                } else if (key == 'C') {
                    pos = next_cp(buf, pos);
                } else if (key == 'D') {
                    pos = prev_cp(buf, pos);
                } else if (key == 'H') {
                    pos = 0;
                } else if (key == 'F') {
                    pos = buf.size();
                } else if (key == '3' && pos < buf.size()) {
                    buf.erase(pos, next_cp(buf, pos) - pos);
                }
                break;
            }
            case '\t': insert(" "); break;
            default:
                if (c >= 0x20) {
                    std::string t(1, (char)c);
                    // the rest of a UTF-8 sequence, so the cursor stays on code points
                    const int more = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
                    for (int k = 0; k < more; k++) {
                        const int b = read_byte();
                        if (b < 0) break;
                        t += (char)b;
                    }
                    insert(t);
                }
        }
        refresh();
    }
}

line_status line_editor::read(const std::string& prompt, const std::string& cont_prompt, const std::string& color,
                              std::string* out) {
    std::vector<std::string> parts;
    bool block = false;
    for (;;) {
        std::string line;
        const std::string& shown = parts.empty() ? prompt : cont_prompt;
        if (!tty_) term_write(shown);  // not echoed input, but the prompt shows where a turn starts
        const line_status st = tty_ ? read_tty_line(shown, color, &line) : read_plain_line(&line);
        if (st == line_status::INTERRUPT) return st;
        if (st == line_status::END) {
            if (parts.empty()) return st;
            break;  // end of input inside a multi-line entry: take what there is
        }
        if (parts.empty() && !block && line.compare(0, 3, "\"\"\"") == 0) {
            block = true;
            line.erase(0, 3);
            if (line.size() >= 3 && ends_with(line, "\"\"\"")) {
                parts.push_back(line.substr(0, line.size() - 3));
                break;
            }
            if (!line.empty()) parts.push_back(line);
            if (parts.empty()) parts.push_back("");  // marks the block as started
            continue;
        }
        if (block) {
            if (ends_with(line, "\"\"\"")) {
                if (line.size() > 3) parts.push_back(line.substr(0, line.size() - 3));
                break;
            }
            parts.push_back(line);
            continue;
        }
        if (!line.empty() && line.back() == '\\') {
            line.pop_back();
            parts.push_back(line);
            continue;
        }
        parts.push_back(line);
        break;
    }
    // A block opened by a bare """ starts with an empty marker part: drop it.
    if (block && parts.size() > 1 && parts.front().empty()) parts.erase(parts.begin());
    std::string entry;
    for (size_t k = 0; k < parts.size(); k++) entry += (k ? "\n" : "") + parts[k];
    *out = entry;
    return line_status::LINE;
}

}  // namespace zk
