// The bases a key head can be compressed in. Each gives a pair of [d x d]
// matrices A (for queries) and B (for keys), column j = direction j, with
// A B^T = I, so that at rank r the score q . k is approximated by
// (A[:, :r]^T q) . (B[:, :r]^T k) and is exact at r = d; the cache keeps the
// r-dim k~ = B[:, :r]^T k, the query is projected with A online.
//
//   pca    A = B = R_qk, the eigenvectors of C_q + C_k (post-RoPE, the paper's):
//          keeps the directions with the most q and k energy.
//   score  minimises the expected score error E (q^T (I - A_r B_r^T) k)^2 for
//          independent q and k: with C_q = L_q L_q^T, C_k = L_k L_k^T and
//          L_q^T L_k = X S Y^T (SVD), A = L_q^-T X S^1/2, B = L_k^-T Y S^1/2.
//          A direction with much key energy but none of the queries' (which
//          cannot change a score) is dropped first.
//   pairs  whole RoPE frequency pairs, in order of their expected score
//          energy per channel tr(C_q,f C_k,f) / |f|: a selection, which commutes with RoPE (it
//          could be folded into W_q / W_k; the engine gathers the channels).
#pragma once
#include <array>
#include <string>
#include <vector>

#include "kernels/rope.h"

namespace zk {

enum class key_basis : int { PCA = 0, SCORE = 1, PAIRS = 2 };
constexpr int k_key_basis_count = 3;
const char* key_basis_name(key_basis b);
key_basis key_basis_from_name(const std::string& s);  // throws on an unknown name

// Cq, Ck: [d x d] symmetric (row-major). A, B: [d x d]; sv: [d] the singular
// values of L_q^T L_k (the score energy of each direction), descending.
void keybasis_score(int d, const double* Cq, const double* Ck, std::vector<double>& A, std::vector<double>& B,
                    std::vector<double>& sv);
// The selection matrix P [d x d] (A = B = P; column j is a unit vector) and the
// energy of each kept direction [d]. Dims past rope.n_dims (not rotated) count
// as single channels.
void keybasis_pairs(int d, const rope_params& rope, const double* Cq, const double* Ck, std::vector<double>& P,
                    std::vector<double>& energy);

// The order in which a key head's pca directions take bits when its KIVI row
// codes channels at unequal widths (a 1-bit tail, 0-bit channels): by
// sqrt(E[(p^T q)^2]) x E_within[(p^T k)^2], the RMS query along direction p times the
// keys' variance along it within their groups (what a per-channel grid codes),
// descending. Its first channels keep the row's widest codes, its last the
// 0-bit ones. Why this and not the pca order (the energy of q and k): the
// same keys in numpy (bench/experiments/key_quantizers.py allocate,
// Qwen2.5-Coder-1.5B, bench/RESULTS.md "key bits per channel") code 2-3% better
// at a fixed 2/1-bit split, and it is the order in which a water-filling of
// per-channel widths on this proxy hands out bits (bits never fall along it),
// which at 4/2/1/0 bits loses 26% less attention output than the 2/1-bit tail
// at the same bytes. The square root: E[q^2] itself, the score error's own
// weight, measured worse (0.0569 against 0.0492 at 28 bytes a row).
// The proxy is kept per direction (a .zack's blk.N.zack.kscore), not only the
// order: with one f(b) for every channel it also decides how many channels of
// a head take each width for a byte budget.
// P: [d x d] row-major, column j = direction j; Cq: the queries' Gram, Cw: the
// keys' scatter within groups (calib/gram.h); score [d]: the proxy of direction j.
void keybasis_quant_scores(int d, const double* P, const double* Cq, const double* Cw, std::vector<double>& score);
// The order itself: engine/model.h zack_key_order.

// The pair a key head's rows at unequal widths (a 1-bit tail, 2-bit or 0-bit
// channels) are coded in, where the .zack has one (blk.N.zack.kwa/kwb/kwscore;
// older files code them in the pca directions in the order above). It is the
// score basis of C_q^1/2 and C_w: A, B from the SVD of L^T L_w (C_q^1/2 = L L^T,
// C_w = L_w L_w^T, keybasis_score), so that both the keys' within-group
// scatter (what a per-channel grid over a group codes) and the queries' RMS
// (the proxy's weight) are diagonal in it: the directions a grid codes
// independently are the ones the score error sees independently. Each column
// is scaled so that the keys' within-group RMS along it is 1 (A's column by the
// inverse: A B^T = I stays; a grid's codes are scale-free, the 8-bit codes of
// a group's grids are not), then the columns are sorted by the proxy
// sqrt(a^T C_q a) x b^T C_w b, descending; score [d] is that proxy in the new
// order. Why: on Qwen2.5-Coder-1.5B's keys (bench/experiments/key_basis_quant.py)
// it loses 13% less attention output than the pca directions at 23 and 28
// bytes a row (10% at 34), and plan 0.1 with its keys in it 5-8% less KL on
// held-out text (bench/RESULTS.md, 2026-12-07 "key bases for quantized keys");
// C_q in place of C_q^1/2 loses 5% more at 28 bytes, C_k in place of C_w 2%
// more again.
// Cq, Cw: [d x d]; A, B: [d x d] row-major, column j = direction j.
void keybasis_quant_pair(int d, const double* Cq, const double* Cw, std::vector<double>& A, std::vector<double>& B,
                         std::vector<double>& score);

// How many of a head's directions (in that order) take 4-bit codes, 2-bit
// codes, a 1-bit tail and 0 bits, for a row of at most `bits` bits a token
// (grids included: with KIVI groups of 32 tokens a 4-bit channel costs 4.5
// bits, a 2-bit one 2.5, a 1-bit one 1.5, a 0-bit one 0.25; with groups of 64,
// 4.25, 2.25, 1.25 and 0.125): water-filling the proxy, each step the channel
// widening that removes most of score x f(width) per bit, f(0) = 1 and, for
// groups of 32, f(1) = 0.30, f(2) = 0.08, f(4) = 0.005 (the pooled errors of
// those widths relative to 0 bits on Qwen2.5-Coder-1.5B's keys: 0.27-0.32,
// 0.069-0.088 and 0.0042-0.0054 in every head measured), for groups of 64
// 0.31, 0.09, 0.006 (0.28-0.34, 0.078-0.10, 0.0052-0.0069 relative to their own
// 0 bits; bench/RESULTS.md "KIVI groups of 64 in plans"). The
// gains per bit of the steps fall (0.56, 0.22, 0.04 x score), so the greedy
// fill is the best split of the bits on the proxy. The proxy is one number a
// direction times a shared f, so no direction gets fewer bits than one after
// it: the counts say it all. At most max_tail 1-bit channels
// (KV_KEY_TAIL_MAX). score [d], descending. group: the cache's KIVI group,
// 32 or 64 tokens (others throw: their f is not measured).
struct key_widths {
    int n4 = 0, n2 = 0, n1 = 0, n0 = 0;
};
// two_bit false: without the 2-bit width (n2 = 0; the rows of .zack files
// from before the 2-bit key channels).
key_widths keybasis_key_widths(int d, const float* score, double bits, int max_tail, bool two_bit = true,
                                int group = 32);
// The rows planned (calib/sensitivity.h k_sens_wide_code): 1.75 bits a channel
// (the bytes of 2-bit keys with a 3/4 1-bit tail) and 2.5 (of 2-bit keys),
// without the 2-bit width (rows 0 and 1: what older files measured) and with
// it (rows 2 and 3: what zack calibrate measures now).
constexpr int k_key_n_wide = 4;
constexpr double k_key_wide_bits[k_key_n_wide] = {1.75, 2.5, 1.75, 2.5};
constexpr bool k_key_wide_two_bit[k_key_n_wide] = {false, false, true, true};
// keybasis_key_widths of every head for each row of k_key_wide_bits: [w][head].
// score [n_heads x d] per pca direction, as a .zack stores it (f32), in any
// order; the double form (a calibration in memory) rounds it to f32 first, so
// that both give the counts a session's file gives. group: as for keybasis_key_widths.
using key_wide_rows = std::array<std::vector<key_widths>, k_key_n_wide>;
key_wide_rows keybasis_wide_rows(int d, size_t n_heads, const float* score, int group = 32);
key_wide_rows keybasis_wide_rows(int d, const std::vector<double>& score, int group = 32);

}  // namespace zk
