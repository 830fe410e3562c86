// Folding the V rotation into the weights (DESIGN.md section 3, V-O pair).
//
// Weight matrices are row-major [out x in] as GGUF stores them (shape [in, out]).
// R_v[g] is [d x d] with column j the j-th direction (R[i][j] = rv[(g*d + i)*d + j]).
//   W_v  [n_kv*d x n_embd]:  rows of head g    W_v,g <- R_v[g]^T W_v,g
//                            (so v_new = R^T v_old: component j is v . direction j)
//   b_v  [n_kv*d]:           b_v,g <- R_v[g]^T b_v,g
//   W_o  [n_embd x n_head*d]: columns of query head i (KV head g = i / group)
//                            W_o[:, i*d:(i+1)*d] <- W_o[:, i*d:(i+1)*d] R_v[g]
// Then W_o,new o_new = W_o R R^T o = W_o o: at full rank attention is unchanged;
// at rank r the engine keeps the first r rotated value components.
#pragma once
#include <cstdint>
#include <vector>

#include "ggml-like/dtype.h"
#include "ggml-like/gguf.h"

namespace zk {

void fold_wv(float* wv, float* bv, const double* rv, int n_kv, int d, int64_t n_embd);
void fold_wo(float* wo, const double* rv, int n_head, int n_kv, int d, int64_t n_embd);

// The type a folded tensor is stored in: F32/F16/BF16/Q8_0 stay as they are;
// lower-precision sources (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K..Q6_K) become
// Q8_0 (zack has no quantizer for the others), or F16 when the row length is
// not a multiple of Q8_0's block of 32. Throws for the activation-only types.
dtype fold_output_type(dtype src, int64_t n_cols);

// A 2-D tensor as f32 [n_rows x n_cols] (1-D: one row).
std::vector<float> fold_dequantize(const gguf_tensor& t);
// f32 [n_rows x n_cols] -> rows of `type`.
std::vector<uint8_t> fold_quantize(const float* x, int64_t n_rows, int64_t n_cols, dtype type);

}  // namespace zk
