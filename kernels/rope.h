// Rotary position embedding, applied in place to [n_tok x n_heads x head_dim].
// Two pair orders exist in GGUF files: llama-arch converters permute Q/K so the
// rotated pairs are adjacent (x[2i], x[2i+1]) ("norm"); qwen2 and other NeoX-style
// models rotate (x[i], x[i + n_dims/2]) ("neox"). Only the first n_dims of each
// head rotate. theta_i = pos * freq_scale * base^(-2i/n_dims).
#pragma once
#include <cstdint>
#include <vector>

namespace zk {

enum class rope_style { NORM, NEOX };

struct rope_params {
    int n_dims = 0;
    float freq_base = 10000.0f;
    float freq_scale = 1.0f;  // 1 / linear scaling factor
    rope_style style = rope_style::NORM;
};

// cos/sin for each token and pair, computed once per forward and shared by every
// head and layer: cs is [n_tok x n_dims/2 x 2] (cos, sin).
void kernel_rope_table(const rope_params& p, const int32_t* pos, int64_t n_tok, float* cs);

void kernel_rope_apply(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim,
                       const rope_params& p, const float* cs);

}  // namespace zk
