// Vector codes for the cache's values (KV_LAYOUT_VQ; the format in
// kernels/attention.h): the codebooks of a model's (layer, KV head) blocks and
// the coding of a value row against them. A .zack made by `zack calibrate`
// carries the books (calib/codebook.h trains them; calib/zack_file.h stores
// them); engine/model.cpp builds a kv_vq_books from the file, and a session hands
// it to the cache when a plan puts a value side at kv_bits 1.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace zk {

// The value precisions that are vector codes, each against its own books: 1 (a
// .zack's first books, 4 channels x 64 centroids: 1.625 bits an element at 128
// channels with the scale) and 0 (its second, 8 x 256: 1.125 bits). A cache's
// and a model's books are indexed by this code (kv_cache_params::vq).
constexpr int KV_VQ_CODES = 2;
inline bool kv_bits_vq(int bits) { return bits == 0 || bits == 1; }
// A code's books in a .zack (calib/zack_file.h): "vq" (code 1) or "vq0" (code 0),
// the keys zack.NAME.dim / .size and the tensors blk.N.zack.NAME / NAME_gain.
inline const char* kv_vq_file_name(int code) { return code == 1 ? "vq" : "vq0"; }

// One block's book: d / c groups of K centroids of c channels each.
struct kv_vq_book {
    const float* enc = nullptr;  // [d / c x K x c] the k-means centroids (rows coded at unit RMS over d channels)
    const float* dec = nullptr;  // [d / c x K x c] enc times the per-channel gain (what a code decodes to)
    // dec in int8 for the integer value sums (kvq_vq_int8_book; optional: the
    // kernel sums in float without it): [d / c x K x c] codes, [d / c] scales.
    const int8_t* dec8 = nullptr;
    const float* dec8_scale = nullptr;
};

struct kv_vq_books {
    int c = 0;  // channels a code
    int K = 0;  // centroids a group (a power of two)
    int d = 0;  // channels a book covers (the head dim); a side of rank r < d uses its first r / c groups
    std::vector<kv_vq_book> heads;  // [n_layer x n_kv]
    int bits() const;               // log2(K): bits a code
};

// Throws zk::error naming what is wrong (c, K, a rank it cannot code).
void kvq_vq_check(int c, int K, int d);
void kvq_vq_check_rank(const kv_vq_books& b, int r, const char* where);

// The index of the centroid of e [K x c] nearest to y [c] in squared distance
// (the first of equals); the encoder's search, and k-means' at calibration.
int kvq_vq_nearest(const float* y, const float* e, int K, int c);

// One head's decoding centroids: dec[q][k][j] = enc[q][k][j] x gain[q c + j]
// (enc, dec [d / c x K x c], gain [d]).
void kvq_vq_decoding_book(int c, int K, int d, const float* enc, const float* gain, float* dec);

// One head's decoding centroids in int8: per group q of c channels a scale
// s_q = max |dec[q]| / 127 and dec8 = round(dec / s_q) (dec, dec8 [d / c x K x
// c], scale [d / c]). kernels/cpu/attention_vq.cpp sums u8 weights times these
// in integers; the rounding (at most s_q / 2 an element, 0.4% of the group's
// largest) is small beside the codes' own error (a row's, 17-31% on
// Qwen2.5-Coder-1.5B).
void kvq_vq_int8_book(int c, int K, int d, const float* dec, int8_t* dec8, float* scale);

// Codes row x [r] (r a multiple of c, at most d): its scale s = sqrt(sum x^2 / d),
// the RMS the book was trained at over the channels the row keeps, as f16 in
// *scale, and per group of c channels the nearest centroid of x / s, packed
// (kernels/attention.h, kv_vq_code) into kv_vq_row_bytes(r / c, bits) bytes.
void kvq_vq_encode_row(const kv_vq_books& b, const kv_vq_book& h, const float* x, int r, uint8_t* codes,
                       uint16_t* scale);
// The row a code row decodes to: scale x dec[g][code_g].
void kvq_vq_decode_row(const kv_vq_books& b, const kv_vq_book& h, const uint8_t* codes, uint16_t scale, int r,
                       float* x);

}  // namespace zk
