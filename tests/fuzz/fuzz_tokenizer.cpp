// Fuzz target "tokenizer": arbitrary bytes encoded and decoded by byte-level BPE
// (the default model's vocabulary with each pre-tokenizer zack knows, and the
// tiny test vocabulary) and SentencePiece-style BPE (a synthetic vocabulary with
// byte fallback, with and without the space prefix).
// Input: byte 0 picks the vocabulary and the add_special / parse_special flags,
// the rest is the text. Checked: every id is in range; streaming the pieces
// through utf8_stream loses and adds nothing; and where the vocabulary can
// represent every byte, decode(encode(text)) gives the text back.
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "engine/unicode.h"
#include "engine/vocab.h"
#include "ggml-like/error.h"
#include "ggml-like/gguf.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/tiny_model.h"

namespace zk_fuzz {

namespace {

struct fuzz_vocab {
    std::string name;
    std::unique_ptr<zk::vocab> voc;
    bool byte_level = false;  // BPE: bytes without a token are dropped by encode
    bool missing[256] = {};   // byte-level: bytes whose mapped code point is no token
    bool roundtrip = false;   // decode(encode(text)) == text (minus missing bytes)
};

std::vector<fuzz_vocab>& vocabs() {
    static std::vector<fuzz_vocab> v;
    return v;
}

[[noreturn]] void fail(const std::string& what) {
    std::fprintf(stderr, "fuzz tokenizer: %s\n", what.c_str());
    std::abort();
}

// The tokenizer.* keys of `src` with tokenizer.ggml.pre replaced, as a GGUF.
void write_tokenizer_copy(const zk::gguf_file& src, const std::string& pre, const std::string& path) {
    zk::gguf_writer w;
    for (const auto& kv : src.kv())
        if (kv.first.rfind("tokenizer.", 0) == 0 && kv.first != "tokenizer.chat_template") w.set(kv.first, kv.second);
    w.set("tokenizer.ggml.pre", zk::gguf_value::make_str(pre));
    w.write(path);
}

// A SentencePiece-style vocabulary: <unk>, <s>, </s>, the 256 byte tokens,
// U+2581 and letters, and merged pieces whose scores make merge order matter.
void write_spm(const std::string& path, bool space_prefix, bool user_defined) {
    using zk::gguf_value;
    std::vector<std::string> tok = {"<unk>", "<s>", "</s>"};
    std::vector<int32_t> type = {2, 3, 3};
    std::vector<float> score = {0, 0, 0};
    char buf[8];
    for (int b = 0; b < 256; b++) {
        std::snprintf(buf, sizeof buf, "<0x%02X>", b);
        tok.push_back(buf), type.push_back(6), score.push_back(0);
    }
    const char* pieces[] = {"\xE2\x96\x81", "a", "b", "c", "t", "h", "e", "\xE2\x96\x81t", "he", "\xE2\x96\x81the",
                            "ab", "abc", "\xC3\xA9", "\xE2\x96\x81\xE2\x96\x81", "bc", "\xE4\xB8\xAD"};
    float s = -1;
    for (const char* p : pieces) tok.push_back(p), type.push_back(1), score.push_back(s -= 0.5f);
    if (user_defined) tok.push_back("<tool>"), type.push_back(4), score.push_back(0);
    zk::gguf_writer w;
    w.set("tokenizer.ggml.model", gguf_value::make_str("llama"));
    w.set("tokenizer.ggml.tokens", gguf_value::make_arr_str(tok));
    w.set("tokenizer.ggml.token_type", gguf_value::make_arr_i32(type));
    w.set("tokenizer.ggml.scores", gguf_value::make_arr_f32(score));
    w.set("tokenizer.ggml.unknown_token_id", gguf_value::make_u32(0));
    w.set("tokenizer.ggml.bos_token_id", gguf_value::make_u32(1));
    w.set("tokenizer.ggml.eos_token_id", gguf_value::make_u32(2));
    w.set("tokenizer.ggml.add_space_prefix", gguf_value::make_bool(space_prefix));
    w.write(path);
}

void add_vocab(const std::string& name, const std::string& path, bool byte_level, bool roundtrip) {
    fuzz_vocab v;
    v.name = name;
    auto f = zk::gguf_file::open(path);
    v.voc = zk::vocab::from_gguf(*f);
    v.byte_level = byte_level;
    v.roundtrip = roundtrip;
    if (byte_level)
        for (int b = 0; b < 256; b++) {
            std::string t;
            zk::unicode_append_utf8(t, zk::unicode_byte_to_cpt((uint8_t)b));
            v.missing[b] = v.voc->find(t) < 0;
        }
    vocabs().push_back(std::move(v));
}

}  // namespace

void fuzz_tokenizer_init() {
    if (!vocabs().empty()) return;
    const std::string dir = fuzz_scratch_dir();
    {
        auto model = zk::gguf_file::open(fuzz_model_path());
        add_vocab("default model", fuzz_model_path(), true, true);
        for (const char* pre : {"gpt2", "llama-bpe", "qwen2"}) {
            const std::string p = dir + "/tok_" + pre + ".gguf";
            write_tokenizer_copy(*model, pre, p);
            add_vocab(std::string("default model, pre ") + pre, p, true, true);
        }
    }
    zk_test::tiny_model_params tp;
    tp.n_layer = 1, tp.n_embd = 32, tp.n_head = 1, tp.n_head_kv = 1, tp.n_ff = 32;
    zk_test::tiny_model_write(dir + "/tiny.gguf", tp);
    add_vocab("tiny byte-level", dir + "/tiny.gguf", true, true);
    write_spm(dir + "/spm.gguf", true, false);
    add_vocab("spm", dir + "/spm.gguf", false, true);
    write_spm(dir + "/spm_noprefix.gguf", false, false);
    add_vocab("spm without space prefix", dir + "/spm_noprefix.gguf", false, true);
    write_spm(dir + "/spm_user.gguf", true, true);
    add_vocab("spm with a user-defined token", dir + "/spm_user.gguf", false, false);
}

void fuzz_tokenizer_one(const uint8_t* data, size_t size) {
    if (size == 0) return;
    fuzz_tokenizer_init();
    const uint8_t sel = data[0];
    const fuzz_vocab& fv = vocabs()[(sel & 0x3f) % vocabs().size()];
    const bool add_special = sel & 0x40, parse_special = sel & 0x80;
    const std::string text((const char*)data + 1, size - 1);
    const zk::vocab& voc = *fv.voc;

    const std::vector<int32_t> ids = voc.encode(text, add_special, parse_special);
    std::string pieces, streamed;
    zk::utf8_stream st;
    for (int32_t id : ids) {
        if (id < 0 || id >= voc.n_tokens()) fail(fv.name + ": id out of range");
        const std::string p = voc.token_to_piece(id, true);
        pieces += p;
        streamed += st.push(p);
    }
    streamed += st.flush();
    if (streamed != pieces) fail(fv.name + ": utf8_stream changed the text");
    const std::string back = voc.decode(ids);

    if (!fv.roundtrip || add_special || parse_special) return;
    std::string expect;
    if (fv.byte_level) {
        for (unsigned char c : text)
            if (!fv.missing[c]) expect += (char)c;
    } else {
        if (text.find("\xE2\x96\x81") != std::string::npos) return;  // U+2581 decodes as a space
        expect = text;
    }
    if (back != expect) fail(fv.name + ": decode(encode(text)) differs from the text");
}

std::vector<std::pair<std::string, std::string>> fuzz_tokenizer_seeds() {
    std::vector<std::pair<std::string, std::string>> out;
    const char* texts[] = {
        "Hello world! It's 2024, isn't it?  Tabs\tand\nnewlines\r\n",
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 \xE2\x96\x81the abc",
        "12345678 3.14159 1,000,000 x=y+z; // code",
        "\xFF\xFE invalid \xC3 utf-8 \xE2\x82",
        "   leading and trailing spaces   ",
    };
    int k = 0;
    for (const char* t : texts)
        for (uint8_t sel : {(uint8_t)0x00, (uint8_t)0x04, (uint8_t)0xC1, (uint8_t)0x05, (uint8_t)0x06}) {
            out.push_back({"text" + std::to_string(k++), std::string(1, (char)sel) + t});
        }
    return out;
}

}  // namespace zk_fuzz
