// SHA-256 (FIPS 180-4), used to record which source model a .zack was built from
// (zack.source.sha256). Streaming: update() any number of times, then final().
// On x86 CPUs with the SHA extensions (SHA-NI) the blocks run on them: about 4x
// the portable code, which matters for a 1.1 GB model (3 s -> under 1 s).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace zk {

class sha256 {
public:
    // shani = false: the portable code even where the CPU has SHA-NI (tests)
    explicit sha256(bool shani = true);
    void update(const void* data, size_t n);
    // The 32-byte digest as 64 lowercase hex characters; the object is spent after.
    std::string final_hex();

private:
    void blocks(const uint8_t* p, size_t n);  // n 64-byte blocks
    bool shani_;
    uint32_t h_[8];
    uint8_t buf_[64];
    size_t buf_len_ = 0;
    uint64_t total_ = 0;  // bytes
};

// Whether this CPU has the SHA extensions (and SSE4.1, which the code also uses).
bool sha256_cpu_has_shani();

std::string sha256_hex(const void* data, size_t n);
// Reads the file in chunks; throws zk::error if it cannot be read.
std::string sha256_file_hex(const std::string& path);

}  // namespace zk
