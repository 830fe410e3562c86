#include "calib/zack_file.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "calib/fold.h"
#include "calib/ranks.h"
#include "calib/sha256.h"
#include "engine/kv_vq.h"
#include "engine/model.h"
#include "ggml-like/error.h"

namespace zk {

zack_spectra zack_calibration_spectra(const zack_calibration& c) {
    zack_spectra spec;
    spec.n_layer = c.n_layer;
    spec.n_kv = c.n_kv;
    spec.d = c.d;
    spec.sigma_k = c.sigma_k;
    spec.sigma_v = c.sigma_v;
    spec.validate();
    return spec;
}

bool zack_calibration_fits_rank_weight(const zack_calibration& c) {
    if (c.sens.grid.empty()) return false;
    const plan_inputs in = zack_calibration_plan_inputs(c);
    return in.per_head() && std::find(in.qbits.begin(), in.qbits.end(), 2) != in.qbits.end();
}

plan_inputs zack_calibration_plan_inputs(const zack_calibration& c) {
    if (c.sens.grid.empty()) ZK_THROW("the calibration has no sensitivity curves (calib.sens_tokens 0)");
    plan_inputs in;
    in.curves.n_layer = c.n_layer, in.curves.n_kv = c.n_kv, in.curves.d = c.d;
    in.curves.grid = c.sens.grid;
    for (int b = 0; b < 3; b++) in.curves.loss_k[b] = c.sens.k[b];
    in.curves.loss_v = c.sens.v;
    in.qbits = c.sens.qbits;
    in.q = c.sens.q;
    in.rank_weight = c.sens.rank_weight;
    in.kscore.assign(c.widths_score().begin(), c.widths_score().end());
    in.set_group(c.sens.group);
    if (!c.sens.layer_gain.empty()) in.weigh_layers(c.sens.layer_gain);
    return in;
}

namespace {

std::string base_name(const std::string& path) {
    const size_t s = path.find_last_of('/');
    return s == std::string::npos ? path : path.substr(s + 1);
}

std::vector<float> to_f32(const double* x, size_t n) { return std::vector<float>(x, x + n); }

// A folded tensor kept alive until the writer is done.
struct folded {
    dtype type;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
};

}  // namespace

bool zack_file_is_zack(const gguf_file& f) { return f.find("zack.version") != nullptr; }

void zack_file_write(const model& src, const zack_calibration& c, const zack_write_params& p,
                     const std::string& out_path) {
    const gguf_file& f = *src.file;
    const model_hparams& hp = src.hp;
    const int L = hp.n_layer, KV = hp.n_head_kv, H = hp.n_head, D = hp.head_dim;
    const int64_t E = hp.n_embd;
    if (zack_file_is_zack(f))
        ZK_THROW("%s is already a .zack file: calibrate its source GGUF instead", f.path().c_str());
    if (c.n_layer != L || c.n_kv != KV || c.d != D)
        ZK_THROW("calibration is for %d layers x %d KV heads x dim %d, the model has %d x %d x %d", c.n_layer,
                 c.n_kv, c.d, L, KV, D);
    const size_t per_rot = (size_t)KV * D * D, per_sig = (size_t)KV * D;
    ZK_ASSERT(c.rqk.size() == L * per_rot && c.rv.size() == L * per_rot);
    ZK_ASSERT(c.sigma_k.size() == L * per_sig && c.sigma_v.size() == L * per_sig);

    gguf_writer w;
    for (const auto& kv : f.kv()) w.set(kv.first, kv.second);
    w.set("zack.version", gguf_value::make_u32(1));
    w.set("zack.source.name", gguf_value::make_str(base_name(f.path())));
    const std::string sha = p.source_sha256.empty() ? sha256_file_hex(f.path()) : p.source_sha256;
    w.set("zack.source.sha256", gguf_value::make_str(sha));
    if (!p.plans.empty()) {
        std::vector<std::string> js;
        for (kv_plan pl : p.plans) {
            pl.source_sha256 = sha;
            js.push_back(pl.to_json().dump());
        }
        w.set("zack.plans", gguf_value::make_arr_str(js));
    }
    w.set("zack.calib.tokens", gguf_value::make_u64((uint64_t)c.n_tokens));
    w.set("zack.calib.ctx", gguf_value::make_u32((uint32_t)c.n_ctx));
    w.set("zack.calib.corpus", gguf_value::make_str(c.corpus));
    w.set("zack.rank_align", gguf_value::make_u32((uint32_t)p.rank_align));
    for (int code = 0; code < KV_VQ_CODES; code++) {
        if (c.vq[code].enc.empty()) continue;
        const std::string name = kv_vq_file_name(code);
        w.set("zack." + name + ".dim", gguf_value::make_u32((uint32_t)c.vq[code].c));
        w.set("zack." + name + ".size", gguf_value::make_u32((uint32_t)c.vq[code].K));
    }

    // Rank table: one row of ranks per reachable rate of the grid.
    const zack_spectra spec = zack_calibration_spectra(c);
    std::vector<float> rates;
    std::vector<int32_t> tk, tv;
    for (float r : p.table_rates) {
        if (r > ranks_max_rate(D, p.rank_align)) continue;
        const zack_ranks zr = ranks_for_rate(spec, r, p.rank_align);
        rates.push_back(r);
        tk.insert(tk.end(), zr.k.begin(), zr.k.end());
        tv.insert(tv.end(), zr.v.begin(), zr.v.end());
    }
    w.set("zack.rank_table.rates", gguf_value::make_arr_f32(rates));
    w.set("zack.rank_table.k", gguf_value::make_arr_i32(tk));
    w.set("zack.rank_table.v", gguf_value::make_arr_i32(tv));
    if (!c.sens.grid.empty()) {
        const size_t n = (size_t)L * KV * c.sens.grid.size();
        ZK_ASSERT(c.sens.v.size() == n && c.sens.k[0].size() == n);
        w.set("zack.sens.grid", gguf_value::make_arr_i32(std::vector<int32_t>(c.sens.grid.begin(), c.sens.grid.end())));
        const char* names[3] = {"zack.sens.k.pca", "zack.sens.k.score", "zack.sens.k.pairs"};
        for (int b = 0; b < 3; b++)
            if (!c.sens.k[b].empty()) w.set(names[b], gguf_value::make_arr_f32(to_f32(c.sens.k[b].data(), n)));
        w.set("zack.sens.v", gguf_value::make_arr_f32(to_f32(c.sens.v.data(), n)));
        const size_t nh = (size_t)L * KV;
        if (!c.sens.qbits.empty()) {
            const size_t nq = c.sens.qbits.size() * c.sens.qbits.size() * nh;
            ZK_ASSERT(c.sens.q.size() == nq && c.sens.qbits[0] == 16);
            w.set("zack.sens.qbits",
                  gguf_value::make_arr_i32(std::vector<int32_t>(c.sens.qbits.begin(), c.sens.qbits.end())));
            w.set("zack.sens.q", gguf_value::make_arr_f32(to_f32(c.sens.q.data(), nq)));
        }
        w.set("zack.sens.metric", gguf_value::make_str(c.sens.metric));
        w.set("zack.sens.rank_weight", gguf_value::make_f32((float)c.sens.rank_weight));
        w.set("zack.sens.group", gguf_value::make_u32((uint32_t)c.sens.group));
        if (!c.sens.layer_gain.empty()) {
            ZK_ASSERT((int)c.sens.layer_gain.size() == L);
            w.set("zack.sens.layer_gain", gguf_value::make_arr_f32(to_f32(c.sens.layer_gain.data(), L)));
        }
        w.set("zack.sens.queries", gguf_value::make_u64((uint64_t)c.sens.queries));
        w.set("zack.sens.tokens", gguf_value::make_u64((uint64_t)c.sens.tokens));
    }

    // Folded W_v, b_v, W_o per layer, keyed by tensor name.
    std::map<std::string, folded> repl;
    for (int il = 0; il < L; il++) {
        const std::string pre = "blk." + std::to_string(il) + ".";
        const double* rv = c.rv.data() + il * per_rot;
        const gguf_tensor& tv_ = f.get_tensor(pre + "attn_v.weight");
        const gguf_tensor& to_ = f.get_tensor(pre + "attn_output.weight");
        const gguf_tensor* tb = f.find_tensor(pre + "attn_v.bias");
        std::vector<float> wv = fold_dequantize(tv_);
        std::vector<float> wo = fold_dequantize(to_);
        std::vector<float> bv;
        if (tb) bv = fold_dequantize(*tb);
        ZK_ASSERT((int64_t)wv.size() == (int64_t)KV * D * E && (int64_t)wo.size() == E * H * D);
        fold_wv(wv.data(), tb ? bv.data() : nullptr, rv, KV, D, E);
        fold_wo(wo.data(), rv, H, KV, D, E);
        const dtype tv_type = p.folded_f32 ? dtype::F32 : fold_output_type(tv_.type, E);
        const dtype to_type = p.folded_f32 ? dtype::F32 : fold_output_type(to_.type, (int64_t)H * D);
        repl[tv_.name] = folded{tv_type, tv_.shape, fold_quantize(wv.data(), (int64_t)KV * D, E, tv_type)};
        repl[to_.name] = folded{to_type, to_.shape, fold_quantize(wo.data(), E, (int64_t)H * D, to_type)};
        if (tb) {
            const size_t nb = bv.size() * sizeof(float);
            std::vector<uint8_t> bytes(nb);
            std::memcpy(bytes.data(), bv.data(), nb);
            repl[tb->name] = folded{dtype::F32, tb->shape, std::move(bytes)};
        }
    }
    for (const gguf_tensor& t : f.tensors()) {
        auto it = repl.find(t.name);
        if (it == repl.end()) {
            w.add_tensor_ref(t.name, t.type, t.shape, t.data, t.n_bytes);
        } else {
            const folded& fd = it->second;
            w.add_tensor_ref(t.name, fd.type, fd.shape, fd.bytes.data(), fd.bytes.size());
        }
    }
    for (int il = 0; il < L; il++) {
        const std::string pre = "blk." + std::to_string(il) + ".zack.";
        const std::vector<float> rqk = to_f32(c.rqk.data() + il * per_rot, per_rot);
        const std::vector<float> rv = to_f32(c.rv.data() + il * per_rot, per_rot);
        const std::vector<float> sk = to_f32(c.sigma_k.data() + il * per_sig, per_sig);
        const std::vector<float> sv = to_f32(c.sigma_v.data() + il * per_sig, per_sig);
        w.add_tensor(pre + "rqk", dtype::F32, {D, D, KV}, rqk.data(), rqk.size() * sizeof(float));
        w.add_tensor(pre + "rv", dtype::F32, {D, D, KV}, rv.data(), rv.size() * sizeof(float));
        w.add_tensor(pre + "sigma_k", dtype::F32, {D, KV}, sk.data(), sk.size() * sizeof(float));
        w.add_tensor(pre + "sigma_v", dtype::F32, {D, KV}, sv.data(), sv.size() * sizeof(float));
        // Alternative key bases, when the calibration has them.
        const std::pair<const char*, const std::vector<double>*> bases[] = {
            {"kqa", &c.kqa}, {"kqb", &c.kqb}, {"kpair", &c.kpair}, {"kwa", &c.kwa}, {"kwb", &c.kwb}};
        for (const auto& b : bases) {
            if (b.second->empty()) continue;
            ZK_ASSERT(b.second->size() == L * per_rot);
            const std::vector<float> x = to_f32(b.second->data() + il * per_rot, per_rot);
            w.add_tensor(pre + b.first, dtype::F32, {D, D, KV}, x.data(), x.size() * sizeof(float));
        }
        if (!c.k_mean.empty()) {
            ZK_ASSERT(c.k_mean.size() == L * per_sig);
            const std::vector<float> x = to_f32(c.k_mean.data() + il * per_sig, per_sig);
            w.add_tensor(pre + "kmean", dtype::F32, {D, KV}, x.data(), x.size() * sizeof(float));
        }
        if (!c.k_score.empty()) {
            ZK_ASSERT(c.k_score.size() == L * per_sig);
            const std::vector<float> x = to_f32(c.k_score.data() + il * per_sig, per_sig);
            w.add_tensor(pre + "kscore", dtype::F32, {D, KV}, x.data(), x.size() * sizeof(float));
        }
        if (!c.kw_score.empty()) {
            ZK_ASSERT(c.kw_score.size() == L * per_sig && c.kwa.size() == L * per_rot && c.kwb.size() == L * per_rot);
            const std::vector<float> x = to_f32(c.kw_score.data() + il * per_sig, per_sig);
            w.add_tensor(pre + "kwscore", dtype::F32, {D, KV}, x.data(), x.size() * sizeof(float));
        }
        // value codebooks [n_kv x d / c x K x c], gains [n_kv x d]
        for (int code = KV_VQ_CODES - 1; code >= 0; code--) {
            const zack_calibration::vq_set& v = c.vq[code];
            if (v.enc.empty()) continue;
            const std::string name = kv_vq_file_name(code);
            const size_t nb = (size_t)KV * D * v.K;
            ZK_ASSERT(v.enc.size() == L * nb && v.gain.size() == L * per_sig);
            w.add_tensor(pre + name, dtype::F32, {v.c, v.K, D / v.c, KV}, v.enc.data() + il * nb, nb * sizeof(float));
            w.add_tensor(pre + name + "_gain", dtype::F32, {D, KV}, v.gain.data() + il * per_sig,
                         per_sig * sizeof(float));
        }
    }
    w.write(out_path);
}

zack_calibration zack_file_read_calibration(const gguf_file& f) {
    if (!zack_file_is_zack(f)) ZK_THROW("%s is not a .zack file (no zack.version key)", f.path().c_str());
    zack_calibration c;
    const std::string arch = f.get_str("general.architecture");
    c.n_layer = (int)f.get_int(arch + ".block_count");
    c.n_tokens = f.get_int("zack.calib.tokens", 0);
    c.n_ctx = f.get_int("zack.calib.ctx", 0);
    c.corpus = f.get_str("zack.calib.corpus", "");
    const gguf_tensor& t0 = f.get_tensor("blk.0.zack.rqk");
    if (t0.shape.size() != 3 || t0.shape[0] != t0.shape[1])
        ZK_THROW("%s: blk.0.zack.rqk must have shape [d, d, n_kv]", f.path().c_str());
    c.d = (int)t0.shape[0];
    c.n_kv = (int)t0.shape[2];
    const bool has_rv = f.find_tensor("blk.0.zack.rv") != nullptr;
    const bool has_bases = f.find_tensor("blk.0.zack.kqa") != nullptr;
    const bool has_mean = f.find_tensor("blk.0.zack.kmean") != nullptr;
    const bool has_score = f.find_tensor("blk.0.zack.kscore") != nullptr;
    const bool has_pair = f.find_tensor("blk.0.zack.kwscore") != nullptr;
    auto read = [&](const std::string& name, std::vector<int64_t> shape, std::vector<double>& out) {
        const gguf_tensor& t = f.get_tensor(name);
        if (t.type != dtype::F32 || t.shape != shape)
            ZK_THROW("%s: tensor %s must be F32 with %zu dims [%lld, ...]", f.path().c_str(), name.c_str(),
                     shape.size(), (long long)shape[0]);
        const float* x = (const float*)t.data;
        out.insert(out.end(), x, x + t.n_elements());
    };
    for (int il = 0; il < c.n_layer; il++) {
        const std::string pre = "blk." + std::to_string(il) + ".zack.";
        read(pre + "rqk", {c.d, c.d, c.n_kv}, c.rqk);
        if (has_rv) read(pre + "rv", {c.d, c.d, c.n_kv}, c.rv);
        read(pre + "sigma_k", {c.d, c.n_kv}, c.sigma_k);
        read(pre + "sigma_v", {c.d, c.n_kv}, c.sigma_v);
        if (has_bases) {
            read(pre + "kqa", {c.d, c.d, c.n_kv}, c.kqa);
            read(pre + "kqb", {c.d, c.d, c.n_kv}, c.kqb);
            read(pre + "kpair", {c.d, c.d, c.n_kv}, c.kpair);
        }
        if (has_mean) read(pre + "kmean", {c.d, c.n_kv}, c.k_mean);
        if (has_score) read(pre + "kscore", {c.d, c.n_kv}, c.k_score);
        if (has_pair) {
            read(pre + "kwa", {c.d, c.d, c.n_kv}, c.kwa);
            read(pre + "kwb", {c.d, c.d, c.n_kv}, c.kwb);
            read(pre + "kwscore", {c.d, c.n_kv}, c.kw_score);
        }
    }
    for (int code = 0; code < KV_VQ_CODES; code++) {
        const std::string name = kv_vq_file_name(code);
        if (!f.find_tensor("blk.0.zack." + name)) continue;
        zack_calibration::vq_set& v = c.vq[code];
        v.c = (int)f.get_int("zack." + name + ".dim");
        v.K = (int)f.get_int("zack." + name + ".size");
        kvq_vq_check(v.c, v.K, c.d);
        std::vector<double> enc, gain;
        for (int il = 0; il < c.n_layer; il++) {
            const std::string pre = "blk." + std::to_string(il) + ".zack.";
            read(pre + name, {v.c, v.K, c.d / v.c, c.n_kv}, enc);
            read(pre + name + "_gain", {c.d, c.n_kv}, gain);
        }
        v.enc.assign(enc.begin(), enc.end());
        v.gain.assign(gain.begin(), gain.end());
    }
    return c;
}

}  // namespace zk
