#include "calib/plan.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>

#include "calib/alloc.h"
#include "calib/codebook.h"
#include "calib/sensitivity.h"
#include "engine/kv_cache.h"
#include "engine/kv_quant.h"
#include "engine/model.h"
#include "engine/session.h"
#include "ggml-like/error.h"

namespace zk {

void plan_validate_target(double target) {
    if (!(target > 0.0 && target <= 1.0))
        ZK_THROW("KV target %g is outside (0, 1] (a fraction of the f16 full-rank cache)", target);
}

nlohmann::json kv_plan::to_json() const {
    nlohmann::json j;
    j["zack_plan"] = mixed() ? 2 : 1;
    j["model"] = {{"source_sha256", source_sha256}, {"n_layer", n_layer}, {"n_kv", n_kv}, {"head_dim", head_dim}};
    j["target"] = target;
    j["kv_fraction"] = kv_fraction;
    j["bits"] = bits;
    if (mixed()) j["bits_k"] = bits_k, j["bits_v"] = bits_v;
    if (!tails_k.empty()) j["tails_k"] = tails_k;
    if (!zeros_k.empty()) j["zeros_k"] = zeros_k;
    if (!mids_k.empty()) j["mids_k"] = mids_k;
    j["rate"] = rate;
    j["ranks_k"] = ranks_k;
    j["ranks_v"] = ranks_v;
    j["key_basis"] = kbasis;
    j["evict"] = evict;
    j["budget"] = budget;
    j["loss"] = loss;
    j["source"] = source;
    j["group"] = group;
    if (tier > 0) j["tier"] = tier;
    return j;
}

kv_plan kv_plan::from_json(const nlohmann::json& j, const std::string& where) {
    kv_plan p;
    try {
        if (!j.is_object() || !j.contains("zack_plan"))
            ZK_THROW("%s: not a zack plan (no zack_plan key)", where.c_str());
        const int version = j.at("zack_plan").get<int>();
        if (version != 1 && version != 2)
            ZK_THROW("%s: plan version %d is not supported (this zack reads 1 and 2)", where.c_str(), version);
        const nlohmann::json& mj = j.at("model");
        p.source_sha256 = mj.value("source_sha256", "");
        p.n_layer = mj.at("n_layer").get<int>();
        p.n_kv = mj.at("n_kv").get<int>();
        p.head_dim = mj.at("head_dim").get<int>();
        p.target = j.value("target", 0.0);
        p.kv_fraction = j.value("kv_fraction", 1.0);
        p.bits = j.at("bits").get<int>();
        p.bits_k = j.value("bits_k", std::vector<int>{});
        p.bits_v = j.value("bits_v", std::vector<int>{});
        p.tails_k = j.value("tails_k", std::vector<int>{});
        p.zeros_k = j.value("zeros_k", std::vector<int>{});
        p.mids_k = j.value("mids_k", std::vector<int>{});
        p.rate = j.value("rate", 0.0);
        p.ranks_k = j.at("ranks_k").get<std::vector<int>>();
        p.ranks_v = j.at("ranks_v").get<std::vector<int>>();
        p.kbasis = j.value("key_basis", std::vector<int>{});
        p.evict = j.value("evict", std::string("none"));
        p.budget = j.value("budget", (int64_t)0);
        p.loss = j.value("loss", -1.0);
        p.source = j.value("source", std::string());
        p.group = j.value("group", 32);
        p.tier = j.value("tier", 0);
    } catch (const nlohmann::json::exception& e) {
        ZK_THROW("%s: malformed plan (%s)", where.c_str(), e.what());
    }
    auto valid_bits = [](int b) { return b == 16 || b == 8 || b == 4 || b == 2; };
    if (!valid_bits(p.bits)) ZK_THROW("%s: plan bits %d is not 16, 8, 4 or 2", where.c_str(), p.bits);
    if (p.n_layer <= 0 || p.n_kv <= 0 || p.head_dim <= 0)
        ZK_THROW("%s: plan model shapes must be positive", where.c_str());
    if (p.group < 1 || p.group > 256)
        ZK_THROW("%s: plan group %d is outside 1..256 tokens", where.c_str(), p.group);
    if (p.tier < 0 || p.tier % p.group != 0)
        ZK_THROW("%s: plan tier %d is not a multiple of its group (%d tokens)", where.c_str(), p.tier, p.group);
    if (p.tier > 0 && p.evict != "none")
        ZK_THROW("%s: plan has a tier and eviction (%s); a tier does not combine with eviction", where.c_str(),
                 p.evict.c_str());
    const size_t nh = (size_t)p.n_layer * p.n_kv;
    if (p.ranks_k.size() != p.ranks_v.size() || (!p.ranks_k.empty() && p.ranks_k.size() != nh))
        ZK_THROW("%s: plan ranks must have %zu entries each (layers x KV heads) or none", where.c_str(), nh);
    if (p.bits_k.size() != p.bits_v.size() || (!p.bits_k.empty() && p.bits_k.size() != nh))
        ZK_THROW("%s: plan bits_k and bits_v must have %zu entries each (layers x KV heads) or none", where.c_str(),
                 nh);
    for (size_t i = 0; i < p.bits_k.size(); i++) {
        if (!valid_bits(p.bits_k[i]))
            ZK_THROW("%s: plan key precision of head %zu is %d, not 16, 8, 4 or 2 bits", where.c_str(), i, p.bits_k[i]);
        if (!valid_bits(p.bits_v[i]) && !kv_bits_vq(p.bits_v[i]))
            ZK_THROW("%s: plan value precision of head %zu is %d, not 16, 8, 4, 2, or 1 or 0 (vector codes)",
                     where.c_str(), i, p.bits_v[i]);
    }
    if (!p.tails_k.empty() && p.tails_k.size() != nh)
        ZK_THROW("%s: plan tails_k must have %zu entries (layers x KV heads) or none", where.c_str(), nh);
    for (size_t i = 0; i < p.tails_k.size(); i++) {
        if (p.tails_k[i] < 0 || p.tails_k[i] > std::min(p.head_dim, KV_KEY_TAIL_MAX))
            ZK_THROW("%s: plan 1-bit key tail of head %zu is %d, outside 0..%d", where.c_str(), i, p.tails_k[i],
                     std::min(p.head_dim, KV_KEY_TAIL_MAX));
        if (p.tails_k[i] > 0 && p.head_bits_k(i) != 4 && p.head_bits_k(i) != 2)
            ZK_THROW("%s: plan head %zu has a 1-bit key tail but %d-bit keys (tails are for 4- and 2-bit keys)",
                     where.c_str(), i, p.head_bits_k(i));
    }
    if (!p.zeros_k.empty() && p.zeros_k.size() != nh)
        ZK_THROW("%s: plan zeros_k must have %zu entries (layers x KV heads) or none", where.c_str(), nh);
    for (size_t i = 0; i < p.zeros_k.size(); i++) {
        const int t = p.tails_k.empty() ? 0 : p.tails_k[i];
        if (p.zeros_k[i] < 0 || p.zeros_k[i] + t > p.head_dim)
            ZK_THROW("%s: plan head %zu has %d 0-bit key channels and a %d-channel 1-bit tail, more than its %d",
                     where.c_str(), i, p.zeros_k[i], t, p.head_dim);
        if (p.zeros_k[i] > 0 && p.head_bits_k(i) != 4 && p.head_bits_k(i) != 2)
            ZK_THROW("%s: plan head %zu has 0-bit key channels but %d-bit keys (they are for 4- and 2-bit keys)",
                     where.c_str(), i, p.head_bits_k(i));
    }
    if (!p.mids_k.empty() && p.mids_k.size() != nh)
        ZK_THROW("%s: plan mids_k must have %zu entries (layers x KV heads) or none", where.c_str(), nh);
    for (size_t i = 0; i < p.mids_k.size(); i++) {
        const int t = (p.tails_k.empty() ? 0 : p.tails_k[i]) + (p.zeros_k.empty() ? 0 : p.zeros_k[i]);
        if (p.mids_k[i] < 0 || p.mids_k[i] + t > p.head_dim)
            ZK_THROW("%s: plan head %zu has %d 2-bit key channels and %d 1- and 0-bit ones, more than its %d",
                     where.c_str(), i, p.mids_k[i], t, p.head_dim);
        if (p.mids_k[i] > 0 && p.head_bits_k(i) != 4)
            ZK_THROW("%s: plan head %zu has 2-bit key channels but %d-bit keys (they are for 4-bit keys)",
                     where.c_str(), i, p.head_bits_k(i));
    }
    if (!p.kbasis.empty() && p.kbasis.size() != nh)
        ZK_THROW("%s: plan key_basis must have %zu entries or none", where.c_str(), nh);
    for (size_t i = 0; i < p.ranks_k.size(); i++)
        if (p.ranks_k[i] < 1 || p.ranks_k[i] > p.head_dim || p.ranks_v[i] < 1 || p.ranks_v[i] > p.head_dim)
            ZK_THROW("%s: plan rank of head %zu is outside 1..%d", where.c_str(), i, p.head_dim);
    for (int b : p.kbasis)
        if (b < 0 || b > 2) ZK_THROW("%s: plan key basis %d is not 0, 1 or 2", where.c_str(), b);
    if (p.budget < 0) ZK_THROW("%s: plan budget %lld is negative", where.c_str(), (long long)p.budget);
    if ((p.evict == "none") != (p.budget == 0))
        ZK_THROW("%s: plan eviction '%s' and budget %lld do not go together", where.c_str(), p.evict.c_str(),
                 (long long)p.budget);
    return p;
}

std::string kv_plan::describe() const {
    char buf[512];
    std::string prec = std::to_string(bits) + "-bit";
    if (mixed()) {  // how many heads' keys / values at each precision
        prec = "per head";
        for (int side = 0; side < 2; side++) {
            prec += side ? "; V" : " K";
            for (int b : {16, 8, 4, 2, 1, 0}) {
                const std::vector<int>& v = side ? bits_v : bits_k;
                const long n = std::count(v.begin(), v.end(), b);
                const std::string name = kv_bits_vq(b) ? "vector-coded " + std::to_string(k_vq_dim[b]) + "x" +
                                                             std::to_string(k_vq_size[b])
                                                       : std::to_string(b) + "-bit";
                if (n) prec += " " + name + " x" + std::to_string(n);
            }
        }
    }
    const long nt = std::count_if(tails_k.begin(), tails_k.end(), [](int t) { return t > 0; });
    if (nt > 0) prec += ", 1-bit key tails in " + std::to_string(nt) + " heads";
    const long nz = std::count_if(zeros_k.begin(), zeros_k.end(), [](int t) { return t > 0; });
    if (nz > 0) prec += ", 0-bit key channels in " + std::to_string(nz) + " heads";
    const long nm = std::count_if(mids_k.begin(), mids_k.end(), [](int t) { return t > 0; });
    if (nm > 0) prec += ", 2-bit channels in the 4-bit keys of " + std::to_string(nm) + " heads";
    if (group != 32) prec += ", KIVI groups of " + std::to_string(group) + " tokens";
    if (tier > 0) prec += ", a 4-bit tier of " + std::to_string(tier) + " tokens";
    std::snprintf(buf, sizeof buf, "%s, ZACK rate %.3f, %.1f%% of the f16 cache%s%s", prec.c_str(), rate,
                  100.0 * kv_fraction, evict == "none" ? "" : (", " + evict + " " + std::to_string(budget) + " tokens").c_str(),
                  loss >= 0 ? (", predicted loss " + std::to_string(loss)).c_str() : "");
    return buf;
}

plan_inputs plan_inputs::from_model(const model& m, int group) {
    plan_inputs in;
    in.curves = rank_curves::from_model(m);
    const zack_info& z = m.zack;
    in.qbits.assign(z.sens_qbits.begin(), z.sens_qbits.end());
    in.q.assign(z.sens_q.begin(), z.sens_q.end());
    in.source_sha256 = m.file->get_str("zack.source.sha256", "");
    in.rank_weight = z.sens_rank_weight;
    if (!z.layers.empty() && z.layers[0].widths_score()) {  // the proxy, as stored
        const int D = m.hp.head_dim, KV = m.hp.n_head_kv;
        std::vector<float> sc;
        for (const zack_layer& zl : z.layers)
            sc.insert(sc.end(), zl.widths_score(), zl.widths_score() + (size_t)KV * D);
        in.kscore = std::move(sc);
    }
    in.set_group(group > 0 ? group : z.sens_group);
    if (!z.sens_layer_gain.empty())
        in.weigh_layers(std::vector<double>(z.sens_layer_gain.begin(), z.sens_layer_gain.end()));
    return in;
}

void plan_inputs::set_group(int g) {
    if (g < 1 || g > 256) ZK_THROW("plans: KIVI group %d is outside 1..256 tokens", g);
    group = g;
    const int d = curves.d;
    if (!kscore.empty() && d > 0) wide = keybasis_wide_rows(d, kscore.size() / (size_t)d, kscore.data(), g);
}

void plan_inputs::weigh_layers(const std::vector<double>& gain) {
    const rank_curves& c = curves;
    if ((int)gain.size() != c.n_layer)
        ZK_THROW("layer gains: %zu for a model of %d layers", gain.size(), c.n_layer);
    for (double g : gain)
        if (!(g > 0 && std::isfinite(g))) ZK_THROW("layer gains: %g is not a positive factor", g);
    const size_t nh = (size_t)c.n_layer * c.n_kv, ng = c.grid.size();
    for (size_t i = 0; i < q.size(); i++) q[i] *= gain[(i % nh) / c.n_kv];  // [n_p x n_p x n_layer x n_kv]
    for (auto* v : {&curves.loss_k[0], &curves.loss_k[1], &curves.loss_k[2], &curves.loss_v})
        for (size_t i = 0; i < v->size(); i++) (*v)[i] *= gain[i / ng / c.n_kv];  // [n_layer x n_kv x n_grid]
    layer_gain = gain;
}

bool plan_inputs::per_head() const {
    const size_t np = qbits.size(), nh = (size_t)curves.n_layer * curves.n_kv;
    if (np < 2 || q.size() != np * np * nh) return false;
    // every pair of the layouts measured; a 1-bit tail (keys only) where it was
    for (size_t i = 0; i < np; i++)
        for (size_t j = 0; j < np; j++) {
            if (plan_keys_only(qbits[i]) || plan_keys_only(qbits[j])) continue;
            for (size_t h = 0; h < nh; h++)
                if (!std::isfinite(q[(i * np + j) * nh + h])) return false;
        }
    return true;
}

double plan_inputs::qloss_or_nan(int bits_k, int bits_v, size_t h) const {
    if (bits_k == 16 && bits_v == 16) return 0.0;
    const size_t np = qbits.size(), nh = (size_t)curves.n_layer * curves.n_kv;
    const auto ik = std::find(qbits.begin(), qbits.end(), bits_k), iv = std::find(qbits.begin(), qbits.end(), bits_v);
    if (ik == qbits.end() || iv == qbits.end() || q.size() != np * np * nh) return std::nan("");
    return q[((size_t)(ik - qbits.begin()) * np + (size_t)(iv - qbits.begin())) * nh + h];
}

double plan_inputs::head_qloss(int bits_k, int bits_v, size_t h) const {
    const double l = qloss(bits_k, bits_v, h);
    if (bits_k != k_plan_zero_code || !measured(k_plan_tail_code, bits_v, h)) return l;
    const double lt = qloss(k_plan_tail_code, bits_v, h);
    return lt + k_plan_zero_weight * std::max(0.0, l - lt);
}

bool plan_inputs::measured(int bits_k, int bits_v, size_t h) const {
    return std::isfinite(qloss_or_nan(bits_k, bits_v, h));
}

double plan_inputs::qloss(int bits_k, int bits_v, size_t h) const {
    const double x = qloss_or_nan(bits_k, bits_v, h);
    if (std::isfinite(x)) return x;
    ZK_THROW("no measured loss of %d-bit keys with %d-bit values (a .zack from an older zack calibrate)", bits_k,
             bits_v);
}

double plan_f16_bytes(int n_layer, int n_kv, int head_dim) { return (double)n_layer * n_kv * 4.0 * head_dim; }

double plan_side_bytes(int bits, bool key, int r, int group, int tail, int zero, int mid) {
    zero = std::min(zero, r), tail = std::min(tail, r - zero);  // as the cache clamps them
    mid = bits == 4 ? std::min(mid, r - zero - tail) : 0;
    switch (bits) {
        case 1:  // vector-coded values as calibrate trains them (calib/codebook.h): codes and an f16 scale
        case 0:
            if (key) break;
            return (double)kv_vq_row_bytes(r / k_vq_dim[bits], (int)std::lround(std::log2((double)k_vq_size[bits]))) +
                   2.0;
        case 16: return 2.0 * r;
        case 8: return r + 2.0 * kv_n_blocks(r, KV_Q8_BLOCK);
        case 4:
        case 2:
            return (key ? kv_key_row_bytes(bits, r, tail, zero, mid) : kv_qb_row_bytes(bits, r)) +
                   (key ? 2.0 * (kv_key_grid_words(r, zero) + KV_GRID_STEPS) / group  // grid code per (group, channel)
                        : 2.0 * kv_n_blocks(r, KV_Q4_VBLOCK) + 2.0 * KV_GRID_STEPS / group);  // per (token, block)
                                                                                     // + 2 f16 steps a group
    }
    ZK_THROW("no %d-bit KV %s layout (16, 8, 4 or 2%s)", bits, key ? "key" : "value",
             key ? "" : ", or 1 or 0: vector codes");
}

double plan_head_bytes(int bits_k, int bits_v, int group) {
    const bool kivi = bits_k <= 4 || bits_v <= 4;
    return kivi ? (double)sizeof(int32_t) / group : 0.0;  // group starts
}

double plan_cache_bytes() { return sizeof(int32_t); }  // the positions, one ramp for every head

int64_t plan_head_cost(int bits_k, int bits_v, int rank_k, int rank_v, int tail, int zero, int mid, int group) {
    return (int64_t)std::ceil(plan_side_bytes(bits_k, true, rank_k, group, tail, zero, mid) +
                              plan_side_bytes(bits_v, false, rank_v, group) +
                              plan_head_bytes(bits_k, bits_v, group) - 1e-9);
}

double plan_bytes(const kv_plan& p) {
    const size_t nh = (size_t)p.n_layer * p.n_kv;
    double s = plan_cache_bytes();
    for (size_t h = 0; h < nh; h++) {
        const int bk = p.head_bits_k(h), bv = p.head_bits_v(h);
        s += plan_side_bytes(bk, true, p.ranks_k.empty() ? p.head_dim : p.ranks_k[h], p.group,
                             p.tails_k.empty() || bk > 4 ? 0 : p.tails_k[h], p.zeros_k.empty() || bk > 4 ? 0 : p.zeros_k[h],
                             p.mids_k.empty() || bk != 4 ? 0 : p.mids_k[h]) +
             plan_side_bytes(bv, false, p.ranks_v.empty() ? p.head_dim : p.ranks_v[h], p.group) +
             plan_head_bytes(bk, bv, p.group);
    }
    return s;
}

double plan_bytes(int n_layer, int n_kv, int head_dim, int bits, const std::vector<int>& ranks_k,
                  const std::vector<int>& ranks_v, int group) {
    const std::vector<int> full((size_t)n_layer * n_kv, head_dim);
    kv_cache_params kp;
    kp.bits = bits;
    kp.group = group;
    // a small cache: the per-token bytes do not depend on the capacity
    kv_cache c(n_layer, n_kv, 256, kp, ranks_k.empty() ? full : ranks_k, ranks_v.empty() ? full : ranks_v);
    return c.bytes_per_token_exact();
}

double plan_predicted_loss(const plan_inputs& in, int bits, const std::vector<int>& ranks_k,
                           const std::vector<int>& ranks_v, const std::vector<int>& kbasis) {
    kv_plan p;
    p.bits = bits, p.ranks_k = ranks_k, p.ranks_v = ranks_v, p.kbasis = kbasis;
    return plan_predicted_loss(in, p);
}

double plan_predicted_loss(const plan_inputs& in, const kv_plan& p) {
    double loss = p.ranks_k.empty() ? 0.0 : in.rank_weight * ranks_loss(in.curves, p.ranks_k, p.ranks_v, p.kbasis);
    const size_t nh = (size_t)in.curves.n_layer * in.curves.n_kv;
    for (size_t h = 0; h < nh; h++) {
        // a tailed head (or one with 0-bit channels): the measured loss of that layout (measured at one
        // length each: an approximation for others)
        const int bv = p.head_bits_v(h);
        const int tl = p.tails_k.empty() ? 0 : p.tails_k[h], zr = p.zeros_k.empty() ? 0 : p.zeros_k[h];
        const int md = p.mids_k.empty() ? 0 : p.mids_k[h];
        int code = p.head_bits_k(h);
        if (code == 4 && (tl > 0 || zr > 0 || md > 0)) {  // 4-bit keys with narrower channels: the widths they match
            for (int w = 0; w < k_plan_n_wide; w++)
                if (!in.wide[w].empty() && in.wide[w][h].n2 == md && in.wide[w][h].n1 == tl &&
                    in.wide[w][h].n0 == zr && in.measured(k_plan_wide_code[w], bv, h))
                    code = k_plan_wide_code[w];
        } else if (zr > 0 && in.measured(k_plan_zero_code, bv, h)) {
            code = k_plan_zero_code;
        } else if (tl > 0 && in.measured(k_plan_tail_code, bv, h)) {
            code = k_plan_tail_code;
        }
        loss += in.head_qloss(code, bv, h);
    }
    return loss;
}

kv_plan plan_with_layer_exact(const kv_plan& p, int layer) {
    if (layer < 0 || layer >= p.n_layer) ZK_THROW("plan: layer %d is outside 0..%d", layer, p.n_layer - 1);
    kv_plan q = p;
    const size_t nh = (size_t)p.n_layer * p.n_kv;
    if (q.bits_k.empty()) q.bits_k.assign(nh, p.bits), q.bits_v.assign(nh, p.bits);
    for (size_t h = (size_t)layer * p.n_kv; h < (size_t)(layer + 1) * p.n_kv; h++) {
        q.bits_k[h] = q.bits_v[h] = 16;
        for (std::vector<int>* t : {&q.tails_k, &q.zeros_k, &q.mids_k})
            if (!t->empty()) (*t)[h] = 0;
        for (std::vector<int>* r : {&q.ranks_k, &q.ranks_v})
            if (!r->empty()) (*r)[h] = p.head_dim;
    }
    q.bits = 16;
    q.kv_fraction = plan_bytes(q) / plan_f16_bytes(q.n_layer, q.n_kv, q.head_dim);
    q.loss = -1;
    return q;
}

static_assert(k_plan_tail_code == k_sens_tail_code, "one code for 1-bit key tails");
static_assert(k_plan_zero_code == k_sens_zero_code, "one code for 0-bit key channels");
static_assert(k_plan_n_wide == k_sens_n_wide && k_plan_wide_code[0] == k_sens_wide_code[0] &&
                  k_plan_wide_code[1] == k_sens_wide_code[1] && k_plan_wide_code[2] == k_sens_wide_code[2] &&
                  k_plan_wide_code[3] == k_sens_wide_code[3],
              "one code for each per-head widths row");

namespace {

// The per-head plan (see plan.h): every head is an item whose options are its
// (key precision, value precision, key basis, key rank, value rank), costing
// plan_head_cost (whole bytes, so the knapsack's budget stays small: 28,672
// units for Qwen2.5-1.5B's whole f16 cache). A head has up to 4 x 4 x 3 x 16 x
// 16 options; the knapsack keeps the few hundred that are not dominated.
kv_plan plan_per_head(const plan_inputs& in, double target) {
    const rank_curves& c = in.curves;
    const size_t nh = (size_t)c.n_layer * c.n_kv, nr = c.grid.size();
    std::vector<int> bases;
    for (int b = 0; b < 3; b++)
        if (!c.loss_k[b].empty()) bases.push_back(b);
    struct choice { int bits_k, bits_v, basis, rank_k, rank_v, tail, zero, mid; };
    std::vector<std::vector<choice>> what(nh);
    std::vector<std::vector<knap_option>> items(nh);
    for (size_t h = 0; h < nh; h++) {
        // each side's cheapest (basis, rank) loss is searched inside the knapsack; here the
        // cross product of the sides, per precision pair
        for (int bk : in.qbits)
            for (int bv : in.qbits) {
                if (!in.measured(bk, bv, h)) continue;  // a tail as values, or with 16/8-bit values
                if (in.kivi_keys && bk > 4) continue;
                const double lq = in.head_qloss(bk, bv, h);
                // a 1-bit tail: 2-bit keys, their last sens_tail(d) channels 1-bit, at full
                // key rank (its loss was measured there; cutting ranks competes with it instead);
                // with 0-bit channels, the last sens_zero(d) of those are 0-bit
                // per-head widths: 4-bit keys, the head's 2-bit, 1-bit and 0-bit channels
                const bool tail = plan_keys_only(bk), zc = bk == k_plan_zero_code;
                const int wi = plan_wide_index(bk);
                if (wi >= 0 && in.wide[wi].empty()) continue;
                const int kbits = wi >= 0 ? 4 : tail ? 2 : bk;
                const int zr = wi >= 0 ? in.wide[wi][h].n0 : zc ? sens_zero(c.d) : 0;
                const int tl = wi >= 0 ? in.wide[wi][h].n1 : tail ? sens_tail(c.d) - zr : 0;
                const int md = wi >= 0 ? in.wide[wi][h].n2 : 0;
                // quantized keys only in the basis their loss was measured in (pca): in the
                // score basis (not orthogonal) the same codes lose far more (plan 0.2 on
                // Qwen2.5-Coder-1.5B with score-basis 2-bit keys: KLD 0.085 at 4K against
                // 0.038 for 2-bit everywhere)
                for (int b : bases) {
                    if (bk < 16 && b != 0) continue;
                    for (size_t rk = tail ? nr - 1 : 0; rk < nr; rk++)
                        for (size_t rv = 0; rv < nr; rv++) {
                            // value codes cover whole groups of channels
                            if (kv_bits_vq(bv) && c.grid[rv] % k_vq_dim[bv]) continue;
                            const double l = in.rank_weight * (c.loss_k[b][h * nr + rk] + c.loss_v[h * nr + rv]) + lq;
                            what[h].push_back({kbits, bv, b, c.grid[rk], c.grid[rv], tl, zr, md});
                            items[h].push_back(
                                {plan_head_cost(kbits, bv, c.grid[rk], c.grid[rv], tl, zr, md, in.group), l});
                        }
                }
            }
    }
    const double f16 = plan_f16_bytes(c.n_layer, c.n_kv, c.d);
    const int64_t budget = (int64_t)std::floor(target * f16 - plan_cache_bytes() + 1e-9);
    int64_t least = 0;
    for (size_t h = 0; h < nh; h++) {
        int64_t m = INT64_MAX;
        for (const knap_option& o : items[h]) m = std::min(m, o.cost);
        least += m;
    }
    if (least > budget) {
        const int lo = *std::min_element(in.qbits.begin(), in.qbits.end());
        ZK_THROW("no plan fits %.1f%% of the f16 cache: the least is %.1f%% (%s at the highest rate); "
                 "eviction (--kv-evict, --kv-budget) goes further",
                 100.0 * target, 100.0 * ((double)least + plan_cache_bytes()) / f16,
                 lo == k_plan_zero_code   ? "2-bit keys with 1-bit tails and 0-bit channels"
                 : lo == k_plan_tail_code ? "2-bit keys with 1-bit tails"
                                          : (std::to_string(lo) + "-bit").c_str());
    }
    const std::vector<int> pick = alloc_knapsack(items, budget);
    kv_plan p;
    p.n_layer = c.n_layer, p.n_kv = c.n_kv, p.head_dim = c.d, p.group = in.group;
    p.bits_k.resize(nh), p.bits_v.resize(nh), p.ranks_k.resize(nh), p.ranks_v.resize(nh), p.kbasis.resize(nh);
    for (size_t h = 0; h < nh; h++) {
        const choice& ch = what[h][pick[h]];
        p.bits_k[h] = ch.bits_k, p.bits_v[h] = ch.bits_v, p.kbasis[h] = ch.basis;
        p.ranks_k[h] = ch.rank_k, p.ranks_v[h] = ch.rank_v;
        if (ch.tail > 0) p.tails_k.resize(nh, 0), p.tails_k[h] = ch.tail;
        if (ch.zero > 0) p.zeros_k.resize(nh, 0), p.zeros_k[h] = ch.zero;
        if (ch.mid > 0) p.mids_k.resize(nh, 0), p.mids_k[h] = ch.mid;
    }
    p.rate = ranks_rate(p.ranks_k, p.ranks_v, c.d);
    p.bits = std::max(*std::max_element(p.bits_k.begin(), p.bits_k.end()),
                      *std::max_element(p.bits_v.begin(), p.bits_v.end()));
    const bool uniform = std::all_of(p.bits_k.begin(), p.bits_k.end(), [&](int b) { return b == p.bits; }) &&
                         std::all_of(p.bits_v.begin(), p.bits_v.end(), [&](int b) { return b == p.bits; });
    if (uniform) p.bits_k.clear(), p.bits_v.clear();  // one precision: a version-1 plan
    // Ranks stay explicit at full rank too: the losses were measured with the
    // keys in the pca basis, which is what a session with ranks runs.
    p.kv_fraction = plan_bytes(p) / f16;
    p.loss = plan_predicted_loss(in, p);
    return p;
}

}  // namespace

kv_plan plan_for_target(const plan_inputs& in, double target) {
    plan_validate_target(target);
    const rank_curves& c = in.curves;
    c.validate();
    if (in.per_head()) {
        kv_plan p = plan_per_head(in, target);
        p.target = target;
        p.source = in.kivi_keys ? "predicted from the .zack's sensitivity curves (per head, KIVI keys for --kv-select)"
                                : "predicted from the .zack's sensitivity curves (per head)";
        p.source_sha256 = in.source_sha256;
        return p;
    }
    const double f16 = plan_f16_bytes(c.n_layer, c.n_kv, c.d);
    const double max_rate = 1.0 - double(c.grid[0]) / c.d;
    auto bytes = [&](int bits, const std::vector<int>& k, const std::vector<int>& v) {
        return plan_bytes(c.n_layer, c.n_kv, c.d, bits, k, v, in.group);
    };
    kv_plan best;
    bool found = false;
    double least_fraction = 1e30;
    for (int bits : {16, 8, 4}) {
        if (bits != 16 && std::find(in.qbits.begin(), in.qbits.end(), bits) == in.qbits.end()) continue;
        if (in.kivi_keys && bits > 4) continue;
        auto fraction_at = [&](double rate, zack_ranks* out) {
            const zack_ranks r = ranks_by_loss(c, rate, 7u);
            if (out) *out = r;
            return bytes(bits, r.k, r.v) / f16;
        };
        const double at_max = fraction_at(max_rate, nullptr);
        least_fraction = std::min(least_fraction, at_max);
        if (at_max > target) continue;  // this precision cannot reach the target
        // the least rate that fits (the fraction falls as the rate grows): bisection
        zack_ranks r;
        if (fraction_at(0.0, &r) > target) {
            double lo = 0.0, hi = max_rate;
            for (int it = 0; it < 30 && hi - lo > 1e-4; it++) {
                const double mid = 0.5 * (lo + hi);
                (fraction_at(mid, nullptr) <= target ? hi : lo) = mid;
            }
            fraction_at(hi, &r);
        }
        kv_plan p;
        p.bits = bits;
        p.rate = r.rate;
        if (r.rate > 0) p.ranks_k = r.k, p.ranks_v = r.v, p.kbasis = r.kb;
        p.kv_fraction = bytes(bits, p.ranks_k, p.ranks_v) / f16;
        p.loss = plan_predicted_loss(in, bits, p.ranks_k, p.ranks_v, p.kbasis);
        if (!found || p.loss < best.loss) best = p, found = true;
    }
    if (!found)
        ZK_THROW("no plan fits %.1f%% of the f16 cache: the least is %.1f%% (%s at the highest rate); "
                 "eviction (--kv-evict, --kv-budget) goes further",
                 100.0 * target, 100.0 * least_fraction, in.qbits.size() < 2 ? "16-bit" : "4-bit");
    best.target = target;
    best.source = "predicted from the .zack's sensitivity curves";
    best.source_sha256 = in.source_sha256;
    best.n_layer = c.n_layer, best.n_kv = c.n_kv, best.head_dim = c.d, best.group = in.group;
    return best;
}

kv_plan plan_for_target(const model& m, double target, double rank_weight, bool kivi_keys, int group) {
    plan_validate_target(target);
    plan_inputs in = plan_inputs::from_model(m, group);
    if (rank_weight > 0) in.rank_weight = rank_weight;
    in.kivi_keys = kivi_keys;
    return plan_for_target(in, target);
}

void plan_check_model(const kv_plan& p, const model& m, const std::string& where) {
    if (p.n_layer != m.hp.n_layer || p.n_kv != m.hp.n_head_kv || p.head_dim != m.hp.head_dim)
        ZK_THROW("%s: the plan is for %d layers x %d KV heads of %d, %s has %d x %d of %d", where.c_str(), p.n_layer,
                 p.n_kv, p.head_dim, m.file->path().c_str(), m.hp.n_layer, m.hp.n_head_kv, m.hp.head_dim);
    const std::string sha = m.file->get_str("zack.source.sha256", "");
    if (!p.source_sha256.empty() && !sha.empty() && p.source_sha256 != sha)
        ZK_THROW("%s: the plan was made for another model (source sha256 %.12s..., %s was made from %.12s...)",
                 where.c_str(), p.source_sha256.c_str(), m.file->path().c_str(), sha.c_str());
    if (!p.ranks_k.empty() && !m.zack.present)
        ZK_THROW("%s: the plan has ZACK ranks; %s is not a .zack model", where.c_str(), m.file->path().c_str());
    for (int b : p.kbasis)
        if (b > 0 && !m.zack.has_key_bases())
            ZK_THROW("%s: the plan uses score/pairs key bases, which %s does not have", where.c_str(),
                     m.file->path().c_str());
    for (int code = 0; code < KV_VQ_CODES; code++) {
        if (std::find(p.bits_v.begin(), p.bits_v.end(), code) == p.bits_v.end()) continue;
        const kv_vq_books& b = m.zack.vq[code];
        if (b.heads.empty())
            ZK_THROW("%s: the plan has vector-coded values at precision %d; %s has no such value codebooks "
                     "(calibrate it with this zack)", where.c_str(), code, m.file->path().c_str());
        // plans count those bytes at calibrate's book size
        if (b.c != k_vq_dim[code] || b.K != k_vq_size[code])
            ZK_THROW("%s: the plan counts vector-coded values at precision %d as %d channels x %d centroids; %s has "
                     "%d x %d", where.c_str(), code, k_vq_dim[code], k_vq_size[code], m.file->path().c_str(), b.c, b.K);
    }
}

std::vector<kv_plan> plan_list(const model& m) {
    std::vector<kv_plan> out;
    const gguf_value* v = m.file->find("zack.plans");
    if (!v) return out;
    if (v->type != gguf_type::ARRAY)
        ZK_THROW("%s: zack.plans must be an array of JSON strings", m.file->path().c_str());
    for (size_t i = 0; i < v->arr.size(); i++) {
        const std::string where = m.file->path() + ": zack.plans[" + std::to_string(i) + "]";
        if (v->arr[i].type != gguf_type::STRING) ZK_THROW("%s must be a JSON string", where.c_str());
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(v->arr[i].s);
        } catch (const nlohmann::json::exception& e) {
            ZK_THROW("%s is not JSON (%s)", where.c_str(), e.what());
        }
        out.push_back(kv_plan::from_json(j, where));
    }
    return out;
}

namespace {

// A loaded plan's bytes as this zack's cache counts them (files written before
// the positions became one ramp per cache counted one per head).
kv_plan plan_recounted(kv_plan p) {
    p.kv_fraction = plan_bytes(p) / plan_f16_bytes(p.n_layer, p.n_kv, p.head_dim);
    return p;
}

}  // namespace

kv_plan plan_load(const model& m, const std::string& spec) {
    struct stat st;
    if (stat(spec.c_str(), &st) == 0) {
        if (!S_ISREG(st.st_mode)) ZK_THROW_PARAM("kv.plan", "kv.plan %s: not a regular file", spec.c_str());
        std::ifstream in(spec);
        if (!in) ZK_THROW_PARAM("kv.plan", "kv.plan %s: cannot open", spec.c_str());
        std::stringstream ss;
        ss << in.rdbuf();
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(ss.str());
        } catch (const nlohmann::json::exception& e) {
            ZK_THROW("%s: not JSON (%s)", spec.c_str(), e.what());
        }
        kv_plan p = kv_plan::from_json(j, spec);
        plan_check_model(p, m, spec);
        return plan_recounted(p);
    }
    // a recorded plan by its target
    char* end = nullptr;
    const double t = std::strtod(spec.c_str(), &end);
    if (end == spec.c_str() || *end)
        ZK_THROW_PARAM("kv.plan", "kv.plan %s: no such file, and not a target of a recorded plan", spec.c_str());
    const std::vector<kv_plan> plans = plan_list(m);
    std::string have;
    for (const kv_plan& p : plans) {
        if (std::fabs(p.target - t) < 1e-6) {
            plan_check_model(p, m, m.file->path() + ": zack.plans");
            return plan_recounted(p);
        }
        char buf[32];
        std::snprintf(buf, sizeof buf, "%s%g", have.empty() ? "" : ", ", p.target);
        have += buf;
    }
    ZK_THROW_PARAM("kv.plan", "kv.plan %s: %s recorded no plan for that target (%s; kv.target computes one)",
                   spec.c_str(),
             m.file->path().c_str(), have.empty() ? "it has none" : ("it has " + have).c_str());
}

void plan_apply(const kv_plan& p, const model& m, session_params& sp) {
    plan_check_model(p, m, "plan");
    sp.kv.bits = p.bits;
    sp.kv.group = p.group;
    sp.kv.bits_k = p.bits_k;
    sp.kv.bits_v = p.bits_v;
    if (!p.tails_k.empty()) sp.kv.tails_k = p.tails_k;
    if (!p.zeros_k.empty()) sp.kv.zeros_k = p.zeros_k;
    if (!p.mids_k.empty()) sp.kv.mids_k = p.mids_k;
    sp.ranks_k = p.ranks_k;
    sp.ranks_v = p.ranks_v;
    sp.kbasis = p.ranks_k.empty() ? std::vector<int>{} : p.kbasis;
    if (p.evict != "none") {
        sp.evict.policy = p.evict;
        sp.evict.budget = p.budget;
    }
    if (p.tier > 0) sp.kv.tier = p.tier;
}

}  // namespace zk
