// tool_kv_kl MODEL TEXT_FILE [--prompt P] [--decode D] [--threads N] [--kv-type f16|f32] CONFIG...
// KL divergence of next-token distributions between the baseline KV cache (f16,
// no eviction) and each CONFIG over a real text: the first P tokens are a prompt
// (prefill, then eviction to the budget), the next D tokens are fed one at a
// time (decode, eviction in chunks) and the distributions after each of them
// are compared: mean KL(base || config) in nats and top-1 agreement. CONFIG is
// key=value pairs separated by commas: bits, group, residual, select, every (select_every), gear, gear_rank,
// evict, budget, crush, anchor, sinks, krank / vrank (one rank for all heads), full_layer (after a rate), rate (ZACK adaptive), urate (ZACK uniform), eps, srate (sensitivity allocation, key basis per head; srate0/1/2: pca/score/pairs only), head=K/l/g/r, ranks=FILE, e.g. "bits=4,gear=1" or "evict=h2o,budget=128".
// One line per config: config=... bytes_per_token=... kl=... top1=...
#include "calib/alloc.h"
#include "calib/ranks.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/session.h"
#include "engine/vocab.h"
#include "ggml-like/error.h"

namespace {

zk::session_params parse_config(const std::string& cfg, zk::session_params sp, const zk::model& m) {
    std::stringstream ss(cfg);
    std::string kv;
    while (std::getline(ss, kv, ',')) {
        if (kv.empty()) continue;
        const size_t eq = kv.find('=');
        if (eq == std::string::npos) ZK_THROW("config '%s': '%s' is not key=value", cfg.c_str(), kv.c_str());
        const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
        if (k == "bits") sp.kv.bits = std::stoi(v);
        else if (k == "type") sp.kv.type = zk::dtype_from_name(v);
        else if (k == "group") sp.kv.group = std::stoi(v);
        else if (k == "residual") sp.kv.residual = std::stoi(v);
        else if (k == "key_tail") sp.kv.key_tail = std::stoi(v);
        else if (k == "key_zero") sp.kv.key_zero = std::stoi(v);
        else if (k == "key_mid") sp.kv.key_mid = std::stoi(v);
        else if (k == "select") sp.kv.select = std::stoll(v);
        else if (k == "every") sp.kv.select_every = std::stoi(v);
        else if (k == "gear") sp.kv.gear = v != "0";
        else if (k == "gear_rank") sp.kv.gear_rank = std::stoi(v);
        else if (k == "sinks") sp.evict.n_sink = std::stoi(v);
        else if (k == "evict") sp.evict.policy = v;
        else if (k == "budget") sp.evict.budget = std::stoll(v);
        else if (k == "crush") sp.evict.crush = std::stof(v);
        else if (k == "anchor") sp.evict.crush_anchor = v;
        else if (k == "rate" || k == "urate" || k == "eps") {  // ZACK ranks (a .zack model)
            const zk::zack_spectra spec = zk::zack_spectra::from_model(m);
            const zk::zack_ranks r = k == "eps" ? zk::ranks_from_eps(spec, std::stod(v), m.zack.rank_align)
                                                : zk::ranks_for_rate(spec, std::stod(v), m.zack.rank_align, k == "urate");
            sp.ranks_k = r.k;
            sp.ranks_v = r.v;
        } else if (k == "keps" || k == "veps") {  // one side only, the other at full rank (diagnostics)
            const zk::zack_spectra spec = zk::zack_spectra::from_model(m);
            const zk::zack_ranks r = zk::ranks_from_eps(spec, std::stod(v), m.zack.rank_align);
            const std::vector<int> full(r.k.size(), m.hp.head_dim);
            sp.ranks_k = k == "keps" ? r.k : full;
            sp.ranks_v = k == "veps" ? r.v : full;
        }
        else if (k == "full_layer") {  // after rate=...: this layer back at full rank (diagnostics)
            const int il = std::stoi(v), KV = m.hp.n_head_kv;
            if (il < 0 || il >= m.hp.n_layer || sp.ranks_k.empty())
                ZK_THROW("full_layer=%d needs a rate and a layer", il);
            for (int g = 0; g < KV; g++) sp.ranks_k[il * KV + g] = sp.ranks_v[il * KV + g] = m.hp.head_dim;
        }
        else if (k == "srate" || k == "srate0" || k == "srate1" || k == "srate2") {  // sensitivity allocation
            zk::rank_request rq;
            rq.rate = std::stod(v);
            rq.alloc = zk::rank_alloc::SENSITIVITY;
            rq.alloc_set = true;
            rq.key_basis = k == "srate" ? -1 : k[5] - '0';
            const zk::zack_ranks r = zk::ranks_resolve(m, rq);
            sp.ranks_k = r.k;
            sp.ranks_v = r.v;
            sp.kbasis = r.kb;
        }
        else if (k == "head") {  // head=K/layer/g/rank (or V/...): one head's rank, the rest as set (or full)
            char kind = 0;
            int il = -1, g = -1, r = -1;
            if (std::sscanf(v.c_str(), "%c/%d/%d/%d", &kind, &il, &g, &r) != 4 || (kind != 'K' && kind != 'V') ||
                il < 0 || il >= m.hp.n_layer || g < 0 || g >= m.hp.n_head_kv)
                ZK_THROW("config '%s': head=%s is not K|V/layer/head/rank", cfg.c_str(), v.c_str());
            const size_t nh = (size_t)m.hp.n_layer * m.hp.n_head_kv;
            if (sp.ranks_k.empty()) sp.ranks_k.assign(nh, m.hp.head_dim), sp.ranks_v.assign(nh, m.hp.head_dim);
            (kind == 'K' ? sp.ranks_k : sp.ranks_v)[(size_t)il * m.hp.n_head_kv + g] = r;
        }
        else if (k == "ranks") {  // ranks=FILE: lines "layer head r_k r_v [key basis]" (an allocation to try)
            std::ifstream rf(v);
            if (!rf) ZK_THROW("config '%s': cannot open %s", cfg.c_str(), v.c_str());
            const size_t nh = (size_t)m.hp.n_layer * m.hp.n_head_kv;
            sp.ranks_k.assign(nh, m.hp.head_dim), sp.ranks_v.assign(nh, m.hp.head_dim);
            sp.kbasis.assign(nh, 0);
            std::string line;
            while (std::getline(rf, line)) {
                int il, g, rk, rv, kb = 0;
                const int got = std::sscanf(line.c_str(), "%d %d %d %d %d", &il, &g, &rk, &rv, &kb);
                if (got < 4) continue;
                if (il < 0 || il >= m.hp.n_layer || g < 0 || g >= m.hp.n_head_kv)
                    ZK_THROW("%s: bad head %d %d", v.c_str(), il, g);
                sp.ranks_k[(size_t)il * m.hp.n_head_kv + g] = rk;
                sp.ranks_v[(size_t)il * m.hp.n_head_kv + g] = rv;
                sp.kbasis[(size_t)il * m.hp.n_head_kv + g] = kb;
            }
        }
        else if (k == "krank" || k == "vrank") {  // one side at one rank for every head, the other full
            const size_t nh = (size_t)m.hp.n_layer * m.hp.n_head_kv;
            if (sp.ranks_k.empty()) sp.ranks_k.assign(nh, m.hp.head_dim), sp.ranks_v.assign(nh, m.hp.head_dim);
            (k == "krank" ? sp.ranks_k : sp.ranks_v).assign(nh, std::stoi(v));
        }
        else ZK_THROW("config '%s': unknown key '%s'", cfg.c_str(), k.c_str());
    }
    return sp;
}

// Log-softmax of logits into out (double for a stable KL).
void log_softmax(const float* x, int n, std::vector<double>& out) {
    out.resize(n);
    double mx = -1e300;
    for (int i = 0; i < n; i++) mx = std::max(mx, (double)x[i]);
    double s = 0;
    for (int i = 0; i < n; i++) s += std::exp(x[i] - mx);
    const double ls = std::log(s) + mx;
    for (int i = 0; i < n; i++) out[i] = x[i] - ls;
}

// Logits after each of the D decode tokens [D x n_vocab].
std::vector<float> run(const zk::model& m, const zk::session_params& sp, const std::vector<int32_t>& ids, int64_t P,
                       int64_t D, double* bytes_per_token) {
    zk::session s(m, sp);
    *bytes_per_token = s.cache().bytes_per_token_exact();
    const int V = m.hp.n_vocab;
    std::vector<float> out((size_t)D * V);
    s.decode(ids.data(), P);
    for (int64_t i = 0; i < D; i++) {
        const float* lg = s.decode(&ids[P + i], 1);
        std::memcpy(out.data() + (size_t)i * V, lg, sizeof(float) * V);
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: tool_kv_kl MODEL TEXT_FILE [--prompt P] [--decode D] [--threads N] [--kv-type f16|f32] CONFIG...\n");
        return 2;
    }
    try {
        int64_t P = 256, D = 64;
        zk::session_params base;
        base.n_threads = 2;
        std::vector<std::string> configs;
        for (int i = 3; i < argc; i++) {
            if (!std::strcmp(argv[i], "--prompt") && i + 1 < argc) P = std::stoll(argv[++i]);
            else if (!std::strcmp(argv[i], "--decode") && i + 1 < argc) D = std::stoll(argv[++i]);
            else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) base.n_threads = std::stoi(argv[++i]);
            else if (!std::strcmp(argv[i], "--kv-type") && i + 1 < argc) base.kv.type = zk::dtype_from_name(argv[++i]);
            else configs.push_back(argv[i]);
        }
        std::ifstream in(argv[2]);
        if (!in) ZK_THROW("%s: cannot open", argv[2]);
        std::stringstream text;
        text << in.rdbuf();
        auto m = zk::model_load(argv[1]);
        std::vector<int32_t> ids = m->voc->encode(text.str(), true, false);
        if ((int64_t)ids.size() < P + D)
            ZK_THROW("%s: %zu tokens, need %lld (prompt + decode)", argv[2], ids.size(), (long long)(P + D));
        base.n_ctx = P + D;
        const int V = m->hp.n_vocab;
        double base_bytes = 0;
        const std::vector<float> ref = run(*m, base, ids, P, D, &base_bytes);
        std::printf("config=baseline bytes_per_token=%.1f kl=0 top1=1\n", base_bytes);
        std::vector<double> lp, lq;
        for (const std::string& cfg : configs) {
            const zk::session_params sp = parse_config(cfg, base, *m);
            double bytes = 0;
            const std::vector<float> got = run(*m, sp, ids, P, D, &bytes);
            double kl = 0;
            int64_t agree = 0;
            for (int64_t i = 0; i < D; i++) {
                const float* a = ref.data() + (size_t)i * V;
                const float* b = got.data() + (size_t)i * V;
                log_softmax(a, V, lp);
                log_softmax(b, V, lq);
                double k = 0;
                for (int v = 0; v < V; v++) k += std::exp(lp[v]) * (lp[v] - lq[v]);
                kl += k;
                agree += (std::max_element(a, a + V) - a) == (std::max_element(b, b + V) - b);
            }
            std::printf("config=%s bytes_per_token=%.1f kl=%.6f top1=%.4f\n", cfg.c_str(), bytes, kl / D,
                        (double)agree / D);
            std::fflush(stdout);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tool_kv_kl: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
