// A decoder loaded from a GGUF (or .zack) file: hyper-parameters,
// tokenizer and read-only views of the mmapped weights. Immutable after load;
// all run state (activations, KV cache) lives in a session.
//
// Supported architectures (engine/arch.h): "llama" (SmolLM2, Llama 2/3,
// Mistral, TinyLlama), "qwen2" (adds Q/K/V biases, NeoX-order RoPE) and
// "gemma3" (QK-norm, GeGLU, post-norms, scaled embeddings, sliding-window layers).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/kv_vq.h"

#include "engine/arch.h"
#include "engine/chat.h"
#include "engine/vocab.h"
#include "ggml-like/gguf.h"
#include "kernels/matmul.h"
#include "kernels/rope.h"

namespace zk {

struct model_hparams {
    std::string arch;
    const arch_desc* desc = nullptr;  // the architecture's row of engine/arch.h
    std::string name;
    int n_layer = 0;
    int n_embd = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;   // n_embd / n_head unless the file says otherwise
    int n_ff = 0;
    int n_vocab = 0;
    int n_ctx_train = 0;
    float rms_eps = 1e-5f;
    rope_params rope;
    // Score scale; 0 = 1 / sqrt(head_dim) (every supported architecture so far:
    // Gemma 3's query_pre_attn_scalar is the head dim except on the 27B).
    float attn_scale = 0;
    float score_scale() const { return attn_scale > 0 ? attn_scale : 1.0f / std::sqrt((float)head_dim); }
    arch_act act = arch_act::SILU_GLU;  // the gated FFN's activation
    float embd_scale = 1;       // token embeddings times this (gemma3: sqrt(n_embd))
    float logit_softcap = 0;    // logits = c tanh(logits / c) where > 0
    // Sliding-window layers (gemma3): swa_layer[il] is 1 where layer il sees
    // only the last n_swa positions, with RoPE rope_swa; empty = none.
    int n_swa = 0;
    std::vector<uint8_t> swa_layer;  // [n_layer]
    rope_params rope_swa;
    bool layer_is_swa(int il) const { return !swa_layer.empty() && swa_layer[il]; }
    int n_group() const { return n_head / n_head_kv; }  // query heads per KV head
};

struct layer_weights {
    const float* attn_norm;   // [n_embd]
    weight_view wq;           // [n_head*head_dim x n_embd]
    weight_view wk;           // [n_head_kv*head_dim x n_embd]
    weight_view wv;           // [n_head_kv*head_dim x n_embd]
    weight_view wo;           // [n_embd x n_head*head_dim]
    const float* bq = nullptr;  // qwen2 biases, [rows of wq/wk/wv]
    const float* bk = nullptr;
    const float* bv = nullptr;
    const float* q_norm = nullptr;     // gemma3 QK-norm weights, [head_dim]
    const float* k_norm = nullptr;
    const float* attn_post_norm = nullptr;  // gemma3 post-norms, [n_embd]
    const float* ffn_norm;    // [n_embd]
    weight_view w_gate;       // [n_ff x n_embd]
    weight_view w_up;         // [n_ff x n_embd]
    weight_view w_down;       // [n_embd x n_ff]
    const float* ffn_post_norm = nullptr;
};

// What a .zack file adds (see models/README.md): per layer, the Q-K rotation and
// the singular values of each KV head, and a table of ranks for a grid of
// compression rates. W_v and W_o in a .zack already have the V rotation folded in.
struct zack_layer {
    const float* rqk = nullptr;      // [n_head_kv x head_dim x head_dim]: R[g][i][j], column j = j-th direction
    // Alternative key bases (calib/keybasis.h), same layout, null in older files:
    // the score basis (kqa for queries, kqb for keys) and the RoPE-pair selection.
    const float* kqa = nullptr;
    const float* kqb = nullptr;
    const float* kpair = nullptr;
    const float* sigma_k = nullptr;  // [n_head_kv x head_dim], descending
    const float* sigma_v = nullptr;  // [n_head_kv x head_dim], descending
    // [n_head_kv x head_dim] the mean key after RoPE, which sessions leave out
    // of the cache (calib/zack_file.h); null in older files.
    const float* kmean = nullptr;
    // [n_head_kv x head_dim] per pca direction the proxy that orders a head's
    // directions in a key row coding channels at unequal widths (calib/keybasis.h
    // keybasis_quant_scores); null in older files.
    const float* kscore = nullptr;
    // [n_head_kv x head_dim] that order: korder[g][i] = the direction in place i
    // (empty without kscore)
    std::vector<int32_t> korder;
    // The pair such rows are coded in instead where the file has it
    // (calib/keybasis.h keybasis_quant_pair; engine/session.cpp): kwa for
    // queries, kwb for keys, same layout as rqk, and its proxy kwscore
    // [n_head_kv x head_dim] (descending, the widths' water-filling reads it);
    // null in older files.
    const float* kwa = nullptr;
    const float* kwb = nullptr;
    const float* kwscore = nullptr;
    // the proxy a head's widths come from: the pair's, else the pca directions'
    const float* widths_score() const { return kwscore ? kwscore : kscore; }
};

// The order of a head's pca directions by their quantization score (a .zack's
// blk.N.zack.kscore, calib/keybasis.h keybasis_quant_scores): order[i] = the
// direction in place i, by score descending, ties in direction order.
template <typename T>
void zack_key_order(int d, const T* score, std::vector<int32_t>& order) {
    order.resize((size_t)d);
    for (int i = 0; i < d; i++) order[(size_t)i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return score[a] > score[b]; });
}

struct zack_info {
    bool present = false;
    int version = 0;
    int rank_align = 1;
    std::vector<zack_layer> layers;      // [n_layer]
    std::vector<float> table_rates;      // [n_rates] overall rates of the rank table
    std::vector<int32_t> table_k;        // [n_rates x n_layer x n_head_kv]
    std::vector<int32_t> table_v;        // [n_rates x n_layer x n_head_kv]
    // Measured sensitivity (calib/sensitivity.h), empty in older files: the
    // rank grid and the loss curves [n_layer x n_head_kv x n_grid] of the keys
    // in each key basis (pca, score, pairs; empty where not measured) and of the values.
    std::vector<int32_t> sens_grid;
    std::vector<float> sens_k[3];
    std::vector<float> sens_v;
    // Quantized caches at full rank: the precisions (the first 16) and
    // [n_p x n_p x n_layer x n_head_kv] the loss with keys at sens_qbits[i] and
    // values at sens_qbits[j]; older files measured both sides at one precision
    // only (8, 4): their other pairs are NaN. Precision 1 is 2-bit keys with a
    // 1-bit tail (calib/sensitivity.h), keys only: NaN as values and with 16- or
    // 8-bit values.
    std::vector<int32_t> sens_qbits;
    std::vector<float> sens_q;
    std::string sens_metric;
    // What a unit of rank loss costs against a unit of quantization loss in a
    // plan (calib/plan.h, plan_inputs::rank_weight); 1 in files without it.
    double sens_rank_weight = 1.0;
    // The KIVI group (tokens) the losses were measured at (zack.sens.group; 32 in files without it).
    int sens_group = 32;
    // Per-layer corrections of the measured losses, measured end to end
    // (calib/layer_gain.h, zack.sens.layer_gain [n_layer]); empty in files without them.
    std::vector<float> sens_layer_gain;
    // Value codebooks (engine/kv_vq.h; blk.N.zack.vq, .vq_gain), for
    // vector-coded values: vq.heads empty in files without them. vq_dec owns the
    // decoding centroids (the file's centroids times the per-channel gains).
    // Indexed by the value precision code (engine/kv_vq.h): vq[1] from
    // blk.N.zack.vq (4 x 64), vq[0] from blk.N.zack.vq0 (8 x 256).
    kv_vq_books vq[KV_VQ_CODES];
    std::vector<float> vq_dec[KV_VQ_CODES];
    // vq_dec in int8 (kvq_vq_int8_book), [n_layer x n_kv x d x K]; empty where
    // kernel_attention_vq_int8_faster() says the float sums are faster
    std::vector<int8_t> vq_dec8[KV_VQ_CODES];
    std::vector<float> vq_dec8_scale[KV_VQ_CODES];  // their scales [n_layer x n_kv x d / c]
    bool has_key_bases() const { return !layers.empty() && layers[0].kqa && layers[0].kqb && layers[0].kpair; }
};

// Interleaved copies of the K-quant weight matrices for the tiled matmul
// kernels (ggml-like/quant_pack.h), one anonymous mapping owned by the model.
// The packed views point into it; the file's pages of packed tensors are
// released after packing (read again from the file only if something reads
// the GGUF bytes, e.g. calibration folding W_o), so the model's resident
// memory stays about the file's size.
// The mapping starts on a 2 MiB boundary and asks for transparent huge pages.
constexpr size_t k_packed_align = (size_t)2 << 20;
struct packed_weights {
    void* base = nullptr;
    size_t bytes = 0;
    int n_tensors = 0;
    packed_weights() = default;
    packed_weights(const packed_weights&) = delete;
    packed_weights& operator=(const packed_weights&) = delete;
    ~packed_weights();
};

struct model {
    std::unique_ptr<gguf_file> file;
    model_hparams hp;
    std::unique_ptr<vocab> voc;
    weight_view tok_embd;     // [n_vocab x n_embd]
    const float* output_norm; // [n_embd]
    weight_view output;       // [n_vocab x n_embd], tok_embd when tied
    bool tied_output = false;
    std::vector<layer_weights> layers;
    zack_info zack;  // present only for .zack files
    packed_weights packed;
};

struct model_load_params {
    // Pack the weight matrices the build has tiled kernels for (quant_pack.h).
    // Off: every matmul reads the mmapped GGUF blocks (tests of that path).
    bool pack_weights = true;
};

// Opens, validates (architecture, every tensor's presence, type and shape) and
// maps a model. Throws zk::error "PATH: what" on any problem.
std::unique_ptr<model> model_load(const std::string& path, const model_load_params& params = {});

// The model's chat template: the family of its tokenizer.chat_template, or where
// the file has none, its architecture's (gemma3: gemma; otherwise chatml, as
// llama.cpp falls back).
chat_template model_chat_template(const model& m);

// One-line description for logs: "llama, 30 layers, 576 dim, 9/3 heads, ...".
std::string model_describe(const model& m);

}  // namespace zk
