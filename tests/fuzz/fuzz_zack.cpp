// Fuzz target "zack": a model file (.zack or plain GGUF) through the engine's
// own loading path, model_load (hyper-parameters, tokenizer, every tensor's
// presence, type and shape, the zack.* keys and tensors against the model's
// shapes), then what a run does next: the rank selection from the stored
// spectra, calibrate's reader of the rotations, and a session with those ranks
// decoding two tokens. New .zack keys are covered as soon as model_load reads them.
// Seeds: tiny llama and qwen2 models and their .zack files (the real writer).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>

#include "calib/ranks.h"
#include "calib/zack_file.h"
#include "engine/model.h"
#include "engine/session.h"
#include "ggml-like/error.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/tiny_model.h"

namespace zk_fuzz {

namespace {

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

void run_model(const zk::model& m) {
    (void)zk::model_describe(m);
    const zk::vocab& voc = *m.voc;
    const std::vector<int32_t> ids = voc.encode("ab <|im_start|>user\nab", true, true);
    (void)voc.decode(ids, true);

    zk::session_params sp;
    sp.n_ctx = 16;
    sp.n_batch = 4;
    sp.n_threads = 1;
    if (m.zack.present) {
        const zk::zack_spectra spec = zk::zack_spectra::from_model(m);
        const zk::zack_ranks r = zk::ranks_for_rate(spec, 0.25, m.zack.rank_align);
        (void)zk::ranks_from_eps(spec, 0.1, m.zack.rank_align);
        sp.ranks_k = r.k;
        sp.ranks_v = r.v;
        (void)zk::zack_file_read_calibration(*m.file);
    }
    zk::session_validate_params(sp, m.hp);
    zk::session s(m, sp);
    const int32_t toks[2] = {0, m.hp.n_vocab - 1};
    s.decode(toks, 2);
}

}  // namespace

void fuzz_zack_init() {}

void fuzz_zack_one(const uint8_t* data, size_t size) {
    const std::string& path = fuzz_file_set(data, size);
    std::unique_ptr<zk::model> m;
    try {
        m = zk::model_load(path);
        run_model(*m);
    } catch (const zk::error&) {
    }
}

std::vector<std::pair<std::string, std::string>> fuzz_zack_seeds() {
    std::vector<std::pair<std::string, std::string>> out;
    const std::string dir = fuzz_scratch_dir();
    zk_test::tiny_model_params p;
    p.n_layer = 1, p.n_embd = 32, p.n_head = 2, p.n_head_kv = 1, p.n_ff = 32, p.byte_vocab = false;
    p.weight_type = zk::dtype::F32;
    for (bool qwen2 : {false, true}) {
        p.qwen2 = qwen2;
        const std::string base = qwen2 ? "tiny_qwen2" : "tiny_llama";
        zk_test::tiny_model_write(dir + "/" + base + ".gguf", p);
        zk_test::tiny_zack_write(dir + "/" + base + ".gguf", dir + "/" + base + ".zack", 64);
        out.push_back({base + ".gguf", read_file(dir + "/" + base + ".gguf")});
        out.push_back({base + ".zack", read_file(dir + "/" + base + ".zack")});
    }
    return out;
}

}  // namespace zk_fuzz
