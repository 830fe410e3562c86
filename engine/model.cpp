#include "engine/model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>

#include "engine/arch.h"
#include "ggml-like/error.h"
#include "ggml-like/quant_pack.h"
#include "kernels/attention.h"

namespace zk {

namespace {

// One line for a tensor whose type zack cannot use where the model needs it.
[[noreturn]] void refuse_type(const gguf_file& f, const gguf_tensor& t) {
    ZK_THROW("%s: tensor '%s' has type %s, which zack cannot compute with (supported: %s)",
             f.path().c_str(), t.name.c_str(), dtype_name(t.type), dtype_weight_names().c_str());
}

const gguf_tensor& need_tensor(const gguf_file& f, const std::string& name,
                               std::vector<int64_t> shape) {
    const gguf_tensor* t = f.find_tensor(name);
    if (!t) ZK_THROW("%s: missing tensor '%s'", f.path().c_str(), name.c_str());
    if (t->shape != shape) {
        auto fmt = [](const std::vector<int64_t>& s) {
            std::string o = "[";
            for (size_t i = 0; i < s.size(); i++) o += (i ? ", " : "") + std::to_string(s[i]);
            return o + "]";
        };
        ZK_THROW("%s: tensor '%s' has shape %s, expected %s", f.path().c_str(), name.c_str(),
                 fmt(t->shape).c_str(), fmt(shape).c_str());
    }
    return *t;
}

weight_view need_matrix(const gguf_file& f, const std::string& name, int64_t n_cols, int64_t n_rows) {
    const gguf_tensor& t = need_tensor(f, name, {n_cols, n_rows});
    if (!dtype_is_weight(t.type)) refuse_type(f, t);
    return weight_view{t.type, n_rows, n_cols, t.data};
}

const float* need_vector(const gguf_file& f, const std::string& name, int64_t n) {
    const gguf_tensor& t = need_tensor(f, name, {n});
    if (t.type != dtype::F32)
        ZK_THROW("%s: tensor '%s' has type %s, expected F32", f.path().c_str(), name.c_str(),
                 dtype_name(t.type));
    return (const float*)t.data;
}

const float* opt_vector(const gguf_file& f, const std::string& name, int64_t n) {
    return f.find_tensor(name) ? need_vector(f, name, n) : nullptr;
}

int need_positive(const gguf_file& f, const std::string& key) {
    const int64_t v = f.get_int(key);
    if (v <= 0 || v > (1 << 24))
        ZK_THROW("%s: key %s = %lld is out of range", f.path().c_str(), key.c_str(), (long long)v);
    return (int)v;
}

// An optional integer key, range-checked before it is narrowed to int.
int opt_int(const gguf_file& f, const std::string& key, int64_t dflt, int64_t lo, int64_t hi) {
    const int64_t v = f.get_int(key, dflt);
    if (v < lo || v > hi)
        ZK_THROW("%s: key %s = %lld is out of range (expected %lld..%lld)", f.path().c_str(), key.c_str(),
                 (long long)v, (long long)lo, (long long)hi);
    return (int)v;
}

std::vector<int32_t> int_array(const gguf_file& f, const std::string& key, size_t n) {
    const gguf_value* v = f.find(key);
    if (!v || v->type != gguf_type::ARRAY)
        ZK_THROW("%s: missing array key %s", f.path().c_str(), key.c_str());
    if (v->arr.size() != n)
        ZK_THROW("%s: %s has %zu entries, expected %zu", f.path().c_str(), key.c_str(), v->arr.size(), n);
    std::vector<int32_t> out(n);
    for (size_t i = 0; i < n; i++) out[i] = (int32_t)v->arr[i].as_int(key.c_str());
    return out;
}

// nan_ok: NaN marks an entry that was not measured (zack.sens.q's pairs).
std::vector<float> float_array(const gguf_file& f, const std::string& key, size_t n, bool nan_ok = false) {
    const gguf_value* v = f.find(key);
    if (!v || v->type != gguf_type::ARRAY)
        ZK_THROW("%s: missing array key %s", f.path().c_str(), key.c_str());
    if (v->arr.size() != n)
        ZK_THROW("%s: %s has %zu entries, expected %zu", f.path().c_str(), key.c_str(), v->arr.size(), n);
    std::vector<float> out(n);
    for (size_t i = 0; i < n; i++) {
        out[i] = (float)v->arr[i].as_float(key.c_str());
        if (nan_ok && std::isnan(out[i])) continue;
        if (!std::isfinite(out[i]) || out[i] < 0)
            ZK_THROW("%s: %s[%zu] = %g is not a finite non-negative loss", f.path().c_str(), key.c_str(), i, out[i]);
    }
    return out;
}

// The optional zack.sens.* keys: the rank grid and the measured loss curves.
void model_load_sensitivity(model& m) {
    const gguf_file& f = *m.file;
    zack_info& z = m.zack;
    const model_hparams& hp = m.hp;
    if (!f.find("zack.sens.grid")) return;
    const gguf_value* g = f.find("zack.sens.grid");
    if (g->type != gguf_type::ARRAY || g->arr.empty() || g->arr.size() > 1024)
        ZK_THROW("%s: zack.sens.grid must be a non-empty array of ranks", f.path().c_str());
    z.sens_grid = int_array(f, "zack.sens.grid", g->arr.size());
    for (size_t i = 0; i < z.sens_grid.size(); i++)
        if (z.sens_grid[i] < 1 || z.sens_grid[i] > hp.head_dim || (i && z.sens_grid[i] <= z.sens_grid[i - 1]))
            ZK_THROW("%s: zack.sens.grid must be ascending ranks within 1..%d (head dim)", f.path().c_str(), hp.head_dim);
    if (z.sens_grid.back() != hp.head_dim)
        ZK_THROW("%s: zack.sens.grid must end at the head dim %d", f.path().c_str(), hp.head_dim);
    const size_t n = (size_t)hp.n_layer * hp.n_head_kv * z.sens_grid.size();
    const char* kb[3] = {"zack.sens.k.pca", "zack.sens.k.score", "zack.sens.k.pairs"};
    for (int b = 0; b < 3; b++)
        if (f.find(kb[b])) z.sens_k[b] = float_array(f, kb[b], n);
    if (z.sens_k[0].empty()) ZK_THROW("%s: zack.sens.grid without zack.sens.k.pca", f.path().c_str());
    if ((!z.sens_k[1].empty() || !z.sens_k[2].empty()) && !z.has_key_bases())
        ZK_THROW("%s: sensitivity curves for the score/pairs key bases but no blk.N.zack.kqa/kqb/kpair tensors",
                 f.path().c_str());
    z.sens_v = float_array(f, "zack.sens.v", n);
    const size_t nh = (size_t)hp.n_layer * hp.n_head_kv;
    if (const gguf_value* qb = f.find("zack.sens.qbits")) {
        if (qb->type != gguf_type::ARRAY || qb->arr.size() < 2 || qb->arr.size() > 8)
            ZK_THROW("%s: zack.sens.qbits must be an array of 2..8 precisions", f.path().c_str());
        z.sens_qbits = int_array(f, "zack.sens.qbits", qb->arr.size());
        // 1: 2-bit keys with a 1-bit tail, 0: that tail ending in 0-bit channels, 5, 6, 9, 10: per-head
        // widths (calib/sensitivity.h)
        for (size_t i = 0; i < z.sens_qbits.size(); i++) {
            const int32_t b = z.sens_qbits[i];
            if ((i == 0) != (b == 16) || (b != 16 && b != 8 && b != 4 && b != 2 && b != 1 && b != 0 && b != 5 && b != 6 && b != 9 && b != 10) ||
                std::count(z.sens_qbits.begin(), z.sens_qbits.end(), b) != 1)
                ZK_THROW("%s: zack.sens.qbits must be 16 and then some of 8, 4, 2, 1, 0, 5, 6, 9, 10 once each (got %d at %zu)",
                         f.path().c_str(), b, i);
        }
        z.sens_q = float_array(f, "zack.sens.q", z.sens_qbits.size() * z.sens_qbits.size() * nh, true);
    } else if (f.find("zack.sens.q8") || f.find("zack.sens.q4")) {  // one precision for both sides
        z.sens_qbits = {16, 8, 4};
        z.sens_q.assign(9 * nh, NAN);
        std::fill_n(z.sens_q.begin(), nh, 0.0f);
        const std::vector<float> q8 = float_array(f, "zack.sens.q8", nh), q4 = float_array(f, "zack.sens.q4", nh);
        std::copy(q8.begin(), q8.end(), z.sens_q.begin() + 4 * nh);  // [1][1]
        std::copy(q4.begin(), q4.end(), z.sens_q.begin() + 8 * nh);  // [2][2]
    }
    z.sens_metric = f.get_str("zack.sens.metric", "");
    z.sens_rank_weight = f.get_float("zack.sens.rank_weight", 1.0);
    const int64_t sg = f.get_int("zack.sens.group", 32);
    if (sg < 1 || sg > 256)
        ZK_THROW("%s: zack.sens.group %lld is outside 1..256 tokens", f.path().c_str(), (long long)sg);
    z.sens_group = (int)sg;
    if (!(z.sens_rank_weight > 0 && z.sens_rank_weight < 1e6))
        ZK_THROW("%s: zack.sens.rank_weight %g is not a positive weight", f.path().c_str(), z.sens_rank_weight);
    if (f.find("zack.sens.layer_gain")) {
        z.sens_layer_gain = float_array(f, "zack.sens.layer_gain", (size_t)m.hp.n_layer);
        for (size_t i = 0; i < z.sens_layer_gain.size(); i++)
            if (!(z.sens_layer_gain[i] > 0))
                ZK_THROW("%s: zack.sens.layer_gain[%zu] = %g is not a positive factor", f.path().c_str(), i,
                         z.sens_layer_gain[i]);
    }
}

// The value codebooks of a .zack (engine/kv_vq.h), when it has them: for each
// value code, all layers' or none.
void model_load_codebooks(model& m, int code) {
    const gguf_file& f = *m.file;
    const model_hparams& hp = m.hp;
    zack_info& z = m.zack;
    const std::string name = kv_vq_file_name(code), kd = "zack." + name + ".dim", ks = "zack." + name + ".size";
    if (!f.find(kd) && !f.find_tensor("blk.0.zack." + name)) return;
    const int64_t D = hp.head_dim, KV = hp.n_head_kv;
    if (!f.find(kd) || !f.find(ks))
        ZK_THROW("%s: value codebooks need both %s and %s", f.path().c_str(), kd.c_str(), ks.c_str());
    const int c = opt_int(f, kd.c_str(), 0, 1, 16), K = opt_int(f, ks.c_str(), 0, 2, KV_VQ_MAX_K);
    try {
        kvq_vq_check(c, K, (int)D);
    } catch (const zk::error& e) {
        ZK_THROW("%s: %s", f.path().c_str(), e.what());
    }
    kv_vq_books& books = z.vq[code];
    std::vector<float>& dec_all = z.vq_dec[code];
    std::vector<int8_t>& dec8_all = z.vq_dec8[code];
    std::vector<float>& dec8_scale_all = z.vq_dec8_scale[code];
    books.c = c, books.K = K, books.d = (int)D;
    const size_t per_head = (size_t)D * K;  // D / c groups x K x c
    dec_all.resize((size_t)hp.n_layer * KV * per_head);
    // int8 copies where this build sums 8 x 256 codes' values faster with them
    const bool int8 = kernel_attention_vq_int8_shape(c, K) && kernel_attention_vq_int8_faster();
    if (int8) {
        dec8_all.resize(dec_all.size());
        dec8_scale_all.resize((size_t)hp.n_layer * KV * (D / c));
    }
    for (int il = 0; il < hp.n_layer; il++) {
        const std::string p = "blk." + std::to_string(il) + ".zack.";
        const gguf_tensor& tb = need_tensor(f, p + name, {c, K, D / c, KV});
        const gguf_tensor& tg = need_tensor(f, p + name + "_gain", {D, KV});
        for (const gguf_tensor* t : {&tb, &tg})
            if (t->type != dtype::F32) ZK_THROW("%s: tensor %s must be F32", f.path().c_str(), t->name.c_str());
        const float* enc = (const float*)tb.data;
        const float* gain = (const float*)tg.data;
        for (size_t i = 0; i < per_head * KV; i++)
            if (!std::isfinite(enc[i]))
                ZK_THROW("%s: tensor %s%s holds a non-finite value at %zu", f.path().c_str(), p.c_str(), name.c_str(),
                         i);
        for (int64_t i = 0; i < D * KV; i++)
            if (!(gain[i] > 0 && gain[i] < 1e3f))
                ZK_THROW("%s: tensor %s%s_gain holds %g at %lld; a gain is positive and below 1000", f.path().c_str(),
                         p.c_str(), name.c_str(), gain[i], (long long)i);
        for (int64_t g = 0; g < KV; g++) {
            const size_t h = (size_t)il * KV + g;
            float* dec = dec_all.data() + h * per_head;
            const float* e = enc + g * per_head;
            kvq_vq_decoding_book(c, K, (int)D, e, gain + g * D, dec);
            int8_t* dec8 = nullptr;
            float* dec8_scale = nullptr;
            if (int8) {
                dec8 = dec8_all.data() + h * per_head;
                dec8_scale = dec8_scale_all.data() + h * (D / c);
                kvq_vq_int8_book(c, K, (int)D, dec, dec8, dec8_scale);
            }
            books.heads.push_back(kv_vq_book{e, dec, dec8, dec8_scale});
        }
    }
}

// A .zack's per-direction proxy blk.N.zack.<name> (kscore, kwscore), F32
// [d, n_kv]: zack_key_order and the widths' water-filling read it as finite and
// not negative, so a file that breaks that is refused here, in one line naming
// the tensor and its layer.
const float* model_need_zack_score(const gguf_file& f, const std::string& prefix, const char* name, int64_t D,
                                   int64_t KV) {
    const gguf_tensor& t = need_tensor(f, prefix + name, {D, KV});
    if (t.type != dtype::F32) ZK_THROW("%s: tensor %s%s must be F32", f.path().c_str(), prefix.c_str(), name);
    const float* score = (const float*)t.data;
    for (int64_t i = 0; i < D * KV; i++)
        if (!(score[i] >= 0 && std::isfinite(score[i])))
            ZK_THROW("%s: tensor %s%s holds %g at %lld; a score is finite and not negative", f.path().c_str(),
                     prefix.c_str(), name, score[i], (long long)i);
    return score;
}

// The zack.* keys and tensors of a .zack file (models/README.md lists them).
void model_load_zack(model& m) {
    const gguf_file& f = *m.file;
    const model_hparams& hp = m.hp;
    zack_info& z = m.zack;
    z.present = true;
    z.version = (int)f.get_int("zack.version");
    if (z.version != 1)
        ZK_THROW("%s: zack.version %d is not supported (this zack reads version 1)", f.path().c_str(), z.version);
    const int64_t D = hp.head_dim, KV = hp.n_head_kv;
    z.rank_align = opt_int(f, "zack.rank_align", 1, 1, D);
    for (int il = 0; il < hp.n_layer; il++) {
        const std::string p = "blk." + std::to_string(il) + ".zack.";
        zack_layer zl;
        zl.rqk = (const float*)need_tensor(f, p + "rqk", {D, D, KV}).data;
        zl.sigma_k = (const float*)need_tensor(f, p + "sigma_k", {D, KV}).data;
        zl.sigma_v = (const float*)need_tensor(f, p + "sigma_v", {D, KV}).data;
        for (const char* n : {"rqk", "sigma_k", "sigma_v"})
            if (f.find_tensor(p + n)->type != dtype::F32)
                ZK_THROW("%s: tensor %s%s must be F32", f.path().c_str(), p.c_str(), n);
        // optional key bases: all three or none
        const bool bases = f.find_tensor(p + "kqa") || f.find_tensor(p + "kqb") || f.find_tensor(p + "kpair");
        if (bases) {
            const float** dst[3] = {&zl.kqa, &zl.kqb, &zl.kpair};
            const char* names[3] = {"kqa", "kqb", "kpair"};
            for (int i = 0; i < 3; i++) {
                const gguf_tensor& t = need_tensor(f, p + names[i], {D, D, KV});
                if (t.type != dtype::F32) ZK_THROW("%s: tensor %s%s must be F32", f.path().c_str(), p.c_str(), names[i]);
                *dst[i] = (const float*)t.data;
            }
        }
        if (il > 0 && bases != (z.layers[0].kqa != nullptr))
            ZK_THROW("%s: layer %d %s the key-basis tensors that layer 0 %s", f.path().c_str(), il,
                     bases ? "has" : "lacks", bases ? "lacks" : "has");
        if (f.find_tensor(p + "kmean")) {
            const gguf_tensor& t = need_tensor(f, p + "kmean", {D, KV});
            if (t.type != dtype::F32) ZK_THROW("%s: tensor %skmean must be F32", f.path().c_str(), p.c_str());
            zl.kmean = (const float*)t.data;
            for (int64_t i = 0; i < D * KV; i++)
                if (!std::isfinite(zl.kmean[i]))
                    ZK_THROW("%s: tensor %skmean holds a non-finite value at %lld", f.path().c_str(), p.c_str(),
                             (long long)i);
        }
        if (il > 0 && (zl.kmean != nullptr) != (z.layers[0].kmean != nullptr))
            ZK_THROW("%s: layer %d %s blk.N.zack.kmean, layer 0 %s", f.path().c_str(), il,
                     zl.kmean ? "has" : "lacks", zl.kmean ? "lacks it" : "has it");
        if (f.find_tensor(p + "kscore")) {
            zl.kscore = model_need_zack_score(f, p, "kscore", D, KV);
            std::vector<int32_t> o;
            for (int64_t g = 0; g < KV; g++) {
                zack_key_order((int)D, zl.kscore + g * D, o);
                zl.korder.insert(zl.korder.end(), o.begin(), o.end());
            }
        }
        if (il > 0 && (zl.kscore != nullptr) != (z.layers[0].kscore != nullptr))
            ZK_THROW("%s: layer %d %s blk.N.zack.kscore, layer 0 %s", f.path().c_str(), il,
                     zl.kscore ? "has" : "lacks", zl.kscore ? "lacks it" : "has it");
        // the quantization pair: all three or none
        if (f.find_tensor(p + "kwa") || f.find_tensor(p + "kwb") || f.find_tensor(p + "kwscore")) {
            const float** dst[2] = {&zl.kwa, &zl.kwb};
            const char* names[2] = {"kwa", "kwb"};
            for (int i = 0; i < 2; i++) {
                const gguf_tensor& t = need_tensor(f, p + names[i], {D, D, KV});
                if (t.type != dtype::F32) ZK_THROW("%s: tensor %s%s must be F32", f.path().c_str(), p.c_str(), names[i]);
                *dst[i] = (const float*)t.data;
                for (int64_t x = 0; x < D * D * KV; x++)
                    if (!std::isfinite((*dst[i])[x]))
                        ZK_THROW("%s: tensor %s%s holds a non-finite value at %lld", f.path().c_str(), p.c_str(),
                                 names[i], (long long)x);
            }
            zl.kwscore = model_need_zack_score(f, p, "kwscore", D, KV);
            // sessions take the pair's columns in stored order and give the widest
            // codes to the first (keybasis_wide_rows counts widths on the sorted
            // proxy), so a file out of that order would code the wrong directions
            for (int64_t g = 0; g < KV; g++)
                for (int64_t j = 1; j < D; j++)
                    if (zl.kwscore[g * D + j] > zl.kwscore[g * D + j - 1])
                        ZK_THROW("%s: tensor %skwscore rises in head %lld at %lld (%g after %g); the pair's "
                                 "columns come in descending proxy order",
                                 f.path().c_str(), p.c_str(), (long long)g, (long long)j, zl.kwscore[g * D + j],
                                 zl.kwscore[g * D + j - 1]);
        }
        if (il > 0 && (zl.kwa != nullptr) != (z.layers[0].kwa != nullptr))
            ZK_THROW("%s: layer %d %s blk.N.zack.kwa/kwb/kwscore, layer 0 %s", f.path().c_str(), il,
                     zl.kwa ? "has" : "lacks", zl.kwa ? "lacks them" : "has them");
        z.layers.push_back(zl);
    }
    if (const gguf_value* rates = f.find("zack.rank_table.rates")) {
        if (rates->type != gguf_type::ARRAY)
            ZK_THROW("%s: zack.rank_table.rates must be an array", f.path().c_str());
        for (const auto& r : rates->arr) z.table_rates.push_back((float)r.as_float("zack.rank_table.rates"));
        const size_t n = z.table_rates.size() * hp.n_layer * KV;
        z.table_k = int_array(f, "zack.rank_table.k", n);
        z.table_v = int_array(f, "zack.rank_table.v", n);
        // A rank is a number of kept dimensions of a head: 1..head_dim.
        for (const auto* t : {&z.table_k, &z.table_v})
            for (size_t i = 0; i < n; i++)
                if ((*t)[i] < 1 || (*t)[i] > D)
                    ZK_THROW("%s: zack.rank_table.%c[%zu] = %d is out of range (expected 1..%lld, the head dim)",
                             f.path().c_str(), t == &z.table_k ? 'k' : 'v', i, (*t)[i], (long long)D);
    }
    model_load_sensitivity(m);
    for (int code = 0; code < KV_VQ_CODES; code++) model_load_codebooks(m, code);
}

// Packs every weight matrix of a supported type into one anonymous mapping
// and releases the file pages behind them. The mapping is 2 MiB-aligned and
// asks for transparent huge pages (MADV_HUGEPAGE): a decode step streams all
// of it, and memory streams faster through 2 MiB pages (bench/read_bandwidth.c
// on the AVX-512 Xeon: 35-38 GB/s against 27 through 4 KiB pages; whether TLB
// walks or the hardware prefetcher's stop at each 4 KiB page is the cause was
// not isolated). On the 1.5B that was 5-8% of a decode step (depth 0 45.7 ->
// 42.8 ms, 8K 52.6 -> 50.1 ms, bench/RESULTS.md 2026-12-06 fourth session);
// the first touch may make the kernel compact memory: up to 0.3 s more load
// time (once in 8 loads 1.4 s). A matrix is
// packed in slices of about k_pack_slice_bytes of its GGUF bytes, each slice's
// file pages released once it is packed: the load's peak then holds one slice
// twice, not a whole matrix (the 0.5B's 145 MB Q8_0 output matrix raised its
// peak RSS by 70 MB).
constexpr size_t k_pack_slice_bytes = (size_t)16 << 20;

void model_pack_weights(model& m) {
    std::vector<weight_view*> views;
    for (layer_weights& L : m.layers)
        for (weight_view* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) views.push_back(w);
    views.push_back(&m.output);
    std::vector<size_t> offset;
    size_t total = 0;
    for (weight_view* w : views) {
        offset.push_back(total);
        if (quant_pack_supported(w->type, w->n_cols)) total += (quant_pack_size(w->type, w->n_rows, w->n_cols) + 63) / 64 * 64;
    }
    if (total == 0) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    total = (total + page - 1) & ~(page - 1);
    // mapped with a huge page of slack, then trimmed to an aligned start (the
    // kernel aligns large anonymous mappings itself only since Linux 6.7)
    const uintptr_t huge = k_packed_align;
    void* raw = mmap(nullptr, total + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        ZK_THROW("%s: cannot allocate %.1f MiB for the packed weights (%s)", m.file->path().c_str(),
                 total / 1048576.0, std::strerror(errno));
    const uintptr_t start = ((uintptr_t)raw + huge - 1) & ~(huge - 1);
    if (start > (uintptr_t)raw) munmap(raw, start - (uintptr_t)raw);
    munmap((void*)(start + total), (uintptr_t)raw + huge - start);  // start < raw + huge: never empty
    void* base = (void*)start;
    madvise(base, total, MADV_HUGEPAGE);  // advice only: without THP the pages stay 4 KiB
    m.packed.base = base;
    m.packed.bytes = total;
    thread_pool pool((int)std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
    for (size_t i = 0; i < views.size(); i++) {
        weight_view& w = *views[i];
        if (!quant_pack_supported(w.type, w.n_cols)) continue;
        // The GGUF bytes are no longer read: not by the matmuls, and not by
        // the embedding when the output is tied to its table (the rows are
        // then read from the packed copy, below). An embedding row read from
        // the file costs a page fault a new token (on a cold page cache a disk
        // read: ~12 ms each, measured on a 2-core VM), and the table's pages,
        // all touched by the packing, stayed resident beside the packed copy.
        const bool drop = w.data != m.tok_embd.data || (&w == &m.output && m.tied_output);
        const size_t row = dtype_row_size(w.type, w.n_cols);
        const int64_t groups = (w.n_rows + k_pack_rows - 1) / k_pack_rows;
        const int64_t slice = std::max<int64_t>(1, (int64_t)(k_pack_slice_bytes / (row * k_pack_rows)));
        uintptr_t dropped = ((uintptr_t)w.data + page - 1) & ~(page - 1);  // pages below are released
        weight_view packed = w;
        for (int64_t g0 = 0; g0 < groups; g0 += slice) {
            const int64_t g1 = std::min(groups, g0 + slice);
            packed = kernel_matmul_pack(w, (uint8_t*)base + offset[i], pool, g0, g1);
            const uintptr_t e = ((uintptr_t)w.data + row * (size_t)std::min(w.n_rows, g1 * k_pack_rows)) & ~(page - 1);
            if (drop && e > dropped) {
                madvise((void*)dropped, e - dropped, MADV_DONTNEED);
                dropped = e;
            }
        }
        w = packed;
        m.packed.n_tensors++;
    }
    // backend_cpu::embed reads rows of a packed table (quant_pack_dequantize_row)
    if (m.tied_output && m.output.packed) m.tok_embd.packed = m.output.packed;
}

}  // namespace

packed_weights::~packed_weights() {
    if (base) munmap(base, bytes);
}

std::unique_ptr<model> model_load(const std::string& path, const model_load_params& params) {
    auto m = std::make_unique<model>();
    m->file = gguf_file::open(path);
    const gguf_file& f = *m->file;
    model_hparams& hp = m->hp;

    hp.arch = f.get_str("general.architecture");
    const arch_desc& A = arch_find(hp.arch, path);
    hp.desc = &A;
    auto key = [&](arch_key k) { return arch_key_name(A, k); };
    auto tname = [](arch_tensor t, int il = -1) { return arch_tensor_name(t, il); };
    // A file holding a ggml type zack has no kernels for (IQ2_XXS, ...) is
    // refused here, naming the first such tensor, before any of it is used.
    for (const gguf_tensor& t : f.tensors())
        if (!dtype_is_supported((uint32_t)t.type)) refuse_type(f, t);
    hp.name = f.get_str("general.name", "");
    hp.n_layer = need_positive(f, key(arch_key::BLOCK_COUNT));
    hp.n_embd = need_positive(f, key(arch_key::EMBEDDING_LENGTH));
    hp.n_head = need_positive(f, key(arch_key::HEAD_COUNT));
    hp.n_head_kv = opt_int(f, key(arch_key::HEAD_COUNT_KV), hp.n_head, INT32_MIN, INT32_MAX);
    if (hp.n_head_kv <= 0 || hp.n_head % hp.n_head_kv != 0)
        ZK_THROW("%s: %d query heads cannot share %d KV heads evenly", path.c_str(), hp.n_head,
                 hp.n_head_kv);
    hp.n_ff = need_positive(f, key(arch_key::FEED_FORWARD_LENGTH));
    hp.n_ctx_train = opt_int(f, key(arch_key::CONTEXT_LENGTH), 2048, 1, INT32_MAX);
    if (!f.find(key(arch_key::KEY_LENGTH)) && hp.n_embd % hp.n_head != 0)
        ZK_THROW("%s: %d heads do not divide the embedding width %d (and no attention.key_length gives the head "
                 "dim)", path.c_str(), hp.n_head, hp.n_embd);
    hp.head_dim = opt_int(f, key(arch_key::KEY_LENGTH), hp.n_embd / hp.n_head, INT32_MIN, INT32_MAX);
    if (hp.head_dim <= 0 || hp.head_dim % 2 != 0 || hp.head_dim > 256)
        ZK_THROW("%s: head dimension %d is not supported (even, at most 256)", path.c_str(), hp.head_dim);
    if (f.get_int(key(arch_key::VALUE_LENGTH), hp.head_dim) != hp.head_dim)
        ZK_THROW("%s: different key and value head sizes are not supported", path.c_str());
    hp.rms_eps = (float)f.get_float(key(arch_key::RMS_EPS), 1e-5);
    if (!(hp.rms_eps > 0 && hp.rms_eps < 1))
        ZK_THROW("%s: attention.layer_norm_rms_epsilon %g is out of range (expected 0 < eps < 1)", path.c_str(),
                 (double)hp.rms_eps);
    hp.rope.n_dims = opt_int(f, key(arch_key::ROPE_DIMS), hp.head_dim, INT32_MIN, INT32_MAX);
    if (hp.rope.n_dims <= 0 || hp.rope.n_dims > hp.head_dim || hp.rope.n_dims % 2)
        ZK_THROW("%s: rope.dimension_count %d is invalid for head dim %d", path.c_str(),
                 hp.rope.n_dims, hp.head_dim);
    hp.rope.freq_base = (float)f.get_float(key(arch_key::ROPE_FREQ_BASE), 10000.0);
    if (!(hp.rope.freq_base > 1 && std::isfinite(hp.rope.freq_base)))
        ZK_THROW("%s: rope.freq_base %g is out of range (expected a finite base > 1)", path.c_str(),
                 (double)hp.rope.freq_base);
    const std::string scaling = f.get_str(key(arch_key::ROPE_SCALING_TYPE), "none");
    if (scaling == "linear") {
        const double factor = f.get_float(key(arch_key::ROPE_SCALING_FACTOR), 1.0);
        if (!(factor > 0 && std::isfinite(factor))) ZK_THROW("%s: rope.scaling.factor must be positive", path.c_str());
        hp.rope.freq_scale = (float)(1.0 / factor);
    } else if (scaling != "none" && !scaling.empty()) {
        ZK_THROW("%s: rope scaling '%s' is not supported (none, linear)", path.c_str(), scaling.c_str());
    }
    hp.rope.style = A.rope;
    hp.act = A.act;
    if (A.embd_scale) hp.embd_scale = std::sqrt((float)hp.n_embd);
    hp.logit_softcap = (float)f.get_float(key(arch_key::FINAL_LOGIT_SOFTCAP), 0.0);
    if (!(hp.logit_softcap >= 0 && std::isfinite(hp.logit_softcap)))
        ZK_THROW("%s: %s = %g is out of range (expected a finite value >= 0)", path.c_str(),
                 key(arch_key::FINAL_LOGIT_SOFTCAP).c_str(), (double)hp.logit_softcap);
    if (A.swa_period > 0) {
        // local layers: a window of positions and RoPE without scaling at the local base
        hp.n_swa = need_positive(f, key(arch_key::SLIDING_WINDOW));
        hp.swa_layer.resize(hp.n_layer);
        for (int il = 0; il < hp.n_layer; il++) hp.swa_layer[il] = (il + 1) % A.swa_period != 0;
        hp.rope_swa = hp.rope;
        hp.rope_swa.freq_base = A.swa_rope_base;
        hp.rope_swa.freq_scale = 1.0f;
    }

    m->voc = vocab::from_gguf(f);
    const int64_t E = hp.n_embd, D = hp.head_dim;
    const std::string emb_name = tname(arch_tensor::TOKEN_EMBD);
    const gguf_tensor* emb = f.find_tensor(emb_name);
    if (!emb) ZK_THROW("%s: missing tensor '%s'", path.c_str(), emb_name.c_str());
    if (emb->shape.size() != 2 || emb->shape[0] != E)
        ZK_THROW("%s: %s must be [%lld, n_vocab]", path.c_str(), emb_name.c_str(), (long long)E);
    hp.n_vocab = (int)emb->shape[1];
    if (m->voc->n_tokens() > hp.n_vocab)
        ZK_THROW("%s: tokenizer has %d tokens but the embedding only %d rows", path.c_str(),
                 m->voc->n_tokens(), hp.n_vocab);
    m->tok_embd = need_matrix(f, emb_name, E, hp.n_vocab);
    m->output_norm = need_vector(f, tname(arch_tensor::OUTPUT_NORM), E);
    if (f.find_tensor(tname(arch_tensor::OUTPUT))) {
        m->output = need_matrix(f, tname(arch_tensor::OUTPUT), E, hp.n_vocab);
    } else {
        m->output = m->tok_embd;
        m->tied_output = true;
    }

    for (int il = 0; il < hp.n_layer; il++) {
        layer_weights L;
        auto vec = [&](arch_tensor t, int64_t n) { return need_vector(f, tname(t, il), n); };
        auto mat = [&](arch_tensor t, int64_t cols, int64_t rows) { return need_matrix(f, tname(t, il), cols, rows); };
        L.attn_norm = vec(arch_tensor::ATTN_NORM, E);
        L.wq = mat(arch_tensor::ATTN_Q, E, hp.n_head * D);
        L.wk = mat(arch_tensor::ATTN_K, E, hp.n_head_kv * D);
        L.wv = mat(arch_tensor::ATTN_V, E, hp.n_head_kv * D);
        L.wo = mat(arch_tensor::ATTN_OUT, hp.n_head * D, E);
        if (A.qkv_bias) {
            L.bq = opt_vector(f, tname(arch_tensor::ATTN_Q_BIAS, il), hp.n_head * D);
            L.bk = opt_vector(f, tname(arch_tensor::ATTN_K_BIAS, il), hp.n_head_kv * D);
            L.bv = opt_vector(f, tname(arch_tensor::ATTN_V_BIAS, il), hp.n_head_kv * D);
        }
        if (A.qk_norm) {
            L.q_norm = vec(arch_tensor::ATTN_Q_NORM, D);
            L.k_norm = vec(arch_tensor::ATTN_K_NORM, D);
        }
        if (A.post_norms) {
            L.attn_post_norm = vec(arch_tensor::ATTN_POST_NORM, E);
            L.ffn_post_norm = vec(arch_tensor::FFN_POST_NORM, E);
        }
        L.ffn_norm = vec(arch_tensor::FFN_NORM, E);
        L.w_gate = mat(arch_tensor::FFN_GATE, E, hp.n_ff);
        L.w_up = mat(arch_tensor::FFN_UP, E, hp.n_ff);
        L.w_down = mat(arch_tensor::FFN_DOWN, hp.n_ff, E);
        m->layers.push_back(L);
    }
    if (f.find("zack.version")) model_load_zack(*m);
    if (params.pack_weights) model_pack_weights(*m);
    return m;
}

chat_template model_chat_template(const model& m) {
    const std::string src = m.file->get_str("tokenizer.chat_template", "");
    if (src.empty() && m.hp.desc && *m.hp.desc->chat_template) return chat_template_from_name(m.hp.desc->chat_template);
    return chat_template_detect(src);
}

std::string model_describe(const model& m) {
    const model_hparams& h = m.hp;
    std::string s = strfmt("%s (%s), %d layers, %d dim, %d/%d heads of %d, ffn %d, vocab %d, ctx %d",
                           h.name.empty() ? "?" : h.name.c_str(), h.arch.c_str(), h.n_layer, h.n_embd,
                           h.n_head, h.n_head_kv, h.head_dim, h.n_ff, h.n_vocab, h.n_ctx_train);
    if (h.n_swa > 0) {
        int n_local = 0;
        for (uint8_t l : h.swa_layer) n_local += l;
        s += strfmt(", %d of %d layers local (window %d)", n_local, h.n_layer, h.n_swa);
    }
    if (m.packed.n_tensors > 0)
        s += strfmt(", %d matrices packed (%.1f MiB)", m.packed.n_tensors, m.packed.bytes / 1048576.0);
    return s;
}

}  // namespace zk
