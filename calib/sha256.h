// SHA-256 (FIPS 180-4), used to record which source model a .zack was built from
// (zack.source.sha256). Streaming: update() any number of times, then final().
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace zk {

class sha256 {
public:
    sha256();
    void update(const void* data, size_t n);
    // The 32-byte digest as 64 lowercase hex characters; the object is spent after.
    std::string final_hex();

private:
    void block(const uint8_t* p);  // one 64-byte block
    uint32_t h_[8];
    uint8_t buf_[64];
    size_t buf_len_ = 0;
    uint64_t total_ = 0;  // bytes
};

std::string sha256_hex(const void* data, size_t n);
// Reads the file in chunks; throws zk::error if it cannot be read.
std::string sha256_file_hex(const std::string& path);

}  // namespace zk
