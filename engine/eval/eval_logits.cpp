// The baseline logits file; the format is specified in eval_logits.h.
#include "engine/eval/eval_logits.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "ggml-like/dtype.h"
#include "ggml-like/error.h"
#include "ggml-like/file_out.h"

namespace zk {

namespace {

constexpr char k_logits_magic[8] = {'Z', 'K', 'L', 'O', 'G', 'I', 'T', 'S'};
constexpr uint32_t k_logits_version = 1;
constexpr size_t k_logits_align = 64;

template <typename T>
void put(std::string& out, T v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// Reads fields in order with bounds checks.
struct reader {
    const uint8_t* p;
    size_t size, at = 0;
    const std::string& path;
    template <typename T>
    T get(const char* what) {
        if (at + sizeof(T) > size) ZK_THROW("%s: truncated logits file (at %s)", path.c_str(), what);
        T v;
        std::memcpy(&v, p + at, sizeof v);
        at += sizeof v;
        return v;
    }
};

}  // namespace

uint64_t eval_vocab_hash(const vocab& v) {
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&](unsigned char c) {
        h ^= c;
        h *= 0x100000001b3ull;
    };
    for (int32_t id = 0; id < v.n_tokens(); id++) {
        for (unsigned char c : v.token_text(id)) mix(c);
        mix(0);
    }
    return h;
}

void eval_logits_write(const std::string& path, const eval_logits_header& h, const std::vector<int32_t>& tokens,
                       const float* lp) {
    std::string head(k_logits_magic, sizeof k_logits_magic);
    put(head, k_logits_version);
    put(head, h.n_vocab);
    put(head, h.vocab_hash);
    for (int64_t v : {h.window, h.stride, h.step, h.first, h.per_chunk, h.n_chunks}) put(head, v);
    put(head, h.bos);
    put(head, (uint32_t)h.model.size());
    head += h.model;
    put(head, (int64_t)tokens.size());
    head.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(int32_t));
    head.resize((head.size() + k_logits_align - 1) / k_logits_align * k_logits_align, '\0');

    file_out out(path);
    out.write(head);
    std::vector<uint16_t> row(h.n_vocab);
    const size_t n_rows = (size_t)h.n_chunks * (size_t)h.per_chunk;
    for (size_t r = 0; r < n_rows; r++) {
        const float* src = lp + r * h.n_vocab;
        for (uint32_t i = 0; i < h.n_vocab; i++) row[i] = fp32_to_fp16(src[i]);
        out.write(row.data(), row.size() * sizeof(uint16_t));
    }
    out.commit();
}

eval_logits_file::eval_logits_file(const std::string& path) : path_(path) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) ZK_THROW("%s: cannot open the logits file: %s", path.c_str(), std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        ZK_THROW("%s: not a regular file", path.c_str());
    }
    size_ = (size_t)st.st_size;
    if (size_ < sizeof k_logits_magic || size_ == 0) {
        close(fd);
        ZK_THROW("%s: not a zack logits file (too short)", path.c_str());
    }
    void* m = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) ZK_THROW("%s: cannot map the logits file: %s", path.c_str(), std::strerror(errno));
    map_ = static_cast<const uint8_t*>(m);

    if (std::memcmp(map_, k_logits_magic, sizeof k_logits_magic) != 0)
        ZK_THROW("%s: not a zack logits file (no ZKLOGITS magic; it is written with eval.kl_divergence_base)",
                 path.c_str());
    reader r{map_, size_, sizeof k_logits_magic, path_};
    const uint32_t version = r.get<uint32_t>("version");
    if (version != k_logits_version)
        ZK_THROW("%s: logits file version %u; this zack reads version %u", path.c_str(), version, k_logits_version);
    h_.n_vocab = r.get<uint32_t>("n_vocab");
    h_.vocab_hash = r.get<uint64_t>("vocab_hash");
    h_.window = r.get<int64_t>("window");
    h_.stride = r.get<int64_t>("stride");
    h_.step = r.get<int64_t>("step");
    h_.first = r.get<int64_t>("first");
    h_.per_chunk = r.get<int64_t>("per_chunk");
    h_.n_chunks = r.get<int64_t>("n_chunks");
    h_.bos = r.get<int32_t>("bos");
    const uint32_t model_len = r.get<uint32_t>("model_len");
    if (model_len > size_ - r.at) ZK_THROW("%s: truncated logits file (at model)", path.c_str());
    h_.model.assign(reinterpret_cast<const char*>(map_ + r.at), model_len);
    r.at += model_len;
    const int64_t n_tokens = r.get<int64_t>("n_tokens");
    if (h_.n_vocab == 0 || h_.window < 2 || h_.step < 1 || h_.first < 0 || h_.per_chunk < 1 ||
        h_.first + h_.per_chunk + 1 != h_.window || h_.n_chunks < 1 || h_.stride < 0 || n_tokens < h_.window ||
        (int64_t)((size_ - r.at) / sizeof(int32_t)) < n_tokens ||
        (h_.n_chunks - 1) * h_.step + h_.window > n_tokens)
        ZK_THROW("%s: inconsistent logits file header", path.c_str());
    tokens_.resize((size_t)n_tokens);
    std::memcpy(tokens_.data(), map_ + r.at, tokens_.size() * sizeof(int32_t));
    r.at += tokens_.size() * sizeof(int32_t);
    for (int32_t t : tokens_)
        if (t < 0 || (uint32_t)t >= h_.n_vocab) ZK_THROW("%s: token id %d outside the vocabulary", path.c_str(), t);
    data_off_ = (r.at + k_logits_align - 1) / k_logits_align * k_logits_align;
    const double want = (double)data_off_ + (double)h_.n_chunks * h_.per_chunk * h_.n_vocab * sizeof(uint16_t);
    if ((double)size_ != want)
        ZK_THROW("%s: the logits file has %zu bytes, its header says %.0f (truncated?)", path.c_str(), size_, want);
}

eval_logits_file::~eval_logits_file() {
    if (map_) munmap(const_cast<uint8_t*>(map_), size_);
}

void eval_logits_file::row(int64_t chunk, int64_t j, float* out) const {
    ZK_ASSERT(chunk >= 0 && chunk < h_.n_chunks && j >= 0 && j < h_.per_chunk);
    const size_t n = h_.n_vocab;
    const uint8_t* src = map_ + data_off_ + ((size_t)chunk * h_.per_chunk + (size_t)j) * n * sizeof(uint16_t);
    float mx = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        std::memcpy(&h, src + i * sizeof h, sizeof h);
        out[i] = fp16_to_fp32(h);
        mx = std::max(mx, out[i]);
    }
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += std::exp((double)out[i] - mx);
    const float lse = (float)(mx + std::log(sum));
    for (size_t i = 0; i < n; i++) out[i] -= lse;
}

}  // namespace zk
