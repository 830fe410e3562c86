// The architectures zack runs, as data: per architecture the GGUF metadata key
// prefix, the tensors it has and the features in which its decoder block
// differs from the plain llama block. engine/model.cpp reads a file through
// this table and engine/arch_block.cpp computes a layer from its features, so
// adding an architecture that only recombines these features is one row here
// (README.md, "Adding an architecture", lists the files to touch otherwise).
//
// Tensor names are GGUF's (llama.cpp's converters write them): one name table
// serves every architecture; a feature decides which of them a file must have.
#pragma once
#include <string>

#include "kernels/rope.h"

namespace zk {

// The gated feed-forward's activation: act(gate) * up.
enum class arch_act {
    SILU_GLU,       // SwiGLU: silu(g) = g / (1 + e^-g)                        (llama, qwen2)
    GELU_TANH_GLU,  // GeGLU: gelu(g) = g/2 (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))  (gemma3)
};

struct arch_desc {
    const char* name;          // general.architecture, also the prefix of its keys ("gemma3.block_count")
    rope_style rope;           // NORM: llama converters permute Q/K rows so pairs are adjacent; NEOX: half split
    bool qkv_bias;             // attn_{q,k,v}.bias [rows], where the file has them, added after the projections
    bool qk_norm;              // attn_q_norm / attn_k_norm [head_dim]: RMS norm of every q and k head before RoPE
    bool post_norms;           // post_attention_norm / post_ffw_norm [n_embd]: RMS norm of each sub-layer's
                               // output before it joins the residual stream
    arch_act act;
    bool embd_scale;           // token embeddings scaled by sqrt(n_embd)
    // Sliding-window attention: layer il is local (attends to the last
    // `<prefix>.attention.sliding_window` positions, RoPE base swa_rope_base)
    // unless (il + 1) % swa_period == 0; 0 = every layer global.
    int swa_period;
    float swa_rope_base;
    const char* chat_template; // template family when the GGUF has no tokenizer.chat_template ("" = chatml)
};

// The row of an architecture; throws zk::error "PATH: unsupported architecture
// 'x' (zack runs llama, qwen2, gemma3)" for any other.
const arch_desc& arch_find(const std::string& name, const std::string& path);

// "llama, qwen2, gemma3".
std::string arch_supported_names();

// Metadata keys under an architecture's prefix.
enum class arch_key {
    BLOCK_COUNT,
    EMBEDDING_LENGTH,
    HEAD_COUNT,
    HEAD_COUNT_KV,
    FEED_FORWARD_LENGTH,
    CONTEXT_LENGTH,
    KEY_LENGTH,
    VALUE_LENGTH,
    RMS_EPS,
    ROPE_DIMS,
    ROPE_FREQ_BASE,
    ROPE_SCALING_TYPE,
    ROPE_SCALING_FACTOR,
    SLIDING_WINDOW,
    FINAL_LOGIT_SOFTCAP,
};

// "gemma3.attention.sliding_window" for (gemma3, SLIDING_WINDOW).
std::string arch_key_name(const arch_desc& a, arch_key k);

// Tensors: global ones (layer ignored) and per-layer ones ("blk.N.").
enum class arch_tensor {
    TOKEN_EMBD,
    OUTPUT_NORM,
    OUTPUT,
    ATTN_NORM,
    ATTN_Q,
    ATTN_K,
    ATTN_V,
    ATTN_OUT,
    ATTN_Q_BIAS,
    ATTN_K_BIAS,
    ATTN_V_BIAS,
    ATTN_Q_NORM,
    ATTN_K_NORM,
    ATTN_POST_NORM,
    FFN_NORM,
    FFN_GATE,
    FFN_UP,
    FFN_DOWN,
    FFN_POST_NORM,
};

// "blk.3.attn_q.weight" for (ATTN_Q, 3); "token_embd.weight" for TOKEN_EMBD.
std::string arch_tensor_name(arch_tensor t, int layer = -1);

}  // namespace zk
