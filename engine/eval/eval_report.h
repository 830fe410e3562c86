// Output of `zack eval`: a table for people (stdout), JSON with every number and
// the exact configurations (--json), and an SVG chart of accuracy against KV
// size, one curve per method, drawn by our own code (--plot).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/eval/eval_sweep.h"

namespace zk {

struct eval_report {
    std::string model_path;
    std::string task;
    nlohmann::json settings = nlohmann::json::object();  // every option that shaped the run
    eval_point baseline;
    std::vector<eval_point> runs;                // every configuration evaluated, in order
    double target = 0;                           // 0 = no --target
    std::vector<eval_target_result> targets;
    std::vector<eval_data_issue> issues;
};

std::string eval_report_table(const eval_report& r);
nlohmann::json eval_report_json(const eval_report& r);
// One row per configuration (the baseline first): config, method, metric, value,
// retention, kv_fraction, bytes_per_token, tokens_kept, n_items, kld_mean,
// same_top_p (ppl against the baseline; empty otherwise), error. Fields with a
// comma, quote or newline are quoted as RFC 4180 says.
std::string eval_report_csv(const eval_report& r);
// y = share of the baseline kept (%), x = KV size (% of an f16 full-rank cache).
std::string eval_report_svg(const eval_report& r);
nlohmann::json eval_point_json(const eval_point& p);

}  // namespace zk
