// Tokenizer built from GGUF metadata. Sections: loading, special-token splitting,
// byte-level BPE (model "gpt2"), SentencePiece-style BPE (model "llama"),
// pieces and decoding, utf8_stream.
#include "engine/vocab.h"

#include <algorithm>
#include <queue>
#include <unordered_map>

#include "engine/unicode.h"
#include "ggml-like/error.h"
#include "ggml-like/gguf.h"

namespace zk {

namespace {

// tokenizer.ggml.token_type values.
enum token_kind : int32_t {
    TOKEN_NORMAL = 1,
    TOKEN_UNKNOWN = 2,
    TOKEN_CONTROL = 3,
    TOKEN_USER_DEFINED = 4,
    TOKEN_UNUSED = 5,
    TOKEN_BYTE = 6,
};

const char* const k_space_marker = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// End-of-turn texts, looked up when tokenizer.ggml.eot_token_id is absent; all of
// them (and <|endoftext|>, <|eom_id|>) also end generation when they are control tokens.
const char* const k_eot_texts[] = {"<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>"};
const char* const k_eog_texts[] = {"<|endoftext|>", "<|eom_id|>"};

// "<0xNN>" -> NN, or -1.
int parse_byte_token(const std::string& s) {
    if (s.size() != 6 || s.compare(0, 3, "<0x") != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        const char c = s[k];
        const int d = (c >= '0' && c <= '9')   ? c - '0'
                      : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                      : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                               : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

uint64_t pair_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

// (left id, right id) -> (rank, merged id), open addressing with linear probing:
// the lookup is the inner loop of BPE, and a node-based map spends it on cache misses.
class merge_table {
public:
    struct entry {
        uint64_t key;
        int32_t rank, merged;
    };
    void init(size_t n) {
        size_t cap = 16;
        while (cap < 2 * n) cap *= 2;
        slots_.assign(cap, entry{k_empty, -1, -1});
        mask_ = cap - 1;
    }
    // Keeps the first insertion of a key (the lowest rank).
    void insert(uint64_t key, int32_t rank, int32_t merged) {
        for (size_t i = slot(key);; i = (i + 1) & mask_) {
            if (slots_[i].key == key) return;
            if (slots_[i].key == k_empty) {
                slots_[i] = {key, rank, merged};
                return;
            }
        }
    }
    const entry* find(uint64_t key) const {
        if (slots_.empty()) return nullptr;
        for (size_t i = slot(key);; i = (i + 1) & mask_) {
            if (slots_[i].key == key) return &slots_[i];
            if (slots_[i].key == k_empty) return nullptr;
        }
    }

private:
    static constexpr uint64_t k_empty = ~0ull;  // ids are >= 0, so no real key is all ones
    size_t slot(uint64_t key) const {
        return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask_;
    }
    std::vector<entry> slots_;
    size_t mask_ = 0;
};

// A stretch of the input: raw text to tokenize, or an already matched special token.
struct fragment {
    int32_t token;  // -1 for raw text
    size_t begin, end;
};

}  // namespace

struct vocab::impl {
    vocab_type type = vocab_type::BPE;
    std::string pre;
    unicode_pre pre_kind = unicode_pre::GPT2;
    bool ignore_merges = false;  // Llama-3: a pre-token that is a whole token is used as is

    std::vector<std::string> text;                        // (n_tokens)
    std::vector<float> score;                             // (n_tokens), SPM merge priority
    std::vector<int32_t> kind;                            // (n_tokens), token_kind
    std::unordered_map<std::string_view, int32_t> index;  // views into `text`
    merge_table merges;
    int32_t byte_token[256];  // BPE: token of the byte's mapped code point; SPM: <0xNN>

    int32_t bos = -1, eos = -1, eot = -1, unk = -1;
    bool add_bos = false, add_eos = false, add_space_prefix = false;
    std::vector<uint8_t> eog;  // (n_tokens)
    // Tokens matched as wholes inside the text, by first byte, longest first.
    std::vector<int32_t> specials_by_byte[256];

    void load(const gguf_file& f);
    std::vector<fragment> split_specials(std::string_view s, bool parse_special) const;
    void bpe_encode(std::string_view s, std::vector<int32_t>& out) const;
    void bpe_piece(std::string_view piece, std::vector<int32_t>& out) const;
    void spm_encode(std::string_view s, bool space_prefix, std::vector<int32_t>& out) const;
    int32_t lookup(std::string_view s) const {
        auto it = index.find(s);
        return it == index.end() ? -1 : it->second;
    }
    bool mergeable(int32_t id) const {
        return id >= 0 && (kind[id] == TOKEN_NORMAL || kind[id] == TOKEN_USER_DEFINED);
    }
};

// ---- loading ----

void vocab::impl::load(const gguf_file& f) {
    const std::string& path = f.path();
    const std::string model = f.get_str("tokenizer.ggml.model");
    if (model == "gpt2") {
        type = vocab_type::BPE;
    } else if (model == "llama") {
        type = vocab_type::SPM;
    } else {
        ZK_THROW("%s: unknown tokenizer.ggml.model '%s' (supported: gpt2, llama)", path.c_str(),
                 model.c_str());
    }

    const gguf_value* tokens = f.find("tokenizer.ggml.tokens");
    if (!tokens || tokens->type != gguf_type::ARRAY || tokens->arr.empty()) {
        ZK_THROW("%s: missing or empty tokenizer.ggml.tokens", path.c_str());
    }
    const size_t n = tokens->arr.size();
    text.reserve(n);
    for (const auto& v : tokens->arr) text.push_back(v.as_str("tokenizer.ggml.tokens[]"));
    auto read_array = [&](const char* key, auto& dst, auto conv, auto dflt) {
        const gguf_value* v = f.find(key);
        if (!v) {
            dst.assign(n, dflt);
            return;
        }
        if (v->type != gguf_type::ARRAY || v->arr.size() != n) {
            ZK_THROW("%s: %s has %zu entries, expected %zu (one per token)", path.c_str(), key,
                     v->type == gguf_type::ARRAY ? v->arr.size() : (size_t)0, n);
        }
        dst.clear();
        for (const auto& e : v->arr) dst.push_back(conv(e, key));
    };
    read_array(
        "tokenizer.ggml.token_type", kind,
        [](const gguf_value& e, const char* k) { return (int32_t)e.as_int(k); },
        (int32_t)TOKEN_NORMAL);
    read_array(
        "tokenizer.ggml.scores", score,
        [](const gguf_value& e, const char* k) { return (float)e.as_float(k); }, 0.0f);

    index.reserve(n * 2);
    for (size_t i = 0; i < n; i++) index.emplace(std::string_view(text[i]), (int32_t)i);

    auto token_id = [&](const char* key) -> int32_t {
        const int64_t id = f.get_int(key, -1);
        if (id < -1 || id >= (int64_t)n) {
            ZK_THROW("%s: %s = %lld is out of range (vocabulary has %zu tokens)", path.c_str(), key,
                     (long long)id, n);
        }
        return (int32_t)id;
    };
    bos = token_id("tokenizer.ggml.bos_token_id");
    eos = token_id("tokenizer.ggml.eos_token_id");
    unk = token_id("tokenizer.ggml.unknown_token_id");
    eot = token_id("tokenizer.ggml.eot_token_id");
    if (eot < 0) {
        for (const char* t : k_eot_texts) {
            if ((eot = lookup(t)) >= 0) break;
        }
    }
    const bool spm = type == vocab_type::SPM;
    add_bos = f.get_bool("tokenizer.ggml.add_bos_token", spm);
    add_eos = f.get_bool("tokenizer.ggml.add_eos_token", false);
    // llama.cpp ignores the prefix flag for byte-level BPE; so do we.
    add_space_prefix = spm && f.get_bool("tokenizer.ggml.add_space_prefix", true);

    eog.assign(n, 0);
    for (int32_t id : {eos, eot}) {
        if (id >= 0) eog[id] = 1;
    }
    auto mark_eog = [&](const char* t) {
        const int32_t id = lookup(t);
        if (id >= 0 && kind[id] == TOKEN_CONTROL) eog[id] = 1;
    };
    for (const char* t : k_eot_texts) mark_eog(t);
    for (const char* t : k_eog_texts) mark_eog(t);

    for (size_t i = 0; i < n; i++) {
        if ((kind[i] == TOKEN_CONTROL || kind[i] == TOKEN_USER_DEFINED) && !text[i].empty()) {
            specials_by_byte[(uint8_t)text[i][0]].push_back((int32_t)i);
        }
    }
    for (auto& list : specials_by_byte) {
        std::stable_sort(list.begin(), list.end(),
                         [&](int32_t a, int32_t b) { return text[a].size() > text[b].size(); });
    }

    std::fill(std::begin(byte_token), std::end(byte_token), -1);
    if (spm) {
        for (size_t i = 0; i < n; i++) {
            const int b = parse_byte_token(text[i]);
            if (b >= 0 && byte_token[b] < 0) byte_token[b] = (int32_t)i;
        }
        return;
    }

    pre = f.get_str("tokenizer.ggml.pre", "default");
    if (!unicode_pre_from_name(pre, pre_kind)) {
        ZK_THROW("%s: unknown tokenizer.ggml.pre '%s' (supported: %s)", path.c_str(), pre.c_str(),
                 unicode_pre_names().c_str());
    }
    ignore_merges = pre_kind == unicode_pre::LLAMA3;

    for (int b = 0; b < 256; b++) {
        std::string s;
        unicode_append_utf8(s, unicode_byte_to_cpt((uint8_t)b));
        byte_token[b] = lookup(s);
    }
    const gguf_value* m = f.find("tokenizer.ggml.merges");
    if (!m || m->type != gguf_type::ARRAY) {
        ZK_THROW("%s: BPE tokenizer without tokenizer.ggml.merges", path.c_str());
    }
    merges.init(m->arr.size());
    for (size_t r = 0; r < m->arr.size(); r++) {
        const std::string& line = m->arr[r].as_str("tokenizer.ggml.merges[]");
        const size_t sp = line.find(' ', 1);  // byte-level tokens never hold a space
        const int32_t a =
            sp == std::string::npos ? -1 : lookup(std::string_view(line).substr(0, sp));
        const int32_t b =
            sp == std::string::npos ? -1 : lookup(std::string_view(line).substr(sp + 1));
        const int32_t ab = (a < 0 || b < 0) ? -1 : lookup(text[a] + text[b]);
        if (ab < 0) {
            ZK_THROW("%s: merge %zu '%s' names tokens that are not in the vocabulary", path.c_str(),
                     r, line.c_str());
        }
        merges.insert(pair_key(a, b), (int32_t)r, ab);
    }
}

std::unique_ptr<vocab> vocab::from_gguf(const gguf_file& f) {
    std::unique_ptr<vocab> v(new vocab());
    v->p_->load(f);
    return v;
}

vocab::vocab() : p_(new impl()) {}
vocab::~vocab() = default;

vocab_type vocab::type() const {
    return p_->type;
}
const std::string& vocab::pre() const {
    return p_->pre;
}
int32_t vocab::n_tokens() const {
    return (int32_t)p_->text.size();
}
int32_t vocab::bos() const {
    return p_->bos;
}
int32_t vocab::eos() const {
    return p_->eos;
}
int32_t vocab::eot() const {
    return p_->eot;
}
bool vocab::add_bos() const {
    return p_->add_bos;
}
bool vocab::add_eos() const {
    return p_->add_eos;
}
bool vocab::is_eog(int32_t id) const {
    return id >= 0 && id < n_tokens() && p_->eog[id];
}
bool vocab::is_control(int32_t id) const {
    return id >= 0 && id < n_tokens() && p_->kind[id] == TOKEN_CONTROL;
}
int32_t vocab::find(std::string_view t) const {
    return p_->lookup(t);
}
const std::string& vocab::token_text(int32_t id) const {
    if (id < 0 || id >= n_tokens()) ZK_THROW("token id %d out of range [0, %d)", id, n_tokens());
    return p_->text[id];
}

// ---- special tokens ----

// Leftmost-longest matching of special-token texts (user-defined ones always,
// control ones only when parse_special), as HF's added-vocabulary split does.
std::vector<fragment> vocab::impl::split_specials(std::string_view s, bool parse_special) const {
    std::vector<fragment> out;
    size_t raw = 0;
    for (size_t pos = 0; pos < s.size();) {
        int32_t hit = -1;
        for (int32_t id : specials_by_byte[(uint8_t)s[pos]]) {
            if (!parse_special && kind[id] == TOKEN_CONTROL) continue;
            const std::string& t = text[id];
            if (s.compare(pos, t.size(), t) == 0) {
                hit = id;
                break;
            }
        }
        if (hit < 0) {
            pos++;
            continue;
        }
        if (pos > raw) out.push_back({-1, raw, pos});
        out.push_back({hit, pos, pos + text[hit].size()});
        pos += text[hit].size();
        raw = pos;
    }
    if (raw < s.size()) out.push_back({-1, raw, s.size()});
    return out;
}

std::vector<int32_t> vocab::encode(std::string_view s, bool add_special, bool parse_special) const {
    const impl& v = *p_;
    std::vector<int32_t> out;
    out.reserve(s.size() / 3 + 4);
    if (add_special && v.add_bos && v.bos >= 0) out.push_back(v.bos);
    // SentencePiece prefixes a space to the text at the start and after each
    // special token (llama.cpp's behaviour).
    bool prev_special = true;
    for (const fragment& fr : v.split_specials(s, parse_special)) {
        if (fr.token >= 0) {
            out.push_back(fr.token);
            prev_special = true;
            continue;
        }
        const std::string_view part = s.substr(fr.begin, fr.end - fr.begin);
        if (v.type == vocab_type::BPE) {
            v.bpe_encode(part, out);
        } else {
            v.spm_encode(part, v.add_space_prefix && prev_special, out);
        }
        prev_special = false;
    }
    if (add_special && v.add_eos && v.eos >= 0) out.push_back(v.eos);
    return out;
}

// ---- byte-level BPE ----

void vocab::impl::bpe_encode(std::string_view s, std::vector<int32_t>& out) const {
    std::vector<std::pair<size_t, size_t>> pieces;
    unicode_pre_split(pre_kind, s, pieces);
    for (const auto& pc : pieces) bpe_piece(s.substr(pc.first, pc.second - pc.first), out);
}

// Merges the adjacent pair of lowest merge rank (leftmost on ties) until no pair
// has a merge. Symbols form a linked list over the bytes; a min-heap holds
// candidate pairs, re-checked when popped because merges make some stale.
void vocab::impl::bpe_piece(std::string_view piece, std::vector<int32_t>& out) const {
    if (ignore_merges) {
        std::string mapped;
        for (char c : piece) unicode_append_utf8(mapped, unicode_byte_to_cpt((uint8_t)c));
        const int32_t id = lookup(mapped);
        if (id >= 0) {
            out.push_back(id);
            return;
        }
    }
    const int32_t n = (int32_t)piece.size();
    struct symbol {
        int32_t id, prev, next;  // id -2: absorbed into its left neighbour
    };
    std::vector<symbol> sym(n);
    for (int32_t i = 0; i < n; i++)
        sym[i] = {byte_token[(uint8_t)piece[i]], i - 1, i + 1 < n ? i + 1 : -1};

    struct cand {
        int32_t rank, left, left_id, right_id, merged;
        bool operator<(const cand& o) const {  // inverted: priority_queue pops the smallest
            return rank != o.rank ? rank > o.rank : left > o.left;
        }
    };
    std::priority_queue<cand> heap;
    auto push_pair = [&](int32_t left) {
        if (left < 0 || sym[left].next < 0) return;
        const int32_t a = sym[left].id, b = sym[sym[left].next].id;
        if (a < 0 || b < 0) return;
        if (const auto* e = merges.find(pair_key(a, b)))
            heap.push({e->rank, left, a, b, e->merged});
    };
    for (int32_t i = 0; i + 1 < n; i++) push_pair(i);

    while (!heap.empty()) {
        const cand c = heap.top();
        heap.pop();
        symbol& l = sym[c.left];
        if (l.id != c.left_id || l.next < 0 || sym[l.next].id != c.right_id) continue;  // stale
        symbol& r = sym[l.next];
        l.id = c.merged;
        l.next = r.next;
        if (r.next >= 0) sym[r.next].prev = c.left;
        r.id = -2;
        push_pair(l.prev);
        push_pair(c.left);
    }
    // A byte whose mapped code point is no token (SmolLM2 lacks e.g. 0x1D) is dropped,
    // as HF's BPE without an unk_token does; GGUFs name an unknown id regardless.
    for (int32_t i = 0; i >= 0 && i < n; i = sym[i].next) {
        if (sym[i].id >= 0) out.push_back(sym[i].id);
    }
}

// ---- SentencePiece-style BPE ----

// Spaces become U+2581; symbols start as UTF-8 characters; the adjacent pair whose
// concatenation is a token with the highest score merges first (leftmost on
// ties). What is left and is no token falls back to <0xNN> byte tokens.
void vocab::impl::spm_encode(std::string_view s, bool space_prefix,
                             std::vector<int32_t>& out) const {
    std::string t;
    t.reserve(s.size() + 8);
    if (space_prefix) t += k_space_marker;
    for (char c : s) {
        if (c == ' ') {
            t += k_space_marker;
        } else {
            t += c;
        }
    }
    struct symbol {
        int32_t begin, len, prev, next;  // len 0: absorbed into its left neighbour
    };
    std::vector<symbol> sym;
    for (size_t pos = 0; pos < t.size();) {
        const size_t start = pos;
        unicode_decode_utf8(t, pos);  // an invalid byte is a symbol of its own
        const int32_t i = (int32_t)sym.size();
        sym.push_back({(int32_t)start, (int32_t)(pos - start), i - 1, -1});
        if (i > 0) sym[i - 1].next = i;
    }
    struct cand {
        float score;
        int32_t left, len;
        bool operator<(const cand& o) const {  // priority_queue pops the highest score
            return score != o.score ? score < o.score : left > o.left;
        }
    };
    std::priority_queue<cand> heap;
    auto push_pair = [&](int32_t left) {
        if (left < 0 || sym[left].next < 0) return;
        const int32_t len = sym[left].len + sym[sym[left].next].len;
        const int32_t id = lookup(std::string_view(t).substr(sym[left].begin, len));
        if (mergeable(id)) heap.push({score[id], left, len});
    };
    for (int32_t i = 0; i + 1 < (int32_t)sym.size(); i++) push_pair(i);
    while (!heap.empty()) {
        const cand c = heap.top();
        heap.pop();
        symbol& l = sym[c.left];
        if (l.len == 0 || l.next < 0 || l.len + sym[l.next].len != c.len) continue;  // stale
        symbol& r = sym[l.next];
        l.len = c.len;
        l.next = r.next;
        if (r.next >= 0) sym[r.next].prev = c.left;
        r.len = 0;
        push_pair(l.prev);
        push_pair(c.left);
    }
    for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) {
        const std::string_view piece = std::string_view(t).substr(sym[i].begin, sym[i].len);
        const int32_t id = lookup(piece);
        if (mergeable(id)) {
            out.push_back(id);
            continue;
        }
        for (char c : piece) {
            const int32_t b = byte_token[(uint8_t)c];
            if (b >= 0) {
                out.push_back(b);
            } else if (unk >= 0) {
                out.push_back(unk);
            }
        }
    }
}

// ---- pieces and decoding ----

std::string vocab::token_to_piece(int32_t id, bool special) const {
    const impl& v = *p_;
    const std::string& t = token_text(id);
    switch (v.kind[id]) {
        case TOKEN_CONTROL:
            return special ? t : std::string();
        case TOKEN_UNUSED:
            return std::string();
        case TOKEN_UNKNOWN:
            return special ? t : std::string("\xE2\x96\x85");  // U+2585, as llama.cpp shows it
        case TOKEN_USER_DEFINED:
            return t;
        case TOKEN_BYTE: {
            const int b = parse_byte_token(t);
            if (b >= 0) return std::string(1, (char)b);
            return t;
        }
        default:
            break;
    }
    std::string out;
    if (v.type == vocab_type::SPM) {
        for (size_t pos = 0; pos < t.size();) {
            if (t.compare(pos, 3, k_space_marker) == 0) {
                out += ' ';
                pos += 3;
            } else {
                out += t[pos++];
            }
        }
        return out;
    }
    for (size_t pos = 0; pos < t.size();) {
        const size_t start = pos;
        const uint32_t cp = unicode_decode_utf8(t, pos);
        const int b = cp == UNICODE_INVALID ? -1 : unicode_cpt_to_byte(cp);
        if (b >= 0) {
            out += (char)b;
        } else {
            out.append(t, start, pos - start);  // not a mapped byte: keep the text
        }
    }
    return out;
}

std::string vocab::decode(const std::vector<int32_t>& ids, bool special) const {
    std::string out;
    bool strip = p_->add_space_prefix;  // undo the prefix encode() put at the start
    for (int32_t id : ids) {
        std::string piece = token_to_piece(id, special);
        if (piece.empty()) continue;
        if (strip && piece[0] == ' ') piece.erase(0, 1);
        strip = false;
        out += piece;
    }
    return out;
}

// ---- utf8_stream ----

std::string utf8_stream::push(const std::string& piece) {
    pending_ += piece;
    const size_t n = pending_.size();
    size_t cut = n;
    // Find the last lead byte; hold it back if its sequence is not complete yet.
    for (size_t k = 1; k <= 4 && k <= n; k++) {
        const auto b = (uint8_t)pending_[n - k];
        if ((b & 0xC0) == 0x80) continue;
        if (unicode_utf8_len(b) > k) cut = n - k;
        break;
    }
    std::string ready = pending_.substr(0, cut);
    pending_.erase(0, cut);
    return ready;
}

std::string utf8_stream::flush() {
    std::string rest;
    rest.swap(pending_);
    return rest;
}

}  // namespace zk
