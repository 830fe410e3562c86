// tool_logits MODEL IDS_FILE OUT_FILE [--threads N] [--batch N] [--kv-type T] [--greedy N]
//             [--kv-bits B] [--kv-gear 0|1] [--kv-evict POLICY] [--kv-budget N] [--kv-sinks N]
//             [--nll 1]
// Runs zack's forward pass over the whitespace-separated token ids in IDS_FILE
// (one prefill chunk per --batch tokens) and writes the logits of every position
// as raw little-endian float32 [n_tok x n_vocab] to OUT_FILE. With --greedy N it
// then decodes N more tokens one at a time, each the argmax of the previous logits
// (lowest id on ties, as the greedy sampler picks; no stop at end-of-generation
// tokens), and prints their ids on stdout, space separated. Used by the python
// reference tests, and with the KV flags (session_params' kv_bits, kv_gear,
// evict.policy, evict.budget, evict.n_sink) to compare the logits of cache
// layouts before and after a change, byte for byte.
// --nll 1: each line of IDS_FILE is a sequence of its own (a fresh session
// each, the model loaded once), and OUT_FILE gets, sequence after sequence, the
// negative log-likelihood of each next token as float64 [n_i - 1]: -log
// softmax(logits[t])[ids[t + 1]], e^(x - max) in float32, its sum and the log
// in float64 (tests/ref/ref_ppl.py's nll), instead of 600 KB of logits a token.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/session.h"
#include "ggml-like/error.h"
#include "ggml-like/file_out.h"

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: tool_logits MODEL IDS_FILE OUT_FILE [--threads N] [--batch N] [--kv-type f16|f32] "
                     "[--greedy N] [--kv-bits B] [--kv-gear 0|1] [--kv-evict POLICY] [--kv-budget N] [--kv-sinks N] "
                     "[--nll 1]\n");
        return 2;
    }
    try {
        zk::session_params sp;
        sp.n_threads = 2;
        int64_t n_greedy = 0;
        bool nll = false;
        for (int i = 4; i + 1 < argc; i += 2) {
            if (!std::strcmp(argv[i], "--threads")) sp.n_threads = std::stoi(argv[i + 1]);
            if (!std::strcmp(argv[i], "--batch")) sp.n_batch = std::stoi(argv[i + 1]);
            if (!std::strcmp(argv[i], "--kv-type")) sp.kv.type = zk::dtype_from_name(argv[i + 1]);
            if (!std::strcmp(argv[i], "--greedy")) n_greedy = std::stoll(argv[i + 1]);
            if (!std::strcmp(argv[i], "--kv-bits")) sp.kv.bits = std::stoi(argv[i + 1]);
            if (!std::strcmp(argv[i], "--kv-gear")) sp.kv.gear = std::stoi(argv[i + 1]) != 0;
            if (!std::strcmp(argv[i], "--kv-evict")) sp.evict.policy = argv[i + 1];
            if (!std::strcmp(argv[i], "--kv-budget")) sp.evict.budget = std::stoll(argv[i + 1]);
            if (!std::strcmp(argv[i], "--kv-sinks")) sp.evict.n_sink = std::stoi(argv[i + 1]);
            if (!std::strcmp(argv[i], "--nll")) nll = std::stoi(argv[i + 1]) != 0;
        }
        if (nll) {
            if (n_greedy > 0) ZK_THROW("--nll and --greedy do not go together");
            std::ifstream in(argv[2]);
            if (!in) ZK_THROW("%s: cannot open", argv[2]);
            std::vector<std::vector<int32_t>> seqs;
            for (std::string line; std::getline(in, line);) {
                std::istringstream ls(line);
                std::vector<int32_t> ids;
                for (long v; ls >> v;) ids.push_back((int32_t)v);
                if (ids.size() == 1) ZK_THROW("%s: a sequence of one token has nothing to score", argv[2]);
                if (!ids.empty()) seqs.push_back(std::move(ids));
            }
            if (seqs.empty()) ZK_THROW("%s: no token ids", argv[2]);
            auto m = zk::model_load(argv[1]);
            const int64_t V = m->hp.n_vocab;
            std::vector<double> out;
            for (const auto& ids : seqs) {
                sp.n_ctx = (int64_t)ids.size();
                zk::session s(*m, sp);
                const float* lg = s.decode(ids.data(), (int64_t)ids.size(), true);
                for (size_t t = 0; t + 1 < ids.size(); t++) {
                    const float* row = lg + t * (size_t)V;
                    float mx = row[0];
                    for (int64_t v = 1; v < V; v++) mx = std::max(mx, row[v]);
                    double sum = 0;
                    for (int64_t v = 0; v < V; v++) sum += (double)std::exp(row[v] - mx);
                    out.push_back(std::log(sum) + (double)mx - (double)row[ids[t + 1]]);
                }
            }
            zk::file_out f(argv[3]);  // a temporary name, renamed when complete
            f.write(out.data(), out.size() * sizeof(double));
            f.commit();
            return 0;
        }
        std::ifstream in(argv[2]);
        if (!in) ZK_THROW("%s: cannot open", argv[2]);
        std::vector<int32_t> ids;
        for (long v; in >> v;) ids.push_back((int32_t)v);
        if (ids.empty()) ZK_THROW("%s: no token ids", argv[2]);
        auto m = zk::model_load(argv[1]);
        sp.n_ctx = (int64_t)ids.size() + n_greedy;
        zk::session s(*m, sp);
        const float* logits = s.decode(ids.data(), (int64_t)ids.size(), true);
        const int64_t n_vocab = m->hp.n_vocab;
        {
            zk::file_out f(argv[3]);
            f.write(logits, ids.size() * (size_t)n_vocab * sizeof(float));
            f.commit();
        }
        const float* last = logits + (ids.size() - 1) * (size_t)n_vocab;
        for (int64_t k = 0; k < n_greedy; k++) {
            int32_t best = 0;
            for (int32_t v = 1; v < n_vocab; v++)
                if (last[v] > last[best]) best = v;
            std::printf(k ? " %d" : "%d", best);
            last = s.decode(&best, 1);
        }
        if (n_greedy > 0) std::printf("\n");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tool_logits: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
