// Unicode classes, UTF-8 and the hand-written pre-tokenizer matchers. Each matcher
// reproduces what a backtracking regex engine (Oniguruma, as used by HF
// tokenizers) returns for the pattern in unicode.h: alternatives are tried in
// order at each position and the first that matches wins, greedy within itself.
#include "engine/unicode.h"

#include <algorithm>
#include <array>

namespace zk {

namespace {

struct unicode_range {
    uint32_t first, last;
    uint8_t flags;
};

#include "engine/unicode_tables.inc"

constexpr size_t k_n_ranges = sizeof(k_unicode_ranges) / sizeof(k_unicode_ranges[0]);

// Flat table for the Basic Multilingual Plane (64 KiB), where almost all text lives;
// the rest goes through a binary search of the ranges.
const std::array<uint8_t, 0x10000>& bmp_table() {
    static const std::array<uint8_t, 0x10000> table = [] {
        std::array<uint8_t, 0x10000> t{};
        for (const auto& r : k_unicode_ranges) {
            if (r.first > 0xFFFF) break;
            for (uint32_t c = r.first; c <= std::min<uint32_t>(r.last, 0xFFFF); c++) t[c] = r.flags;
        }
        return t;
    }();
    return table;
}

}  // namespace

uint8_t unicode_flags(uint32_t cp) {
    if (cp <= 0xFFFF) return bmp_table()[cp];
    if (cp > 0x10FFFF) return 0;
    const unicode_range* end = k_unicode_ranges + k_n_ranges;
    const unicode_range* it = std::upper_bound(
        k_unicode_ranges, end, cp, [](uint32_t c, const unicode_range& r) { return c < r.first; });
    if (it == k_unicode_ranges) return 0;
    --it;
    return cp <= it->last ? it->flags : 0;
}

// ---- UTF-8 ----

size_t unicode_utf8_len(uint8_t lead) {
    if (lead < 0x80) return 1;
    if ((lead & 0xE0) == 0xC0) return 2;
    if ((lead & 0xF0) == 0xE0) return 3;
    if ((lead & 0xF8) == 0xF0) return 4;
    return 1;
}

size_t unicode_utf8_invalid_at(std::string_view s) {
    for (size_t pos = 0; pos < s.size();) {
        const size_t at = pos;
        if (unicode_decode_utf8(s, pos) == UNICODE_INVALID) return at;
    }
    return std::string_view::npos;
}

uint32_t unicode_decode_utf8(std::string_view s, size_t& pos) {
    const auto b0 = (uint8_t)s[pos];
    if (b0 < 0x80) {
        pos += 1;
        return b0;
    }
    const size_t len = unicode_utf8_len(b0);
    if (len == 1 || pos + len > s.size()) {
        pos += 1;
        return UNICODE_INVALID;
    }
    uint32_t cp = b0 & (0x7F >> len);
    for (size_t k = 1; k < len; k++) {
        const auto b = (uint8_t)s[pos + k];
        if ((b & 0xC0) != 0x80) {
            pos += 1;
            return UNICODE_INVALID;
        }
        cp = (cp << 6) | (b & 0x3F);
    }
    // Reject overlong forms, surrogates and values past U+10FFFF: Python (and so
    // the reference tokenizer) never produces them.
    static const uint32_t k_min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < k_min[len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
        pos += 1;
        return UNICODE_INVALID;
    }
    pos += len;
    return cp;
}

void unicode_append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += (char)cp;
    } else if (cp < 0x800) {
        out += (char)(0xC0 | (cp >> 6));
        out += (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += (char)(0xE0 | (cp >> 12));
        out += (char)(0x80 | ((cp >> 6) & 0x3F));
        out += (char)(0x80 | (cp & 0x3F));
    } else {
        out += (char)(0xF0 | (cp >> 18));
        out += (char)(0x80 | ((cp >> 12) & 0x3F));
        out += (char)(0x80 | ((cp >> 6) & 0x3F));
        out += (char)(0x80 | (cp & 0x3F));
    }
}

// ---- GPT-2 byte mapping ----

namespace {

struct byte_map {
    uint32_t to_cpt[256];
    std::array<int16_t, 512> to_byte;  // every mapped code point is below 512
    byte_map() {
        to_byte.fill(-1);
        auto printable = [](int b) {
            return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        };
        uint32_t next = 256;
        for (int b = 0; b < 256; b++) {
            to_cpt[b] = printable(b) ? (uint32_t)b : next++;
            to_byte[to_cpt[b]] = (int16_t)b;
        }
    }
};

const byte_map& gpt2_bytes() {
    static const byte_map m;
    return m;
}

}  // namespace

uint32_t unicode_byte_to_cpt(uint8_t b) {
    return gpt2_bytes().to_cpt[b];
}

int unicode_cpt_to_byte(uint32_t cp) {
    return cp < 512 ? gpt2_bytes().to_byte[cp] : -1;
}

// ---- pre-tokenizers ----

namespace {

// The text as code points with their classes; matchers see a window [.., end)
// and treat `end` as the end of the text (HF runs each split separately).
struct cpt_text {
    std::vector<uint32_t> cp;
    std::vector<uint8_t> fl;
    std::vector<size_t> off;  // byte offset of each code point, plus the total size

    explicit cpt_text(std::string_view s) {
        cp.reserve(s.size());
        fl.reserve(s.size());
        off.reserve(s.size() + 1);
        for (size_t pos = 0; pos < s.size();) {
            off.push_back(pos);
            const uint32_t c = unicode_decode_utf8(s, pos);
            cp.push_back(c);
            fl.push_back(c == UNICODE_INVALID ? 0 : unicode_flags(c));
        }
        off.push_back(s.size());
    }
    size_t size() const { return cp.size(); }
    bool letter(size_t i) const { return fl[i] & UNICODE_LETTER; }
    bool number(size_t i) const { return fl[i] & UNICODE_NUMBER; }
    bool space(size_t i) const { return fl[i] & UNICODE_SPACE; }
    // [^\s\p{L}\p{N}]
    bool other(size_t i) const {
        return !(fl[i] & (UNICODE_LETTER | UNICODE_NUMBER | UNICODE_SPACE));
    }
    bool newline(size_t i) const { return cp[i] == '\r' || cp[i] == '\n'; }
};

// Lower-cases the letters the contractions use, as a case-insensitive regex
// compares them (U+017F LATIN SMALL LETTER LONG S folds to 's').
uint32_t fold_ascii(uint32_t c, bool icase) {
    if (!icase) return c;
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c == 0x17F) return 's';
    return c;
}

// 's|'t|'re|'ve|'m|'ll|'d (no alternative is a prefix of another, so the order
// does not matter). Returns the end of the match or 0.
size_t match_contraction(const cpt_text& t, size_t i, size_t end, bool icase) {
    if (t.cp[i] != '\'' || i + 1 >= end) return 0;
    const uint32_t a = fold_ascii(t.cp[i + 1], icase);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 >= end) return 0;
    const uint32_t b = fold_ascii(t.cp[i + 2], icase);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return 0;
}

// \s+(?!\S)|\s+ at a whitespace code point: the run, less its last code point when
// a non-space follows and the run is longer than one.
size_t match_space_run(const cpt_text& t, size_t i, size_t end) {
    size_t k = i;
    while (k < end && t.space(k)) k++;
    return (k == end || k - i == 1) ? k : k - 1;
}

template <class Pred>
size_t run_while(size_t j, size_t end, Pred pred) {
    while (j < end && pred(j)) j++;
    return j;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t match_gpt2(const cpt_text& t, size_t i, size_t end) {
    if (size_t m = match_contraction(t, i, end, false)) return m;
    const size_t j = i + (t.cp[i] == ' ' ? 1 : 0);
    if (j < end) {
        if (t.letter(j)) return run_while(j, end, [&](size_t k) { return t.letter(k); });
        if (t.number(j)) return run_while(j, end, [&](size_t k) { return t.number(k); });
        if (t.other(j)) return run_while(j, end, [&](size_t k) { return t.other(k); });
    }
    if (t.space(i)) return match_space_run(t, i, end);
    return i + 1;  // unreachable: every code point is space, letter, number or other
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t match_llama3(const cpt_text& t, size_t i, size_t end, size_t max_digits) {
    if (size_t m = match_contraction(t, i, end, true)) return m;
    auto letters = [&](size_t k) { return t.letter(k); };
    if (t.letter(i)) return run_while(i, end, letters);
    if (!t.newline(i) && !t.number(i) && i + 1 < end && t.letter(i + 1)) {
        return run_while(i + 1, end, letters);
    }
    if (t.number(i)) {
        return run_while(i, std::min(end, i + max_digits), [&](size_t k) { return t.number(k); });
    }
    const size_t j = i + (t.cp[i] == ' ' ? 1 : 0);
    if (j < end && t.other(j)) {
        const size_t k = run_while(j, end, [&](size_t q) { return t.other(q); });
        return run_while(k, end, [&](size_t q) { return t.newline(q); });
    }
    if (t.space(i)) {
        // \s*[\r\n]+ backtracks to the last newline inside the whitespace run.
        const size_t k = run_while(i, end, [&](size_t q) { return t.space(q); });
        for (size_t q = k; q > i; q--) {
            if (t.newline(q - 1)) return q;
        }
        return match_space_run(t, i, end);
    }
    return i + 1;  // unreachable
}

}  // namespace

namespace {

struct pre_entry {
    const char* name;
    unicode_pre kind;
};
// tokenizer.ggml.pre names (as llama.cpp's converter writes them) -> split pattern.
const pre_entry k_pre_table[] = {
    {"default", unicode_pre::GPT2},
    {"gpt2", unicode_pre::GPT2},
    {"gpt-2", unicode_pre::GPT2},
    {"smollm", unicode_pre::DIGITS_GPT2},
    {"starcoder", unicode_pre::DIGITS_GPT2},
    {"refact", unicode_pre::DIGITS_GPT2},
    {"llama-bpe", unicode_pre::LLAMA3},
    {"llama3", unicode_pre::LLAMA3},
    {"llama-v3", unicode_pre::LLAMA3},
    {"qwen2", unicode_pre::QWEN2},
    {"deepseek-r1-qwen", unicode_pre::QWEN2},  // DeepSeek-R1-Distill-Qwen: Qwen2's tokenizer
};

}  // namespace

bool unicode_pre_from_name(std::string_view name, unicode_pre& kind) {
    for (const auto& e : k_pre_table) {
        if (name == e.name) {
            kind = e.kind;
            return true;
        }
    }
    return false;
}

std::string unicode_pre_names() {
    std::string names;
    for (const auto& e : k_pre_table) names += std::string(names.empty() ? "" : ", ") + e.name;
    return names;
}

void unicode_pre_split(unicode_pre kind, std::string_view text,
                       std::vector<std::pair<size_t, size_t>>& out) {
    const cpt_text t(text);
    const size_t n = t.size();
    auto emit = [&](size_t a, size_t b) { out.emplace_back(t.off[a], t.off[b]); };
    auto split_window = [&](size_t begin, size_t end) {
        for (size_t i = begin; i < end;) {
            size_t m;
            switch (kind) {
                case unicode_pre::LLAMA3:
                    m = match_llama3(t, i, end, 3);
                    break;
                case unicode_pre::QWEN2:
                    m = match_llama3(t, i, end, 1);
                    break;
                default:
                    m = match_gpt2(t, i, end);
                    break;
            }
            emit(i, m);
            i = m;
        }
    };
    if (kind != unicode_pre::DIGITS_GPT2) {
        split_window(0, n);
        return;
    }
    // Digits(individual_digits=True) first: each \p{N} is a piece of its own and the
    // GPT-2 pattern runs on the text between them.
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        if (!t.number(i)) continue;
        split_window(start, i);
        emit(i, i + 1);
        start = i + 1;
    }
    split_window(start, n);
}

}  // namespace zk
