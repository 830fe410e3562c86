// tool_sensitivity SOURCE.gguf CALIB.zack TEXT_FILE [--ctx N] [--tokens N] [--stride S] [--threads T]
// Runs calib/sensitivity.h's observer over the text (windows of --ctx tokens,
// --tokens in all) with the rotations of CALIB.zack on the uncompressed SOURCE
// model and prints one line per (layer, head, K|V, rank): the mean ||dy||^2 and
// ||dy||^2 / ||x||^2 (diagnostics for the allocation work).
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "calib/blas_threads.h"
#include "calib/sensitivity.h"
#include "calib/zack_file.h"
#include "engine/session.h"
#include "ggml-like/error.h"

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: tool_sensitivity SOURCE.gguf CALIB.zack TEXT [--ctx N] [--tokens N] [--stride S] [--threads T]\n");
        return 2;
    }
    try {
        int64_t ctx = 512, tokens = 1024;
        int stride = 4, threads = 2;
        for (int i = 4; i + 1 < argc; i += 2) {
            if (!std::strcmp(argv[i], "--ctx")) ctx = std::stoll(argv[i + 1]);
            else if (!std::strcmp(argv[i], "--tokens")) tokens = std::stoll(argv[i + 1]);
            else if (!std::strcmp(argv[i], "--stride")) stride = std::stoi(argv[i + 1]);
            else if (!std::strcmp(argv[i], "--threads")) threads = std::stoi(argv[i + 1]);
            else ZK_THROW("unknown option %s", argv[i]);
        }
        auto m = zk::model_load(argv[1]);
        auto zf = zk::gguf_file::open(argv[2]);
        const zk::zack_calibration c = zk::zack_file_read_calibration(*zf);
        std::ifstream in(argv[3]);
        if (!in) ZK_THROW("%s: cannot open", argv[3]);
        std::stringstream text;
        text << in.rdbuf();
        const std::vector<int32_t> ids = m->voc->encode(text.str(), true, false);
        zk::sens_params sp;
        sp.query_stride = stride;
        sp.ranks = zk::sens_default_ranks(m->hp.head_dim, 4);
        zk::sensitivity_observer obs(*m, c, sp, ctx);
        zk::session_params ses;
        ses.n_ctx = ctx;
        ses.n_threads = threads;
        zk::session s(*m, ses);
        obs.set_pool(&s.pool());
        const zk::blas_single_thread blas_guard;
        s.set_observer(&obs);
        for (int64_t at = 0; at + 1 < (int64_t)ids.size() && at < tokens; at += ctx) {
            const int64_t n = std::min<int64_t>({ctx, (int64_t)ids.size() - at, tokens - at});
            s.reset();
            s.decode(ids.data() + at, n);
            std::fprintf(stderr, "tool_sensitivity: %lld/%lld tokens\n", (long long)(at + n), (long long)tokens);
        }
        s.set_observer(nullptr);
        const zk::zack_sensitivity r = obs.result();
        std::printf("# queries %lld\n# layer head kind rank abs rel (kind: K = pca keys, S = score keys, P = pair keys, V)\n",
                    (long long)r.n_queries);
        const char kinds[] = {'K', 'S', 'P', 'V'};
        for (int l = 0; l < r.n_layer; l++)
            for (int g = 0; g < r.n_kv; g++)
                for (int kind = 0; kind < 4; kind++) {
                    const std::vector<double>& ab = kind == 3 ? r.abs_v : r.abs_k[kind];
                    const std::vector<double>& rl = kind == 3 ? r.rel_v : r.rel_k[kind];
                    if (ab.empty()) continue;
                    for (int ri = 0; ri < r.n_r(); ri++) {
                        const size_t a = r.at(l, g, ri);
                        std::printf("%d %d %c %d %.6g %.6g\n", l, g, kinds[kind], r.ranks[ri], ab[a], rl[a]);
                    }
                }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tool_sensitivity: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
