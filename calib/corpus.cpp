#include "calib/corpus.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "calib/progress.h"
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
    // dialogue, technical explanation, lists, code and numbers.
    static const std::vector<std::string> prompts = {
        "The old lighthouse keeper had not seen a ship in eleven years, until one stormy night",
        "Photosynthesis is the process by which plants",
        "Here is a step-by-step guide to baking sourdough bread at home.\n\n1.",
        "Dear Grandma,\n\nThank you so much for the birthday present. This summer I",
        "The history of the printing press begins in",
        "def merge_sorted_lists(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n",
        "Q: Why is the sky blue?\nA:",
        "In economics, inflation refers to",
        "\"Where were you last night?\" asked the detective, leaning across the table.",
        "The Amazon rainforest covers much of northwestern Brazil and",
        "Top ten tips for staying productive while working from home:\n\n1.",
        "Black holes form when massive stars",
        "Once upon a time, in a kingdom beyond the mountains, there lived a young girl who",
        "To solve the equation 3x + 7 = 22, we first",
        "Meeting notes, project kickoff, Monday:\n- Attendees:",
        "The human immune system protects the body by",
        "A review of the new smartphone: after two weeks of daily use,",
        "The French Revolution, which began in 1789,",
        "SELECT name, COUNT(*) AS orders\nFROM customers\nJOIN",
        "My favourite place in the whole world is a small cafe on the corner of",
        "Climate change affects ocean currents because",
        "Chapter 1\n\nThe train pulled into the station just after midnight, and",
        "The rules of chess are simple to learn: each player starts with sixteen pieces,",
        "Water boils at a lower temperature at high altitude because",
        "Interviewer: What inspired you to become a scientist?\nDr. Patel:",
        "The following is a short biography of Marie Curie.",
        "How do vaccines work? In simple terms,",
        "Product description: This lightweight hiking backpack",
        "Ancient Rome was founded, according to legend, by",
        "A beginner's introduction to machine learning: a model learns from data by",
        "The recipe calls for two cups of flour, one teaspoon of salt, and",
        "It was the first day of school, and Tom was nervous because",
    };
    return prompts;
}

std::vector<std::string> corpus_generate(const model& m, const corpus_gen_params& p) {
    if (p.n_tokens <= 0) ZK_THROW("--tokens must be positive, got %lld", (long long)p.n_tokens);
    if (p.max_per_sample <= 0) ZK_THROW("tokens per sample must be positive");
    const vocab& voc = *m.voc;
    const auto& prompts = corpus_seed_prompts();
    session_params sp;
    sp.n_threads = p.n_threads;
    sp.n_ctx = p.max_per_sample + 128;  // longest seed prompt is far below 128 tokens
    session s(m, sp);
    // Moderate temperature with nucleus/min-p filtering and a light repetition
    // penalty: coherent text that does not fall into loops (loops would repeat the
    // same vectors and skew the statistics).
    sampler_params smp_p;
    smp_p.temp = 0.8f;
    smp_p.top_k = 40;
    smp_p.top_p = 0.95f;
    smp_p.min_p = 0.05f;
    smp_p.repeat_penalty = 1.1f;
    smp_p.repeat_last_n = 64;

    std::vector<std::string> docs;
    int64_t total = 0;
    calib_progress prog("generation", p.n_tokens, p.progress);
    for (uint64_t i = 0; total < p.n_tokens; i++) {
        const std::string& prompt = prompts[i % prompts.size()];
        std::vector<int32_t> ids = voc.encode(prompt, /*add_special=*/true, /*parse_special=*/false);
        smp_p.seed = p.seed + i;
        sampler smp(smp_p, m.hp.n_vocab);
        s.reset();
        const int64_t want = std::min(p.max_per_sample, std::max<int64_t>(1, p.n_tokens - total - (int64_t)ids.size()));
        const int64_t base = total;
        std::string text = prompt;
        const generate_stats st = generate_run(
            s, smp, ids, want,
            [&](const std::string&) { prog.update(std::min(p.n_tokens, base + s.n_past())); },
            nullptr);
        text += st.text;
        total += st.n_prompt + st.n_gen;
        prog.update(std::min(total, p.n_tokens));
        docs.push_back(std::move(text));
    }
    prog.finish(total);
    return docs;
}

std::vector<std::vector<int32_t>> corpus_tokenize(const model& m, const std::vector<std::string>& docs) {
    std::vector<std::vector<int32_t>> out;
    for (const std::string& d : docs) out.push_back(m.voc->encode(d, /*add_special=*/false, /*parse_special=*/false));
    return out;
}

}  // namespace zk
