// GGUF v2/v3 reader (mmap, validated) and v3 writer (temp file + rename).
// The format is described at the top of gguf.h.
#include "ggml-like/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "ggml-like/error.h"
#include "ggml-like/file_out.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "GGUF I/O assumes a little-endian host");

namespace zk {

namespace {

constexpr uint32_t k_gguf_magic = 0x46554747u;  // "GGUF" read as a little-endian u32
constexpr size_t k_default_alignment = 32;
constexpr int k_max_array_depth = 8;  // deeper nesting is surely malformed; bounds recursion
constexpr int k_max_dims = 4;
constexpr uint32_t k_n_value_types = 13;
// A gguf_value takes ~100 bytes in memory, so a small-element array in a big file
// could cost 100x the file size. Real models hold ~1.5M metadata values (vocab,
// merges, scores); past this many the file is treated as corrupt.
constexpr size_t k_max_meta_values = (size_t)1 << 24;
// Reserve at most this many entries up front; vectors grow as items really parse.
constexpr size_t k_max_reserve = 4096;
// Memory the parsed header may take: a metadata value costs ~100 bytes in memory
// for as little as 1 in the file, so without a bound a small file could ask for
// a hundred times its size. Real files stay far below (SmolLM2: ~20 MB for a
// 98 MB file; a vocabulary-only Llama 3 file ~10x its 7.6 MB), so the bound is
// 16 x the file size plus a floor for small files.
constexpr size_t k_mem_per_file_byte = 16;
constexpr size_t k_mem_floor = (size_t)16 << 20;
// Bookkeeping bytes of one map entry (node, pointers, colour) besides its key.
constexpr size_t k_map_node_bytes = 64;

// Smallest encodings, used to reject absurd counts before allocating anything.
constexpr size_t k_min_kv_bytes = 8 + 4 + 1;              // empty key, u8 value
constexpr size_t k_min_tensor_bytes = 8 + 4 + 8 + 4 + 8;  // empty name, 1 dim

bool gguf_type_valid(uint32_t t) { return t < k_n_value_types; }

// Encoded size of a scalar value type; 0 for STRING/ARRAY (variable).
size_t gguf_type_fixed_size(gguf_type t) {
    switch (t) {
        case gguf_type::UINT8: case gguf_type::INT8: case gguf_type::BOOL: return 1;
        case gguf_type::UINT16: case gguf_type::INT16: return 2;
        case gguf_type::UINT32: case gguf_type::INT32: case gguf_type::FLOAT32: return 4;
        case gguf_type::UINT64: case gguf_type::INT64: case gguf_type::FLOAT64: return 8;
        default: return 0;
    }
}

// Minimal bytes one array element of type t can occupy in a file.
size_t gguf_type_min_size(gguf_type t) {
    if (t == gguf_type::STRING) return 8;
    if (t == gguf_type::ARRAY) return 4 + 8;
    return gguf_type_fixed_size(t);
}

bool gguf_type_is_unsigned(gguf_type t) {
    return t == gguf_type::UINT8 || t == gguf_type::UINT16 || t == gguf_type::UINT32 ||
           t == gguf_type::UINT64;
}
bool gguf_type_is_signed(gguf_type t) {
    return t == gguf_type::INT8 || t == gguf_type::INT16 || t == gguf_type::INT32 ||
           t == gguf_type::INT64;
}

size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
bool is_pow2(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

// ---------------------------------------------------------------------------
// Bounds-checked cursor over the mapped file. Every read calls need() first.

struct gguf_cursor {
    const std::string& path;
    const uint8_t* base;
    size_t size;
    size_t pos = 0;
    std::string ctx;  // what is being read, for error messages ("key 'x'", "tensor 'y'")
    size_t values_left = k_max_meta_values;  // array elements still allowed in all metadata
    size_t mem_left = 0;                      // bytes the parsed header may still take in memory

    // Accounts for n bytes of memory the header is about to take, before they are allocated.
    void charge(size_t n, const char* what) {
        if (n > mem_left)
            ZK_THROW("%s: %s%s%s: metadata too large for the file, file corrupt (expected at most %zu more bytes in memory for a %zu-byte file, got %zu)",
                     path.c_str(), ctx.c_str(), ctx.empty() ? "" : " ", what, mem_left, size, n);
        mem_left -= n;
    }

    size_t remaining() const { return size - pos; }

    void need(size_t n, const char* what) const {
        if (n > remaining())
            ZK_THROW("%s: truncated file while reading %s%s%s at offset %zu (expected %zu bytes, got %zu)",
                     path.c_str(), ctx.c_str(), ctx.empty() ? "" : " ", what, pos, n, remaining());
    }
    template <typename T>
    T read(const char* what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, base + pos, sizeof(T));
        pos += sizeof(T);
        return v;
    }
    std::string read_str(const char* what) {
        const uint64_t n = read<uint64_t>(what);
        if (n > remaining())
            ZK_THROW("%s: %s%s%s: string length too large, file corrupt or truncated, at offset %zu (expected at most %zu, got %" PRIu64 ")",
                     path.c_str(), ctx.c_str(), ctx.empty() ? "" : " ", what, pos - 8, remaining(), n);
        charge((size_t)n, what);
        std::string s((const char*)base + pos, (size_t)n);
        pos += (size_t)n;
        return s;
    }
    gguf_value read_value(gguf_type type, int depth);
};

gguf_value gguf_cursor::read_value(gguf_type type, int depth) {
    gguf_value v;
    v.type = type;
    switch (type) {
        case gguf_type::UINT8: v.u = read<uint8_t>("u8 value"); break;
        case gguf_type::INT8: v.i = read<int8_t>("i8 value"); break;
        case gguf_type::UINT16: v.u = read<uint16_t>("u16 value"); break;
        case gguf_type::INT16: v.i = read<int16_t>("i16 value"); break;
        case gguf_type::UINT32: v.u = read<uint32_t>("u32 value"); break;
        case gguf_type::INT32: v.i = read<int32_t>("i32 value"); break;
        case gguf_type::UINT64: v.u = read<uint64_t>("u64 value"); break;
        case gguf_type::INT64: v.i = read<int64_t>("i64 value"); break;
        case gguf_type::FLOAT32: v.f = read<float>("f32 value"); break;
        case gguf_type::FLOAT64: v.f = read<double>("f64 value"); break;
        case gguf_type::BOOL: v.u = read<uint8_t>("bool value") != 0; break;
        case gguf_type::STRING: v.s = read_str("string value"); break;
        case gguf_type::ARRAY: {
            if (depth >= k_max_array_depth)
                ZK_THROW("%s: %s: arrays nested too deep (expected at most %d levels, got more)",
                         path.c_str(), ctx.c_str(), k_max_array_depth);
            const uint32_t et = read<uint32_t>("array element type");
            if (!gguf_type_valid(et))
                ZK_THROW("%s: %s: unknown array element type (expected 0..%u, got %u)", path.c_str(),
                         ctx.c_str(), k_n_value_types - 1, et);
            v.arr_type = (gguf_type)et;
            const uint64_t n = read<uint64_t>("array length");
            const size_t min = gguf_type_min_size(v.arr_type);
            if (n > remaining() / min)
                ZK_THROW("%s: %s: array length too large, file corrupt or truncated, at offset %zu (expected at most %zu %s items, got %" PRIu64 ")",
                         path.c_str(), ctx.c_str(), pos - 8, remaining() / min,
                         gguf_type_name(v.arr_type), n);
            if (n > values_left)
                ZK_THROW("%s: %s: array length too large (expected at most %zu metadata values in all, got %" PRIu64 " more)",
                         path.c_str(), ctx.c_str(), values_left, n);
            values_left -= (size_t)n;
            charge((size_t)n * sizeof(gguf_value), "array");
            v.arr.reserve(std::min((size_t)n, k_max_reserve));
            for (uint64_t k = 0; k < n; k++) v.arr.push_back(read_value(v.arr_type, depth + 1));
            break;
        }
        default:
            ZK_THROW("%s: %s: unknown value type (expected 0..%u, got %u)", path.c_str(), ctx.c_str(),
                     k_n_value_types - 1, (unsigned)type);
    }
    return v;
}

// Appends printable text, escaping quotes, backslashes and control bytes.
void append_escaped(std::string& out, const std::string& s) {
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\t': out += "\\t"; break;
            case '\r': out += "\\r"; break;
            default:
                if (c < 0x20 || c == 0x7f) out += strfmt("\\x%02x", c);
                else out += (char)c;
        }
    }
}

// Shortest %g text that reads back to the same float (or double): 1e-05, not
// 9.99999975e-06.
std::string shortest_float(double v, bool is_f32) {
    std::string out;
    for (int prec = 1; prec <= (is_f32 ? 9 : 17); prec++) {
        out = strfmt("%.*g", prec, v);
        const double back = std::strtod(out.c_str(), nullptr);
        if (is_f32 ? (float)back == (float)v : back == v) break;
    }
    return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// gguf_value

const char* gguf_type_name(gguf_type t) {
    static const char* const names[k_n_value_types] = {"u8",   "i8",     "u16",   "i16", "u32",
                                                       "i32",  "f32",    "bool",  "string",
                                                       "array", "u64",   "i64",   "f64"};
    return gguf_type_valid((uint32_t)t) ? names[(uint32_t)t] : "unknown";
}

gguf_value gguf_value::make_u8(uint8_t v) { gguf_value r; r.type = gguf_type::UINT8; r.u = v; return r; }
gguf_value gguf_value::make_i8(int8_t v) { gguf_value r; r.type = gguf_type::INT8; r.i = v; return r; }
gguf_value gguf_value::make_u16(uint16_t v) { gguf_value r; r.type = gguf_type::UINT16; r.u = v; return r; }
gguf_value gguf_value::make_i16(int16_t v) { gguf_value r; r.type = gguf_type::INT16; r.i = v; return r; }
gguf_value gguf_value::make_u32(uint32_t v) { gguf_value r; r.type = gguf_type::UINT32; r.u = v; return r; }
gguf_value gguf_value::make_i32(int32_t v) { gguf_value r; r.type = gguf_type::INT32; r.i = v; return r; }
gguf_value gguf_value::make_u64(uint64_t v) { gguf_value r; r.type = gguf_type::UINT64; r.u = v; return r; }
gguf_value gguf_value::make_i64(int64_t v) { gguf_value r; r.type = gguf_type::INT64; r.i = v; return r; }
gguf_value gguf_value::make_f32(float v) { gguf_value r; r.type = gguf_type::FLOAT32; r.f = v; return r; }
gguf_value gguf_value::make_f64(double v) { gguf_value r; r.type = gguf_type::FLOAT64; r.f = v; return r; }
gguf_value gguf_value::make_bool(bool v) { gguf_value r; r.type = gguf_type::BOOL; r.u = v ? 1 : 0; return r; }
gguf_value gguf_value::make_str(const std::string& v) {
    gguf_value r;
    r.type = gguf_type::STRING;
    r.s = v;
    return r;
}

gguf_value gguf_value::make_arr(gguf_type elem, std::vector<gguf_value> elems) {
    for (size_t k = 0; k < elems.size(); k++)
        if (elems[k].type != elem)
            ZK_THROW("array element %zu has the wrong type (expected %s, got %s)", k,
                     gguf_type_name(elem), gguf_type_name(elems[k].type));
    gguf_value r;
    r.type = gguf_type::ARRAY;
    r.arr_type = elem;
    r.arr = std::move(elems);
    return r;
}

gguf_value gguf_value::make_arr_str(const std::vector<std::string>& v) {
    std::vector<gguf_value> e;
    e.reserve(v.size());
    for (const auto& s : v) e.push_back(make_str(s));
    return make_arr(gguf_type::STRING, std::move(e));
}
gguf_value gguf_value::make_arr_i32(const std::vector<int32_t>& v) {
    std::vector<gguf_value> e;
    e.reserve(v.size());
    for (int32_t x : v) e.push_back(make_i32(x));
    return make_arr(gguf_type::INT32, std::move(e));
}
gguf_value gguf_value::make_arr_f32(const std::vector<float>& v) {
    std::vector<gguf_value> e;
    e.reserve(v.size());
    for (float x : v) e.push_back(make_f32(x));
    return make_arr(gguf_type::FLOAT32, std::move(e));
}

int64_t gguf_value::as_int(const char* what) const {
    if (gguf_type_is_signed(type)) return i;
    if (gguf_type_is_unsigned(type) || type == gguf_type::BOOL) {
        if (u > (uint64_t)std::numeric_limits<int64_t>::max())
            ZK_THROW("%s: integer out of range (expected at most %lld, got %" PRIu64 ")", what,
                     (long long)std::numeric_limits<int64_t>::max(), u);
        return (int64_t)u;
    }
    ZK_THROW("%s: wrong value type (expected an integer, got %s)", what, gguf_type_name(type));
}

double gguf_value::as_float(const char* what) const {
    if (type == gguf_type::FLOAT32 || type == gguf_type::FLOAT64) return f;
    if (gguf_type_is_signed(type)) return (double)i;
    if (gguf_type_is_unsigned(type)) return (double)u;
    ZK_THROW("%s: wrong value type (expected a number, got %s)", what, gguf_type_name(type));
}

const std::string& gguf_value::as_str(const char* what) const {
    if (type != gguf_type::STRING)
        ZK_THROW("%s: wrong value type (expected string, got %s)", what, gguf_type_name(type));
    return s;
}

std::string gguf_value::to_display(size_t max_elems) const {
    constexpr size_t k_max_str = 60;  // bytes of a string shown before "..."
    switch (type) {
        case gguf_type::BOOL: return u ? "true" : "false";
        case gguf_type::FLOAT32: return shortest_float(f, true);
        case gguf_type::FLOAT64: return shortest_float(f, false);
        case gguf_type::STRING: {
            std::string out = "\"";
            if (s.size() <= k_max_str) {
                append_escaped(out, s);
                out += "\"";
            } else {
                size_t cut = k_max_str;  // do not split a UTF-8 sequence
                while (cut > 0 && ((unsigned char)s[cut] & 0xC0) == 0x80) cut--;
                append_escaped(out, s.substr(0, cut));
                out += "\"...";
            }
            return out;
        }
        case gguf_type::ARRAY: {
            std::string out = "[";
            const size_t shown = arr.size() < max_elems ? arr.size() : max_elems;
            for (size_t k = 0; k < shown; k++) {
                if (k) out += ", ";
                out += arr[k].to_display(max_elems);
            }
            if (shown < arr.size()) out += strfmt("%s... (%zu items)", shown ? ", " : "", arr.size());
            return out + "]";
        }
        default:
            if (gguf_type_is_signed(type)) return strfmt("%" PRId64, i);
            if (gguf_type_is_unsigned(type)) return strfmt("%" PRIu64, u);
            return strfmt("<unknown type %u>", (unsigned)type);
    }
}

// ---------------------------------------------------------------------------
// gguf_tensor

int64_t gguf_tensor::n_elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;  // validated not to overflow when read
    return n;
}

int64_t gguf_tensor::n_rows() const {
    int64_t n = 1;
    for (size_t k = 1; k < shape.size(); k++) n *= shape[k];
    return n;
}

// ---------------------------------------------------------------------------
// gguf_file: reading

gguf_file::~gguf_file() {
    if (map_) munmap((void*)map_, size_);
}

std::unique_ptr<gguf_file> gguf_file::open(const std::string& path) {
    std::unique_ptr<gguf_file> f(new gguf_file());
    f->path_ = path;
    const char* p = path.c_str();

    const int fd = ::open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) ZK_THROW("%s: cannot open file (%s)", p, std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        ZK_THROW("%s: cannot stat file (%s)", p, std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        ZK_THROW("%s: not a regular file (expected a GGUF file, got %s)", p,
                 S_ISDIR(st.st_mode) ? "a directory" : "a special file");
    }
    if (st.st_size == 0) {
        ::close(fd);
        ZK_THROW("%s: empty file (expected a GGUF header, got 0 bytes)", p);
    }
    void* m = mmap(nullptr, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int e = errno;
    ::close(fd);  // the mapping stays valid without the descriptor
    if (m == MAP_FAILED) ZK_THROW("%s: cannot mmap file (%s)", p, std::strerror(e));
    f->map_ = (const uint8_t*)m;
    f->size_ = (size_t)st.st_size;
    try {
        f->parse();
    } catch (const std::bad_alloc&) {
        ZK_THROW("%s: out of memory while reading the GGUF header (expected a smaller header, got a %zu-byte file)",
                 p, f->size_);
    }
    return f;
}

void gguf_file::parse() {
    const char* p = path_.c_str();
    gguf_cursor c{path_, map_, size_, 0, {}};
    c.mem_left = size_ > (SIZE_MAX - k_mem_floor) / k_mem_per_file_byte ? SIZE_MAX
                                                                       : size_ * k_mem_per_file_byte + k_mem_floor;

    // --- fixed header
    const uint32_t magic = c.read<uint32_t>("magic");
    if (magic != k_gguf_magic) {
        std::string got;
        append_escaped(got, std::string((const char*)map_, 4));
        ZK_THROW("%s: bad magic, not a GGUF file (expected \"GGUF\", got \"%s\")", p, got.c_str());
    }
    version_ = c.read<uint32_t>("version");
    if (version_ != 2 && version_ != 3)
        ZK_THROW("%s: unsupported GGUF version (expected 2 or 3, got %u%s)", p, version_,
                 (version_ & 0xffff) == 0 ? ", a big-endian file?" : "");
    const uint64_t n_tensors = c.read<uint64_t>("tensor count");
    const uint64_t n_kv = c.read<uint64_t>("key count");
    if (n_tensors > c.remaining() / k_min_tensor_bytes)
        ZK_THROW("%s: absurd tensor count, file corrupt or truncated (expected at most %zu for the file size, got %" PRIu64 ")",
                 p, c.remaining() / k_min_tensor_bytes, n_tensors);
    if (n_kv > c.remaining() / k_min_kv_bytes)
        ZK_THROW("%s: absurd key count, file corrupt or truncated (expected at most %zu for the file size, got %" PRIu64 ")", p,
                 c.remaining() / k_min_kv_bytes, n_kv);

    // --- metadata
    kv_.reserve(std::min((size_t)n_kv, k_max_reserve));
    for (uint64_t k = 0; k < n_kv; k++) {
        c.ctx = strfmt("key #%" PRIu64, k);
        std::string key = c.read_str("name");
        c.ctx = "key '" + key + "'";
        if (kv_index_.count(key)) ZK_THROW("%s: duplicate key '%s'", p, key.c_str());
        c.charge(sizeof(gguf_value) + key.size() + k_map_node_bytes, "key");
        const uint32_t t = c.read<uint32_t>("value type");
        if (!gguf_type_valid(t))
            ZK_THROW("%s: key '%s': unknown value type (expected 0..%u, got %u)", p, key.c_str(),
                     k_n_value_types - 1, t);
        gguf_value v = c.read_value((gguf_type)t, 0);
        kv_index_.emplace(key, kv_.size());
        kv_.emplace_back(std::move(key), std::move(v));
    }

    if (const gguf_value* a = find("general.alignment")) {
        if (!gguf_type_is_unsigned(a->type) && !gguf_type_is_signed(a->type))
            ZK_THROW("%s: bad general.alignment type (expected u32, got %s)", p, gguf_type_name(a->type));
        const int64_t al = a->as_int("general.alignment");
        if (al <= 0 || al > (int64_t)1 << 30 || !is_pow2((uint64_t)al))
            ZK_THROW("%s: bad general.alignment (expected a non-zero power of two, got %lld)", p,
                     (long long)al);
        alignment_ = (size_t)al;
    }

    // --- tensor infos
    tensors_.reserve(std::min((size_t)n_tensors, k_max_reserve));
    for (uint64_t k = 0; k < n_tensors; k++) {
        c.ctx = strfmt("tensor #%" PRIu64, k);
        gguf_tensor t;
        t.name = c.read_str("name");
        c.ctx = "tensor '" + t.name + "'";
        const char* tn = t.name.c_str();
        if (tensor_index_.count(t.name)) ZK_THROW("%s: duplicate tensor name '%s'", p, tn);
        c.charge(sizeof(gguf_tensor) + t.name.size() + k_map_node_bytes + k_max_dims * sizeof(int64_t), "tensor info");
        const uint32_t n_dims = c.read<uint32_t>("n_dims");
        if (n_dims < 1 || n_dims > k_max_dims)
            ZK_THROW("%s: tensor '%s': bad n_dims (expected 1..%d, got %u)", p, tn, k_max_dims, n_dims);
        int64_t n_el = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            const uint64_t ne = c.read<uint64_t>("dimension");
            if (ne < 1 || ne > (uint64_t)std::numeric_limits<int64_t>::max())
                ZK_THROW("%s: tensor '%s': bad size of dimension %u (expected >= 1, got %" PRIu64 ")",
                         p, tn, d, ne);
            if (__builtin_mul_overflow(n_el, (int64_t)ne, &n_el))
                ZK_THROW("%s: tensor '%s': element count overflows (dimension %u is %" PRIu64 ")", p,
                         tn, d, ne);
            t.shape.push_back((int64_t)ne);
        }
        const uint32_t type_id = c.read<uint32_t>("type");
        // Known types zack cannot compute with are laid out like the others (so
        // `zack info` can show them); model loading refuses them by name.
        if (!dtype_is_known(type_id))
            ZK_THROW("%s: tensor '%s': unknown type id (expected a ggml type id, got %u)", p, tn, type_id);
        t.type = (dtype)type_id;
        t.offset = c.read<uint64_t>("data offset");

        const dtype_traits& tr = dtype_get_traits(t.type);
        if (t.shape[0] % tr.block_size != 0)
            ZK_THROW("%s: tensor '%s': row length is not a multiple of the %s block size (expected a multiple of %lld, got %lld)",
                     p, tn, tr.name, (long long)tr.block_size, (long long)t.shape[0]);
        size_t row;
        if (__builtin_mul_overflow((size_t)(t.shape[0] / tr.block_size), tr.type_size, &row) ||
            __builtin_mul_overflow(row, (size_t)t.n_rows(), &t.n_bytes))
            ZK_THROW("%s: tensor '%s': byte size overflows", p, tn);
        if (t.offset % alignment_ != 0)
            ZK_THROW("%s: tensor '%s': misaligned data offset (expected a multiple of %zu, got %" PRIu64 ")",
                     p, tn, alignment_, t.offset);
        tensor_index_.emplace(t.name, tensors_.size());
        tensors_.push_back(std::move(t));
    }
    c.ctx.clear();

    // --- data section: starts at the next multiple of the alignment
    data_offset_ = align_up(c.pos, alignment_);
    if (data_offset_ > size_) {
        if (!tensors_.empty())
            ZK_THROW("%s: truncated file: data section starts past the end (expected at least %zu bytes, got %zu)",
                     p, data_offset_, size_);
        data_offset_ = size_;  // metadata-only file without trailing padding
    }
    const size_t avail = size_ - data_offset_;
    for (gguf_tensor& t : tensors_) {
        if (t.offset > avail)
            ZK_THROW("%s: tensor '%s': data offset out of range (expected at most %zu, got %" PRIu64 ")", p,
                     t.name.c_str(), avail, t.offset);
        if (t.n_bytes > avail - t.offset)
            ZK_THROW("%s: tensor '%s': data truncated (expected %zu bytes at data offset %" PRIu64 ", got %zu)",
                     p, t.name.c_str(), t.n_bytes, t.offset, avail - (size_t)t.offset);
        // With general.alignment below 4 a tensor can start at an odd address, and
        // every reader of F32/F16 data (and the kernels) loads whole words.
        if ((data_offset_ + t.offset) % 4 != 0)
            ZK_THROW("%s: tensor '%s': data at file offset %zu is not 4-byte aligned (general.alignment is %zu; zack reads tensor data as 4-byte words)",
                     p, t.name.c_str(), (size_t)(data_offset_ + t.offset), alignment_);
        t.data = map_ + data_offset_ + t.offset;
    }
    // Tensor data may not overlap or alias: writing one tensor (as calibrate's
    // folded copies do) must never change another, and every byte has one type.
    std::vector<const gguf_tensor*> by_offset;
    by_offset.reserve(tensors_.size());
    for (const gguf_tensor& t : tensors_) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const gguf_tensor* a, const gguf_tensor* b) { return a->offset < b->offset; });
    for (size_t k = 1; k < by_offset.size(); k++) {
        const gguf_tensor& a = *by_offset[k - 1];
        const gguf_tensor& b = *by_offset[k];
        if (a.offset + a.n_bytes > b.offset)
            ZK_THROW("%s: tensors '%s' and '%s' overlap in the data section (expected '%s' to start at or after data offset %zu, got %" PRIu64 ")",
                     p, a.name.c_str(), b.name.c_str(), b.name.c_str(), (size_t)(a.offset + a.n_bytes), b.offset);
    }
}

// ---------------------------------------------------------------------------
// gguf_file: getters

const gguf_value* gguf_file::find(const std::string& key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const gguf_value& gguf_file::require(const std::string& key) const {
    const gguf_value* v = find(key);
    if (!v) ZK_THROW("%s: missing key %s", path_.c_str(), key.c_str());
    return *v;
}

// Re-throws a value conversion error with the file path in front.
template <typename F>
static auto with_path(const std::string& path, F&& f) -> decltype(f()) {
    try {
        return f();
    } catch (const error& e) {
        throw error(path + ": " + e.what());
    }
}

int64_t gguf_file::get_int(const std::string& key) const {
    const gguf_value& v = require(key);
    return with_path(path_, [&] { return v.as_int(key.c_str()); });
}
int64_t gguf_file::get_int(const std::string& key, int64_t dflt) const {
    return find(key) ? get_int(key) : dflt;
}
double gguf_file::get_float(const std::string& key) const {
    const gguf_value& v = require(key);
    return with_path(path_, [&] { return v.as_float(key.c_str()); });
}
double gguf_file::get_float(const std::string& key, double dflt) const {
    return find(key) ? get_float(key) : dflt;
}
std::string gguf_file::get_str(const std::string& key) const {
    const gguf_value& v = require(key);
    return with_path(path_, [&] { return v.as_str(key.c_str()); });
}
std::string gguf_file::get_str(const std::string& key, const std::string& dflt) const {
    return find(key) ? get_str(key) : dflt;
}
bool gguf_file::get_bool(const std::string& key, bool dflt) const {
    const gguf_value* v = find(key);
    if (!v) return dflt;
    if (v->type != gguf_type::BOOL)
        ZK_THROW("%s: %s: wrong value type (expected bool, got %s)", path_.c_str(), key.c_str(),
                 gguf_type_name(v->type));
    return v->u != 0;
}

const gguf_tensor* gguf_file::find_tensor(const std::string& name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const gguf_tensor& gguf_file::get_tensor(const std::string& name) const {
    const gguf_tensor* t = find_tensor(name);
    if (!t) ZK_THROW("%s: missing tensor '%s'", path_.c_str(), name.c_str());
    return *t;
}

// ---------------------------------------------------------------------------
// gguf_writer

namespace {

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
    const size_t n = out.size();
    out.resize(n + sizeof(T));
    std::memcpy(out.data() + n, &v, sizeof(T));
}

void put_str(std::vector<uint8_t>& out, const std::string& s) {
    put<uint64_t>(out, s.size());
    out.insert(out.end(), s.begin(), s.end());
}

// Serialises one value (without its type tag); checks that it fits its type.
void put_value(std::vector<uint8_t>& out, const gguf_value& v, const std::string& key) {
    auto urange = [&](uint64_t max) {
        if (v.u > max)
            ZK_THROW("gguf writer: key '%s': value out of range for %s (expected at most %" PRIu64 ", got %" PRIu64 ")",
                     key.c_str(), gguf_type_name(v.type), max, v.u);
    };
    auto irange = [&](int64_t min, int64_t max) {
        if (v.i < min || v.i > max)
            ZK_THROW("gguf writer: key '%s': value out of range for %s (expected %lld..%lld, got %lld)",
                     key.c_str(), gguf_type_name(v.type), (long long)min, (long long)max, (long long)v.i);
    };
    switch (v.type) {
        case gguf_type::UINT8: urange(UINT8_MAX); put<uint8_t>(out, (uint8_t)v.u); break;
        case gguf_type::INT8: irange(INT8_MIN, INT8_MAX); put<int8_t>(out, (int8_t)v.i); break;
        case gguf_type::UINT16: urange(UINT16_MAX); put<uint16_t>(out, (uint16_t)v.u); break;
        case gguf_type::INT16: irange(INT16_MIN, INT16_MAX); put<int16_t>(out, (int16_t)v.i); break;
        case gguf_type::UINT32: urange(UINT32_MAX); put<uint32_t>(out, (uint32_t)v.u); break;
        case gguf_type::INT32: irange(INT32_MIN, INT32_MAX); put<int32_t>(out, (int32_t)v.i); break;
        case gguf_type::UINT64: put<uint64_t>(out, v.u); break;
        case gguf_type::INT64: put<int64_t>(out, v.i); break;
        case gguf_type::FLOAT32: put<float>(out, (float)v.f); break;
        case gguf_type::FLOAT64: put<double>(out, v.f); break;
        case gguf_type::BOOL: put<uint8_t>(out, v.u ? 1 : 0); break;
        case gguf_type::STRING: put_str(out, v.s); break;
        case gguf_type::ARRAY:
            if (!gguf_type_valid((uint32_t)v.arr_type))
                ZK_THROW("gguf writer: key '%s': unknown array element type %u", key.c_str(),
                         (unsigned)v.arr_type);
            put<uint32_t>(out, (uint32_t)v.arr_type);
            put<uint64_t>(out, v.arr.size());
            for (size_t k = 0; k < v.arr.size(); k++) {
                if (v.arr[k].type != v.arr_type)
                    ZK_THROW("gguf writer: key '%s': array element %zu has the wrong type (expected %s, got %s)",
                             key.c_str(), k, gguf_type_name(v.arr_type), gguf_type_name(v.arr[k].type));
                put_value(out, v.arr[k], key);
            }
            break;
        default:
            ZK_THROW("gguf writer: key '%s': unknown value type %u", key.c_str(), (unsigned)v.type);
    }
}

}  // namespace

void gguf_writer::set(const std::string& key, gguf_value v) {
    if (key == "general.alignment") {
        const int64_t a = v.as_int("general.alignment");
        if (a <= 0 || a > (int64_t)1 << 30 || !is_pow2((uint64_t)a))
            ZK_THROW("gguf writer: bad general.alignment (expected a non-zero power of two, got %lld)",
                     (long long)a);
        alignment_ = (size_t)a;
        v = gguf_value::make_u32((uint32_t)a);  // the format stores it as u32
    }
    for (auto& kv : kv_)
        if (kv.first == key) {
            kv.second = std::move(v);
            return;
        }
    kv_.emplace_back(key, std::move(v));
}

void gguf_writer::remove(const std::string& key) {
    for (auto it = kv_.begin(); it != kv_.end(); ++it)
        if (it->first == key) {
            kv_.erase(it);
            break;
        }
    if (key == "general.alignment") alignment_ = k_default_alignment;
}

void gguf_writer::add_tensor_ref(const std::string& name, dtype type,
                                 const std::vector<int64_t>& shape, const void* data,
                                 size_t n_bytes) {
    const char* tn = name.c_str();
    for (const auto& t : tensors_)
        if (t.name == name) ZK_THROW("gguf writer: duplicate tensor name '%s'", tn);
    if (shape.empty() || shape.size() > (size_t)k_max_dims)
        ZK_THROW("gguf writer: tensor '%s': bad n_dims (expected 1..%d, got %zu)", tn, k_max_dims,
                 shape.size());
    if (!dtype_is_known((uint32_t)type))
        ZK_THROW("gguf writer: tensor '%s': unknown type id %u", tn, (unsigned)type);
    int64_t rows = 1;
    for (size_t d = 0; d < shape.size(); d++) {
        if (shape[d] < 1)
            ZK_THROW("gguf writer: tensor '%s': bad size of dimension %zu (expected >= 1, got %lld)",
                     tn, d, (long long)shape[d]);
        if (d > 0 && __builtin_mul_overflow(rows, shape[d], &rows))
            ZK_THROW("gguf writer: tensor '%s': element count overflows", tn);
    }
    size_t expected;
    try {
        if (__builtin_mul_overflow(dtype_row_size(type, shape[0]), (size_t)rows, &expected))
            ZK_THROW("byte size overflows");
    } catch (const error& e) {
        ZK_THROW("gguf writer: tensor '%s': %s", tn, e.what());
    }
    if (n_bytes != expected)
        ZK_THROW("gguf writer: tensor '%s': wrong data size (expected %zu bytes, got %zu)", tn,
                 expected, n_bytes);
    if (!data && n_bytes) ZK_THROW("gguf writer: tensor '%s': null data", tn);
    tensors_.push_back(pending{name, type, shape, {}, data, n_bytes, nullptr});
}

void gguf_writer::add_tensor_fill(const std::string& name, dtype type, const std::vector<int64_t>& shape,
                                  fill_fn fill) {
    if (!fill) ZK_THROW("gguf writer: tensor '%s': no fill function", name.c_str());
    // the checks of add_tensor_ref, with the size the shape implies
    int64_t rows = 1;
    bool ok = !shape.empty() && shape[0] > 0 && dtype_is_known((uint32_t)type);
    for (size_t d = 1; ok && d < shape.size(); d++) ok = shape[d] > 0 && !__builtin_mul_overflow(rows, shape[d], &rows);
    size_t n_bytes = 0;  // when !ok, add_tensor_ref says what is wrong
    if (ok) {
        try {
            if (__builtin_mul_overflow(dtype_row_size(type, shape[0]), (size_t)rows, &n_bytes)) n_bytes = 0;
        } catch (const error& e) {
            ZK_THROW("gguf writer: tensor '%s': %s", name.c_str(), e.what());
        }
    }
    static const uint8_t k_dummy = 0;
    add_tensor_ref(name, type, shape, &k_dummy, n_bytes);
    tensors_.back().data = nullptr;
    tensors_.back().fill = std::move(fill);
}

void gguf_writer::add_tensor(const std::string& name, dtype type, const std::vector<int64_t>& shape,
                             const void* data, size_t n_bytes) {
    add_tensor_ref(name, type, shape, data, n_bytes);
    pending& t = tensors_.back();
    t.owned.assign((const uint8_t*)data, (const uint8_t*)data + n_bytes);
    t.data = t.owned.data();
}

void gguf_writer::write(const std::string& path) const {
    // Header and metadata are serialised in memory first (a few MB for a vocab);
    // tensor data is streamed from the callers' buffers.
    std::vector<uint8_t> head;
    put<uint32_t>(head, k_gguf_magic);
    put<uint32_t>(head, 3);
    put<uint64_t>(head, tensors_.size());
    put<uint64_t>(head, kv_.size());
    for (const auto& kv : kv_) {
        put_str(head, kv.first);
        put<uint32_t>(head, (uint32_t)kv.second.type);
        put_value(head, kv.second, kv.first);
    }
    std::vector<uint64_t> offsets;
    uint64_t off = 0;
    for (const auto& t : tensors_) {
        put_str(head, t.name);
        put<uint32_t>(head, (uint32_t)t.shape.size());
        for (int64_t d : t.shape) put<uint64_t>(head, (uint64_t)d);
        put<uint32_t>(head, (uint32_t)t.type);
        put<uint64_t>(head, off);
        offsets.push_back(off);
        off = align_up(off + t.n_bytes, alignment_);
    }
    head.resize(align_up(head.size(), alignment_), 0);

    // file_out (ggml-like/file_out.h): a temporary file renamed over the target,
    // every write and the close checked; non-regular targets are refused.
    file_out out(path);
    const std::vector<uint8_t> zeros(alignment_, 0);
    out.write(head.data(), head.size());
    for (size_t k = 0; k < tensors_.size(); k++) {
        const pending& t = tensors_[k];
        if (t.fill) {
            const size_t row = dtype_row_size(t.type, t.shape[0]);
            const int64_t n_rows = (int64_t)(t.n_bytes / row);
            const int64_t chunk = std::max<int64_t>(1, (int64_t)(k_fill_chunk / row));
            std::vector<uint8_t> buf(row * (size_t)std::min(chunk, n_rows));
            for (int64_t r = 0; r < n_rows; r += chunk) {
                const int64_t n = std::min(chunk, n_rows - r);
                t.fill(r, n, buf.data());
                out.write(buf.data(), row * (size_t)n);
            }
        } else {
            out.write(t.owned.empty() ? t.data : t.owned.data(), t.n_bytes);
        }
        out.write(zeros.data(), align_up(t.n_bytes, alignment_) - t.n_bytes);
    }
    out.commit();
}

}  // namespace zk
