// Tokenizer built from GGUF metadata (tokenizer.ggml.*):
//   model "gpt2"  byte-level BPE; the pre-tokenizer regex is chosen by
//                 tokenizer.ggml.pre (smollm, gpt2, llama-bpe/llama3, qwen2, ...)
//   model "llama" SentencePiece-style BPE over scores with byte fallback (<0xNN>)
// Special and control tokens (token_type 3/4, e.g. <|im_start|>) are matched as
// whole tokens when parse_special is set. add_bos/add_eos follow the GGUF flags.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace zk {

class gguf_file;

enum class vocab_type { BPE, SPM };

class vocab {
public:
    // Throws zk::error for a missing/unknown tokenizer model or pre-tokenizer.
    static std::unique_ptr<vocab> from_gguf(const gguf_file& f);
    ~vocab();

    vocab_type type() const;
    const std::string& pre() const;  // pre-tokenizer name
    int32_t n_tokens() const;
    int32_t bos() const;  // -1 if none
    int32_t eos() const;  // -1 if none
    int32_t eot() const;  // end-of-turn (<|im_end|>, <|eot_id|>, <end_of_turn>), -1 if none
    bool add_bos() const;
    bool add_eos() const;
    bool is_eog(int32_t id) const;      // eos, eot and other end-of-generation tokens
    bool is_control(int32_t id) const;  // control/special tokens (not printed)
    int32_t find(std::string_view text) const;  // exact token text -> id, -1 if none

    // Text -> ids. add_special adds BOS/EOS as the GGUF flags say; parse_special
    // turns special-token texts inside `text` into their ids.
    std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;
    // The bytes one token stands for (may be an incomplete UTF-8 sequence).
    // Control tokens give their text only when `special` is true.
    std::string token_to_piece(int32_t id, bool special = false) const;
    std::string decode(const std::vector<int32_t>& ids, bool special = false) const;
    const std::string& token_text(int32_t id) const;  // raw vocabulary entry

private:
    vocab();
    struct impl;
    std::unique_ptr<impl> p_;
};

// Streams token pieces as valid UTF-8: holds back an incomplete trailing
// sequence until its remaining bytes arrive.
class utf8_stream {
public:
    std::string push(const std::string& piece);  // complete UTF-8 ready to print
    std::string flush();                         // whatever is left (may be invalid)
private:
    std::string pending_;
};

}  // namespace zk
