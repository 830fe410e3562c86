// GGUF v3 reader (mmap) and writer.
//
// File layout (little endian):
//   u32 magic "GGUF" | u32 version (3; 2 is read too) | u64 n_tensors | u64 n_kv
//   n_kv x { string key | u32 value_type | value }
//   n_tensors x { string name | u32 n_dims | n_dims x u64 ne (ne[0] fastest)
//                 | u32 dtype | u64 offset (relative to the data section) }
//   padding to `general.alignment` (default 32) | data section
// string = u64 length + bytes (no NUL); array = u32 elem_type + u64 count + elems
// (arrays may nest). Value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32,
// 7 bool, 8 string, 9 array, 10 u64, 11 i64, 12 f64.
//
// zack adds keys and tensors to the same format (.zack files); they are listed
// in models/README.md.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ggml-like/dtype.h"

namespace zk {

enum class gguf_type : uint32_t {
    UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
    BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* gguf_type_name(gguf_type t);

// One metadata value. Scalars live in the matching field; arrays keep their
// element type and elements (which may be arrays again).
struct gguf_value {
    gguf_type type = gguf_type::UINT32;
    uint64_t u = 0;     // UINT8/16/32/64, BOOL
    int64_t i = 0;      // INT8/16/32/64
    double f = 0;       // FLOAT32/64
    std::string s;      // STRING
    gguf_type arr_type = gguf_type::UINT32;
    std::vector<gguf_value> arr;  // ARRAY

    static gguf_value make_u8(uint8_t v);
    static gguf_value make_i8(int8_t v);
    static gguf_value make_u16(uint16_t v);
    static gguf_value make_i16(int16_t v);
    static gguf_value make_u32(uint32_t v);
    static gguf_value make_i32(int32_t v);
    static gguf_value make_u64(uint64_t v);
    static gguf_value make_i64(int64_t v);
    static gguf_value make_f32(float v);
    static gguf_value make_f64(double v);
    static gguf_value make_bool(bool v);
    static gguf_value make_str(const std::string& v);
    // Throws zk::error if an element's type differs from `elem`.
    static gguf_value make_arr(gguf_type elem, std::vector<gguf_value> elems);
    static gguf_value make_arr_str(const std::vector<std::string>& v);
    static gguf_value make_arr_i32(const std::vector<int32_t>& v);
    static gguf_value make_arr_f32(const std::vector<float>& v);

    // Numeric conversions with range checks; throw zk::error naming `what`.
    // as_int takes any integer type or bool (u64 above INT64_MAX throws);
    // as_float takes any number; as_str only STRING.
    int64_t as_int(const char* what = "value") const;
    double as_float(const char* what = "value") const;
    const std::string& as_str(const char* what = "value") const;
    // For `zack info`: strings quoted, escaped and cut after 60 bytes ("..."),
    // arrays as [a, b, c, ... (N items)] showing at most max_elems elements.
    std::string to_display(size_t max_elems = 8) const;
};

struct gguf_tensor {
    std::string name;
    dtype type;                  // any known ggml type id (see dtype_is_supported)
    std::vector<int64_t> shape;  // ne[0] (fastest, = row length) first
    uint64_t offset;             // relative to the data section
    size_t n_bytes;
    const uint8_t* data;         // into the mapping
    int64_t n_elements() const;
    int64_t n_rows() const;      // product of shape[1..]
};

class gguf_file {
public:
    // Maps and validates the whole file; throws zk::error "PATH: what" on any
    // malformation (bad magic/version, truncation, absurd counts, a type id that
    // is no ggml type, offsets out of range or misaligned, duplicate names).
    // Tensors of ggml types zack does not compute with (IQ2_XXS, ...) are read
    // like the others: dtype_is_supported(t.type) tells them apart.
    static std::unique_ptr<gguf_file> open(const std::string& path);
    ~gguf_file();

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    size_t file_size() const { return size_; }
    size_t alignment() const { return alignment_; }
    size_t data_offset() const { return data_offset_; }

    const std::vector<std::pair<std::string, gguf_value>>& kv() const { return kv_; }
    const gguf_value* find(const std::string& key) const;  // nullptr if absent
    // Typed getters; the one-argument forms throw "PATH: missing key K".
    int64_t get_int(const std::string& key) const;
    int64_t get_int(const std::string& key, int64_t dflt) const;
    double get_float(const std::string& key) const;
    double get_float(const std::string& key, double dflt) const;
    std::string get_str(const std::string& key) const;
    std::string get_str(const std::string& key, const std::string& dflt) const;
    bool get_bool(const std::string& key, bool dflt) const;

    const std::vector<gguf_tensor>& tensors() const { return tensors_; }
    const gguf_tensor* find_tensor(const std::string& name) const;  // nullptr if absent
    const gguf_tensor& get_tensor(const std::string& name) const;   // throws if absent

private:
    gguf_file() = default;
    void parse();  // validates the mapping and fills kv_ and tensors_
    const gguf_value& require(const std::string& key) const;  // throws "PATH: missing key K"
    std::string path_;
    uint32_t version_ = 0;
    size_t size_ = 0;
    size_t alignment_ = 32;
    size_t data_offset_ = 0;
    const uint8_t* map_ = nullptr;
    std::vector<std::pair<std::string, gguf_value>> kv_;
    std::map<std::string, size_t> kv_index_;
    std::vector<gguf_tensor> tensors_;
    std::map<std::string, size_t> tensor_index_;
};

// Builds a GGUF v3 file in memory order and writes it through file_out
// (ggml-like/file_out.h), so a failed write never leaves a half-written file
// under PATH and a device or directory at PATH is refused.
class gguf_writer {
public:
    // Keys are written in insertion order; set() on an existing key replaces its
    // value in place. Setting "general.alignment" (a power of two, stored as u32)
    // changes the alignment of the data section and of every tensor offset.
    void set(const std::string& key, gguf_value v);
    void remove(const std::string& key);
    // Data is copied; bytes must equal n_rows * dtype_row_size(type, shape[0]).
    void add_tensor(const std::string& name, dtype type, const std::vector<int64_t>& shape,
                    const void* data, size_t n_bytes);
    // Like add_tensor but keeps a pointer (the caller keeps data alive until write()).
    void add_tensor_ref(const std::string& name, dtype type, const std::vector<int64_t>& shape,
                        const void* data, size_t n_bytes);
    // Like add_tensor_ref, but the data is made at write() time: fill(row0, n_rows, dst)
    // writes rows [row0, row0 + n_rows) of the tensor (n_rows x dtype_row_size bytes)
    // into dst, in order, a chunk of at most k_fill_chunk bytes (or one row) at a time,
    // so that a file larger than memory streams out (engine/model_synth.h).
    using fill_fn = std::function<void(int64_t row0, int64_t n_rows, uint8_t* dst)>;
    static constexpr size_t k_fill_chunk = (size_t)32 << 20;
    void add_tensor_fill(const std::string& name, dtype type, const std::vector<int64_t>& shape, fill_fn fill);
    // Writes a temporary file next to PATH (zero padding after the header and
    // after each tensor up to the alignment), fsyncs it and renames it over PATH;
    // on any failure the temporary file is removed and zk::error is thrown.
    void write(const std::string& path) const;

private:
    struct pending {
        std::string name;
        dtype type;
        std::vector<int64_t> shape;
        std::vector<uint8_t> owned;
        const void* data;
        size_t n_bytes;
        fill_fn fill;  // add_tensor_fill: data is null, the bytes are made at write()
    };
    std::vector<std::pair<std::string, gguf_value>> kv_;
    std::vector<pending> tensors_;
    size_t alignment_ = 32;
};

}  // namespace zk
