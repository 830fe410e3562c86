// The decoder block, computed from the architecture's features (engine/arch.h)
// over n token rows of a forward pass's buffers, through the session's
// backend (engine/backend.h). The session keeps what is not
// the model's: scheduling rows of several sequences, the KV cache, attention
// and observers; a layer is
//
//   arch_block_attn_in   x -> norm -> q, k, v (+ biases, QK-norm, RoPE)
//   (session)            compress, append to the cache, attention -> attn
//   arch_block_attn_out  x += post_norm(W_o attn)
//   arch_block_ffn       x += post_norm(W_down act(W_gate xn) * (W_up xn)), xn = norm(x)
//
// with the post-norms only where the architecture has them. Shapes as in
// forward_buffers (engine/forward_buffers.h): x [n x n_embd], q [n x n_head x head_dim],
// k, v [n x n_head_kv x head_dim].
#pragma once
#include <cstdint>

#include "engine/backend.h"
#include "engine/model.h"

namespace zk {

// Token embeddings of rows [0, n) into fb.x (scaled where the architecture
// does), and the RoPE tables of the rows' positions fb.pos (global and, for
// sliding-window models, local layers).
void arch_block_embed(const model& m, const int32_t* tokens, int64_t n, forward_buffers& fb, backend& be);

void arch_block_attn_in(const model& m, int il, int64_t n, forward_buffers& fb, backend& be);
void arch_block_attn_out(const model& m, int il, int64_t n, forward_buffers& fb, backend& be);
void arch_block_ffn(const model& m, int il, int64_t n, forward_buffers& fb, backend& be);

// Logits of `rows` rows already normalised by the output norm, xn
// [rows x n_embd] -> out [rows x n_vocab] (soft-capped where the file says).
void arch_block_logits(const model& m, const float* xn, int64_t rows, float* out, forward_buffers& fb,
                       backend& be);

}  // namespace zk
