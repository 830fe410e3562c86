// The decode-attention test fixture (tests/simt/test_cuda_attention_decode.cpp
// and the mutant tests): items built as real CPU caches (appends, eviction by
// compact), their double-precision reference over read_slot, the CPU twin, and
// one GPU launch over a batch.
#pragma once
#include <algorithm>
#include <cmath>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/kv_vq.h"
#include "kernels/attention.h"
#include "kernels/cuda/attention_decode.h"
#include "kernels/cuda/cuda_device.h"
#include "tests/simt/cuda_test_util.h"

namespace zk {
namespace cuda_test {

using namespace zk::cuda;

// The layouts of a block's two sides by precision: 16 (rows of the item's
// type), 8, 4 or 2 bits; values also 1 and 0, vector codes (4 x 64, 8 x 256).
struct layout {
    int bits_k, bits_v;
    bool kivi() const { return bits_k == 4 || bits_k == 2 || bits_v == 4 || bits_v == 2; }
    std::string name() const { return "K" + std::to_string(bits_k) + "_V" + std::to_string(bits_v); }
};

inline void PrintTo(const layout& l, std::ostream* os) { *os << l.name(); }

// GEAR on the KIVI sides of a block: off, rank 2 + outliers, outliers alone (rank 0).
enum gear_mode : int { GEAR_OFF = 0, GEAR_RANK2 = 1, GEAR_SPARSE = 2 };

struct item_spec {
    int r_k, r_v;
    int len;       // tokens appended
    int n_group;   // query heads of the KV head
    int n_tok;     // query tokens
    int sinks;     // exact sinks (0: none)
    float keep;    // fraction kept by eviction (1: none)
    int group;     // KIVI group
    dtype type = dtype::F16;  // full-precision rows
    int gear = GEAR_OFF;      // on the KIVI sides, when the layout has one
    // a plan's key parts on KIVI keys (kernels/attention.h): 2-bit (4-bit keys),
    // 1-bit and 0-bit channels, each clamped to the rank as the cache does
    int mid = 0, tail = 0, zero = 0;
};

constexpr int k_head_dim = 128;

// Rows with the structure real caches have: per-channel offsets and scales,
// a shared low-rank part, a few outliers.
inline std::vector<float> make_rows(int n, int d, std::mt19937& g) {
    std::normal_distribution<float> N(0, 1);
    std::vector<float> off(d), sc(d), w(d), x((size_t)n * d);
    for (int c = 0; c < d; c++) off[c] = 0.5f * N(g), sc[c] = 2.0f / (1.0f + 0.05f * c), w[c] = N(g);
    for (int t = 0; t < n; t++) {
        const float u = N(g);
        for (int c = 0; c < d; c++) x[(size_t)t * d + c] = off[c] + sc[c] * (0.7f * N(g) + 0.5f * u * w[c]);
    }
    for (int i = 0; i < n * d / 200; i++) x[g() % (n * d)] += 6.0f * N(g);
    return x;
}

// Random decoding books of vector-coded values for one 128-channel head
// (bits_v 1: 4 channels x 64 centroids; 0: 8 x 256, calibrate's two shapes):
// centroids ~ N(0, 1) times gains in [0.9, 1.3].
inline const kv_vq_books& test_vq_books(int code) {
    struct holder {
        std::vector<float> enc, gain, dec;
        kv_vq_books b;
        holder(int c, int K, uint32_t seed) {
            std::mt19937 g(seed);
            std::normal_distribution<float> N(0, 1);
            std::uniform_real_distribution<float> U(0.9f, 1.3f);
            enc.resize((size_t)k_head_dim * K), gain.resize(k_head_dim), dec.resize(enc.size());
            for (float& x : enc) x = N(g);
            for (float& x : gain) x = U(g);
            kvq_vq_decoding_book(c, K, k_head_dim, enc.data(), gain.data(), dec.data());
            b.c = c, b.K = K, b.d = k_head_dim;
            b.heads.push_back(kv_vq_book{enc.data(), dec.data()});
        }
    };
    static const holder h1(4, 64, 41), h0(8, 256, 42);
    return code == 1 ? h1.b : h0.b;
}

// One item: its CPU cache, queries and the expected outputs.
struct test_item {
    item_spec spec;
    std::unique_ptr<kv_cache> cache;
    std::vector<float> q;        // [n_tok x G x head_dim]
    std::vector<int32_t> q_pos;  // [n_tok]
    int width = 0;               // output channels: max(r_v, sink_dim)
};

// A cache of one block in `lay`, filled as a session would: a prompt in two
// appends (then, with eviction, compaction: evicted gaps, KIVI groups
// shortened and neighbours merged) and the remaining tokens one by one.
inline test_item build_item(const item_spec& s, const layout& lay, uint32_t seed) {
    test_item it;
    it.spec = s;
    std::mt19937 g(seed);
    kv_cache_params p;
    p.type = s.type;
    p.bits_k = {lay.bits_k};
    p.bits_v = {lay.bits_v};
    p.gear = lay.kivi() && s.gear != GEAR_OFF;
    p.gear_rank = s.gear == GEAR_RANK2 ? 2 : 0;
    p.group = s.group;
    p.key_mid = lay.bits_k == 4 ? s.mid : 0;
    p.key_tail = s.tail;
    p.key_zero = s.zero;
    if (lay.bits_v == 1 || lay.bits_v == 0) p.vq[lay.bits_v] = &test_vq_books(lay.bits_v);
    p.evicting = s.keep < 1.0f;
    p.sinks = s.sinks;
    p.sink_dim = s.sinks > 0 ? k_head_dim : 0;
    it.cache = std::make_unique<kv_cache>(1, 1, std::max(s.len, 1), p, std::vector<int>{s.r_k}, std::vector<int>{s.r_v});
    const std::vector<float> K = make_rows(s.len, k_head_dim, g), V = make_rows(s.len, k_head_dim, g);
    std::vector<int32_t> pos(s.len);
    for (int t = 0; t < s.len; t++) pos[t] = t;
    auto append = [&](int t0, int n) {
        if (n > 0)
            it.cache->append(0, 0, n, K.data() + (size_t)t0 * k_head_dim, k_head_dim, V.data() + (size_t)t0 * k_head_dim,
                             k_head_dim, pos.data() + t0);
    };
    const int prompt = s.keep < 1.0f ? s.len * 4 / 5 : s.len, a = prompt / 2;
    append(0, a);
    append(a, prompt - a);
    if (s.keep < 1.0f) {
        const attn_kv_view v = it.cache->view(0, 0);
        std::vector<uint8_t> keep((size_t)v.n_slots);
        std::uniform_real_distribution<float> U(0, 1);
        for (int64_t i = 0; i < v.n_slots; i++) keep[i] = v.pos[i] < s.sinks || U(g) < s.keep;
        it.cache->compact(0, 0, keep.data());
        for (int t = prompt; t < s.len; t++) append(t, 1);
    }
    const int G = s.n_group;
    std::normal_distribution<float> N(0, 1);
    it.q.resize((size_t)s.n_tok * G * k_head_dim);
    for (auto& x : it.q) x = N(g);
    const int32_t last = s.len - 1;
    it.q_pos.resize(s.n_tok);
    // earlier tokens of a multi-token step see fewer slots (causal)
    for (int t = 0; t < s.n_tok; t++) it.q_pos[t] = last - 3 * (s.n_tok - 1 - t);
    it.width = std::max(s.r_v, s.sinks > 0 ? k_head_dim : 0);
    return it;
}

inline const float k_scale = 1.0f / std::sqrt((float)k_head_dim);

// Double-precision attention over the cache as read_slot dequantizes it (sink
// slots: their exact rows at full head dim). out [n_tok x G x width]; logits
// (optional) [n_tok x G x n_slots], -inf where a token cannot see the slot.
inline std::vector<float> reference(const test_item& it, std::vector<float>* logits = nullptr) {
    const item_spec& s = it.spec;
    const attn_kv_view kv = it.cache->view(0, 0);
    const int64_t ns = kv.n_slots;
    const int G = s.n_group, W = it.width;
    // every slot's key and value as attention sees them, read once
    // (sink slots: their exact rows at full head dim)
    std::vector<float> K((size_t)ns * k_head_dim, 0.0f), V((size_t)ns * k_head_dim, 0.0f);
    for (int64_t sl = 0; sl < ns; sl++) {
        float* kr = &K[(size_t)sl * k_head_dim];
        float* vr = &V[(size_t)sl * k_head_dim];
        if (sl < kv.n_sink_slots) {
            std::copy_n(kv.sink_k + (size_t)kv.pos[sl] * kv.sink_dim, kv.sink_dim, kr);
            std::copy_n(kv.sink_v + (size_t)kv.pos[sl] * kv.sink_dim, kv.sink_dim, vr);
        } else {
            it.cache->read_slot(0, 0, sl, kr, vr);
        }
    }
    std::vector<float> out((size_t)s.n_tok * G * W, 0.0f);
    if (logits) logits->assign((size_t)s.n_tok * G * ns, -INFINITY);
    for (int t = 0; t < s.n_tok; t++)
        for (int j = 0; j < G; j++) {
            const float* q = &it.q[((size_t)t * G + j) * k_head_dim];
            std::vector<double> sc(ns, -INFINITY), acc(W, 0.0);
            double mx = -INFINITY;
            for (int64_t sl = 0; sl < ns; sl++) {
                if (kv.pos[sl] > it.q_pos[t]) continue;
                const int rk = sl < kv.n_sink_slots ? kv.sink_dim : s.r_k;
                double d = 0;
                for (int c = 0; c < rk; c++) d += (double)q[c] * K[(size_t)sl * k_head_dim + c];
                sc[sl] = d * k_scale;
                mx = std::max(mx, sc[sl]);
                if (logits) (*logits)[((size_t)t * G + j) * ns + sl] = (float)sc[sl];
            }
            if (mx == -INFINITY) continue;
            double l = 0;
            for (int64_t sl = 0; sl < ns; sl++) {
                if (sc[sl] == -INFINITY) continue;
                const double e = std::exp(sc[sl] - mx);
                l += e;
                const int rv = sl < kv.n_sink_slots ? kv.sink_dim : s.r_v;
                for (int c = 0; c < rv; c++) acc[c] += e * V[(size_t)sl * k_head_dim + c];
            }
            for (int c = 0; c < W; c++) out[((size_t)t * G + j) * W + c] = (float)(acc[c] / l);
        }
    return out;
}

// The CPU twin: one range over the block, the sink partial, the merge; ref:
// through the float reference path (kernel_attention_range_ref: the
// dequantized codes in float, the GPU's arithmetic), else the fast path the
// engine runs (with a KIVI side: the folded query rounded to int8 per group,
// the value weights to 7 bits). logits [n_tok x G x n_slots].
inline std::vector<float> cpu_twin(const test_item& it, std::vector<float>& logits, bool ref = true) {
    const item_spec& s = it.spec;
    const attn_kv_view kv = it.cache->view(0, 0);
    const int G = s.n_group, W = it.width, rows = s.n_tok * G;
    const int64_t n = kv.n_slots;
    const attn_q_view q{it.q.data(), (int64_t)G * k_head_dim, k_head_dim, G, s.n_tok, it.q_pos.data(), k_scale};
    logits.assign((size_t)rows * n, -INFINITY);
    std::vector<float> m(rows), l(rows), acc((size_t)rows * kv.r_v), sm(rows), sl(rows),
        sacc((size_t)rows * std::max(kv.sink_dim, 1));
    std::vector<float> scratch(
        kernel_attention_scratch(G, n, kv.r_k, kv.r_v, std::max(kv.k.gear.rank, kv.v.gear.rank)));
    attn_partial parts[2] = {attn_partial{m.data(), l.data(), acc.data(), logits.data(), n},
                             attn_partial{sm.data(), sl.data(), sacc.data(), logits.data(), n, kv.sink_dim}};
    (ref ? kernel_attention_range_ref : kernel_attention_range)(kv, 0, n, q, parts[0], scratch.data());
    int np = 1;
    if (kv.n_sink_slots > 0) kernel_attention_sinks(kv, q, parts[np++]);
    std::vector<float> out((size_t)rows * W, 0.0f);
    kernel_attention_merge(parts, np, s.n_tok, G, kv.r_v, out.data(), (int64_t)G * W, W);
    return out;
}

struct gpu_result {
    std::vector<std::vector<float>> out, logits;
    cuda_attn_plan plan;
};

// All items in one launch; with logits (the eviction scores) every item runs
// on the generic kernel, without them the fast kernel takes those it can
// (attention_decode_fast.h).
inline gpu_result run_gpu(const std::vector<test_item*>& items, int blocks, int64_t min_range,
                          bool want_logits = true, int fast_variant = 0) {
    device_pool pool;
    std::vector<cuda_attn_item> host;
    std::vector<dptr<float>> outs, lgs;
    for (const test_item* t : items) {
        const item_spec& s = t->spec;
        cuda_attn_item ci;
        ci.kv = upload_kv_block(pool, *t->cache, 0, 0);
        ci.q = pool.up(t->q, "q");
        ci.q_stride = (int64_t)s.n_group * k_head_dim;
        ci.q_head_stride = k_head_dim;
        ci.n_group = s.n_group;
        ci.n_tok = s.n_tok;
        ci.q_pos = pool.up(t->q_pos, "q_pos");
        ci.scale = k_scale;
        outs.push_back(pool.zeros<float>((size_t)s.n_tok * s.n_group * t->width, "out"));
        ci.out = outs.back();
        ci.out_stride = (int64_t)s.n_group * t->width;
        ci.out_head_stride = t->width;
        const int64_t ns = std::max<int64_t>(ci.kv.n_slots, 1);
        lgs.push_back(want_logits ? pool.zeros<float>((size_t)s.n_tok * s.n_group * ns, "logits") : dptr<float>());
        ci.logits = lgs.back();
        ci.logits_stride = want_logits ? ns : 0;
        host.push_back(ci);
    }
    gpu_result r;
    r.plan = cuda_attn_plan_make(host, blocks, min_range);
    r.plan.fast_variant = fast_variant;
    const dptr<const cuda_attn_item> ditems = pool.up(host, "items");
    cuda_attn_plan_device dp;
    dp.tasks = pool.up(r.plan.tasks, "tasks");
    dp.n_tasks = (int)r.plan.tasks.size();
    dp.parts = pool.up(r.plan.parts, "parts");
    dp.item_parts = pool.up(r.plan.item_parts, "item parts");
    const dptr<float> partials = pool.zeros<float>((size_t)std::max<int64_t>(r.plan.partial_floats, 1), "partials");
    cuda_attention_decode(ditems, (int)host.size(), r.plan, dp, partials, nullptr);
    cuda_stream_sync(nullptr);
    for (size_t i = 0; i < items.size(); i++) {
        const item_spec& s = items[i]->spec;
        r.out.push_back(pool.down(outs[i], (size_t)s.n_tok * s.n_group * items[i]->width));
        if (want_logits)
            r.logits.push_back(
                pool.down(lgs[i], (size_t)s.n_tok * s.n_group * std::max<int64_t>(host[i].kv.n_slots, 1)));
    }
    return r;
}

// Every key x value layout pair (16, 8, 4, 2 bits per side).
inline std::vector<layout> all_layout_pairs() {
    std::vector<layout> v;
    for (int k : {16, 8, 4, 2})
        for (int b : {16, 8, 4, 2}) v.push_back({k, b});
    return v;
}

// The batch the layout tests run, one item per G = 1..7 query heads per KV
// head: ranks 4 .. 128, uneven and odd, one slot, ranges shorter than a chunk,
// multi-token steps, exact sinks, eviction (gaps, shortened and merged KIVI
// groups), f16 and f32 rows, GEAR rank 2 and outliers alone on KIVI sides.
inline std::vector<item_spec> decode_batch_specs() {
    return {
        // r_k r_v len  G  tok sinks keep  group type        gear
        {4, 4, 300, 1, 1, 0, 1.0f, 32, dtype::F16, GEAR_OFF},       // rank 4
        {64, 64, 1, 2, 1, 0, 1.0f, 32, dtype::F32, GEAR_OFF},       // one slot
        {12, 20, 37, 3, 2, 4, 1.0f, 32, dtype::F16, GEAR_RANK2},    // uneven, sinks, two tokens
        {128, 96, 300, 4, 1, 4, 0.35f, 32, dtype::F32, GEAR_RANK2}, // evicted (groups merged), sinks
        {36, 100, 150, 5, 1, 0, 0.8f, 8, dtype::F16, GEAR_SPARSE},  // evicted, small groups
        {100, 36, 260, 6, 3, 0, 1.0f, 32, dtype::F16, GEAR_RANK2},  // three tokens
        {13, 7, 200, 7, 1, 4, 0.6f, 16, dtype::F16, GEAR_SPARSE},   // seven heads, odd ranks
    };
}

// A batch the fast kernel takes whole (no logits asked): ranks multiples of 8
// up to 128, at most 8 query rows, no GEAR, f16 rows; with KIVI sides, ranges
// cut at the residual window; eviction (irregular KIVI groups), exact sinks,
// multi-token steps, a single slot.
inline std::vector<item_spec> fast_batch_specs() {
    return {
        // r_k r_v len  G  tok sinks keep  group
        {128, 128, 300, 6, 1, 4, 1.0f, 32},   // Qwen2.5-1.5B's shape, sinks, the window
        {64, 96, 37, 7, 1, 0, 1.0f, 32},      // seven heads, short
        {8, 16, 1000, 1, 2, 0, 0.5f, 32},     // low rank, two tokens, evicted
        {128, 64, 2000, 4, 2, 4, 0.7f, 16},   // eight rows, evicted, small groups, sinks
        {32, 32, 1, 3, 1, 0, 1.0f, 32},       // one slot
        {40, 120, 450, 2, 1, 4, 1.0f, 32},    // uneven multiples of 8
    };
}

}  // namespace cuda_test
}  // namespace zk
