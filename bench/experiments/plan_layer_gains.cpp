// Experiment (not built by CMake, not product code): a KV plan whose predicted
// losses are weighed per layer, to test whether the sensitivity pass's proxy
// mis-prices whole layers (bench/RESULTS.md, 2026-12-03 "what a layer costs").
//
//   plan_layer_gains MODEL.zack TARGET RANK_WEIGHT GAINS OUT.json [--table]
//
// GAINS: n_layer numbers; every loss of layer l (each precision pair's and each
// rank curve's) is multiplied by GAINS[l] before the plan for TARGET is chosen,
// and the plan goes to OUT.json (a --kv-plan file). With --table, GAINS is
// ignored (pass /dev/null) and, for the unweighted plan, each layer's
// predicted loss (the plan's, less the plan's with that layer's heads exact)
// is printed: the column that `bash bench/kv_plans.sh layers` measures end to
// end; their ratio (clipped to [1/4, 8]) is what the entry used as GAINS.
//
// zack calibrate now measures such gains itself (calib/layer_gain.h) and a
// .zack with zack.sens.layer_gain has them applied by plan_inputs::from_model
// before GAINS multiply on top; a build from before that commit ignores them.
//
// Build from a configured tree (build/):
//   c++ -I. -O1 -march=native -std=gnu++17 bench/experiments/plan_layer_gains.cpp \
//       build/libzack_core.a -lopenblas -llapack -lpthread -o /tmp/plan_layer_gains
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "calib/plan.h"
#include "engine/model.h"

int main(int argc, char** argv) {
    if (argc < 6) {
        std::fprintf(stderr, "usage: %s MODEL.zack TARGET RANK_WEIGHT GAINS OUT.json [--table]\n", argv[0]);
        return 2;
    }
    auto m = zk::model_load(argv[1]);
    zk::plan_inputs in = zk::plan_inputs::from_model(*m);
    in.rank_weight = std::atof(argv[3]);
    const double target = std::atof(argv[2]);
    const int L = m->hp.n_layer, KV = m->hp.n_head_kv, D = m->hp.head_dim;
    if (argc > 6 && std::strcmp(argv[6], "--table") == 0) {
        const zk::kv_plan p = zk::plan_for_target(in, target);
        std::ofstream(argv[5]) << p.to_json().dump();
        const double all = zk::plan_predicted_loss(in, p);
        std::printf("plan: %s\nlayer  predicted loss of its heads\n", p.describe().c_str());
        for (int l = 0; l < L; l++) {
            nlohmann::json q = p.to_json();
            q["bits"] = 16;
            for (int h = l * KV; h < (l + 1) * KV; h++) {
                q["bits_k"][h] = 16, q["bits_v"][h] = 16;
                for (const char* t : {"tails_k", "zeros_k", "mids_k"})
                    if (q.contains(t) && q[t].size() > (size_t)h) q[t][h] = 0;
                for (const char* t : {"ranks_k", "ranks_v"})
                    if (q.contains(t) && q[t].size() > (size_t)h) q[t][h] = D;
            }
            std::printf("%5d  %.5f\n", l, all - zk::plan_predicted_loss(in, zk::kv_plan::from_json(q, "layer")));
        }
        return 0;
    }
    std::vector<double> gain;
    std::ifstream gf(argv[4]);
    for (double x; gf >> x;) gain.push_back(x);
    if ((int)gain.size() != L) {
        std::fprintf(stderr, "%s: need %d gains, read %zu\n", argv[4], L, gain.size());
        return 1;
    }
    // q [n_p x n_p x n_layer x n_kv]; curves [n_layer x n_kv x n_grid]
    const size_t nh = (size_t)L * KV, np = in.qbits.size(), ng = in.curves.grid.size();
    for (size_t i = 0; i < np * np; i++)
        for (size_t h = 0; h < nh; h++) in.q[i * nh + h] *= gain[h / KV];
    for (auto* v : {&in.curves.loss_k[0], &in.curves.loss_k[1], &in.curves.loss_k[2], &in.curves.loss_v})
        for (size_t i = 0; i < v->size(); i++) (*v)[i] *= gain[i / ng / KV];
    const zk::kv_plan p = zk::plan_for_target(in, target);
    std::ofstream(argv[5]) << p.to_json().dump();
    std::printf("%s\n", p.describe().c_str());
    return 0;
}
