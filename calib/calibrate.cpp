#include "calib/calibrate.h"

#include <algorithm>
#include <cmath>

#include "calib/blas_threads.h"
#include "calib/eigen.h"
#include "calib/keybasis.h"
#include "calib/progress.h"
#include "calib/ranks.h"
#include "engine/session.h"
#include "ggml-like/error.h"

namespace zk {

int64_t calib_collect(const model& m, const std::vector<std::vector<int32_t>>& docs, const calib_params& p,
                      gram_accumulator& acc) {
    return calib_feed(m, docs, p, acc, "statistics");
}

int64_t calib_feed(const model& m, const std::vector<std::vector<int32_t>>& docs, const calib_params& p,
                   calib_observer& acc, const char* label) {
    if (p.n_tokens <= 0)
        ZK_THROW_PARAM("calib.n_tokens", "calib.n_tokens must be positive, got %lld", (long long)p.n_tokens);
    if (p.n_ctx < 2) ZK_THROW_PARAM("calib.n_ctx", "calib.n_ctx must be at least 2, got %lld", (long long)p.n_ctx);
    const vocab& voc = *m.voc;
    const bool bos = voc.add_bos() && voc.bos() >= 0;
    int64_t available = 0;
    for (const auto& d : docs) available += (int64_t)d.size();
    if (available == 0) ZK_THROW("the calibration corpus has no tokens");

    session_params sp;
    sp.n_ctx = p.n_ctx;
    sp.n_threads = p.n_threads;
    sp.n_batch = std::min<int64_t>(256, p.n_ctx);
    session s(m, sp);
    // The session's workers are idle while the observer runs; detach both on any exit.
    struct attach {
        session& s;
        calib_observer& acc;
        attach(session& s_, calib_observer& a) : s(s_), acc(a) {
            acc.set_pool(&s.pool());
            s.set_observer(&acc);
        }
        ~attach() {
            s.set_observer(nullptr);
            acc.set_pool(nullptr);
        }
    } guard(s, acc);
    const blas_single_thread blas_guard;  // the observers call BLAS from the pool's workers

    // Budget estimate for the progress line: windows add a BOS each.
    const int64_t body = p.n_ctx - (bos ? 1 : 0);
    const int64_t est = std::min(p.n_tokens, available + (bos ? (available + body - 1) / body + (int64_t)docs.size() : 0));
    calib_progress prog(label, est, p.progress);
    int64_t fed = 0;
    std::vector<int32_t> win;
    for (const auto& doc : docs) {
        for (size_t at = 0; at < doc.size() && fed < p.n_tokens;) {
            win.clear();
            if (bos) win.push_back(voc.bos());
            const int64_t room = std::min<int64_t>(p.n_ctx, p.n_tokens - fed) - (int64_t)win.size();
            if (room <= 0) break;
            const size_t take = std::min<size_t>((size_t)room, doc.size() - at);
            win.insert(win.end(), doc.begin() + at, doc.begin() + at + take);
            at += take;
            s.reset();
            s.decode(win.data(), (int64_t)win.size());
            fed += (int64_t)win.size();
            prog.update(fed);
        }
        if (fed >= p.n_tokens) break;
    }
    prog.finish(fed);
    return fed;
}

zack_calibration calib_decompose(const model& m, const gram_accumulator& acc) {
    const model_hparams& hp = m.hp;
    const int L = hp.n_layer, KV = hp.n_head_kv, D = hp.head_dim;
    zack_calibration c;
    c.n_layer = L;
    c.n_kv = KV;
    c.d = D;
    c.n_tokens = acc.n_tokens();
    c.rqk.resize((size_t)L * KV * D * D);
    c.rv.resize(c.rqk.size());
    c.sigma_k.resize((size_t)L * KV * D);
    c.sigma_v.resize(c.sigma_k.size());
    c.kqa.resize(c.rqk.size());
    c.kqb.resize(c.rqk.size());
    c.kpair.resize(c.rqk.size());
    c.k_mean.resize(c.sigma_k.size());
    c.k_score.resize(c.sigma_k.size());
    c.kwa.resize(c.rqk.size());
    c.kwb.resize(c.rqk.size());
    c.kw_score.resize(c.sigma_k.size());
    std::vector<double> vals, vecs, A, B, sv;
    std::vector<double> kscore;
    for (int il = 0; il < L; il++) {
        const std::vector<double> wo = gram_wo(m.layers[il].wo, hp.n_head, KV, D);  // [KV x D x D]
        for (int g = 0; g < KV; g++) {
            const size_t h = (size_t)il * KV + g;
            const std::vector<double> km = acc.k_mean(il, g);
            std::copy(km.begin(), km.end(), c.k_mean.begin() + h * D);
            for (int kv = 0; kv < 2; kv++) {
                std::vector<double> C = kv ? acc.v(il, g) : acc.qk(il, g);
                if (kv)
                    for (size_t x = 0; x < C.size(); x++) C[x] += wo[(size_t)g * D * D + x];
                eigen_sym_desc(D, C.data(), vals, vecs);
                std::copy(vecs.begin(), vecs.end(), (kv ? c.rv : c.rqk).begin() + h * D * D);
                double* sig = (kv ? c.sigma_v : c.sigma_k).data() + h * D;
                for (int j = 0; j < D; j++) sig[j] = std::sqrt(std::max(vals[j], 0.0));
            }
            const std::vector<double> cq = acc.q(il, g), ck = acc.k(il, g), cw = acc.k_within(il, g);
            keybasis_quant_scores(D, c.rqk.data() + h * D * D, cq.data(), cw.data(), kscore);
            std::copy(kscore.begin(), kscore.end(), c.k_score.begin() + h * D);
            keybasis_quant_pair(D, cq.data(), cw.data(), A, B, kscore);
            std::copy(A.begin(), A.end(), c.kwa.begin() + h * D * D);
            std::copy(B.begin(), B.end(), c.kwb.begin() + h * D * D);
            std::copy(kscore.begin(), kscore.end(), c.kw_score.begin() + h * D);
            keybasis_score(D, cq.data(), ck.data(), A, B, sv);
            std::copy(A.begin(), A.end(), c.kqa.begin() + h * D * D);
            std::copy(B.begin(), B.end(), c.kqb.begin() + h * D * D);
            keybasis_pairs(D, hp.rope, cq.data(), ck.data(), A, sv);
            std::copy(A.begin(), A.end(), c.kpair.begin() + h * D * D);
        }
    }
    return c;
}

int calib_dims_for_mass(const double* sigma, int d, double mass) {
    double total = 0;
    for (int j = 0; j < d; j++) total += sigma[j];
    double acc = 0;
    for (int r = 0; r < d; r++) {
        if (acc >= mass * total) return r;
        acc += sigma[r];
    }
    return d;
}

void calib_print_summary(FILE* out, const zack_calibration& c, int rank_align) {
    const int L = c.n_layer, KV = c.n_kv, D = c.d;
    std::fprintf(out, "Dims holding 90%% / 99%% of the singular-value mass, per KV head (head dim %d):\n", D);
    std::fprintf(out, "%5s  %-24s %-24s\n", "layer", "K (90% | 99%)", "V (90% | 99%)");
    for (int il = 0; il < L; il++) {
        std::string cols[2];
        for (int kv = 0; kv < 2; kv++) {
            std::string a, b;
            for (int g = 0; g < KV; g++) {
                const double* s = (kv ? c.sigma_v : c.sigma_k).data() + ((size_t)il * KV + g) * D;
                a += (g ? " " : "") + std::to_string(calib_dims_for_mass(s, D, 0.90));
                b += (g ? " " : "") + std::to_string(calib_dims_for_mass(s, D, 0.99));
            }
            cols[kv] = a + " | " + b;
        }
        std::fprintf(out, "%5d  %-24s %-24s\n", il, cols[0].c_str(), cols[1].c_str());
    }
    const zack_spectra spec = zack_calibration_spectra(c);
    std::fprintf(out, "\nRanks by removal rate eps (aligned to %d):\n", rank_align);
    std::fprintf(out, "%8s %8s %10s %10s %8s %8s\n", "eps", "rate", "mean r_k", "mean r_v", "min r", "max r");
    for (double eps : {0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3}) {
        const zack_ranks r = ranks_from_eps(spec, eps, rank_align);
        double mk = 0, mv = 0;
        int lo = D, hi = 0;
        for (size_t i = 0; i < r.k.size(); i++) {
            mk += r.k[i];
            mv += r.v[i];
            lo = std::min({lo, r.k[i], r.v[i]});
            hi = std::max({hi, r.k[i], r.v[i]});
        }
        std::fprintf(out, "%8.3f %8.3f %10.1f %10.1f %8d %8d\n", eps, r.rate, mk / r.k.size(), mv / r.v.size(), lo, hi);
    }
}

}  // namespace zk
