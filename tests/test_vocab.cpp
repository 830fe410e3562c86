// Tokenizer unit tests on small synthetic vocabularies written to temporary GGUF
// files: SentencePiece-style BPE (merge order by score, space prefix, byte
// fallback, decode), byte-level BPE merge ranks, special tokens, eot detection,
// utf8_stream, Unicode classes and the errors for unknown model/pre names.
// Expected token sequences are worked out by hand from the algorithms' definitions.
// The large comparison against HF tokenizers is tests/test_tokenizer_ref.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "engine/unicode.h"
#include "engine/vocab.h"
#include "ggml-like/error.h"
#include "ggml-like/gguf.h"

using namespace zk;

namespace {

const std::string k_sp = "\xE2\x96\x81";  // U+2581

struct token_def {
    std::string text;
    float score;
    int32_t type;  // 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte
};

// A vocabulary written to a temp GGUF and loaded back through gguf_file.
class synthetic {
public:
    gguf_writer w;
    std::vector<token_def> tokens;

    void add(const std::string& text, float score = 0.0f, int32_t type = 1) {
        tokens.push_back({text, score, type});
    }
    int32_t id(const std::string& text) const {
        for (size_t i = 0; i < tokens.size(); i++) {
            if (tokens[i].text == text) return (int32_t)i;
        }
        ADD_FAILURE() << "no token " << text;
        return -1;
    }
    std::unique_ptr<vocab> load() {
        std::vector<std::string> texts;
        std::vector<float> scores;
        std::vector<int32_t> types;
        for (const auto& t : tokens) {
            texts.push_back(t.text);
            scores.push_back(t.score);
            types.push_back(t.type);
        }
        w.set("tokenizer.ggml.tokens", gguf_value::make_arr_str(texts));
        w.set("tokenizer.ggml.scores", gguf_value::make_arr_f32(scores));
        w.set("tokenizer.ggml.token_type", gguf_value::make_arr_i32(types));
        const std::string path = ::testing::TempDir() + "zack_test_vocab_" +
                                 std::to_string(getpid()) + "_" + std::to_string(counter_++) +
                                 ".gguf";
        w.write(path);
        auto f = gguf_file::open(path);
        std::remove(path.c_str());  // the mapping stays valid
        auto v = vocab::from_gguf(*f);
        return v;
    }

private:
    static int counter_;
};
int synthetic::counter_ = 0;

// <unk>, <s>, </s>, 256 byte tokens, then the caller's pieces.
synthetic make_spm(bool space_prefix) {
    synthetic s;
    s.w.set("tokenizer.ggml.model", gguf_value::make_str("llama"));
    s.w.set("tokenizer.ggml.bos_token_id", gguf_value::make_u32(1));
    s.w.set("tokenizer.ggml.eos_token_id", gguf_value::make_u32(2));
    s.w.set("tokenizer.ggml.unknown_token_id", gguf_value::make_u32(0));
    s.w.set("tokenizer.ggml.add_space_prefix", gguf_value::make_bool(space_prefix));
    s.add("<unk>", 0, 2);
    s.add("<s>", 0, 3);
    s.add("</s>", 0, 3);
    for (int b = 0; b < 256; b++) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "<0x%02X>", b);
        s.add(buf, 0, 6);
    }
    return s;
}

std::vector<int32_t> ids_of(const synthetic& s, const std::vector<std::string>& texts) {
    std::vector<int32_t> out;
    for (const auto& t : texts) out.push_back(s.id(t));
    return out;
}

}  // namespace

// ---- SentencePiece-style BPE ----

TEST(VocabSpm, MergesHighestScoreFirst) {
    for (bool ab_wins : {true, false}) {
        synthetic s = make_spm(false);
        for (const char* c : {"a", "b", "c"}) s.add(c, -10);
        s.add("ab", ab_wins ? -1.0f : -2.0f);
        s.add("bc", ab_wins ? -2.0f : -1.0f);
        auto v = s.load();
        EXPECT_EQ(v->type(), vocab_type::SPM);
        // "abc": the higher-scoring pair merges first and blocks the other.
        const auto want = ab_wins ? ids_of(s, {"ab", "c"}) : ids_of(s, {"a", "bc"});
        EXPECT_EQ(v->encode("abc", false, false), want) << "ab_wins=" << ab_wins;
    }
}

TEST(VocabSpm, EqualScoresMergeLeftmostAndChain) {
    synthetic s = make_spm(false);
    s.add("a", -10);
    s.add("aa", -1);
    s.add("h", -10);
    s.add("e", -10);
    s.add("l", -10);
    s.add("o", -10);
    s.add("ll", -2);
    s.add("he", -3);
    s.add("llo", -4);
    s.add("hello", -5);
    auto v = s.load();
    EXPECT_EQ(v->encode("aaa", false, false), ids_of(s, {"aa", "a"}));
    // ll, then he, then llo, then he+llo: merges chain up to the whole word.
    EXPECT_EQ(v->encode("hello", false, false), ids_of(s, {"hello"}));
    EXPECT_EQ(v->encode("hell", false, false), ids_of(s, {"he", "ll"}));
}

TEST(VocabSpm, SpacePrefixAndSpaces) {
    for (bool prefix : {true, false}) {
        synthetic s = make_spm(prefix);
        for (const char* c : {"h", "i", "t"}) s.add(c, -10);
        s.add(k_sp, -5);
        s.add(k_sp + "h", -2);
        s.add(k_sp + "hi", -1);
        s.add("hi", -3);
        auto v = s.load();
        EXPECT_EQ(v->add_bos(), true);  // SPM default
        const auto got = v->encode("hi hi", false, false);
        const auto want =
            prefix ? ids_of(s, {k_sp + "hi", k_sp + "hi"}) : ids_of(s, {"hi", k_sp + "hi"});
        EXPECT_EQ(got, want) << "prefix=" << prefix;
        EXPECT_EQ(v->decode(got), "hi hi");
        // A leading space survives the round trip: only the added prefix is stripped.
        EXPECT_EQ(v->decode(v->encode(" hi", false, false)), " hi");
    }
}

TEST(VocabSpm, ByteFallbackAndDecode) {
    synthetic s = make_spm(true);
    s.add(k_sp, -5);
    s.add("h", -10);
    s.add(k_sp + "h", -1);
    auto v = s.load();
    // U+00E9 is no piece: its two UTF-8 bytes become <0xC3> <0xA9>.
    const auto ids = v->encode("h\xC3\xA9", true, false);
    const std::vector<int32_t> want = {1, s.id(k_sp + "h"), s.id("<0xC3>"), s.id("<0xA9>")};
    EXPECT_EQ(ids, want);
    EXPECT_EQ(v->token_to_piece(s.id("<0xC3>")), "\xC3");
    // A stray lead byte is one symbol: the letter after it stays a piece.
    EXPECT_EQ(v->encode("h\xC3h", false, false),
              (std::vector<int32_t>{s.id(k_sp + "h"), s.id("<0xC3>"), s.id("h")}));
    EXPECT_EQ(v->decode(ids), "h\xC3\xA9");
    // Only the first piece loses the prefix space, so a shown <s> keeps it after it.
    EXPECT_EQ(v->decode(ids, true), "<s> h\xC3\xA9");
    EXPECT_EQ(v->token_to_piece(1), "");
    EXPECT_EQ(v->token_to_piece(1, true), "<s>");
    EXPECT_TRUE(v->is_control(1));
    EXPECT_FALSE(v->is_control(s.id("h")));
}

TEST(VocabSpm, SpecialTokens) {
    synthetic s = make_spm(false);
    for (const char* c : {"<", "s", ">", "x", "t", "o", "l"}) s.add(c, -10);
    s.add("<tool>", 0, 4);  // user-defined: always matched
    auto v = s.load();
    const auto split = v->encode("x<s>x<tool>", false, true);
    EXPECT_EQ(split, (std::vector<int32_t>{s.id("x"), 1, s.id("x"), s.id("<tool>")}));
    // Without parse_special the control text is ordinary characters (it is no
    // merge target either); the user-defined token is still whole.
    const auto plain = v->encode("x<s>x<tool>", false, false);
    EXPECT_EQ(plain, ids_of(s, {"x", "<", "s", ">", "x", "<tool>"}));
    EXPECT_EQ(v->decode(plain), "x<s>x<tool>");
}

TEST(VocabSpm, BosEosFlags) {
    synthetic s = make_spm(false);
    s.add("x", -1);
    s.w.set("tokenizer.ggml.add_bos_token", gguf_value::make_bool(false));
    s.w.set("tokenizer.ggml.add_eos_token", gguf_value::make_bool(true));
    auto v = s.load();
    EXPECT_EQ(v->encode("x", true, false), (std::vector<int32_t>{s.id("x"), 2}));
    EXPECT_EQ(v->encode("x", false, false), (std::vector<int32_t>{s.id("x")}));
    EXPECT_TRUE(v->is_eog(2));
    EXPECT_FALSE(v->is_eog(1));
}

// ---- byte-level BPE ----

namespace {

// The 256 byte tokens (GPT-2 mapped) plus the given merges' results.
synthetic make_bpe(const std::vector<std::string>& merges, const std::string& pre = "gpt2") {
    synthetic s;
    s.w.set("tokenizer.ggml.model", gguf_value::make_str("gpt2"));
    s.w.set("tokenizer.ggml.pre", gguf_value::make_str(pre));
    for (int b = 0; b < 256; b++) {
        std::string t;
        unicode_append_utf8(t, unicode_byte_to_cpt((uint8_t)b));
        s.add(t);
    }
    for (const auto& m : merges) {
        const size_t sp = m.find(' ');
        s.add(m.substr(0, sp) + m.substr(sp + 1));
    }
    s.add("<|im_end|>", 0, 3);
    s.w.set("tokenizer.ggml.merges", gguf_value::make_arr_str(merges));
    return s;
}

}  // namespace

TEST(VocabBpe, MergeRanks) {
    {
        synthetic s = make_bpe({"b c", "a b", "a bc"});
        auto v = s.load();
        EXPECT_EQ(v->encode("abc", false, false), ids_of(s, {"abc"}));  // bc (rank 0), then a+bc
    }
    {
        synthetic s = make_bpe({"a b", "b c", "a bc"});
        auto v = s.load();
        EXPECT_EQ(v->encode("abc", false, false), ids_of(s, {"ab", "c"}));
    }
}

TEST(VocabBpe, ByteMappingAndPieces) {
    // U+0120 'Ġ' is how GPT-2 shows the space byte.
    synthetic s = make_bpe({"\xC4\xA0 a",
                            "\xC4\xA0"
                            "a b"});
    auto v = s.load();
    const auto ids = v->encode("ab ab", false, false);
    EXPECT_EQ(ids, ids_of(s, {"a", "b",
                              "\xC4\xA0"
                              "ab"}));
    EXPECT_EQ(v->token_to_piece(s.id("\xC4\xA0"
                                     "ab")),
              " ab");
    EXPECT_EQ(v->decode(ids), "ab ab");
    // Arbitrary bytes (also invalid UTF-8) round-trip through the byte tokens.
    const std::string raw = "x\xFF\xC3(\n\t\x01";
    EXPECT_EQ(v->decode(v->encode(raw, false, false)), raw);
}

TEST(VocabBpe, EotAndSpecials) {
    synthetic s = make_bpe({});
    auto v = s.load();
    const int32_t im_end = s.id("<|im_end|>");
    EXPECT_EQ(v->eot(), im_end);
    EXPECT_TRUE(v->is_eog(im_end));
    EXPECT_EQ(v->find("<|im_end|>"), im_end);
    EXPECT_EQ(v->find("no such token"), -1);
    EXPECT_EQ(v->encode("a<|im_end|>", false, true), (std::vector<int32_t>{s.id("a"), im_end}));
    EXPECT_EQ(v->encode("<|im_end|>", false, false).size(), 10u);  // ten bytes as text
    EXPECT_EQ(v->token_to_piece(im_end), "");
    EXPECT_EQ(v->token_to_piece(im_end, true), "<|im_end|>");
    EXPECT_EQ(v->add_bos(), false);  // BPE default
}

TEST(VocabBpe, EotFromMetadata) {
    synthetic s = make_bpe({"a b"});
    s.w.set("tokenizer.ggml.eot_token_id", gguf_value::make_u32(3));
    auto v = s.load();
    EXPECT_EQ(v->eot(), 3);
    EXPECT_TRUE(v->is_eog(3));
}

// ---- errors ----

TEST(VocabErrors, UnknownModelAndPre) {
    {
        synthetic s = make_bpe({});
        s.w.set("tokenizer.ggml.model", gguf_value::make_str("wordpiece-xyz"));
        try {
            s.load();
            FAIL() << "no throw";
        } catch (const zk::error& e) {
            EXPECT_NE(std::string(e.what()).find("wordpiece-xyz"), std::string::npos) << e.what();
        }
    }
    {
        synthetic s = make_bpe({}, "made-up-pre");
        try {
            s.load();
            FAIL() << "no throw";
        } catch (const zk::error& e) {
            EXPECT_NE(std::string(e.what()).find("made-up-pre"), std::string::npos) << e.what();
        }
    }
    {
        synthetic s = make_bpe({"q z"});  // "qz" is in the vocabulary, but fine
        s.w.set("tokenizer.ggml.merges", gguf_value::make_arr_str({"nosuch token"}));
        EXPECT_THROW(s.load(), zk::error);
    }
    {
        gguf_writer w;
        w.set("tokenizer.ggml.model", gguf_value::make_str("gpt2"));
        const std::string path = ::testing::TempDir() + "zack_test_vocab_empty.gguf";
        w.write(path);
        auto f = gguf_file::open(path);
        std::remove(path.c_str());
        EXPECT_THROW(vocab::from_gguf(*f), zk::error);  // no tokens
    }
}

// ---- utf8_stream ----

TEST(Utf8Stream, HoldsBackIncompleteSequences) {
    utf8_stream st;
    EXPECT_EQ(st.push("a"), "a");
    EXPECT_EQ(st.push("\xC3"), "");  // first byte of U+00E9
    EXPECT_EQ(st.push("\xA9!"), "\xC3\xA9!");
    EXPECT_EQ(st.push("\xF0\x9F"), "");  // U+1F642 in three parts
    EXPECT_EQ(st.push("\x99"), "");
    EXPECT_EQ(st.push("\x82 ok"), "\xF0\x9F\x99\x82 ok");
    EXPECT_EQ(st.push("x\xE6\x97"), "x");  // U+65E5, cut
    EXPECT_EQ(st.flush(), "\xE6\x97");     // whatever is left
    EXPECT_EQ(st.flush(), "");
}

TEST(Utf8Stream, ReassemblesTokenPieces) {
    // Byte tokens split a multi-byte character; the stream gives it whole.
    synthetic s = make_bpe({});
    auto v = s.load();
    const std::string text = "\xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x99\x82";
    utf8_stream st;
    std::string out;
    for (int32_t id : v->encode(text, false, false)) {
        const std::string part = st.push(v->token_to_piece(id));
        // Every chunk handed out is complete UTF-8: it starts with no continuation byte.
        if (!part.empty()) {
            EXPECT_NE((uint8_t)part[0] & 0xC0, 0x80);
        }
        out += part;
    }
    out += st.flush();
    EXPECT_EQ(out, text);
}

// ---- Unicode classes and splitting ----

TEST(Unicode, Classes) {
    EXPECT_EQ(unicode_flags('A'), UNICODE_LETTER);
    EXPECT_EQ(unicode_flags(0x4E2D), UNICODE_LETTER);   // CJK
    EXPECT_EQ(unicode_flags(0x1D518), UNICODE_LETTER);  // MATHEMATICAL FRAKTUR CAPITAL U
    EXPECT_EQ(unicode_flags('7'), UNICODE_NUMBER);
    EXPECT_EQ(unicode_flags(0x0663), UNICODE_NUMBER);  // ARABIC-INDIC DIGIT THREE
    EXPECT_EQ(unicode_flags(0x216B), UNICODE_NUMBER);  // ROMAN NUMERAL TWELVE (Nl)
    EXPECT_EQ(unicode_flags(' '), UNICODE_SPACE);
    EXPECT_EQ(unicode_flags(0x3000), UNICODE_SPACE);
    EXPECT_EQ(unicode_flags(0x85), UNICODE_SPACE);
    EXPECT_EQ(unicode_flags(0x1C), 0);  // isspace() in Python, but not White_Space
    EXPECT_EQ(unicode_flags(0x0301), UNICODE_MARK);
    EXPECT_EQ(unicode_flags('!'), 0);
    EXPECT_EQ(unicode_flags(0x10FFFF), 0);
}

TEST(Unicode, Utf8Decode) {
    const std::string s = "a\xC3\xA9\xF0\x9F\x99\x82\xFF\xC0\x80\xED\xA0\x80";
    std::vector<uint32_t> cps;
    for (size_t pos = 0; pos < s.size();) cps.push_back(unicode_decode_utf8(s, pos));
    // a, U+00E9, U+1F642, then an invalid byte, an overlong pair and a surrogate,
    // each invalid byte on its own.
    const std::vector<uint32_t> want = {'a',
                                        0xE9,
                                        0x1F642,
                                        UNICODE_INVALID,
                                        UNICODE_INVALID,
                                        UNICODE_INVALID,
                                        UNICODE_INVALID,
                                        UNICODE_INVALID,
                                        UNICODE_INVALID};
    EXPECT_EQ(cps, want);
}

TEST(Unicode, PreSplitExamples) {
    auto split = [](unicode_pre kind, const std::string& s) {
        std::vector<std::pair<size_t, size_t>> r;
        unicode_pre_split(kind, s, r);
        std::vector<std::string> out;
        for (auto& p : r) out.push_back(s.substr(p.first, p.second - p.first));
        return out;
    };
    using V = std::vector<std::string>;
    EXPECT_EQ(split(unicode_pre::GPT2, "Hello world's  12x!!\n"),
              (V{"Hello", " world", "'s", " ", " 12", "x", "!!", "\n"}));
    EXPECT_EQ(split(unicode_pre::DIGITS_GPT2, "a 123"), (V{"a", " ", "1", "2", "3"}));
    EXPECT_EQ(split(unicode_pre::LLAMA3, "I'M 12345 ok.\n\n  x"),
              (V{"I", "'M", " ", "123", "45", " ok", ".\n\n", " ", " x"}));
    EXPECT_EQ(split(unicode_pre::QWEN2, "ab 12"), (V{"ab", " ", "1", "2"}));
    EXPECT_EQ(split(unicode_pre::LLAMA3, "a \n\t b"), (V{"a", " \n", "\t", " b"}));
}
