// Batched decoding: several sequences (sessions on one model) advance by one
// token each per step, in one forward pass. The weight matmuls (QKV, O, FFN,
// output) run once over the B rows, so each weight block is loaded once for
// all of them, while every row keeps its own position, and every sequence its
// own KV cache (precision, ZACK compression, eviction policy) and attention;
// the attention tasks of all sequences share one longest-first schedule.
// Prompts are fed to each session alone (session::decode); a step is the same
// forward pass (engine/session.h) with one row per sequence.
#pragma once
#include <memory>
#include <vector>

#include "engine/session.h"

namespace zk {

class batch_decoder {
public:
    // seqs: not owned, distinct, on the same model; their parameters may differ
    // (each keeps its own cache and policy). Steps run on a pool of n_threads
    // (0 = the first session's thread count).
    explicit batch_decoder(const std::vector<session*>& seqs, int n_threads = 0);
    ~batch_decoder();
    batch_decoder(const batch_decoder&) = delete;
    batch_decoder& operator=(const batch_decoder&) = delete;

    // Feeds tokens[i] to sequence i at its position n_past() (tokens [B]) and
    // evicts per sequence as session::decode does after one token. Returns the
    // next-token logits [B x n_vocab], row i for sequence i. Throws, changing
    // nothing, if a token is invalid or a sequence's context is full.
    const float* step(const int32_t* tokens);

    int size() const { return (int)seqs_.size(); }
    session& seq(int i) const { return *seqs_[i]; }

private:
    std::vector<session*> seqs_;
    std::vector<forward_seq> rows_;  // [B]: sequence i owns row i
    std::unique_ptr<backend> be_;
    std::unique_ptr<forward_buffers> fb_;
    std::vector<float> logits_;  // [B x n_vocab]
};

}  // namespace zk
