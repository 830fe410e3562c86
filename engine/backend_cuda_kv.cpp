// The CUDA backend's attention side (engine/backend_cuda.h): the q/k
// projection of compressed heads, KV append through the host cache into its
// device mirror, and attention: a decode step's (sequence, KV head) items
// split into equal-cost slot ranges (flash-decoding, kernels/cuda/
// attention_decode.h), a prefill chunk's in tiles of equal work
// (attention_prefill.h).
#include <cstring>

#include "engine/backend_cuda.h"
#include "engine/kv_cache.h"
#include "ggml-like/error.h"
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
    } st{&m, &up_, whole, flushed};
    const auto* sp = &st;
    m.head = cuda_kv_head_from_view(c.view(il, g), [sp](const void* host, size_t bytes, const char* name) -> void* {
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
            // twice the size: a growing cache is copied whole O(log n) times
            a->d = device_array<uint8_t>(std::max(bytes, 2 * a->d.size()), name);
            a->synced = 0;
        }
        const size_t from = sp->whole || (sp->flushed && moves_on_flush(name)) ? 0 : std::min(a->synced, bytes);
        if (bytes > from) sp->up->add(a->d.data() + from, (const uint8_t*)host + from, bytes - from);
        a->synced = bytes;
        return a->d.data();
    });
    m.edits = b.edits;
    m.n_quant = b.n_quant;
    return m;
}

// The new rows' k and v come to the host, go into the host cache as on the
// CPU (one transfer per layer; the quantization is the CPU's), and the
// mirrors follow.
void backend_cuda::kv_append(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                             forward_buffers& fb) {
    const int64_t D = hp.head_dim, KV = hp.n_head_kv;
    int64_t n = 0;
    for (int i = 0; i < n_seqs; i++) n = std::max(n, seqs[i].row0 + seqs[i].n);
    h_k_.resize((size_t)(n * KV * D));
    h_v_.resize((size_t)(n * KV * D));
    cuda_copy_to_host(h_k_.data(), fb.k.data(), h_k_.size() * sizeof(float));
    cuda_copy_to_host(h_v_.data(), fb.v.data(), h_v_.size() * sizeof(float));
    for (int i = 0; i < n_seqs; i++) {
        const backend_seq& sq = seqs[i];
        for (int g = 0; g < KV; g++) {
            sq.cache->append(il, g, sq.n, h_k_.data() + (sq.row0 * KV + g) * D, KV * D,
                             h_v_.data() + (sq.row0 * KV + g) * D, KV * D, fb.pos.data() + sq.row0);
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
        }
        const dptr<const int32_t> pos(dpos);
        cuda_project_heads(dptr<float>(fb.q.data() + s.row0 * H * D), s.n, H, D, pl.q_ptr.cptr(),
                           pl.q_rank.cptr(), pos + s.row0, 0, nullptr);
        cuda_project_heads(dptr<float>(fb.k.data() + s.row0 * KV * D), s.n, KV, D, pl.k_ptr.cptr(),
                           pl.k_rank.cptr(), pos + s.row0, sinks, nullptr);
    }
}

void backend_cuda::attention(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                             forward_buffers& fb) {
    const int64_t D = hp.head_dim, H = hp.n_head, KV = hp.n_head_kv;
    const int G = hp.n_group();
    int64_t n = 0, max_tok = 0;
    bool compressed = false;
    for (int i = 0; i < n_seqs; i++) {
        n = std::max(n, seqs[i].row0 + seqs[i].n);
        max_tok = std::max(max_tok, seqs[i].n);
        compressed |= seqs[i].compressed();
    }
    const dptr<const int32_t> pos(upload_pos(fb.pos.data(), n));
    // compressed heads write their first r_v channels (max(r_v, sink_dim));
    // W_o's folded rows for the rest must see zeros
    if (compressed) cuda_memset(fb.attn.data(), 0, (size_t)(n * H * D) * sizeof(float));
    items_.clear();
    for (int i = 0; i < n_seqs; i++) {
        const backend_seq& s = seqs[i];
        for (int g = 0; g < KV; g++) {
            std::vector<cuda_kv_mirror>& ms = mirrors_[s.cache->id()];
            ZK_ASSERT(!ms.empty());  // kv_append made it
            cuda_attn_item it;
            it.kv = ms[(size_t)il * KV + g].head;
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
        const cuda_attn_plan plan = cuda_attn_plan_make(items_, 2 * dev_.sm_count);
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
