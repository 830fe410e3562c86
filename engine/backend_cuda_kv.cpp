// The CUDA backend's attention side (engine/backend_cuda.h): the q/k
// projection of compressed heads, KV append (a decode step's on the device
// mirror first, the host cache following at the pass's end; otherwise through
// the host cache into the mirror), and attention: a decode step's (sequence,
// KV head) items split into equal-cost slot ranges (flash-decoding, kernels/cuda/
// attention_decode.h), a prefill chunk's in tiles of equal work
// (attention_prefill.h).
#include <cstring>

#include "engine/backend_cuda.h"
#include "engine/kv_cache.h"
#include "ggml-like/error.h"
#include "kernels/cuda/attention_decode_fast.h"
#include "kernels/cuda/kv_append.h"
#include "kernels/cuda/project.h"

namespace zk {

using namespace cuda;

namespace {

// Query rows per tile of the prefill kernel for the widest heads.
constexpr int k_prefill_rows_base = 16;

// A windowed side's residual rows: they move down when a group is quantized,
// so they are copied whole then; every other array of a block only grows at
// its end between edits (positions, codes, scales, group starts, GEAR, sinks,
// the rows of a rows side).
bool moves_on_flush(const char* name) {
    return !std::strcmp(name, k_kv_label_k_rows) || !std::strcmp(name, k_kv_label_v_rows);
}

}  // namespace

void* backend_cuda::shared_array(const kv_cache& c, const void* host, const char* name) {
    const int32_t* ramp = c.ramp();
    if (!ramp || std::strcmp(name, "pos")) return nullptr;
    ZK_ASSERT((const int32_t*)host >= ramp && (const int32_t*)host < ramp + c.capacity());
    device_array<int32_t>& d = ramps_[c.id()];
    if (d.size() == 0) d = device_array<int32_t>(std::vector<int32_t>(ramp, ramp + c.capacity()), "positions ramp");
    return d.data() + ((const int32_t*)host - ramp);
}

cuda_kv_mirror& backend_cuda::mirror_sync(const kv_cache& c, int il, int g) {
    std::vector<cuda_kv_mirror>& ms = mirrors_[c.id()];
    if (ms.empty()) ms.resize((size_t)c.n_layer() * c.n_head_kv());
    cuda_kv_mirror& m = ms[(size_t)il * c.n_head_kv() + g];
    const kv_block& b = c.block(il, g);
    const bool whole = m.edits != b.edits;
    const bool flushed = m.n_quant != b.n_quant;
    if (whole)
        for (auto& a : m.arrays) a.synced = 0;
    // cuda_kv_head_from_view asks for each array the block uses, with its
    // current size: copy what is new into the mirror's array of that name
    // (one captured pointer: the std::function keeps it without allocating)
    const struct {
        cuda_kv_mirror* m;
        cuda_upload_batch* up;
        bool whole, flushed;
        backend_cuda* be;
        const kv_cache* c;
    } st{&m, &up_, whole, flushed, this, &c};
    const auto* sp = &st;
    m.head = cuda_kv_head_from_view(c.view(il, g), [sp](const void* host, size_t bytes, const char* name) -> void* {
        if (void* d = sp->be->shared_array(*sp->c, host, name)) return d;
        cuda_kv_mirror& mr = *sp->m;
        cuda_kv_mirror::array* a = nullptr;
        for (auto& x : mr.arrays)
            if (!std::strcmp(x.name, name)) a = &x;
        if (!a) {
            mr.arrays.emplace_back();
            a = &mr.arrays.back();
            a->name = name;
        }
        if (a->d.size() < bytes) {
            // twice the size: a growing cache is copied whole O(log n) times, and
            // the appends on the device (kv_append_device) find room meanwhile
            a->d = device_array<uint8_t>(std::max(2 * bytes, 2 * a->d.size()), name);
            a->synced = 0;
        }
        const size_t from = sp->whole || (sp->flushed && moves_on_flush(name)) ? 0 : std::min(a->synced, bytes);
        if (bytes > from) sp->up->add(a->d.data() + from, (const uint8_t*)host + from, bytes - from);
        a->synced = bytes;
        return a->d.data();
    });
    m.edits = b.edits;
    m.n_quant = b.n_quant;
    m.n_used = b.n_used;
    return m;
}

namespace {

cuda_kv_mirror::array* mirror_find(cuda_kv_mirror& m, const char* name) {
    for (auto& a : m.arrays)
        if (!std::strcmp(a.name, name)) return &a;
    return nullptr;
}

bool layout_quantizes(kv_layout_id l) { return l != KV_LAYOUT_ROWS; }

// The store of one side over the mirror's arrays (kernels/cuda/kv_append.h).
cuda_kv_side_store side_store(cuda_kv_mirror& m, const kv_block& b, dtype type, bool keys) {
    cuda_kv_side_store d;
    d.layout = (keys ? b.k : b.v)->layout();
    d.keys = keys;
    d.windowed = b.windowed;
    d.r = keys ? b.r_k : b.r_v;
    auto arr = [&](const char* name) -> uint8_t* {
        cuda_kv_mirror::array* a = mirror_find(m, name);
        return a ? a->d.data() : nullptr;
    };
    uint8_t* rows = arr(keys ? k_kv_label_k_rows : k_kv_label_v_rows);
    if (type == dtype::F32)
        d.rows32 = dptr<float>((float*)rows);
    else
        d.rows16 = dptr<uint16_t>((uint16_t*)rows);
    d.codes = dptr<uint8_t>(arr(keys ? "k codes" : "v codes"));
    d.scale = dptr<uint16_t>((uint16_t*)arr(keys ? "k scales" : "v scales"));
    d.min = dptr<uint16_t>((uint16_t*)arr(keys ? "k mins" : "v mins"));
    return d;
}

}  // namespace

bool backend_cuda::kv_append_device(const backend_seq& s, const model_hparams& hp, int il, forward_buffers& fb) {
    const int64_t D = hp.head_dim, KV = hp.n_head_kv;
    kv_cache& c = *s.cache;
    const kv_cache_params& p = c.params();
    // a prefill chunk of a windowed block keeps rows aside on the host (kv_append_holds)
    if (s.n > k_matvec_max_tok || p.gear || p.scores || (kv_cache_windowed(p) && kv_append_holds(s))) return false;
    if (p.sinks > 0 && fb.pos[s.row0] < p.sinks) return false;  // sink rows are written on the host
    std::vector<cuda_kv_mirror>& ms = mirrors_[c.id()];
    if (ms.empty()) return false;
    const size_t elt = c.type() == dtype::F32 ? sizeof(float) : sizeof(uint16_t);
    // every head first: all or nothing for this sequence's layer
    head_plans_.resize((size_t)KV);
    for (int g = 0; g < KV; g++) {
        const kv_block& b = c.block(il, g);
        cuda_kv_mirror& m = ms[(size_t)il * KV + g];
        if (m.edits != b.edits || m.n_quant != b.n_quant || m.n_used != b.n_used) return false;
        head_plan& hp_g = head_plans_[(size_t)g];
        hp_g.plan = c.append_plan(il, g, s.n);  // throws, as append would, when the block is full
        // the head after the append, over the mirror's arrays, each with room
        bool room = true;
        hp_g.head = cuda_kv_head_from_view(c.view_after(il, g, hp_g.plan),
                                           [&](const void* host, size_t bytes, const char* name) -> void* {
                                               if (void* d = shared_array(c, host, name)) return d;
                                               cuda_kv_mirror::array* a = mirror_find(m, name);
                                               if (!a || a->d.size() < bytes) {
                                                   room = false;
                                                   return nullptr;
                                               }
                                               return a->d.data();
                                           });
        if (!room) return false;
        // keys with a plan's 2/1/0-bit parts and vector-coded values are
        // coded on the host (kv_append.cu codes one width of grids); the steps
        // between their flushes only write rows into the window, here as for
        // any layout
        const cuda_kv_side& hk = hp_g.head.k;
        if (hk.tail > 0 || hk.zero > 0 || hk.mid > 0 || hp_g.head.v.layout == KV_LAYOUT_VQ)
            for (const kv_append_step& st : hp_g.plan.steps)
                if (st.flush) return false;
        // a windowed block's quantizing sides fill their window before a flush
        // empties it: it needs room for the fullest it gets
        int64_t window = 0;
        for (const kv_append_step& st : hp_g.plan.steps)
            if (!st.flush) window = std::max(window, st.rs0 + st.n);
        if (b.windowed)
            for (bool keys : {true, false}) {
                if (!layout_quantizes((keys ? b.k : b.v)->layout())) continue;
                const cuda_kv_mirror::array* a = mirror_find(m, keys ? k_kv_label_k_rows : k_kv_label_v_rows);
                if (!a || a->d.size() < (size_t)window * (keys ? b.r_k : b.r_v) * elt) return false;
            }
        if (!c.ramp() && !mirror_find(m, "pos")) return false;
        if (b.windowed && !mirror_find(m, "group starts")) return false;
    }
    // the rows stay on the device for the host cache (pass_end)
    const size_t rows = (size_t)(s.n * KV * D);
    cuda_kv_deferred dfr{&c, il, s.row0, s.n, staged_};
    float* stage = d_stage_.data() + staged_;
    cuda_copy_on_device(stage, fb.k.data() + s.row0 * KV * D, rows * sizeof(float));
    cuda_copy_on_device(stage + rows, fb.v.data() + s.row0 * KV * D, rows * sizeof(float));
    staged_ += 2 * rows;
    deferred_.push_back(dfr);
    for (int g = 0; g < KV; g++) {
        const kv_block& b = c.block(il, g);
        cuda_kv_mirror& m = ms[(size_t)il * KV + g];
        const head_plan& hp_g = head_plans_[(size_t)g];
        const cuda_kv_side_store ks = side_store(m, b, c.type(), true), vs = side_store(m, b, c.type(), false);
        for (const kv_append_step& st : hp_g.plan.steps) {
            if (!st.flush) {
                const int64_t r0 = (s.row0 + st.t0) * KV + g;
                cuda_rows kr{dptr<const float>(fb.k.data() + r0 * D), {}, KV * D, st.n, b.r_k};
                cuda_rows vr{dptr<const float>(fb.v.data() + r0 * D), {}, KV * D, st.n, b.r_v};
                cuda_kv_side_append(ks, kr, st.s0, st.rs0, nullptr);
                cuda_kv_side_append(vs, vr, st.s0, st.rs0, nullptr);
                continue;
            }
            const int G = p.group;
            const size_t scratch = (size_t)std::max<int64_t>(st.rest, 1) * std::max(b.r_k, b.r_v) * elt;
            uint8_t* x = cuda_grow(d_flush_, scratch, "window rows in transit");
            cuda_kv_side_flush(ks, st.group, st.s0, G, st.rest, x, nullptr);
            cuda_kv_side_flush(vs, st.group, st.s0, G, st.rest, x, nullptr);
            const int32_t end = (int32_t)(st.s0 + G);  // group_start[group + 1]
            up_.add(mirror_find(m, "group starts")->d.data() + (size_t)(st.group + 1) * sizeof(int32_t), &end,
                    sizeof(end));
        }
        if (!c.ramp())  // else the ramp has them already (kv_cache::append checks the host's)
            up_.add(mirror_find(m, "pos")->d.data() + (size_t)b.n_used * sizeof(int32_t), fb.pos.data() + s.row0,
                    (size_t)s.n * sizeof(int32_t));
        m.head = hp_g.head;
    }
    return true;
}

void backend_cuda::mirror_caught_up(const kv_cache& c, int il, int g) {
    cuda_kv_mirror& m = mirrors_[c.id()][(size_t)il * c.n_head_kv() + g];
    const kv_block& b = c.block(il, g);
    bool ok = true;
    cuda_kv_head_from_view(c.view(il, g), [&](const void* host, size_t bytes, const char* name) -> void* {
        if (void* d = shared_array(c, host, name)) return d;
        cuda_kv_mirror::array* a = mirror_find(m, name);
        if (!a || a->d.size() < bytes) {
            ok = false;
            return nullptr;
        }
        a->synced = bytes;
        return a->d.data();
    });
    ZK_ASSERT(ok);  // kv_append_device checked the room
    m.edits = b.edits;
    m.n_quant = b.n_quant;
    m.n_used = b.n_used;
}

namespace {

// Bytes of the rows view_attend reads from the host cache's held arrays, each
// rounded up to 256 (the device copies' alignment).
size_t held_bytes(const kv_cache& c, int il, int g) {
    const attn_kv_view v = c.view_attend(il, g);
    const size_t elt = c.type() == dtype::F32 ? sizeof(float) : sizeof(uint16_t);
    size_t n = 0;
    for (bool keys : {true, false})
        if (c.held_rows(g, (keys ? v.k : v.v).rows))
            n += ((size_t)cuda_kv_side_extent_of(v, keys).rows * elt + 255) / 256 * 256;
    return n;
}

}  // namespace

cuda_kv_head backend_cuda::held_head(const kv_cache& c, int il, int g, uint8_t* held, size_t* at) {
    cuda_kv_mirror& m = mirrors_[c.id()][(size_t)il * c.n_head_kv() + g];
    // the mirror holds the block after the append: the groups it quantized
    // only add codes past the held view's, and group starts past its count
    return cuda_kv_head_from_view(c.view_attend(il, g), [&](const void* host, size_t bytes, const char* name) -> void* {
        if (void* d = shared_array(c, host, name)) return d;
        if (c.held_rows(g, host)) {
            uint8_t* d = held + *at;
            up_.add(d, host, bytes);
            *at += (bytes + 255) / 256 * 256;
            return d;
        }
        cuda_kv_mirror::array* a = mirror_find(m, name);
        ZK_ASSERT(a && a->d.size() >= bytes);  // mirror_sync copied the block after the append
        return a->d.data();
    });
}

void backend_cuda::pass_end(const backend_seq*, int, const model_hparams& hp, forward_buffers& fb) {
    if (!deferred_.empty()) {
        const int64_t D = hp.head_dim, KV = hp.n_head_kv;
        h_stage_.resize(staged_);
        cuda_copy_to_host(h_stage_.data(), d_stage_.data(), staged_ * sizeof(float));  // waits for the stream
        for (const cuda_kv_deferred& e : deferred_) {
            const float* k = h_stage_.data() + e.at;
            const float* v = k + e.n * KV * D;
            for (int g = 0; g < KV; g++) {
                e.cache->append(e.il, g, e.n, k + g * D, KV * D, v + g * D, KV * D, fb.pos.data() + e.row0);
                mirror_caught_up(*e.cache, e.il, g);
            }
        }
        deferred_.clear();
        staged_ = 0;
    } else {
        cuda_stream_sync(nullptr);
    }
    up_.recycle();  // the device has run every send
}

// Each mirror array against the host's bytes (the extents the host block uses).
std::string backend_cuda::kv_copy_check(const kv_cache& c) {
    auto it = mirrors_.find(c.id());
    if (it == mirrors_.end()) return "";
    char buf[256];
    std::string out;
    for (int il = 0; il < c.n_layer() && out.empty(); il++)
        for (int g = 0; g < c.n_head_kv() && out.empty(); g++) {
            cuda_kv_mirror& m = it->second[(size_t)il * c.n_head_kv() + g];
            const kv_block& b = c.block(il, g);
            if (m.n_used < 0) continue;  // never copied
            if (m.n_used != b.n_used || m.n_quant != b.n_quant) {
                std::snprintf(buf, sizeof buf,
                              "layer %d head %d: %lld slots (%lld quantized) on the device, %lld (%lld) on the host", il,
                              g, (long long)m.n_used, (long long)m.n_quant, (long long)b.n_used, (long long)b.n_quant);
                out = buf;
                break;
            }
            cuda_kv_head_from_view(c.view(il, g), [&](const void* host, size_t bytes, const char* name) -> void* {
                if (!out.empty()) return nullptr;
                void* dev = shared_array(c, host, name);
                cuda_kv_mirror::array* a = dev ? nullptr : mirror_find(m, name);
                if (!dev && (!a || a->d.size() < bytes)) {
                    std::snprintf(buf, sizeof buf, "layer %d head %d: %s: no device copy of %zu bytes", il, g, name,
                                  bytes);
                    out = buf;
                    return nullptr;
                }
                if (!dev) dev = a->d.data();
                std::vector<uint8_t> d(bytes);
                cuda_copy_to_host(d.data(), dev, bytes);
                const uint8_t* h = (const uint8_t*)host;
                for (size_t i = 0; i < bytes; i++)
                    if (d[i] != h[i]) {
                        std::snprintf(buf, sizeof buf,
                                      "layer %d head %d: %s: byte %zu of %zu is %d on the device, %d on the host", il,
                                      g, name, i, bytes, d[i], h[i]);
                        out = buf;
                        break;
                    }
                return dev;
            });
        }
    return out;
}

// A decode step's rows go into the device mirrors (kv_append_device), the
// host cache following at the pass's end, so the step never waits for the
// device until its logits. Otherwise (prefill, GEAR, sinks, a mirror without
// room) the rows come to the host and go into the host cache as on the CPU
// (one transfer per layer; the quantization is the CPU's), and the mirrors
// follow.
void backend_cuda::kv_append(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                             forward_buffers& fb) {
    const int64_t D = hp.head_dim, KV = hp.n_head_kv;
    int64_t n = 0;
    for (int i = 0; i < n_seqs; i++) n = std::max(n, seqs[i].row0 + seqs[i].n);
    if (il == 0) {
        // a pass that ended early (an exception) left its host appends undone:
        // those mirrors are ahead of their blocks; copy them whole again
        for (const cuda_kv_deferred& e : deferred_)
            for (auto& m : mirrors_[e.cache->id()]) m.edits = ~uint64_t(0);
        deferred_.clear();
        staged_ = 0;
        // staging for every layer of this pass (a decode step: a few hundred KiB at most)
        cuda_grow(d_stage_, (size_t)(hp.n_layer * 2 * n * KV * D), "staged cache rows");
    }
    bool slow = false;
    for (int i = 0; i < n_seqs; i++) {
        bs_fast_.resize((size_t)n_seqs);
        bs_fast_[(size_t)i] = kv_append_device(seqs[i], hp, il, fb);
        slow |= !bs_fast_[(size_t)i];
    }
    if (!slow) return;
    // the rest through the host cache: the rows come over, the host appends
    // (and quantizes), the mirrors copy what changed
    h_k_.resize((size_t)(n * KV * D));
    h_v_.resize((size_t)(n * KV * D));
    cuda_copy_to_host(h_k_.data(), fb.k.data(), h_k_.size() * sizeof(float));
    cuda_copy_to_host(h_v_.data(), fb.v.data(), h_v_.size() * sizeof(float));
    for (int i = 0; i < n_seqs; i++) {
        if (bs_fast_[(size_t)i]) continue;
        const backend_seq& sq = seqs[i];
        for (int g = 0; g < KV; g++) {
            sq.cache->append(il, g, sq.n, h_k_.data() + (sq.row0 * KV + g) * D, KV * D,
                             h_v_.data() + (sq.row0 * KV + g) * D, KV * D, fb.pos.data() + sq.row0,
                             kv_append_holds(sq));
            mirror_sync(*sq.cache, il, g);
        }
    }
}

// q~ = q R[:, :r_k] and k~ = k R[:, :r_k] per head, in place (the CPU
// backend's project_qk): queries at full head dim with exact sinks, keys at
// full head dim for the sink positions.
void backend_cuda::project_qk(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                              forward_buffers& fb) {
    const int D = hp.head_dim, H = hp.n_head, KV = hp.n_head_kv, G = hp.n_group();
    int64_t n = 0;
    for (int i = 0; i < n_seqs; i++) n = std::max(n, seqs[i].row0 + seqs[i].n);
    const int32_t* dpos = upload_pos(fb.pos.data(), n);
    for (int i = 0; i < n_seqs; i++) {
        const backend_seq& s = seqs[i];
        if (!s.compressed()) continue;
        std::vector<proj_layer>& layers = proj_[s.proj_q];
        if (layers.empty()) layers.resize((size_t)hp.n_layer);
        proj_layer& pl = layers[(size_t)il];
        const int sinks = s.cache->params().sinks;
        if (!pl.mats.size()) {
            // q's then k's matrix per KV head, [D x D] each, as the session stores them
            std::vector<float> m((size_t)KV * 2 * D * D);
            for (int g = 0; g < KV; g++) {
                const size_t h = (size_t)il * KV + g;
                std::memcpy(m.data() + (size_t)(2 * g) * D * D, (*s.proj_q)[h].data(), sizeof(float) * D * D);
                std::memcpy(m.data() + (size_t)(2 * g + 1) * D * D, (*s.proj_k)[h].data(), sizeof(float) * D * D);
            }
            pl.mats = device_array<float>(m, "projections");
            std::vector<dptr<const float>> qp((size_t)H), kp((size_t)KV);
            std::vector<int32_t> qr((size_t)H), kr((size_t)KV);
            for (int g = 0; g < KV; g++) {
                const int r_k = s.cache->block(il, g).r_k;
                kp[(size_t)g] = dptr<const float>(pl.mats.data() + (size_t)(2 * g + 1) * D * D);
                kr[(size_t)g] = r_k;
                for (int j = 0; j < G; j++) {
                    qp[(size_t)(g * G + j)] = dptr<const float>(pl.mats.data() + (size_t)(2 * g) * D * D);
                    qr[(size_t)(g * G + j)] = sinks > 0 ? D : r_k;
                }
            }
            pl.q_ptr = device_array<dptr<const float>>(qp, "projection pointers");
            pl.k_ptr = device_array<dptr<const float>>(kp, "projection pointers");
            pl.q_rank = device_array<int32_t>(qr, "projection ranks");
            pl.k_rank = device_array<int32_t>(kr, "projection ranks");
            if (s.k_shift) {
                std::vector<float> sh((size_t)KV * D);
                for (int g = 0; g < KV; g++)
                    std::memcpy(sh.data() + (size_t)g * D, (*s.k_shift)[(size_t)il * KV + g].data(), sizeof(float) * D);
                pl.k_shift = device_array<float>(sh, "mean keys");
            }
        }
        const dptr<const int32_t> pos(dpos);
        cuda_project_heads(dptr<float>(fb.q.data() + s.row0 * H * D), s.n, H, D, pl.q_ptr.cptr(),
                           pl.q_rank.cptr(), pos + s.row0, 0, nullptr, nullptr);
        cuda_project_heads(dptr<float>(fb.k.data() + s.row0 * KV * D), s.n, KV, D, pl.k_ptr.cptr(),
                           pl.k_rank.cptr(), pos + s.row0, sinks,
                           pl.k_shift.size() ? pl.k_shift.cptr() : dptr<const float>(nullptr), nullptr);
    }
}

void backend_cuda::attention(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                             forward_buffers& fb) {
    const int64_t D = hp.head_dim, H = hp.n_head, KV = hp.n_head_kv;
    const int G = hp.n_group();
    int64_t n = 0, max_tok = 0;
    bool compressed = false;
    for (int i = 0; i < n_seqs; i++) {
        // the device's decode kernel attends to every group (engine/kv_select.h is the CPU's)
        if (seqs[i].cache->params().select > 0)
            ZK_THROW("--kv-select (key-group selection) runs on the CPU backend only; drop it or use --device cpu");
        n = std::max(n, seqs[i].row0 + seqs[i].n);
        max_tok = std::max(max_tok, seqs[i].n);
        compressed |= seqs[i].compressed();
    }
    const dptr<const int32_t> pos(upload_pos(fb.pos.data(), n));
    // compressed heads write their first r_v channels (max(r_v, sink_dim));
    // W_o's folded rows for the rest must see zeros
    if (compressed) cuda_memset(fb.attn.data(), 0, (size_t)(n * H * D) * sizeof(float));
    // a prefill chunk's queries read the rows kept aside for them (kv_cache::view_attend;
    // a decode step's host append waits for pass_end, so the host's block may
    // still hold the last chunk's: asked only of segments that held)
    auto holds = [&](const backend_seq& s, int g) { return kv_append_holds(s) && s.cache->held(il, g); };
    size_t held = 0, held_at = 0;
    for (int i = 0; i < n_seqs; i++)
        for (int g = 0; g < KV; g++)
            if (holds(seqs[i], g)) held += held_bytes(*seqs[i].cache, il, g);
    uint8_t* held_base = held > 0 ? cuda_grow(d_held_, held, "rows held for a prefill chunk") : nullptr;
    items_.clear();
    for (int i = 0; i < n_seqs; i++) {
        const backend_seq& s = seqs[i];
        for (int g = 0; g < KV; g++) {
            std::vector<cuda_kv_mirror>& ms = mirrors_[s.cache->id()];
            ZK_ASSERT(!ms.empty());  // kv_append made it
            cuda_attn_item it;
            it.kv = holds(s, g) ? held_head(*s.cache, il, g, held_base, &held_at) : ms[(size_t)il * KV + g].head;
            it.q = dptr<const float>(fb.q.data() + (s.row0 * H + g * G) * D);
            it.q_stride = H * D;
            it.q_head_stride = D;
            it.n_group = G;
            it.n_tok = (int)s.n;
            it.q_pos = pos + s.row0;
            it.scale = hp.score_scale();
            it.out = dptr<float>(fb.attn.data() + (s.row0 * H + g * G) * D);
            it.out_stride = H * D;
            it.out_head_stride = D;
            items_.push_back(it);
        }
    }
    // the items and the plan go with the cache's new rows (kv_append), in one transfer
    const size_t ni = items_.size();
    auto queue = [this](auto& d, const auto& h, const char* what) {
        cuda_grow(d, h.size(), what);
        up_.add(d.data(), h.data(), h.size() * sizeof(h[0]));
    };
    queue(d_items_, items_, "attention items");
    if (max_tok <= k_matvec_max_tok) {
        int rows = 1;
        for (const cuda_attn_item& it : items_) rows = std::max(rows, it.n_tok * it.n_group);
        const cuda_attn_plan plan = cuda_attn_plan_make(items_, cuda_attn_fast_blocks_per_sm(rows) * dev_.sm_count);
        cuda_attn_plan_device dp;
        queue(d_tasks_, plan.tasks, "attention tasks");
        queue(d_parts_, plan.parts, "attention parts");
        queue(d_item_parts_, plan.item_parts, "attention parts");
        up_.send();
        dp.tasks = d_tasks_.cptr();
        dp.n_tasks = (int)plan.tasks.size();
        dp.parts = d_parts_.cptr();
        dp.item_parts = d_item_parts_.cptr();
        float* part = cuda_grow(d_partials_, (size_t)std::max<int64_t>(plan.partial_floats, 1), "partials");
        cuda_attention_decode(d_items_.cptr(), (int)ni, plan, dp, dptr<float>(part), nullptr);
    } else {
        const cuda_prefill_plan plan = cuda_prefill_plan_make(items_, k_prefill_rows_base, dev_.smem_per_block_optin);
        queue(d_ptasks_, plan.tasks, "prefill tasks");
        up_.send();
        cuda_attention_prefill(d_items_.cptr(), plan, d_ptasks_.cptr(), nullptr);
    }
}

}  // namespace zk
