// Unicode helpers for the tokenizer: UTF-8 decoding, code point classes
// (letter / number / whitespace / mark, from engine/unicode_tables.inc), the GPT-2
// byte <-> code point mapping, and the regex-free pre-tokenizers that split text
// the way the GPT-2 / Llama-3 / Qwen2 patterns do.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zk {

enum unicode_flag : uint8_t {
    UNICODE_LETTER = 1,  // \p{L}
    UNICODE_NUMBER = 2,  // \p{N}
    UNICODE_SPACE = 4,   // \s (White_Space)
    UNICODE_MARK = 8,    // \p{M}
};

// Flags of a code point (0 for punctuation, symbols, controls, unassigned and
// for UNICODE_INVALID).
uint8_t unicode_flags(uint32_t cp);

// Stands for a byte that does not start a valid UTF-8 sequence; such a byte
// is one "code point" of class other, so any byte string can be split.
constexpr uint32_t UNICODE_INVALID = 0xFFFFFFFFu;

// Decodes the code point at s[pos] and advances pos (by 1 for an invalid byte,
// which gives UNICODE_INVALID). Requires pos < s.size().
uint32_t unicode_decode_utf8(std::string_view s, size_t& pos);
// Byte offset of the first invalid UTF-8 sequence in s (by the rules of
// unicode_decode_utf8), or std::string_view::npos when s is valid UTF-8.
size_t unicode_utf8_invalid_at(std::string_view s);
// Length of the sequence a lead byte starts (1 for continuation/invalid bytes).
size_t unicode_utf8_len(uint8_t lead);
void unicode_append_utf8(std::string& out, uint32_t cp);

// GPT-2 byte-level mapping: each byte is shown as a printable code point
// (printable Latin-1 bytes map to themselves, the rest to U+0100 upwards).
uint32_t unicode_byte_to_cpt(uint8_t b);
int unicode_cpt_to_byte(uint32_t cp);  // -1 if cp stands for no byte

// Pre-tokenizer patterns (hand-written matchers, no regex engine):
//   GPT2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   DIGITS_GPT2  every \p{N} isolated first, then GPT2 on the text between
//           (SmolLM, StarCoder, Refact)
//   LLAMA3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   QWEN2   as LLAMA3 with \p{N} (single digits); tokenizer.ggml.pre qwen2 and
//           deepseek-r1-qwen
enum class unicode_pre { GPT2, DIGITS_GPT2, LLAMA3, QWEN2 };

// tokenizer.ggml.pre name -> pattern; false for an unknown name.
// unicode_pre_names() lists the known names, for error messages.
bool unicode_pre_from_name(std::string_view name, unicode_pre& kind);
std::string unicode_pre_names();

// Splits `text` into pieces and appends their byte ranges [begin, end) to
// `out`; the pieces cover the text exactly and in order.
void unicode_pre_split(unicode_pre kind, std::string_view text,
                       std::vector<std::pair<size_t, size_t>>& out);

}  // namespace zk
