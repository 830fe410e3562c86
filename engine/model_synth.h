// Synthetic models: a GGUF with the shape of a real model (architecture,
// layers, widths, heads, vocabulary size) and random weights, for speed
// measurements where no model file exists (`zack bench --shape NAME` on a
// benchmark machine). The file is an ordinary GGUF that model_load reads; its
// general.name says it is a random-weight model of shape NAME, and its text is
// meaningless.
//
// What the file holds, per shape:
// - the architecture's metadata keys (engine/arch.h names them), the real
//   model's hyper-parameters (checked against the real GGUFs: `zack info`);
// - a byte-level BPE tokenizer ("gpt2") of exactly n_vocab tokens: the ChatML
//   control tokens, the 256 byte tokens, a few merges, and filler tokens
//   "<synth_N>" that no text produces (ids random benchmark tokens may take);
// - every tensor: norms F32 near 1, Q/K/V biases F32 small (where the real
//   model has them), weight matrices in the requested type with values of
//   standard deviation 1/sqrt(row length). The output matrix is tied to the
//   embedding where the real model's file ties it.
// Weight bytes: where zack has a quantizer for the type (F32, F16, BF16,
// Q8_0, Q4_0, Q4_1) the matrix is model_synth_row's values quantized by it;
// for the other types (Q5_0, Q5_1, IQ4_NL, Q2_K..Q6_K) the blocks are random
// bytes whose f16 scale fields (d, and dmin / m) are set so that the
// dequantized values have mean about 0 and the same standard deviation: no
// NaN or Inf anywhere, activations of the usual size.
// As llama.cpp's quantizer does, a 256-element (K) type is replaced for a
// matrix whose rows are not a multiple of 256 long: Q2_K, Q3_K -> IQ4_NL,
// Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0 (SmolLM2's 576-wide and Qwen2.5
// 0.5B's 896-wide rows; `tiny`'s 64-wide rows).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ggml-like/dtype.h"

namespace zk {

struct synth_shape {
    const char* name;   // "qwen2.5-0.5b", as --shape takes it
    const char* arch;   // general.architecture: "llama", "qwen2"
    const char* like;   // the real model it has the shape of
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train;
    float rope_base, rms_eps;
    bool qkv_bias;      // Q/K/V biases (qwen2)
    bool tied_output;   // no output.weight: the embedding serves as the output matrix
    const char* tok_pre;  // tokenizer.ggml.pre of the real model
};

// The shapes, in table order (tiny first: the tests' shape).
const std::vector<synth_shape>& synth_shapes();
// "tiny, smollm2-135m, ..." for messages and --help.
std::string synth_shape_names();
// Throws zk::error "unknown shape 'x' (accepted: ...)".
const synth_shape& synth_shape_find(const std::string& name);

// The weight types model_synth_write takes (every weight type zack computes with).
const std::vector<dtype>& synth_weight_types();
// "f32, f16, bf16, q4_0, ..." (lower case, as --shape-type takes them).
std::string synth_weight_type_names();
// Parses a name of synth_weight_types (any case); throws listing them.
dtype synth_weight_type_from_name(const std::string& name);

// One tensor of a synthetic model.
struct synth_tensor {
    enum class kind { NORM, BIAS, MATRIX };
    std::string name;            // "blk.0.attn_q.weight"
    kind k;
    dtype type;                  // F32 for norms and biases; the matrix type after the K fallback
    std::vector<int64_t> shape;  // ne[0] (row length) first
    float std;                   // matrix / bias: values N(0, std); norm: 1 + N(0, std)
};

// The tensors of shape s with matrices of weight_type, in file order.
std::vector<synth_tensor> model_synth_tensors(const synth_shape& s, dtype weight_type);

// The type a matrix with rows of n_cols elements gets when weight_type is asked for
// (the K fallback above; F16 if even that does not divide the rows).
dtype model_synth_matrix_type(dtype weight_type, int64_t n_cols);

// True when zack quantizes model_synth_row's values into type t; false when t's
// blocks are random bytes with set scales (the values then only share the
// distribution, not the numbers).
bool model_synth_quantized(dtype t);

// The values asked for in row `row` of tensor t (t.shape[0] of them): a fixed
// function of (seed, t.name, row), approximately normal (a sum of four
// uniforms), so a test can compare a written file with them.
void model_synth_row(const synth_tensor& t, uint64_t seed, int64_t row, float* out);

// Writes the model to path through gguf_writer (a temporary file renamed when
// complete); the tensor data is made chunk by chunk while it is written (on up
// to n_threads threads, 0 = all), never held whole. progress: a line on stderr
// updated as it goes (for files over 64 MiB).
void model_synth_write(const synth_shape& s, dtype weight_type, uint64_t seed, const std::string& path,
                       bool progress = false, int n_threads = 0);

// "random weights, shape NAME, TYPE": the label bench prints beside its results.
std::string model_synth_label(const synth_shape& s, dtype weight_type);

}  // namespace zk
