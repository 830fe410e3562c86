#include "engine/batch.h"

#include <algorithm>

#include "ggml-like/error.h"

namespace zk {

batch_decoder::batch_decoder(const std::vector<session*>& seqs, int n_threads) : seqs_(seqs) {
    if (seqs_.empty()) ZK_THROW("batch_decoder needs at least one session");
    const model& m = seqs_[0]->mdl();
    int64_t cap = 1;
    int gear_rank = 0;
    bool observe = false;
    for (size_t i = 0; i < seqs_.size(); i++) {
        session* s = seqs_[i];
        if (!s) ZK_THROW("batch_decoder: session %zu is null", i);
        if (&s->mdl() != &m)
            ZK_THROW("batch_decoder: session %zu runs %s, session 0 runs %s (one model per batch)", i,
                     s->mdl().file->path().c_str(), m.file->path().c_str());
        for (size_t j = 0; j < i; j++)
            if (seqs_[j] == s) ZK_THROW("batch_decoder: session %zu is also session %zu", i, j);
        const kv_cache_params& kp = s->cache().params();
        cap = std::max(cap, s->cache().capacity());
        if (kp.gear) gear_rank = std::max(gear_rank, kp.gear_rank);
        observe |= s->policy_->needs_attention();
        rows_.push_back(forward_seq{s, (int64_t)i, 1});
    }
    if (n_threads == 0) n_threads = seqs_[0]->params().n_threads;
    if (n_threads < 1 || n_threads > 512) ZK_THROW("thread count must be between 1 and 512, got %d", n_threads);
    // Each sequence splits its heads into as many slot ranges as it would on
    // its own threads: the buffers must hold that many for every one.
    int split_threads = n_threads;
    for (session* s : seqs_) split_threads = std::max(split_threads, s->params().n_threads);
    const int B = size();
    // the sequences' device: every session of a batch runs on one
    const backend_device dev = seqs_[0]->params().device;
    for (size_t i = 1; i < seqs_.size(); i++)
        if (seqs_[i]->params().device != dev)
            ZK_THROW("batch_decoder: session %zu runs on %s, session 0 on %s (one device per batch)", i,
                     backend_device_name(seqs_[i]->params().device), backend_device_name(dev));
    be_ = backend_create(backend_params{dev, n_threads});
    fb_ = be_->buffers_create(m.hp, B, B, split_threads, cap, gear_rank, observe);
    for (session* s : seqs_) fb_->reserve_select(kv_select_sizes_max(s->cache(), m.hp.n_group()));
    logits_.resize((size_t)B * m.hp.n_vocab);
}

batch_decoder::~batch_decoder() = default;

const float* batch_decoder::step(const int32_t* tokens) {
    const int B = size();
    for (int i = 0; i < B; i++) seqs_[i]->check_tokens(tokens + i, 1);
    for (int i = 0; i < B; i++) seqs_[i]->evict_before(1);
    session::forward(rows_.data(), B, tokens, false, logits_.data(), *fb_, *be_);
    for (int i = 0; i < B; i++) seqs_[i]->evict_after(1);
    return logits_.data();
}

}  // namespace zk
