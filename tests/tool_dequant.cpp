// tool_dequant MODEL TENSOR_NAME OUT.f32 [ROW0 N_ROWS]
//   Writes the tensor (or rows ROW0 .. ROW0 + N_ROWS - 1 of it) dequantized to
//   float32, row-major (ne[0] fastest), for tests/test_dequant_ref.py to compare
//   with gguf-py. Prints "TYPE ne0 ne1 ...".
// tool_dequant --types
//   Prints dtype.cpp's table, one "ID NAME BLOCK_SIZE TYPE_SIZE supported|-" line
//   per known ggml type id.
// tool_dequant --quantize TYPE N_COLS IN.f32 OUT.bin
//   Quantizes rows of N_COLS floats with dtype_quantize_row (to compare the
//   bytes with gguf.quants.quantize).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ggml-like/error.h"
#include "ggml-like/gguf.h"

namespace {

std::vector<uint8_t> read_file(const char* path) {
    std::FILE* f = std::fopen(path, "rb");
    if (!f) ZK_THROW("cannot open %s", path);
    std::vector<uint8_t> data;
    uint8_t buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.insert(data.end(), buf, buf + n);
    std::fclose(f);
    return data;
}

void write_file(const char* path, const void* data, size_t n) {
    std::FILE* f = std::fopen(path, "wb");
    if (!f) ZK_THROW("cannot open %s for writing", path);
    const bool ok = std::fwrite(data, 1, n, f) == n;
    if (std::fclose(f) != 0 || !ok) ZK_THROW("short write to %s", path);
}

void quantize_file(const char* type, const char* cols, const char* in, const char* out) {
    const zk::dtype t = zk::dtype_from_name(type);
    const int64_t n_cols = std::atoll(cols);
    const auto raw = read_file(in);
    const size_t n = raw.size() / sizeof(float);
    if (n_cols <= 0 || n % (size_t)n_cols != 0) ZK_THROW("%s: %zu floats is not a multiple of %s", in, n, cols);
    const size_t row = zk::dtype_row_size(t, n_cols);
    std::vector<uint8_t> q(row * (n / n_cols));
    for (size_t r = 0; r < n / n_cols; r++)
        zk::dtype_quantize_row(t, (const float*)raw.data() + r * n_cols, q.data() + r * row, n_cols);
    write_file(out, q.data(), q.size());
}

void print_types() {
    for (uint32_t id = 0; id < 1024; id++) {
        if (!zk::dtype_is_known(id)) continue;
        const zk::dtype_traits& tr = zk::dtype_get_traits((zk::dtype)id);
        std::printf("%u %s %lld %zu %s\n", id, tr.name, (long long)tr.block_size, tr.type_size,
                    zk::dtype_is_supported(id) ? "supported" : "-");
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 2 && std::string(argv[1]) == "--types") {
        print_types();
        return 0;
    }
    if (argc == 6 && std::string(argv[1]) == "--quantize") {
        try {
            quantize_file(argv[2], argv[3], argv[4], argv[5]);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "tool_dequant: %s\n", e.what());
            return 1;
        }
        return 0;
    }
    if (argc != 4 && argc != 6) {
        std::fprintf(stderr,
                     "usage: %s MODEL TENSOR_NAME OUT.f32 [ROW0 N_ROWS]\n       %s --quantize TYPE N_COLS IN.f32 OUT.bin\n"
                     "       %s --types\n",
                     argv[0], argv[0], argv[0]);
        return 2;
    }
    try {
        const auto file = zk::gguf_file::open(argv[1]);
        const zk::gguf_tensor& t = file->get_tensor(argv[2]);
        const int64_t n_cols = t.shape.empty() ? 1 : t.shape[0];
        int64_t row0 = 0, n_rows = t.n_rows();
        if (argc == 6) {
            row0 = std::atoll(argv[4]);
            n_rows = std::atoll(argv[5]);
            if (row0 < 0 || n_rows < 1 || row0 + n_rows > t.n_rows())
                ZK_THROW("rows %s + %s out of range (tensor has %lld)", argv[4], argv[5], (long long)t.n_rows());
        }
        const size_t row_bytes = zk::dtype_row_size(t.type, n_cols);
        if (row_bytes * (size_t)t.n_rows() != t.n_bytes)
            ZK_THROW("%s: tensor %s has %zu bytes, expected %zu", argv[1], argv[2], t.n_bytes,
                     row_bytes * (size_t)t.n_rows());
        std::FILE* out = std::fopen(argv[3], "wb");
        if (!out) ZK_THROW("cannot open %s for writing", argv[3]);
        std::vector<float> row((size_t)n_cols);
        for (int64_t r = 0; r < n_rows; r++) {
            zk::dtype_dequantize_row(t.type, t.data + (row0 + r) * row_bytes, row.data(), n_cols);
            if (std::fwrite(row.data(), sizeof(float), row.size(), out) != row.size()) {
                std::fclose(out);
                ZK_THROW("short write to %s", argv[3]);
            }
        }
        if (std::fclose(out) != 0) ZK_THROW("cannot close %s", argv[3]);
        std::printf("%s", zk::dtype_name(t.type));
        for (int64_t d : t.shape) std::printf(" %lld", (long long)d);
        std::printf("\n");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tool_dequant: %s\n", e.what());
        return 1;
    }
    return 0;
}
