#include "engine/arch.h"

#include "ggml-like/error.h"

namespace zk {

namespace {

// name, rope, qkv_bias, qk_norm, post_norms, act, embd_scale, swa_period, swa_rope_base, chat_template
const arch_desc k_archs[] = {
    {"llama", rope_style::NORM, true, false, false, arch_act::SILU_GLU, false, 0, 0.0f, ""},
    {"qwen2", rope_style::NEOX, true, false, false, arch_act::SILU_GLU, false, 0, 0.0f, ""},
    // Gemma 3: five local layers (window 512 on the 270M, RoPE base 10000)
    // for each global one (the file's rope.freq_base, 1e6); its GGUF norms
    // already hold Gemma's (1 + w) (llama.cpp's converter adds the 1).
    {"gemma3", rope_style::NEOX, false, true, true, arch_act::GELU_TANH_GLU, true, 6, 10000.0f, "gemma"},
};

}  // namespace

std::string arch_supported_names() {
    std::string s;
    for (const arch_desc& a : k_archs) s += (s.empty() ? "" : ", ") + std::string(a.name);
    return s;
}

const arch_desc& arch_find(const std::string& name, const std::string& path) {
    for (const arch_desc& a : k_archs)
        if (name == a.name) return a;
    ZK_THROW("%s: unsupported architecture '%s' (zack runs %s)", path.c_str(), name.c_str(),
             arch_supported_names().c_str());
}

std::string arch_key_name(const arch_desc& a, arch_key k) {
    const char* s = "";
    switch (k) {
        case arch_key::BLOCK_COUNT: s = "block_count"; break;
        case arch_key::EMBEDDING_LENGTH: s = "embedding_length"; break;
        case arch_key::HEAD_COUNT: s = "attention.head_count"; break;
        case arch_key::HEAD_COUNT_KV: s = "attention.head_count_kv"; break;
        case arch_key::FEED_FORWARD_LENGTH: s = "feed_forward_length"; break;
        case arch_key::CONTEXT_LENGTH: s = "context_length"; break;
        case arch_key::KEY_LENGTH: s = "attention.key_length"; break;
        case arch_key::VALUE_LENGTH: s = "attention.value_length"; break;
        case arch_key::RMS_EPS: s = "attention.layer_norm_rms_epsilon"; break;
        case arch_key::ROPE_DIMS: s = "rope.dimension_count"; break;
        case arch_key::ROPE_FREQ_BASE: s = "rope.freq_base"; break;
        case arch_key::ROPE_SCALING_TYPE: s = "rope.scaling.type"; break;
        case arch_key::ROPE_SCALING_FACTOR: s = "rope.scaling.factor"; break;
        case arch_key::SLIDING_WINDOW: s = "attention.sliding_window"; break;
        case arch_key::FINAL_LOGIT_SOFTCAP: s = "final_logit_softcapping"; break;
    }
    return std::string(a.name) + "." + s;
}

std::string arch_tensor_name(arch_tensor t, int layer) {
    const char* s = "";
    bool global = false;
    switch (t) {
        case arch_tensor::TOKEN_EMBD: s = "token_embd.weight", global = true; break;
        case arch_tensor::OUTPUT_NORM: s = "output_norm.weight", global = true; break;
        case arch_tensor::OUTPUT: s = "output.weight", global = true; break;
        case arch_tensor::ATTN_NORM: s = "attn_norm.weight"; break;
        case arch_tensor::ATTN_Q: s = "attn_q.weight"; break;
        case arch_tensor::ATTN_K: s = "attn_k.weight"; break;
        case arch_tensor::ATTN_V: s = "attn_v.weight"; break;
        case arch_tensor::ATTN_OUT: s = "attn_output.weight"; break;
        case arch_tensor::ATTN_Q_BIAS: s = "attn_q.bias"; break;
        case arch_tensor::ATTN_K_BIAS: s = "attn_k.bias"; break;
        case arch_tensor::ATTN_V_BIAS: s = "attn_v.bias"; break;
        case arch_tensor::ATTN_Q_NORM: s = "attn_q_norm.weight"; break;
        case arch_tensor::ATTN_K_NORM: s = "attn_k_norm.weight"; break;
        case arch_tensor::ATTN_POST_NORM: s = "post_attention_norm.weight"; break;
        case arch_tensor::FFN_NORM: s = "ffn_norm.weight"; break;
        case arch_tensor::FFN_GATE: s = "ffn_gate.weight"; break;
        case arch_tensor::FFN_UP: s = "ffn_up.weight"; break;
        case arch_tensor::FFN_DOWN: s = "ffn_down.weight"; break;
        case arch_tensor::FFN_POST_NORM: s = "post_ffw_norm.weight"; break;
    }
    if (global) return s;
    ZK_ASSERT(layer >= 0);
    return "blk." + std::to_string(layer) + "." + s;
}

}  // namespace zk
