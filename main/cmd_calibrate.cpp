// `zack calibrate`: build a .zack from a GGUF model and a corpus (user text
// files, or text the model generates), or compare the rotations of two .zack
// files (stability).
//
//   zack calibrate -m SOURCE.gguf -o OUT.zack [--corpus FILE ...] [--tokens N] [--ctx N]
//                  [-t N] [--rank-align A] [--compare OTHER.zack]
//                  [--seed S] [--gen-temp T] [--gen-top-k K] [--gen-top-p P] [--gen-min-p P]
//                  [--gen-repeat-penalty R] [--gen-len N] [--gen-parallel N] [--save-corpus FILE]
//   zack calibrate -m A.zack --compare B.zack       (compare only; no -o)
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <exception>
#include <fstream>
#include <thread>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "calib/calibrate.h"
#include "calib/compare.h"
#include "calib/corpus.h"
#include "calib/ranks.h"
#include "calib/plan.h"
#include "calib/codebook.h"
#include "calib/layer_gain.h"
#include "calib/rank_fit.h"
#include "calib/sensitivity.h"
#include "calib/sha256.h"
#include "calib/zack_file.h"
#include "engine/model.h"
#include "ggml-like/error.h"
#include "ggml-like/threadpool.h"
#include "ggml-like/file_out.h"
#include "main/commands.h"

namespace zk {

void options_add_calibrate(CLI::App& app, calibrate_opts& o) {
    app.add_option("-m,--model", o.model_path, "source model (.gguf); with --compare and no -o: a .zack")->required();
    app.add_option("-o,--output", o.out_path, "the .zack file to write");
    app.add_option("--corpus", o.corpus,
                   "calibration text file(s); default: text the model generates from 64 varied seed prompts "
                   "(--gen-* options), joined into one text")
        ->expected(1, -1);
    app.add_option("--tokens", o.n_tokens, "calibration tokens (the paper finds 16K+ enough)")
        ->check(CLI::Range(int64_t(1), int64_t(1) << 32));
    app.add_option("--ctx", o.n_ctx, "tokens per window of the statistics pass (cache reset between windows)")
        ->check(CLI::Range(int64_t(2), int64_t(1) << 20));
    app.add_option("-t,--threads", o.n_threads, "threads (0 = all hardware threads)")->check(CLI::Range(0, 512));
    app.add_option("--rank-align", o.rank_align, "ranks are multiples of this (zack.rank_align)")
        ->check(CLI::Range(1, 1024));
    app.add_option("--seed", o.seed, "sampler seed of the generated default corpus");
    app.add_option("--gen-temp", o.gen.temp, "generated corpus: sampling temperature")->check(CLI::Range(0.0f, 10.0f));
    app.add_option("--gen-top-k", o.gen.top_k, "generated corpus: top-k (0 = off)")->check(CLI::Range(0, 1 << 30));
    app.add_option("--gen-top-p", o.gen.top_p, "generated corpus: top-p (1 = off)")->check(CLI::Range(1e-6f, 1.0f));
    app.add_option("--gen-min-p", o.gen.min_p, "generated corpus: min-p (0 = off)")->check(CLI::Range(0.0f, 0.999f));
    app.add_option("--gen-repeat-penalty", o.gen.repeat_penalty, "generated corpus: repetition penalty (1 = off)")
        ->check(CLI::Range(0.01f, 10.0f));
    app.add_option("--gen-len", o.gen_len, "generated corpus: tokens generated per seed prompt at most")
        ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
    app.add_option("--gen-parallel", o.gen_parallel,
                   "generated corpus: samples decoded together in one batch (same text, faster)")
        ->check(CLI::Range(1, 256));
    app.add_option("--save-corpus", o.save_corpus, "write the generated default corpus to this text file");
    app.add_option("--compare", o.compare_path, "report how far this .zack's rotations are from the new (or -m) one");
    app.add_option("--compare-rate", o.compare_rate, "overall rate whose ranks the comparison uses");
    app.add_option("--v-stat", o.v_stat,
                   "V statistic: attn (attention outputs, what W_o multiplies) or v (value vectors, as the paper)")
        ->check(CLI::IsMember({"attn", "v"}));
    app.add_option("--sens-tokens", o.sens_tokens,
                   "tokens of the corpus for the sensitivity pass that --kv-alloc sensitivity uses (0 = none)")
        ->check(CLI::Range(int64_t(0), int64_t(1) << 24));
    app.add_option("--sens-stride", o.sens_stride, "sensitivity pass: every N-th token of a window is a measured query")
        ->check(CLI::Range(1, 1 << 16));
    app.add_option("--value-codes", o.vq_rows,
                   "value rows a KV head on which the codebooks of vector-coded values (plans' value precisions 1 and 0) "
                   "are trained, sampled over the statistics pass (0 = none; they are held in memory, n_layer x "
                   "n_kv x head_dim floats a row)")
        ->check(CLI::Range(int64_t(0), int64_t(65536)));
    app.add_option("--fit-tokens", o.fit_tokens,
                   "tokens set aside from the end of the corpus (at most a third) on which the weight of rank "
                   "losses against quantization losses in KV plans is chosen end to end (0 = none: weight 1)")
        ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
    app.add_option("--gain-tokens", o.gain_tokens,
                   "tokens set aside from the end of the corpus (the larger of this and --fit-tokens, at most a "
                   "third of it) on which each layer's cost in KV plans is measured end to end: a plan run with each "
                   "layer exact in turn, in windows of up to 2048 tokens (0 = none: plans add up the sensitivity "
                   "pass's losses as they are; default: 4096 with --kv-target or --gain-target, else 0)")
        ->check(CLI::Range(int64_t(0), int64_t(1) << 20))
        ->default_str("auto");  // -1 inside: resolved in cmd_calibrate
    app.add_option("--gain-target", o.gain_target,
                   "the plan (fraction of the f16 cache) the layer gains are measured at (default: the least "
                   "--kv-target, else the rank-weight fit's)")
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--kv-target", o.kv_targets,
                   "record KV plans (precision + ranks) predicted for these fractions of the f16 cache, each in "
                   "(0, 1]; run/bench/eval --kv-plan F uses one")
        ->expected(1, -1)->delimiter(',');
    app.add_flag("--kv-kivi-keys", o.kv_kivi_keys,
                 "with --kv-target: plans keep every head's keys in 4- or 2-bit KIVI codes, whose grids --kv-select "
                 "chooses from (a head with 8- or 16-bit keys scores every slot to choose)");
    app.add_option("--kv-group", o.kv_group,
                   "KIVI group (tokens per key grid) the sensitivity pass measures and the plans are made for: 32 "
                   "or 64")
        ->check(CLI::IsMember({32, 64}));
    app.add_flag("-q,--quiet", o.quiet, "no progress lines");
}

namespace {

int run_compare(const std::string& path_a, const std::string& path_b, double rate, int align) {
    ranks_validate_rate(rate);
    auto fa = gguf_file::open(path_a);
    auto fb = gguf_file::open(path_b);
    const zack_calibration a = zack_file_read_calibration(*fa);
    const zack_calibration b = zack_file_read_calibration(*fb);
    const int al = (int)fa->get_int("zack.rank_align", align);
    const compare_result r = compare_calibrations(a, b, rate, std::min(al, a.d));
    compare_print(stdout, r, path_a.c_str(), path_b.c_str());
    return 0;
}

std::string join_names(const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); i++) {
        const size_t sl = v[i].find_last_of('/');
        s += (i ? ", " : "") + (sl == std::string::npos ? v[i] : v[i].substr(sl + 1));
    }
    return s;
}

}  // namespace

int cmd_calibrate(const calibrate_opts& o) {
    if (o.out_path.empty()) {
        if (o.compare_path.empty())
            ZK_THROW("calibrate needs -o OUT.zack (or, to compare two .zack files, -m A.zack --compare B.zack)");
        return run_compare(o.model_path, o.compare_path, o.compare_rate, o.rank_align);
    }
    if (!o.compare_path.empty()) ranks_validate_rate(o.compare_rate);
    // Outputs are checked before the long work (file_out refuses devices, directories).
    const std::string out_target = file_out_check(o.out_path);
    if (!o.save_corpus.empty()) file_out_check(o.save_corpus);
    char* src_real = realpath(o.model_path.c_str(), nullptr);
    char* out_real = realpath(out_target.c_str(), nullptr);
    const bool same = src_real && out_real && std::string(src_real) == out_real;
    std::free(src_real);
    std::free(out_real);
    if (same || o.out_path == o.model_path)
        ZK_THROW("%s: the output would overwrite the source model", o.out_path.c_str());
    for (double t : o.kv_targets) plan_validate_target(t);
    if (o.kv_kivi_keys && o.kv_targets.empty()) ZK_THROW("--kv-kivi-keys goes with --kv-target");
    if (!o.kv_targets.empty() && o.sens_tokens == 0)
        ZK_THROW("--kv-target needs the sensitivity pass (--sens-tokens > 0)");
    // Read the corpus (or check the generation sampler) before the model: bad input fails fast.
    std::vector<std::string> texts;
    if (!o.corpus.empty()) texts = corpus_read_files(o.corpus);
    else sampler_validate_params(o.gen);

    auto m = model_load(o.model_path);
    if (m->zack.present || zack_file_is_zack(*m->file))
        ZK_THROW("%s is a .zack file: calibrate the source GGUF it was made from (zack.source.name = %s)",
                 o.model_path.c_str(), m->file->get_str("zack.source.name", "?").c_str());
    if (o.rank_align > m->hp.head_dim)
        ZK_THROW("--rank-align %d is larger than the head dim %d", o.rank_align, m->hp.head_dim);
    const int n_threads = o.n_threads > 0 ? o.n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
    std::fprintf(stderr, "zack calibrate: %s\n", model_describe(*m).c_str());

    std::string corpus_desc;
    const int64_t gain_tokens =
        o.gain_tokens >= 0 ? o.gain_tokens : !o.kv_targets.empty() || o.gain_target > 0 ? o.gain_tokens_with_plans : 0;
    const int64_t held_tokens = std::max(o.fit_tokens, gain_tokens);  // the fit's and the gains' windows
    if (texts.empty()) {
        corpus_gen_params gp;
        // A small margin: the text is re-tokenized and each window adds a BOS.
        // ... and the text the rank-weight fit sets aside (below), up to half as much again
        gp.n_tokens = o.n_tokens + o.n_tokens / 32 + 64 + (o.sens_tokens > 0 ? std::min(held_tokens, o.n_tokens / 2) : 0);
        gp.seed = o.seed;
        gp.sampling = o.gen;
        gp.max_per_sample = o.gen_len;
        gp.n_parallel = o.gen_parallel;
        gp.n_threads = n_threads;
        gp.progress = !o.quiet;
        const std::vector<std::string> samples = corpus_generate(*m, gp);
        corpus_desc = corpus_describe_generation(gp, samples.size());
        texts = {corpus_join(samples)};
        if (!o.save_corpus.empty()) file_out_write(o.save_corpus, texts[0]);
    } else {
        corpus_desc = "files: " + join_names(o.corpus);
    }
    std::vector<std::vector<int32_t>> docs = corpus_tokenize(*m, texts);
    // The rank-weight fit and the layer gains measure on the end of the corpus, which the
    // statistics and the sensitivity pass then never see (in-sample, rank cuts look cheaper
    // than they are): at most a third of it, and none below 256 tokens.
    std::vector<std::vector<int32_t>> fit_docs;
    if (held_tokens > 0 && o.sens_tokens > 0) {
        int64_t total = 0;
        for (const auto& d : docs) total += (int64_t)d.size();
        const int64_t n_fit = std::min<int64_t>(held_tokens, total / 3);
        if (n_fit >= 256)
            fit_docs = corpus_take_tail(docs, n_fit);
        else
            std::fprintf(stderr, "zack calibrate: note: a corpus of %lld tokens is too short to set %lld aside for the "
                         "rank-weight fit and the layer gains; plans weigh rank and quantization losses 1:1, and "
                         "layers as the sensitivity pass measured them\n",
                         (long long)total, (long long)held_tokens);
    }

    calib_params cp;
    cp.n_tokens = o.n_tokens;
    cp.n_ctx = o.n_ctx;
    cp.n_threads = n_threads;
    cp.progress = !o.quiet;
    gram_accumulator acc(m->hp, nullptr, gram_v_stat_from_name(o.v_stat));
    acc.set_key_group(o.kv_group);
    // value rows for the codebooks, spread evenly over the statistics pass
    value_sampler vs(m->hp, o.vq_rows, o.vq_rows > 0 ? std::max<int64_t>(1, o.n_tokens / o.vq_rows) : 1);
    calib_observer_tee tee(acc, vs);
    // Windows spread over the whole corpus, as the sensitivity pass takes them: from
    // its start alone, several --corpus files of which the first holds --tokens feed
    // that file only. The value codebooks depend on the kind of text most
    // (Qwen2.5-Coder-1.5B, books from licence text: row error 0.16 on more licence,
    // 0.23 on Python and Node.js docs at 4 x 64, 0.24 / 0.39 at 8 x 256).
    const bool bos = m->voc->add_bos() && m->voc->bos() >= 0;
    const std::vector<std::vector<int32_t>> windows =
        calib_spread_windows(docs, o.n_ctx - (bos ? 1 : 0), o.n_tokens, bos ? 1 : 0);
    const int64_t fed =
        o.vq_rows > 0 ? calib_feed(*m, windows, cp, tee, "statistics") : calib_collect(*m, windows, cp, acc);
    if (fed < o.n_tokens)
        std::fprintf(stderr, "zack calibrate: note: the corpus gave %lld tokens, fewer than --tokens %lld\n",
                     (long long)fed, (long long)o.n_tokens);
    if (fed < 16384)
        std::fprintf(stderr, "zack calibrate: note: %lld calibration tokens; rotations stabilize from about 16K "
                     "(paper, section 6.6)\n", (long long)fed);

    zack_calibration c = calib_decompose(*m, acc);
    c.n_ctx = o.n_ctx;
    c.corpus = corpus_desc + "; V statistic: " + o.v_stat;
    for (int code = KV_VQ_CODES - 1; code >= 0 && o.vq_rows > 0; code--) {  // 4 x 64, then 8 x 256
        vq_train_params vp = vq_train_params_for(code);
        vp.max_rows = o.vq_rows;
        if (m->hp.head_dim % vp.c) {
            std::fprintf(stderr, "zack calibrate: note: the head dim %d is not a multiple of %d channels a code; this "
                         ".zack will have no %d x %d value codes (precision %d)\n", (int)m->hp.head_dim, vp.c, vp.c,
                         vp.K, code);
        } else if (vs.n_rows(0) < 4 * vp.K) {
            std::fprintf(stderr, "zack calibrate: note: %lld value rows a head are too few for %d-centroid codebooks "
                         "(%d needed); this .zack will have no %d x %d value codes (precision %d)\n",
                         (long long)vs.n_rows(0), vp.K, 4 * vp.K, vp.c, vp.K, code);
        } else {
            const auto t_vq = std::chrono::steady_clock::now();
            thread_pool pool(n_threads);
            const vq_train_report r = calib_train_codebooks(c, code, vs, vp, &pool);
            if (!o.quiet) {
                char held[96] = "";
                if (r.heldout_rows > 0)
                    std::snprintf(held, sizeof held, ", %.3f on %lld held-out rows", r.heldout_err,
                                  (long long)r.heldout_rows);
                std::fprintf(stderr, "zack calibrate: value codebooks (%d channels x %d centroids, %lld rows a head): "
                             "row error %.3f on them%s, in %.1f s\n", vp.c, vp.K, (long long)r.train_rows,
                             r.train_err, held,
                             std::chrono::duration<double>(std::chrono::steady_clock::now() - t_vq).count());
            }
            // k-means learns its rows rather than the source when a centroid has few of them
            if (r.heldout_err > 1.2 * r.train_err)
                std::fprintf(stderr, "zack calibrate: note: the %d x %d value codes code held-out rows %.0f%% worse "
                             "than their training rows (%.1f rows a centroid); more --tokens and --value-codes "
                             "would make them generalise better\n", vp.c, vp.K,
                             100.0 * (r.heldout_err / r.train_err - 1.0), (double)r.train_rows / vp.K);
        }
    }
    if (o.sens_tokens > 0) {
        // Loss curves per head and rank for the allocation (--kv-alloc sensitivity), on
        // windows spread over the same corpus.
        calib_params sp = cp;
        sp.n_tokens = o.sens_tokens;
        sens_params sens;
        sens.query_stride = o.sens_stride;
        sens.ranks = sens_default_ranks(m->hp.head_dim, o.rank_align);
        sens.group = sens.widths_group = o.kv_group;
        std::vector<float> vq_dec[KV_VQ_CODES];
        kv_vq_books books[KV_VQ_CODES];
        for (int code = 0; code < KV_VQ_CODES; code++) {
            books[code] = calib_codebooks_view(c, code, vq_dec[code]);
            if (!books[code].heads.empty()) sens.vq[code] = &books[code];
        }
        c.sens = calib_sensitivity(*m, c, docs, sp, sens);
        c.sens.group = o.kv_group;
        // Whether each plan asked for fits is known now: a plan's size depends on its heads'
        // options, which the rank-weight fit and the layer gains (most of the time left) only
        // re-weigh. So an infeasible --kv-target or --gain-target fails here, not at the end.
        plan_inputs in = zack_calibration_plan_inputs(c);
        in.kivi_keys = o.kv_kivi_keys;
        std::vector<std::pair<const char*, double>> asked;
        for (double t : o.kv_targets) asked.emplace_back("--kv-target", t);
        if (o.gain_target > 0 && gain_tokens > 0) asked.emplace_back("--gain-target", o.gain_target);
        for (const auto& [flag, t] : asked) {
            try {
                (void)plan_for_target(in, t);
            } catch (const std::exception& e) {
                ZK_THROW("%s %g: %s", flag, t, e.what());
            }
        }
    }
    zack_write_params wp;
    wp.rank_align = o.rank_align;
    if (!fit_docs.empty() && zack_calibration_fits_rank_weight(c)) {
        wp.source_sha256 = sha256_file_hex(m->file->path());  // for both files written
        // the fit and the gains run the .zack itself: written first to a temporary
        // file next to the output, loaded, measured, removed
        const file_scratch fit_file(out_target, "rankfit");
        zack_file_write(*m, c, wp, fit_file.path());
        const auto zm = model_load(fit_file.path());
        plan_inputs fit_in = zack_calibration_plan_inputs(c);
        fit_in.kivi_keys = o.kv_kivi_keys;  // fitted on the kind of plan the file records
        double fit_target = 0;
        if (o.fit_tokens > 0) {
            // the weight of rank losses in plans, end to end
            const auto t_fit = std::chrono::steady_clock::now();
            rank_fit_params fp;
            fp.n_tokens = o.fit_tokens;
            fp.n_ctx = std::min<int64_t>(o.fit_tokens, 3072);
            fp.n_score = fp.n_ctx / 4;
            fp.n_threads = n_threads;
            fp.progress = !o.quiet;
            const rank_fit f = calib_fit_rank_weight(*zm, fit_in, fit_docs, fp);
            c.sens.rank_weight = fit_in.rank_weight = f.weight;
            fit_target = f.targets[0];
            std::fprintf(stderr,
                         "zack calibrate: rank losses weigh %.3g x quantization losses in KV plans (%d passes over "
                         "%lld tokens in %.1f s)\n",
                         f.weight, f.runs, (long long)f.window_tokens,
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - t_fit).count());
        }
        if (gain_tokens > 0) {
            // each layer's cost, end to end, at the plan the file is for
            layer_gain_params gp;
            gp.n_tokens = gain_tokens;
            gp.n_ctx = std::min<int64_t>(gain_tokens, 2048);
            gp.n_score = gp.n_ctx / 2;
            gp.target = o.gain_target > 0 ? o.gain_target
                        : !o.kv_targets.empty() ? *std::min_element(o.kv_targets.begin(), o.kv_targets.end())
                        : fit_target > 0 ? fit_target : calib_fit_target(fit_in, rank_fit_params{}.at[0]);
            gp.n_threads = n_threads;
            gp.progress = !o.quiet;
            const layer_gains g = calib_measure_layer_gains(*zm, fit_in, fit_docs, gp);
            c.sens.layer_gain = g.gain;
            std::fprintf(stderr,
                         "zack calibrate: %d of %d layers cost other than their measured losses say in KV plans "
                         "(plan %.3f, KLD %.5f over %lld tokens)\n",
                         g.moved(), (int)g.gain.size(), gp.target, g.kl, (long long)g.window_tokens);
        }
    }
    for (double t : o.kv_targets) {
        plan_inputs in = zack_calibration_plan_inputs(c);
        in.kivi_keys = o.kv_kivi_keys;
        kv_plan pl = plan_for_target(in, t);
        pl.source = o.kv_kivi_keys ? "zack calibrate --kv-target --kv-kivi-keys" : "zack calibrate --kv-target";
        std::fprintf(stderr, "zack calibrate: plan for %.3f: %s\n", t, pl.describe().c_str());
        wp.plans.push_back(pl);
    }
    zack_file_write(*m, c, wp, o.out_path);
    std::fprintf(stderr, "zack calibrate: wrote %s (%lld calibration tokens)\n", o.out_path.c_str(), (long long)fed);

    calib_print_summary(stdout, c, o.rank_align);
    if (!o.compare_path.empty()) {
        std::printf("\n");
        run_compare(o.out_path, o.compare_path, o.compare_rate, o.rank_align);
    }
    return 0;
}

}  // namespace zk
