#include "calib/corpus.h"

#include <algorithm>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "calib/progress.h"
#include "engine/batch.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "ggml-like/error.h"

namespace zk {

std::vector<std::string> corpus_read_files(const std::vector<std::string>& paths) {
    std::vector<std::string> out;
    for (const std::string& p : paths) {
        std::ifstream in(p, std::ios::binary);
        if (!in) ZK_THROW("%s: cannot open corpus file: %s", p.c_str(), std::strerror(errno));
        std::ostringstream ss;
        ss << in.rdbuf();
        if (in.bad()) ZK_THROW("%s: read error", p.c_str());
        std::string text = ss.str();
        if (text.find_first_not_of(" \t\r\n") == std::string::npos)
            ZK_THROW("%s: corpus file is empty", p.c_str());
        out.push_back(std::move(text));
    }
    return out;
}

const std::vector<std::string>& corpus_seed_prompts() {
    // Openings in different registers so that the generated text covers prose,
    // dialogue, technical explanation, lists, code and numbers, and also the
    // kinds of text a computer holds: legal and formal prose, manual pages,
    // READMEs, change logs, mail, C/Java/JS/shell/HTML/JSON/CSV. Sample i starts
    // from prompt i % 64, so the two groups are interleaved: a short corpus
    // still gets both. Replacing 32 narrower prompts by these (with 256 instead
    // of 512 tokens per sample, so that 16K tokens visit every prompt once)
    // lowered the mean KL at rate 0.1 / 0.3 from 0.131 / 0.581 to 0.090 / 0.428
    // (8K-token calibrations, joined samples, temperature 1; protocol and texts
    // in corpus_default_sampling).
    static const std::vector<std::string> prompts = {
        "The old lighthouse keeper had not seen a ship in eleven years, until one stormy night",
        "Section 1. Definitions.\n\nFor the purposes of this Agreement, the following terms shall have the meanings",
        "Photosynthesis is the process by which plants",
        "NAME\n       tar - an archiving utility\n\nSYNOPSIS\n       tar [OPTION...] [FILE]...\n\nDESCRIPTION\n",
        "Here is a step-by-step guide to baking sourdough bread at home.\n\n1.",
        "Abstract\n\nWe study the problem of",
        "Dear Grandma,\n\nThank you so much for the birthday present. This summer I",
        "## Installation\n\nTo install the package, run",
        "The history of the printing press begins in",
        "#include <stdio.h>\n#include <stdlib.h>\n\n/* Read a file line by line and",
        "def merge_sorted_lists(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n",
        "Changes in version 2.4.0 (2019-03-12)\n\n* Fixed a crash when",
        "Q: Why is the sky blue?\nA:",
        "From: Alice Johnson\nTo: Engineering Team\nSubject: Server migration this weekend\n\nHi all,\n\n",
        "In economics, inflation refers to",
        "WASHINGTON (Reuters) - The Senate on Tuesday",
        "\"Where were you last night?\" asked the detective, leaning across the table.",
        "Theorem 2. Let f be a continuous function on the closed interval [a, b]. Then",
        "The Amazon rainforest covers much of northwestern Brazil and",
        "function debounce(fn, delay) {\n  let timer;\n",
        "Top ten tips for staying productive while working from home:\n\n1.",
        "#!/bin/sh\n# Back up the home directory to an external drive.\nset -e\n",
        "Black holes form when massive stars",
        "{\n  \"name\": \"weather-station\",\n  \"version\": \"1.0.3\",\n",
        "Once upon a time, in a kingdom beyond the mountains, there lived a young girl who",
        "I have been using Linux for about five years now and I recently ran into a strange problem:",
        "To solve the equation 3x + 7 = 22, we first",
        "The committee shall meet at least four times a year. Minutes of each meeting",
        "Meeting notes, project kickoff, Monday:\n- Attendees:",
        "Warning: Do not operate this appliance",
        "The human immune system protects the body by",
        "Year,Country,Population,GDP (billion USD)\n2015,",
        "A review of the new smartphone: after two weeks of daily use,",
        "The autumn wind moves through the empty field,\n",
        "The French Revolution, which began in 1789,",
        "ACT I\n\nSCENE 1. A kitchen, early morning.\n\nMARY:",
        "SELECT name, COUNT(*) AS orders\nFROM customers\nJOIN",
        "Patient history: a 54-year-old man presented with",
        "My favourite place in the whole world is a small cafe on the corner of",
        "The court held that the defendant's",
        "Climate change affects ocean currents because",
        "Configuration\n-------------\n\nThe server reads its settings from /etc/",
        "Chapter 1\n\nThe train pulled into the station just after midnight, and",
        "public class BankAccount {\n    private double balance;\n\n",
        "The rules of chess are simple to learn: each player starts with sixteen pieces,",
        "The Treaty of Westphalia, signed in 1648,",
        "Water boils at a lower temperature at high altitude because",
        "Step 3: Configure the network interface\n\nOpen a terminal and",
        "Interviewer: What inspired you to become a scientist?\nDr. Patel:",
        "El sistema solar está formado por",
        "The following is a short biography of Marie Curie.",
        "User reviews\n\n5 stars. Great value for the price.\n",
        "How do vaccines work? In simple terms,",
        "<!DOCTYPE html>\n<html>\n<head>\n  <title>",
        "Product description: This lightweight hiking backpack",
        "Error: connection refused\n\nI get this error when I try to connect to the database from my application.",
        "Ancient Rome was founded, according to legend, by",
        "Table 3 shows the results of the experiment. The accuracy of the proposed method",
        "A beginner's introduction to machine learning: a model learns from data by",
        "Dear Sir or Madam,\n\nI am writing to apply for the position of",
        "The recipe calls for two cups of flour, one teaspoon of salt, and",
        "Mount Kilimanjaro is a dormant volcano in",
        "It was the first day of school, and Tom was nervous because",
        "Installing the software requires administrator rights. Before you begin, make sure that",
    };
    return prompts;
}

sampler_params corpus_default_sampling() {
    // Temperature 1 and no truncation: samples from the model's own distribution,
    // which carry the surprise of real text; a truncated low-temperature sampler
    // (temp 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat penalty 1.1, the
    // previous default) writes blander text whose statistics miss what real text
    // makes attention do. No repetition penalty: at temperature 1 loops are rare.
    // Measured (SmolLM2-135M, 8K calibration tokens, mean KL to the uncompressed
    // model at ZACK rate 0.1 / 0.3, tests/tool_kv_kl with a 256-token prompt and
    // 48 decode steps, over four texts that are neither licences nor generated:
    // Austen + Gettysburg + textwrap.py, perldiag.pod, argparse.py, IDLE's NEWS):
    // 0.133 / 0.722 with the old sampler, 0.122 / 0.552 with this one
    // (0.154 / 0.762 -> 0.131 / 0.581 with the samples joined).
    sampler_params s;
    s.temp = 1.0f;
    s.top_k = 0;
    s.top_p = 1.0f;
    s.min_p = 0.0f;
    s.repeat_penalty = 1.0f;
    s.repeat_last_n = 64;  // used only with --gen-repeat-penalty
    return s;
}

std::string corpus_describe_generation(const corpus_gen_params& p, size_t n_samples) {
    const sampler_params& s = p.sampling;
    return strfmt("generated by the source model: %zu samples from %zu seed prompts, seed %llu, "
                  "temp %g top-k %d top-p %g min-p %g repeat-penalty %g (last %d), up to %lld tokens each, "
                  "joined into one text",
                  n_samples, corpus_seed_prompts().size(), (unsigned long long)p.seed, (double)s.temp, (int)s.top_k,
                  (double)s.top_p, (double)s.min_p, (double)s.repeat_penalty, (int)s.repeat_last_n,
                  (long long)p.max_per_sample);
}

namespace {

// One sequence of the batched generator: a seed prompt being continued.
struct gen_slot {
    std::unique_ptr<session> s;
    std::unique_ptr<sampler> smp;
    utf8_stream out;
    size_t doc = 0;        // index of its sample in the returned documents
    int64_t n_prompt = 0;
    int64_t want = 0;      // tokens to generate at most
    int64_t n_gen = 0;
    int32_t pending = -1;  // sampled, not yet fed
    bool active = false;
};

}  // namespace

std::vector<std::string> corpus_generate(const model& m, const corpus_gen_params& p) {
    if (p.n_tokens <= 0)
        ZK_THROW_PARAM("calib.n_tokens", "calib.n_tokens must be positive, got %lld", (long long)p.n_tokens);
    if (p.max_per_sample <= 0) ZK_THROW("tokens per sample must be positive");
    if (p.n_parallel < 1 || p.n_parallel > 256)
        ZK_THROW_PARAM("calib.gen_parallel", "calib.gen_parallel must be between 1 and 256, got %d", p.n_parallel);
    sampler_params smp_p = p.sampling;
    sampler_validate_params(smp_p);
    const vocab& voc = *m.voc;
    const auto& prompts = corpus_seed_prompts();
    session_params sp;
    sp.n_threads = p.n_threads;
    sp.n_ctx = p.max_per_sample + 128;  // longest seed prompt is far below 128 tokens

    // Samples are decoded n_parallel at a time (engine/batch.h): each weight block
    // is read once per step for all of them. A batched step gives each sequence
    // the logits it would get alone (tests/test_batch.cpp), so sample i is the
    // same text as when generated alone; only the length of the last samples
    // depends on n_parallel, because a sample is sized when it starts from the
    // tokens not yet promised to running samples.
    std::vector<gen_slot> slots(p.n_parallel);
    std::vector<std::string> docs;
    int64_t committed = 0;  // tokens of finished samples
    int64_t promised = 0;   // prompt + want of running samples
    uint64_t next_sample = 0;
    calib_progress prog("generation", p.n_tokens, p.progress);

    auto produced = [&]() {
        int64_t t = committed;
        for (const gen_slot& g : slots)
            if (g.active) t += g.n_prompt + g.n_gen;
        return std::min(t, p.n_tokens);
    };
    auto finish = [&](gen_slot& g) {
        docs[g.doc] += g.out.flush();
        committed += g.n_prompt + g.n_gen;
        promised -= g.n_prompt + g.want;
        g.active = false;
    };
    // Takes a sampled token: ends the sample at end of generation or at its
    // length, otherwise leaves the token pending to be fed.
    auto take = [&](gen_slot& g, int32_t tok) {
        if (voc.is_eog(tok)) return finish(g);
        g.smp->accept(tok);
        g.n_gen++;
        docs[g.doc] += g.out.push(voc.token_to_piece(tok));
        if (g.n_gen >= g.want) return finish(g);
        g.pending = tok;
    };
    // Starts samples in an idle slot until one is running or the corpus is promised.
    auto start = [&](gen_slot& g) {
        while (!g.active && committed + promised < p.n_tokens) {
            const uint64_t i = next_sample++;
            const std::string& prompt = prompts[i % prompts.size()];
            const std::vector<int32_t> ids = voc.encode(prompt, /*add_special=*/true, /*parse_special=*/false);
            if (!g.s) g.s = std::make_unique<session>(m, sp);
            g.s->reset();
            smp_p.seed = p.seed + i;
            g.smp = std::make_unique<sampler>(smp_p, m.hp.n_vocab);
            g.out = utf8_stream();
            g.doc = docs.size();
            docs.push_back(prompt);
            g.n_prompt = (int64_t)ids.size();
            g.want = std::min(p.max_per_sample, std::max<int64_t>(1, p.n_tokens - committed - promised - g.n_prompt));
            g.n_gen = 0;
            g.active = true;
            promised += g.n_prompt + g.want;
            const float* logits = g.s->decode(ids.data(), g.n_prompt);
            for (int32_t t : ids) g.smp->accept(t);
            take(g, g.smp->sample(logits));
        }
    };

    for (gen_slot& g : slots) start(g);
    std::unique_ptr<batch_decoder> bd;
    std::vector<gen_slot*> running, now;  // reused: no allocation per step
    std::vector<int32_t> tokens;
    for (;;) {
        now.clear();
        for (gen_slot& g : slots)
            if (g.active) now.push_back(&g);
        if (now.empty()) break;
        if (now != running) {  // only at the end, when slots stop being refilled
            running = now;
            std::vector<session*> seqs;
            for (gen_slot* g : running) seqs.push_back(g->s.get());
            bd = std::make_unique<batch_decoder>(seqs, p.n_threads);
            tokens.resize(running.size());
        }
        for (size_t r = 0; r < running.size(); r++) tokens[r] = running[r]->pending;
        const float* logits = bd->step(tokens.data());
        for (size_t r = 0; r < running.size(); r++) {
            gen_slot& g = *running[r];
            take(g, g.smp->sample(logits + r * (size_t)m.hp.n_vocab));
            if (!g.active) start(g);
        }
        prog.update(produced());
    }
    prog.finish(committed);
    return docs;
}

std::string corpus_join(const std::vector<std::string>& samples) {
    std::string out;
    for (const std::string& t : samples) out += t + "\n\n";
    return out;
}

std::vector<std::vector<int32_t>> corpus_tokenize(const model& m, const std::vector<std::string>& docs) {
    std::vector<std::vector<int32_t>> out;
    for (const std::string& d : docs) out.push_back(m.voc->encode(d, /*add_special=*/false, /*parse_special=*/false));
    return out;
}

std::vector<std::vector<int32_t>> corpus_take_tail(std::vector<std::vector<int32_t>>& docs, int64_t n) {
    std::vector<std::vector<int32_t>> tail;
    while (n > 0 && !docs.empty()) {
        std::vector<int32_t>& d = docs.back();
        if ((int64_t)d.size() <= n) {
            n -= (int64_t)d.size();
            tail.push_back(std::move(d));
            docs.pop_back();
        } else {
            tail.emplace_back(d.end() - n, d.end());
            d.resize(d.size() - (size_t)n);
            n = 0;
        }
    }
    std::reverse(tail.begin(), tail.end());
    return tail;
}

}  // namespace zk
