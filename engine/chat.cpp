// Chat templates; the families and conventions are described in chat.h.
#include "engine/chat.h"

#include "engine/unicode.h"

#include <cctype>
#include <cstdint>

#include "ggml-like/error.h"

namespace zk {

// ---------------------------------------------------------------------------
// Python-compatible strip (Jinja's `trim` filter and str.strip())
// ---------------------------------------------------------------------------

// Python's str.isspace() set.
static bool chat_is_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

// Decodes the UTF-8 sequence at s[i, end); returns its length, 0 if malformed.
static size_t chat_decode_utf8(const std::string& s, size_t i, size_t end, uint32_t* cp) {
    const unsigned char c = (unsigned char)s[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + len > end) return 0;
    uint32_t v = len == 1 ? c : (c & (0x7F >> len));
    for (size_t k = 1; k < len; ++k) {
        const unsigned char cc = (unsigned char)s[i + k];
        if ((cc & 0xC0) != 0x80) return 0;
        v = (v << 6) | (cc & 0x3F);
    }
    *cp = v;
    return len;
}

static std::string chat_strip(const std::string& s) {
    size_t b = 0, e = s.size();
    uint32_t cp = 0;
    while (b < e) {
        const size_t len = chat_decode_utf8(s, b, e, &cp);
        if (len == 0 || !chat_is_space(cp)) break;
        b += len;
    }
    while (e > b) {
        size_t start = e - 1;  // back up to the lead byte of the last character
        while (start > b && ((unsigned char)s[start] & 0xC0) == 0x80 && e - start < 4) --start;
        const size_t len = chat_decode_utf8(s, start, e, &cp);
        if (len != e - start || !chat_is_space(cp)) break;
        e = start;
    }
    return s.substr(b, e - b);
}

// ---------------------------------------------------------------------------
// Reading the default system text out of a ChatML Jinja template
// ---------------------------------------------------------------------------

namespace {

// One piece of the template: raw text, {{ expression }} or {% statement %}.
struct jinja_piece {
    enum kind_t { TEXT, EXPR, STMT } kind;
    std::string body;         // inner text without delimiters and '-'/'+' markers
    bool trim_left = false;   // "{%-" / "{{-": strips whitespace before the tag
    bool trim_right = false;  // "-%}" / "-}}": strips whitespace after the tag
};

// Finds the end of a tag started at `open` (pointing at "{{" or "{%"), skipping
// string literals, which may contain "%}". Returns npos when unterminated.
size_t jinja_tag_end(const std::string& src, size_t open, char close_char) {
    size_t i = open + 2;
    while (i + 1 < src.size()) {
        const char c = src[i];
        if (c == '\'' || c == '"') {
            for (++i; i < src.size() && src[i] != c; ++i)
                if (src[i] == '\\') ++i;
            ++i;
            continue;
        }
        if (c == close_char && src[i + 1] == '}') return i;
        ++i;
    }
    return std::string::npos;
}

// Splits the source into pieces; comments are dropped. Stops at malformed tags.
std::vector<jinja_piece> jinja_split(const std::string& src) {
    std::vector<jinja_piece> out;
    size_t i = 0;
    while (i < src.size()) {
        size_t open = src.find('{', i);
        while (open != std::string::npos && open + 1 < src.size() && src[open + 1] != '{' && src[open + 1] != '%' &&
               src[open + 1] != '#')
            open = src.find('{', open + 1);
        if (open == std::string::npos || open + 1 >= src.size()) {
            out.push_back({jinja_piece::TEXT, src.substr(i)});
            break;
        }
        if (open > i) out.push_back({jinja_piece::TEXT, src.substr(i, open - i)});
        const char kind = src[open + 1];
        if (kind == '#') {
            const size_t end = src.find("#}", open + 2);
            if (end == std::string::npos) break;
            i = end + 2;
            continue;
        }
        const size_t close = jinja_tag_end(src, open, kind == '{' ? '}' : '%');
        if (close == std::string::npos) break;
        jinja_piece p{kind == '{' ? jinja_piece::EXPR : jinja_piece::STMT, src.substr(open + 2, close - open - 2)};
        if (!p.body.empty() && (p.body.front() == '-' || p.body.front() == '+')) {
            p.trim_left = p.body.front() == '-';
            p.body.erase(0, 1);
        }
        if (!p.body.empty() && (p.body.back() == '-' || p.body.back() == '+')) {
            p.trim_right = p.body.back() == '-';
            p.body.pop_back();
        }
        out.push_back(p);
        i = close + 2;
    }
    return out;
}

std::string jinja_without_spaces(const std::string& s) {
    std::string out;
    for (char c : s)
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') out += c == '"' ? '\'' : c;
    return out;
}

// The first word of a statement: "if", "elif", "else", "endif", "for", ...
std::string jinja_keyword(const std::string& body) {
    size_t b = body.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return "";
    size_t e = b;
    while (e < body.size() && (isalnum((unsigned char)body[e]) || body[e] == '_')) ++e;
    return body.substr(b, e - b);
}


// Decodes the string literal at body[*i] (a quote) as Jinja does (Python
// unicode-escape); advances *i past it. False if unterminated.
bool jinja_read_literal(const std::string& body, size_t* i, std::string* out) {
    const char q = body[*i];
    size_t k = *i + 1;
    while (k < body.size() && body[k] != q) {
        const char c = body[k];
        if (c != '\\' || k + 1 >= body.size()) {
            *out += c;
            ++k;
            continue;
        }
        const char e = body[k + 1];
        k += 2;
        switch (e) {
            case 'n': *out += '\n'; break;
            case 't': *out += '\t'; break;
            case 'r': *out += '\r'; break;
            case 'a': *out += '\a'; break;
            case 'b': *out += '\b'; break;
            case 'f': *out += '\f'; break;
            case 'v': *out += '\v'; break;
            case '\\': *out += '\\'; break;
            case '\'': *out += '\''; break;
            case '"': *out += '"'; break;
            case '\n': break;  // line continuation
            case 'x':
            case 'u':
            case 'U': {
                const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
                if (k + n > body.size()) return false;
                uint32_t cp = 0;
                for (size_t j = 0; j < n; ++j) {
                    const char h = body[k + j];
                    if (!isxdigit((unsigned char)h)) return false;
                    cp = cp * 16 + (uint32_t)(isdigit((unsigned char)h) ? h - '0' : (tolower(h) - 'a' + 10));
                }
                k += n;
                unicode_append_utf8(*out, cp);
                break;
            }
            default:  // Python keeps unknown escapes as written
                *out += '\\';
                *out += e;
        }
    }
    if (k >= body.size()) return false;
    *i = k + 1;
    return true;
}

// An expression made only of string literals joined by '+' or '~'; false otherwise.
bool jinja_eval_literals(const std::string& body, std::string* out) {
    size_t i = 0;
    bool want_literal = true;
    while (true) {
        while (i < body.size() && isspace((unsigned char)body[i])) ++i;
        if (i >= body.size()) return !want_literal;
        if (want_literal) {
            if (body[i] != '\'' && body[i] != '"') return false;
            if (!jinja_read_literal(body, &i, out)) return false;
        } else if (body[i] != '+' && body[i] != '~') {
            return false;
        } else {
            ++i;
        }
        want_literal = !want_literal;
    }
}

// The text the branch starting at pieces[begin] outputs, up to the end of the
// branch (an elif/else/endif at the same depth) or the first non-literal expression.
std::string jinja_branch_text(const std::vector<jinja_piece>& pieces, size_t begin) {
    std::string out;
    int depth = 0;
    for (size_t i = begin; i < pieces.size(); ++i) {
        const jinja_piece& p = pieces[i];
        if (p.kind == jinja_piece::STMT) {
            const std::string kw = jinja_keyword(p.body);
            if (kw == "if" || kw == "for") ++depth;
            if (kw == "endif" || kw == "endfor") {
                if (depth == 0) break;
                --depth;
            }
            if (depth == 0 && (kw == "elif" || kw == "else")) break;
            if (kw != "if" && kw != "endif" && kw != "for" && kw != "endfor") break;  // set, macro, ...: give up
            continue;
        }
        if (p.kind == jinja_piece::EXPR) {
            if (!jinja_eval_literals(p.body, &out)) break;
            continue;
        }
        // Raw text, shaped by whitespace control: '-' markers on either side, and
        // trim_blocks (a newline right after a statement tag is dropped) as HF sets it.
        std::string text = p.body;
        const jinja_piece* prev = i > 0 ? &pieces[i - 1] : nullptr;
        const jinja_piece* next = i + 1 < pieces.size() ? &pieces[i + 1] : nullptr;
        if (prev && prev->trim_right) {
            const size_t first = text.find_first_not_of(" \t\r\n");
            text.erase(0, first == std::string::npos ? text.size() : first);
        } else if (prev && prev->kind == jinja_piece::STMT && !text.empty() && text[0] == '\n') {
            text.erase(0, 1);
        }
        if (next && next->trim_left) {
            const size_t last = text.find_last_not_of(" \t\r\n");
            text.erase(last == std::string::npos ? 0 : last + 1);
        }
        out += text;
    }
    return out;
}

// Looks for `if messages[0].role != 'system'` branches (or the else branch of
// `== 'system'`) whose output starts with a ChatML system header.
std::string chat_extract_default_system(const std::string& src) {
    static const std::string header = "<|im_start|>system\n";
    static const std::string footer = "<|im_end|>";
    const std::vector<jinja_piece> pieces = jinja_split(src);
    for (size_t i = 0; i < pieces.size(); ++i) {
        const jinja_piece& p = pieces[i];
        if (p.kind != jinja_piece::STMT) continue;
        const std::string kw = jinja_keyword(p.body);
        if (kw != "if" && kw != "elif") continue;
        const std::string cond = jinja_without_spaces(p.body);
        const bool is_ne = cond.find("messages[0]['role']!='system'") != std::string::npos ||
                           cond.find("messages[0].role!='system'") != std::string::npos;
        const bool is_eq = cond.find("messages[0]['role']=='system'") != std::string::npos ||
                           cond.find("messages[0].role=='system'") != std::string::npos;
        size_t branch = std::string::npos;
        if (is_ne) {
            branch = i + 1;
        } else if (is_eq) {  // the else branch at this if's depth
            int depth = 0;
            for (size_t j = i + 1; j < pieces.size() && branch == std::string::npos; ++j) {
                if (pieces[j].kind != jinja_piece::STMT) continue;
                const std::string k = jinja_keyword(pieces[j].body);
                if (k == "if" || k == "for") ++depth;
                else if (k == "endif" || k == "endfor") {
                    if (depth == 0) break;
                    --depth;
                } else if (depth == 0 && k == "else") branch = j + 1;
                else if (depth == 0 && k == "elif") break;
            }
        }
        if (branch == std::string::npos) continue;
        const std::string text = jinja_branch_text(pieces, branch);
        if (text.compare(0, header.size(), header) != 0) continue;
        const size_t end = text.find(footer, header.size());
        if (end == std::string::npos) continue;
        return text.substr(header.size(), end - header.size());
    }
    return "";
}

}  // namespace

// ---------------------------------------------------------------------------
// Detection and names
// ---------------------------------------------------------------------------

chat_template chat_template_detect(const std::string& src) {
    chat_template t;
    if (src.find("<|im_start|>") != std::string::npos) {
        t.kind = chat_template_kind::CHATML;
        t.default_system = chat_extract_default_system(src);
    } else if (src.find("<|start_header_id|>") != std::string::npos) {
        t.kind = chat_template_kind::LLAMA3;
    } else if (src.find("[INST]") != std::string::npos) {
        t.kind = chat_template_kind::LLAMA2;
    } else if (src.find("<start_of_turn>") != std::string::npos) {
        t.kind = chat_template_kind::GEMMA;
    } else {
        t.kind = chat_template_kind::CHATML;  // empty or unknown: llama.cpp's fallback too
    }
    return t;
}

static const chat_template_kind chat_all_kinds[] = {chat_template_kind::CHATML, chat_template_kind::LLAMA3,
                                                    chat_template_kind::LLAMA2, chat_template_kind::GEMMA};

const char* chat_template_name(chat_template_kind k) {
    switch (k) {
        case chat_template_kind::CHATML: return "chatml";
        case chat_template_kind::LLAMA3: return "llama3";
        case chat_template_kind::LLAMA2: return "llama2";
        case chat_template_kind::GEMMA: return "gemma";
    }
    return "?";
}

chat_template chat_template_from_name(const std::string& name) {
    std::string valid;
    for (chat_template_kind k : chat_all_kinds) {
        if (name == chat_template_name(k)) return chat_template{k, ""};
        valid += valid.empty() ? "" : ", ";
        valid += chat_template_name(k);
    }
    ZK_THROW("unknown chat template '%s' (valid: %s)", name.c_str(), valid.c_str());
}

// ---------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------

static void chat_render_chatml(const chat_template& t, const std::vector<chat_message>& msgs, bool gen,
                               std::string& out) {
    if (!msgs.empty() && msgs[0].role != "system" && !t.default_system.empty())
        out += "<|im_start|>system\n" + t.default_system + "<|im_end|>\n";
    for (const chat_message& m : msgs) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    if (gen) out += "<|im_start|>assistant\n";
}

static void chat_render_llama3(const std::vector<chat_message>& msgs, bool gen, std::string& out) {
    for (const chat_message& m : msgs)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + chat_strip(m.content) + "<|eot_id|>";
    if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

// Llama 2 and Gemma: an optional leading system message, then user/assistant
// strictly alternating, starting with the user (the official templates raise otherwise).
static void chat_check_alternation(const std::vector<chat_message>& msgs, size_t first, const char* family) {
    for (size_t i = first; i < msgs.size(); ++i) {
        const bool want_user = (i - first) % 2 == 0;
        if ((msgs[i].role == "user") != want_user)
            ZK_THROW("chat template %s: message %zu has role '%s'; after an optional first system message, "
                     "roles must alternate user/assistant/user/...",
                     family, i, msgs[i].role.c_str());
    }
}

static void chat_render_llama2(const std::vector<chat_message>& msgs, std::string& out) {
    const bool has_system = !msgs.empty() && msgs[0].role == "system";
    const size_t first = has_system ? 1 : 0;
    chat_check_alternation(msgs, first, "llama2");
    for (size_t i = first; i < msgs.size(); ++i) {
        const chat_message& m = msgs[i];
        std::string content = m.content;
        if (i == first && has_system) content = "<<SYS>>\n" + msgs[0].content + "\n<</SYS>>\n\n" + m.content;
        if (m.role == "user")  // the leading BOS is the caller's; later ones are text
            out += std::string(i == first ? "" : "<s>") + "[INST] " + chat_strip(content) + " [/INST]";
        else if (m.role == "assistant")
            out += " " + chat_strip(content) + " </s>";
    }
    // No generation prompt: the model answers right after " [/INST]".
}

static void chat_render_gemma(const std::vector<chat_message>& msgs, bool gen, std::string& out) {
    const bool has_system = !msgs.empty() && msgs[0].role == "system";
    const size_t first = has_system ? 1 : 0;
    chat_check_alternation(msgs, first, "gemma");
    for (size_t i = first; i < msgs.size(); ++i) {
        const chat_message& m = msgs[i];
        out += "<start_of_turn>" + (m.role == "assistant" ? std::string("model") : m.role) + "\n";
        if (i == first && has_system) out += msgs[0].content + "\n\n";
        out += chat_strip(m.content) + "<end_of_turn>\n";
    }
    if (gen) out += "<start_of_turn>model\n";
}

std::string chat_apply(const chat_template& t, const std::vector<chat_message>& msgs, bool add_generation_prompt) {
    std::string out;
    switch (t.kind) {
        case chat_template_kind::CHATML: chat_render_chatml(t, msgs, add_generation_prompt, out); break;
        case chat_template_kind::LLAMA3: chat_render_llama3(msgs, add_generation_prompt, out); break;
        case chat_template_kind::LLAMA2: chat_render_llama2(msgs, out); break;
        case chat_template_kind::GEMMA: chat_render_gemma(msgs, add_generation_prompt, out); break;
    }
    return out;
}

}  // namespace zk
