// The CUDA backend's dense ops (engine/backend_cuda.h): weights kept in their
// GGUF types, mat-vec for decode, dequantized f16 tiles and the GEMM for
// prefill, and the small kernels.
#include "engine/backend_cuda.h"

#include <algorithm>
#include <cstring>

#include "ggml-like/error.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/glu.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/rope.h"

namespace zk {

using namespace cuda;

namespace {

// Weights dequantized for one GEMM at most this many elements at a time (a
// 151,936 x 1,536 output matrix goes in three tiles; 64 MiB of f16).
constexpr int64_t k_gemm_tile_elems = 32ll << 20;

float* device_zeros(size_t n) {
    float* p = (float*)cuda_malloc(n * sizeof(float), "forward buffers");
    cuda_memset(p, 0, n * sizeof(float));
    return p;
}
void device_release(void* p) { cuda_free(p); }

}  // namespace

void cuda_upload_batch::add(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    bytes_ = (bytes_ + 15) & ~size_t(15);
    if (host_.size() < bytes_ + bytes) host_.resize(std::max(bytes_ + bytes, 2 * host_.size()));
    std::memcpy(host_.data() + bytes_, src, bytes);
    pieces_.push_back({(uint64_t)(uintptr_t)dst, (uint64_t)bytes_, (uint64_t)bytes});
    bytes_ += bytes;
}

cuda_upload_batch::~cuda_upload_batch() { cuda_host_free(pinned_); }

void cuda_upload_batch::send() {
    if (pieces_.empty()) return;
    // one buffer: the table of pieces, then their bytes
    const size_t table = ((pieces_.size() * sizeof(cuda_copy_piece)) + 15) & ~size_t(15);
    const size_t need = (table + bytes_ + 15) & ~size_t(15);
    if (staged_ + need > pinned_size_) {
        // every earlier send's staging must have reached the device first
        cuda_stream_sync(nullptr);
        staged_ = 0;
        if (need > pinned_size_) {
            cuda_host_free(pinned_);
            pinned_ = nullptr;
            pinned_size_ = std::max(need, std::max<size_t>(2 * pinned_size_, 1 << 20));
            pinned_ = (uint8_t*)cuda_host_alloc(pinned_size_, "uploads");
        }
    }
    // the device buffer is reused: the copy into it runs after the last scatter read it (stream order)
    uint8_t* d = cuda_grow(dev_, table + bytes_, "uploads");
    for (cuda_copy_piece& p : pieces_) p.src += (uint64_t)(uintptr_t)(d + table);
    uint8_t* st = pinned_ + staged_;
    staged_ += need;
    std::memcpy(st, pieces_.data(), pieces_.size() * sizeof(cuda_copy_piece));
    std::memcpy(st + table, host_.data(), bytes_);
    cuda_copy_to_device_async(d, st, table + bytes_);
    cuda_scatter_bytes(dptr<const cuda_copy_piece>((const cuda_copy_piece*)d), (int)pieces_.size(), nullptr);
    pieces_.clear();
    bytes_ = 0;
}

void backend_cuda_check() {
    if (cuda_device_count() < 1)
        ZK_THROW("device cuda: no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES); use device cpu");
}

std::string backend_cuda_device_describe() {
    const cuda_device_info d = cuda_device_query();
    return d.name + ", " + std::to_string(d.sm_count) + " SMs" + (d.simt ? " (the SIMT harness)" : "");
}

std::unique_ptr<backend> backend_cuda_create(const backend_params& p) {
    backend_cuda_check();
    return std::make_unique<backend_cuda>(p.n_threads);
}

backend_cuda::backend_cuda(int n_threads) : pool_(n_threads), dev_(cuda_device_query()) {}

backend_cuda::~backend_cuda() = default;

std::unique_ptr<forward_buffers> backend_cuda::buffers_create(const model_hparams& hp, int64_t n_rows, int max_seqs,
                                                              int n_threads, int64_t cap, int gear_rank,
                                                              bool observe) {
    if (observe)
        ZK_THROW("device cuda: eviction policies that read the attention (h2o, snapkv, keyformer) are not on the "
                 "GPU yet; use --kv-evict streaming, or device cpu");
    if (hp.n_swa > 0)
        ZK_THROW("device cuda: sliding-window attention layers (this model has a window of %lld) are not on the "
                 "GPU yet; use device cpu", (long long)hp.n_swa);
    static const fb_allocator a{&device_zeros, &device_release, false};
    return std::make_unique<forward_buffers>(hp, n_rows, max_seqs, n_threads, cap, gear_rank, observe, a);
}

const uint8_t* backend_cuda::param(const void* host, size_t bytes) {
    auto it = params_.find(host);
    if (it == params_.end()) {
        device_array<uint8_t> d(bytes, "weights");
        d.upload((const uint8_t*)host, bytes);
        it = params_.emplace(host, std::move(d)).first;
    }
    ZK_ASSERT(it->second.size() >= bytes);
    return it->second.data();
}

cuda_weight backend_cuda::weight(const weight_view& w) {
    if (!cuda_weight_supported(w.type))
        ZK_THROW("device cuda: weights of type %s are not supported on the GPU yet; use device cpu",
                 dtype_name(w.type));
    cuda_weight d;
    d.type = w.type;
    d.n_rows = w.n_rows;
    d.n_cols = w.n_cols;
    d.data = dptr<const uint8_t>(param(w.data, (size_t)w.n_rows * dtype_row_size(w.type, w.n_cols)));
    return d;
}

void backend_cuda::embed(const weight_view& table, const int32_t* tokens, int64_t n, float scale, float* x) {
    int32_t* t = cuda_grow(d_tok_, (size_t)n, "tokens");
    up_.add(t, tokens, (size_t)n * sizeof(int32_t));
    up_.send();
    cuda_dequantize(weight(table), dptr<const int32_t>(t), 0, n, scale, dptr<float>(x), dptr<uint16_t>(), nullptr);
}

// Decode (up to k_matvec_max_tok rows): the mat-vec reads the weights in
// their type. Prefill: rows of W dequantized to f16 tiles, the activations
// converted to f16 once, and the GEMM (tensor cores on a device) per tile.
// The decode mat-vec of K-quant weights reads x rounded to 8 bits
// (cuda_quantize_act), as the CPU's kernel_matmul does: once per x for every
// matrix that multiplies it.
const cuda_act_q8* backend_cuda::act_q8(const float* x, int64_t n_tok, int64_t n_cols) {
    const size_t n = (size_t)(n_tok * n_cols);
    act_q8_.q = dptr<int8_t>(cuda_grow(d_actq_, n, "8-bit activations"));
    act_q8_.meta = dptr<float>(cuda_grow(d_actm_, n / 4, "8-bit activations"));
    cuda_quantize_act(dptr<const float>(x), n_tok, n_cols, act_q8_, nullptr);
    return &act_q8_;
}

void backend_cuda::matmul(const weight_view& w, const float* x, int64_t n_tok, float* y, forward_buffers&) {
    matmul_one(w, x, n_tok, y, nullptr);
}

void backend_cuda::matmul_one(const weight_view& w, const float* x, int64_t n_tok, float* y, const cuda_act_q8* xq) {
    const cuda_weight dw = weight(w);
    if (n_tok <= k_matvec_max_tok) {
        if (!xq && cuda_matvec_takes_q8(dw.type)) xq = act_q8(x, n_tok, w.n_cols);
        cuda_matvec(dw, dptr<const float>(x), n_tok, dptr<float>(y), nullptr,
                    cuda_matvec_takes_q8(dw.type) ? xq : nullptr);
        return;
    }
    const int64_t N = w.n_rows, K = w.n_cols;
    uint16_t* x16 = cuda_grow(d_x16_, (size_t)(n_tok * K), "f16 activations");
    cuda_f32_to_f16(dptr<const float>(x), dptr<uint16_t>(x16), n_tok * K, nullptr);
    const int64_t tile = std::min(N, std::max<int64_t>(1, k_gemm_tile_elems / K));
    uint16_t* w16 = cuda_grow(d_w16_, (size_t)(tile * K), "f16 weight tiles");
    float* yt = tile < N ? cuda_grow(d_ytile_, (size_t)(n_tok * tile), "GEMM tile output") : y;
    for (int64_t r0 = 0; r0 < N; r0 += tile) {
        const int64_t nr = std::min(tile, N - r0);
        cuda_dequantize(dw, dptr<const int32_t>(), r0, nr, 1.0f, dptr<float>(), dptr<uint16_t>(w16), nullptr);
        cuda_gemm_args a;
        a.type = CUDA_GEMM_F16;
        a.M = n_tok;
        a.N = nr;
        a.K = K;
        a.X = x16;
        a.W = w16;
        a.Y = yt;
        cuda_gemm(a, nullptr);
        if (yt != y) cuda_copy_cols(dptr<const float>(yt), nr, dptr<float>(y), N, r0, n_tok, nullptr);
    }
}

void backend_cuda::matmul_multi(const weight_view* ws, float* const* ys, int n_w, const float* x, int64_t n_tok,
                                forward_buffers& fb) {
    // one rounding of x for every K-quant matrix of the group (they share n_cols)
    const cuda_act_q8* xq = nullptr;
    for (int i = 0; i < n_w && !xq; i++)
        if (n_tok <= k_matvec_max_tok && cuda_matvec_takes_q8(ws[i].type)) xq = act_q8(x, n_tok, ws[i].n_cols);
    for (int i = 0; i < n_w; i++) matmul_one(ws[i], x, n_tok, ys[i], xq);
}

void backend_cuda::rmsnorm(const float* x, const float* w, float* y, int64_t n_tok, int64_t n, float eps) {
    const float* dw = (const float*)param(w, (size_t)n * sizeof(float));
    cuda_rmsnorm(dptr<const float>(x), dptr<const float>(dw), dptr<float>(y), n_tok, n, eps, nullptr);
}

void backend_cuda::add_bias(float* y, const float* b, int64_t n_tok, int64_t n) {
    const float* db = (const float*)param(b, (size_t)n * sizeof(float));
    cuda_add_bias(dptr<float>(y), dptr<const float>(db), n_tok, n, nullptr);
}

void backend_cuda::add(float* x, const float* y, int64_t n) {
    cuda_add(dptr<float>(x), dptr<const float>(y), n, nullptr);
}

void backend_cuda::rope_table(const rope_params& p, const int32_t* pos, int64_t n_tok, float* cs) {
    cuda_rope_table(p, dptr<const int32_t>(upload_pos(pos, n_tok)), n_tok, dptr<float>(cs), nullptr);
}

void backend_cuda::rope_apply(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, const rope_params& p,
                              const float* cs) {
    cuda_rope_apply(dptr<float>(x), n_tok, n_heads, head_dim, p, dptr<const float>(cs), nullptr);
}

void backend_cuda::glu(arch_act act, float* g, const float* u, int64_t n_tok, int64_t F) {
    if (act == arch_act::GELU_TANH_GLU)
        cuda_geglu(dptr<const float>(g), dptr<const float>(u), dptr<float>(g), n_tok * F, nullptr);
    else
        cuda_swiglu(dptr<const float>(g), dptr<const float>(u), dptr<float>(g), n_tok * F, nullptr);
}

void backend_cuda::softcap(float* y, int64_t n, float c) { cuda_softcap(dptr<float>(y), n, c, nullptr); }

float* backend_cuda::logits_target(float*, int64_t n) { return cuda_grow(d_logits_, (size_t)n, "logits"); }

void backend_cuda::logits_fetch(float* out, const float* y, int64_t n) {
    cuda_copy_to_host(out, y, (size_t)n * sizeof(float));
}

// Every layer asks; the first of a pass uploads.
const int32_t* backend_cuda::upload_pos(const int32_t* pos, int64_t n) {
    if ((int64_t)h_pos_.size() == n && std::equal(h_pos_.begin(), h_pos_.end(), pos)) return d_pos_.data();
    h_pos_.assign(pos, pos + n);
    // a new array when it grows: the old one may still be read by queued work
    if (d_pos_.size() < (size_t)n) d_pos_ = device_array<int32_t>(std::max<size_t>(n, 64), "positions");
    up_.add(d_pos_.data(), h_pos_.data(), (size_t)n * sizeof(int32_t));
    up_.send();
    return d_pos_.data();
}

}  // namespace zk
