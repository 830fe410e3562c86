#include "calib/keybasis.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "calib/eigen.h"
#include "engine/model.h"
#include "kernels/attention.h"
#include "ggml-like/error.h"

namespace zk {

const char* key_basis_name(key_basis b) {
    switch (b) {
        case key_basis::PCA: return "pca";
        case key_basis::SCORE: return "score";
        case key_basis::PAIRS: return "pairs";
    }
    return "?";
}

key_basis key_basis_from_name(const std::string& s) {
    for (int i = 0; i < k_key_basis_count; i++)
        if (s == key_basis_name((key_basis)i)) return (key_basis)i;
    ZK_THROW("unknown key basis '%s' (pca, score, pairs)", s.c_str());
}

namespace {

// C = U diag(lambda) U^T (C regularised by a tiny multiple of its mean
// eigenvalue, so a direction no vector ever takes stays invertible). Returns
// L^-T = U diag(lambda^-1/2) and L^T = diag(lambda^1/2) U^T, both [d x d].
void whitening(int d, const double* C, std::vector<double>& l_inv_t, std::vector<double>& l_t) {
    std::vector<double> c(C, C + (size_t)d * d);
    double tr = 0;
    for (int i = 0; i < d; i++) tr += c[(size_t)i * d + i];
    const double reg = std::max(1e-30, 1e-6 * tr / d);
    for (int i = 0; i < d; i++) c[(size_t)i * d + i] += reg;
    std::vector<double> lam, U;
    eigen_sym_desc(d, c.data(), lam, U);
    l_inv_t.assign((size_t)d * d, 0);
    l_t.assign((size_t)d * d, 0);
    for (int j = 0; j < d; j++) {
        const double s = std::sqrt(std::max(lam[j], reg));
        for (int i = 0; i < d; i++) {
            l_inv_t[(size_t)i * d + j] = U[(size_t)i * d + j] / s;
            l_t[(size_t)j * d + i] = U[(size_t)i * d + j] * s;
        }
    }
}

// C = A B, all [d x d] row-major.
void matmul(int d, const double* A, const double* B, double* C) {
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double s = 0;
            for (int k = 0; k < d; k++) s += A[(size_t)i * d + k] * B[(size_t)k * d + j];
            C[(size_t)i * d + j] = s;
        }
}

// p^T C p for column j of P ([d x d] row-major, column j = direction j): the
// energy of C along that direction, which both the scores and the pair's
// scaling read.
double keybasis_column_energy(int d, const double* P, const double* C, int j) {
    double e = 0;
    for (int a = 0; a < d; a++) {
        double t = 0;
        for (int b = 0; b < d; b++) t += C[(size_t)a * d + b] * P[(size_t)b * d + j];
        e += P[(size_t)a * d + j] * t;
    }
    return e;
}

}  // namespace

void keybasis_score(int d, const double* Cq, const double* Ck, std::vector<double>& A, std::vector<double>& B,
                    std::vector<double>& sv) {
    std::vector<double> lq_inv_t, lq_t, lk_inv_t, lk_t;
    whitening(d, Cq, lq_inv_t, lq_t);
    whitening(d, Ck, lk_inv_t, lk_t);
    // W = L_q^T L_k, with L_k = (L_k^T)^T
    std::vector<double> lk((size_t)d * d), W((size_t)d * d);
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) lk[(size_t)i * d + j] = lk_t[(size_t)j * d + i];
    matmul(d, lq_t.data(), lk.data(), W.data());
    std::vector<double> X, Y;
    svd_square_desc(d, W.data(), X, sv, Y);
    // Balanced: both sides get S^1/2 so q~ and k~ have comparable magnitudes.
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            const double s = std::sqrt(std::max(sv[j], 0.0));
            X[(size_t)i * d + j] *= s;
            Y[(size_t)i * d + j] *= s;
        }
    A.assign((size_t)d * d, 0);
    B.assign((size_t)d * d, 0);
    matmul(d, lq_inv_t.data(), X.data(), A.data());
    matmul(d, lk_inv_t.data(), Y.data(), B.data());
}

void keybasis_pairs(int d, const rope_params& rope, const double* Cq, const double* Ck, std::vector<double>& P,
                    std::vector<double>& energy) {
    // Channel groups: the rotated pairs, then each unrotated channel alone.
    std::vector<std::vector<int>> groups;
    const int nr = std::min(rope.n_dims, d), half = nr / 2;
    for (int f = 0; f < half; f++) {
        if (rope.style == rope_style::NEOX) groups.push_back({f, f + half});
        else groups.push_back({2 * f, 2 * f + 1});
    }
    for (int c = nr; c < d; c++) groups.push_back({c});
    // Expected score energy of a group under independent q and k: tr(C_q,f C_k,f).
    std::vector<double> e(groups.size(), 0.0);
    for (size_t f = 0; f < groups.size(); f++)
        for (int a : groups[f])
            for (int b : groups[f]) e[f] += Cq[(size_t)a * d + b] * Ck[(size_t)b * d + a];
    std::vector<size_t> order(groups.size());
    std::iota(order.begin(), order.end(), 0);
    // by energy per channel: a rank counts channels, and single unrotated channels compete with pairs
    for (size_t f = 0; f < groups.size(); f++) e[f] /= (double)groups[f].size();
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return e[x] > e[y]; });
    P.assign((size_t)d * d, 0);
    energy.assign(d, 0);
    int j = 0;
    for (size_t f : order)
        for (int c : groups[f]) {
            P[(size_t)c * d + j] = 1.0;
            energy[j] = e[f];
            j++;
        }
    ZK_ASSERT(j == d);
}

void keybasis_quant_scores(int d, const double* P, const double* Cq, const double* Cw, std::vector<double>& score) {
    score.assign((size_t)d, 0.0);
    for (int j = 0; j < d; j++) {
        const double eq = keybasis_column_energy(d, P, Cq, j), ew = keybasis_column_energy(d, P, Cw, j);
        score[j] = std::sqrt(std::max(eq, 0.0)) * std::max(ew, 0.0);
    }
}

void keybasis_quant_pair(int d, const double* Cq, const double* Cw, std::vector<double>& A, std::vector<double>& B,
                         std::vector<double>& score) {
    // C_q^1/2 = U diag(lambda^1/2) U^T
    std::vector<double> lam, U, cq_half((size_t)d * d, 0.0), sv;
    eigen_sym_desc(d, Cq, lam, U);
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double s = 0;
            for (int k = 0; k < d; k++) s += U[(size_t)i * d + k] * std::sqrt(std::max(lam[k], 0.0)) * U[(size_t)j * d + k];
            cq_half[(size_t)i * d + j] = s;
        }
    std::vector<double> a, b;
    keybasis_score(d, cq_half.data(), Cw, a, b, sv);
    // unit within-group RMS along every key direction
    std::vector<double> sc((size_t)d);
    for (int j = 0; j < d; j++) {
        const double w = keybasis_column_energy(d, b.data(), Cw, j), s = w > 0 ? std::sqrt(w) : 1.0;
        for (int i = 0; i < d; i++) b[(size_t)i * d + j] /= s, a[(size_t)i * d + j] *= s;
        sc[(size_t)j] = std::sqrt(std::max(keybasis_column_energy(d, a.data(), Cq, j), 0.0)) *
                        std::max(keybasis_column_energy(d, b.data(), Cw, j), 0.0);
    }
    std::vector<int> order((size_t)d);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return sc[(size_t)x] > sc[(size_t)y]; });
    A.assign((size_t)d * d, 0.0);
    B.assign((size_t)d * d, 0.0);
    score.assign((size_t)d, 0.0);
    for (int j = 0; j < d; j++) {
        const int o = order[(size_t)j];
        score[(size_t)j] = sc[(size_t)o];
        for (int i = 0; i < d; i++) A[(size_t)i * d + j] = a[(size_t)i * d + o], B[(size_t)i * d + j] = b[(size_t)i * d + o];
    }
}

key_widths keybasis_key_widths(int d, const float* score, double bits, int max_tail, bool two_bit, int group) {
    constexpr int n_w = 4;
    constexpr int width[n_w] = {0, 1, 2, 4};
    if (group != 32 && group != 64)
        ZK_THROW("per-head key widths: KIVI groups of %d tokens (their errors are measured for 32 and 64)", group);
    // a 0-bit channel costs its 8-bit min code a group, the others two 8-bit grid codes
    const double g = group;
    const double cost[n_w] = {8 / g, 1 + 16 / g, 2 + 16 / g, 4 + 16 / g};
    constexpr double f32[n_w] = {1.0, 0.30, 0.08, 0.005}, f64[n_w] = {1.0, 0.31, 0.09, 0.006};
    const double* f = group == 32 ? f32 : f64;
    std::vector<int> lev((size_t)d, 0);
    double spent = d * cost[0];
    int n1 = 0;
    for (;;) {
        int best = -1;
        double gain = 0;
        for (int c = 0; c < d; c++) {
            const int l = lev[(size_t)c];
            if (l + 1 >= n_w) continue;
            const double dc = cost[l + 1] - cost[l];
            if (spent + dc > bits + 1e-9) continue;
            if (width[l + 1] == 1 && n1 >= max_tail) continue;
            if (width[l + 1] == 2 && !two_bit) {  // 1 -> 4 bits in one step
                const double dc4 = cost[l + 2] - cost[l];
                if (spent + dc4 > bits + 1e-9) continue;
                const double g4 = std::max(0.0, (double)score[c]) * (f[l] - f[l + 2]) / dc4;
                if (best < 0 || g4 > gain) best = c, gain = g4;
                continue;
            }
            const double g = std::max(0.0, (double)score[c]) * (f[l] - f[l + 1]) / dc;
            if (best < 0 || g > gain) best = c, gain = g;
        }
        if (best < 0) break;
        int& lb = lev[(size_t)best];
        const int l = lb;
        lb += width[l + 1] == 2 && !two_bit ? 2 : 1;
        spent += cost[lb] - cost[l];
        n1 += (width[lb] == 1) - (width[l] == 1);
    }
    key_widths w;
    for (int c = 0; c < d; c++) {
        const int b = width[lev[(size_t)c]];
        (b == 4 ? w.n4 : b == 2 ? w.n2 : b == 1 ? w.n1 : w.n0)++;
    }
    return w;
}

key_wide_rows keybasis_wide_rows(int d, size_t n_heads, const float* score, int group) {
    key_wide_rows out;
    for (auto& w : out) w.resize(n_heads);
    std::vector<int32_t> o;
    std::vector<float> sorted((size_t)d);
    for (size_t h = 0; h < n_heads; h++) {
        zack_key_order(d, score + h * d, o);
        for (int j = 0; j < d; j++) sorted[(size_t)j] = score[h * d + (size_t)o[(size_t)j]];
        for (int w = 0; w < k_key_n_wide; w++)
            out[(size_t)w][h] = keybasis_key_widths(d, sorted.data(), k_key_wide_bits[w] * d,
                                                    std::min(d, KV_KEY_TAIL_MAX), k_key_wide_two_bit[w], group);
    }
    return out;
}

key_wide_rows keybasis_wide_rows(int d, const std::vector<double>& score, int group) {
    const std::vector<float> f(score.begin(), score.end());
    return keybasis_wide_rows(d, f.size() / (size_t)d, f.data(), group);
}

}  // namespace zk
