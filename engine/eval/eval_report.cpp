#include "engine/eval/eval_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "ggml-like/error.h"

namespace zk {

namespace {

std::string f(const char* fmt, double v) {
    if (!std::isfinite(v)) return "n/a";
    char b[64];
    std::snprintf(b, sizeof b, fmt, v);
    return b;
}

// The figures worth a column besides the primary one.
std::string extra(const eval_point& p) {
    const nlohmann::json& d = p.score.detail;
    if (d.contains("vs_baseline")) {
        const nlohmann::json& v = d["vs_baseline"];
        if (v.contains("kld_mean"))
            return "KLD " + f("%.5f", v["kld_mean"].get<double>()) + ", same top " +
                   f("%.2f%%", 100 * v["same_top_p"].get<double>()) + ", RMS dp " +
                   f("%.2f%%", 100 * v["rms_dp"].get<double>());
    }
    if (d.contains("acc") && p.score.metric != "acc") return "acc " + f("%.2f%%", 100 * d["acc"].get<double>());
    return "";
}

std::string value_str(const eval_score& s) {
    return s.metric == "ppl" ? f("%.4f", s.value) : f("%.2f%%", 100 * s.value);
}

std::string xml_escape(const std::string& s) {
    std::string o;
    for (char c : s) {
        if (c == '<') o += "&lt;";
        else if (c == '>') o += "&gt;";
        else if (c == '&') o += "&amp;";
        else if (c == '"') o += "&quot;";
        else o += c;
    }
    return o;
}

}  // namespace

nlohmann::json eval_point_json(const eval_point& p) {
    nlohmann::json j = {{"config", p.cfg.to_json()}};
    if (!p.ok()) {
        j["error"] = p.error;
        return j;
    }
    j["metric"] = p.score.metric;
    j["value"] = p.score.value;
    j["higher_is_better"] = p.score.higher_is_better;
    j["retention"] = std::isfinite(p.retention) ? nlohmann::json(p.retention) : nlohmann::json(nullptr);
    j["n_items"] = p.score.n_items;
    j["kv"] = {{"bytes_per_token", p.bytes_per_token},
               {"tokens_kept", p.score.tokens_kept},
               {"fraction_of_f16", p.kv_fraction},
               {"held_fraction_of_f16", eval_point_held(p)}};
    j["session"] = p.session;
    j["detail"] = p.score.detail;
    return j;
}

static std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
}

std::string eval_report_csv(const eval_report& r) {
    std::string out = "config,method,metric,value,retention,kv_fraction,bytes_per_token,tokens_kept,n_items,kld_mean,"
                      "same_top_p,kv_held_fraction,error\n";
    std::vector<eval_point> rows{r.baseline};
    rows.insert(rows.end(), r.runs.begin(), r.runs.end());
    for (const eval_point& p : rows) {
        out += csv_field(p.cfg.name) + "," + csv_field(p.cfg.method) + ",";
        if (!p.ok()) {
            out += ",,,,,,,,,," + csv_field(p.error) + "\n";
            continue;
        }
        const nlohmann::json vs = p.score.detail.value("vs_baseline", nlohmann::json::object());
        auto num = [](double v) { return std::isfinite(v) ? strfmt("%.9g", v) : std::string(); };
        out += csv_field(p.score.metric) + "," + num(p.score.value) + "," + num(p.retention) + "," +
               num(p.kv_fraction) + "," + num(p.bytes_per_token) + "," + num(p.score.tokens_kept) + "," +
               std::to_string(p.score.n_items) + "," +
               (vs.contains("kld_mean") ? num(vs["kld_mean"].get<double>()) : "") + "," +
               (vs.contains("same_top_p") ? num(vs["same_top_p"].get<double>()) : "") + "," +
               num(eval_point_held(p)) + ",\n";
    }
    return out;
}

std::string eval_report_table(const eval_report& r) {
    std::string out;
    const eval_score& b = r.baseline.score;
    out += "task " + r.task + " on " + r.model_path + ": baseline " + b.metric + " = " + value_str(b) + " over " +
           std::to_string(b.n_items) + " items\n";
    if (r.settings.contains("shared_flags"))  // (cmd_eval: the flags a sweep or search gives every configuration)
        out += "every configuration but the baseline: " + r.settings["shared_flags"].get<std::string>() + "\n";
    out += "\n";
    char line[512];
    // KV size: the cost of one more token (what long contexts approach); held: the
    // whole cache at this task's context (eval_point_held: residual windows, sinks
    // and a tier included, and what eviction let go left out).
    std::snprintf(line, sizeof line, "| %-34s | %-14s | %9s | %7s | %10s | %9s | %s\n", "configuration", "method",
                  "KV size", "held", b.metric.c_str(), "% of base", "vs baseline");
    out += line;
    out += "|------------------------------------|----------------|-----------|---------|------------|-----------|"
           "------------\n";
    std::vector<eval_point> rows{r.baseline};
    rows.insert(rows.end(), r.runs.begin(), r.runs.end());
    for (const eval_point& p : rows) {
        const std::string name = p.cfg.name.empty() ? "baseline" : p.cfg.name;
        if (!p.ok()) {
            std::snprintf(line, sizeof line, "| %-34s | %-14s | %9s | %7s | %10s | %9s | %s\n", name.c_str(),
                          p.cfg.method.c_str(), "-", "-", "-", "-", p.error.c_str());
        } else {
            std::snprintf(line, sizeof line, "| %-34s | %-14s | %8s%% | %6s%% | %10s | %8s%% | %s\n", name.c_str(),
                          p.cfg.method.c_str(), f("%.1f", 100 * p.kv_fraction).c_str(),
                          f("%.1f", 100 * eval_point_held(p)).c_str(), value_str(p.score).c_str(),
                          f("%.2f", 100 * p.retention).c_str(), extra(p).c_str());
        }
        out += line;
    }
    if (r.task == "passkey") {
        out += "\npasskey accuracy by length (rows) and depth (columns), per configuration:\n";
        for (const eval_point& p : rows) {
            if (!p.ok() || !p.score.detail.contains("by_length_depth")) continue;
            std::map<int64_t, std::map<double, double>> t;
            std::vector<double> depths;
            for (const auto& c : p.score.detail["by_length_depth"]) {
                const double d = c["depth"].get<double>();
                t[c["length"].get<int64_t>()][d] = c["acc"].get<double>();
                if (std::find(depths.begin(), depths.end(), d) == depths.end()) depths.push_back(d);
            }
            std::sort(depths.begin(), depths.end());
            out += "  " + (p.cfg.name.empty() ? std::string("baseline") : p.cfg.name) + "\n    length ";
            for (double d : depths) out += f("%7.2f", d);
            out += "\n";
            for (const auto& [len, row] : t) {
                std::snprintf(line, sizeof line, "    %6lld ", (long long)len);
                out += line;
                for (double d : depths) out += row.count(d) ? f("%6.0f%%", 100 * row.at(d)) : std::string("      -");
                out += "\n";
            }
        }
    }
    if (!r.targets.empty()) {
        out += "\nlargest KV reduction keeping >= " + f("%.1f%%", 100 * r.target) + " of the baseline:\n";
        for (const eval_target_result& t : r.targets) {
            if (t.found && t.best.ok()) {
                std::snprintf(line, sizeof line, "  %-14s KV %6s%% of f16, held %s%% (%s), %s of baseline   [%s]%s%s\n",
                              t.method.c_str(), f("%.1f", 100 * t.best.kv_fraction).c_str(),
                              f("%.1f", 100 * eval_point_held(t.best)).c_str(), t.best.cfg.name.c_str(),
                              f("%.2f%%", 100 * t.best.retention).c_str(),
                              t.best.cfg.cli().c_str(), t.note.empty() ? "" : ": ", t.note.c_str());
            } else {
                std::snprintf(line, sizeof line, "  %-14s none: %s\n", t.method.c_str(), t.note.c_str());
            }
            out += line;
        }
    }
    {
        // every evaluated configuration (and the baseline) that no other beats in both size and accuracy
        std::vector<eval_point> all{r.baseline};
        all.insert(all.end(), r.runs.begin(), r.runs.end());
        const std::vector<size_t> front = eval_pareto_front(all);
        if (front.size() > 1) {
            out += "\nPareto front (no configuration holds less at this context and keeps more):\n";
            for (size_t i : front) {
                const eval_point& p = all[i];
                std::snprintf(line, sizeof line, "  held %6s%%  KV %6s%%  %8s%% of baseline  %-34s [%s]\n",
                              f("%.1f", 100 * eval_point_held(p)).c_str(), f("%.1f", 100 * p.kv_fraction).c_str(),
                              f("%.2f", 100 * p.retention).c_str(),
                              p.cfg.name.empty() ? "baseline" : p.cfg.name.c_str(), p.cfg.cli().c_str());
                out += line;
            }
        }
        if (r.target > 0) {
            const int64_t best = eval_smallest_passing(r.runs, r.target);
            if (best >= 0) {
                const eval_point& p = r.runs[best];
                std::snprintf(line, sizeof line,
                              "smallest configuration keeping >= %s: held %s%% of f16 at this context (KV %s%% a "
                              "token), %s of baseline [%s]\n",
                              f("%.1f%%", 100 * r.target).c_str(), f("%.1f", 100 * eval_point_held(p)).c_str(),
                              f("%.1f", 100 * p.kv_fraction).c_str(),
                              f("%.2f%%", 100 * p.retention).c_str(), p.cfg.cli().c_str());
                out += line;
            }
        }
    }
    if (!r.issues.empty()) {
        out += "\n" + std::to_string(r.issues.size()) + " data problem(s) skipped:\n";
        for (const eval_data_issue& i : r.issues) out += "  " + i.describe() + "\n";
    }
    return out;
}

nlohmann::json eval_report_json(const eval_report& r) {
    nlohmann::json j;
    j["model"] = r.model_path;
    j["task"] = r.task;
    j["settings"] = r.settings;
    j["baseline"] = eval_point_json(r.baseline);
    j["runs"] = nlohmann::json::array();
    for (const eval_point& p : r.runs) j["runs"].push_back(eval_point_json(p));
    if (r.target > 0) {
        j["target"] = r.target;
        j["targets"] = nlohmann::json::array();
        for (const eval_target_result& t : r.targets) {
            nlohmann::json o = {{"method", t.method}, {"found", t.found}, {"note", t.note}};
            if (t.found) o["best"] = eval_point_json(t.best);
            o["tried"] = nlohmann::json::array();
            for (const eval_point& p : t.tried) o["tried"].push_back(p.cfg.cli());
            j["targets"].push_back(o);
        }
    }
    std::vector<eval_point> all{r.baseline};
    all.insert(all.end(), r.runs.begin(), r.runs.end());
    j["pareto"] = nlohmann::json::array();
    for (size_t i : eval_pareto_front(all))
        j["pareto"].push_back({{"config", all[i].cfg.cli()}, {"name", all[i].cfg.name.empty() ? "baseline" : all[i].cfg.name},
                               {"kv_fraction", all[i].kv_fraction}, {"held_fraction", eval_point_held(all[i])},
                               {"retention", all[i].retention}});
    if (r.target > 0) {
        const int64_t best = eval_smallest_passing(r.runs, r.target);
        j["smallest_passing"] = best >= 0 ? eval_point_json(r.runs[best]) : nlohmann::json();
    }
    j["issues"] = nlohmann::json::array();
    for (const eval_data_issue& i : r.issues)
        j["issues"].push_back({{"file", i.file}, {"line", i.line}, {"what", i.what}});
    return j;
}

std::string eval_report_svg(const eval_report& r) {
    // Curves: method -> points (x = % held at the task's context, eval_point_held;
    // y = % of baseline), each starting at the baseline.
    std::map<std::string, std::vector<std::pair<double, double>>> curves;
    std::vector<std::string> order;
    for (const eval_point& p : r.runs) {
        if (!p.ok() || !std::isfinite(p.retention)) continue;
        if (!curves.count(p.cfg.method)) {
            order.push_back(p.cfg.method);
            curves[p.cfg.method].push_back({100 * eval_point_held(r.baseline), 100.0});
        }
        curves[p.cfg.method].push_back({100 * eval_point_held(p), 100 * p.retention});
    }
    double ymin = 100, ymax = 100;
    for (auto& [m, pts] : curves) {
        std::sort(pts.begin(), pts.end());
        for (const auto& q : pts) ymin = std::min(ymin, q.second), ymax = std::max(ymax, q.second);
    }
    if (r.target > 0) ymin = std::min(ymin, 100 * r.target);
    ymin = std::floor(ymin / 5) * 5 - 5;
    ymax = std::ceil(ymax / 5) * 5 + 1;
    const double W = 720, H = 460, L = 70, R = 190, T = 40, B = 60;
    const double pw = W - L - R, ph = H - T - B;
    auto X = [&](double x) { return L + x / 110.0 * pw; };
    auto Y = [&](double y) { return T + (ymax - y) / (ymax - ymin) * ph; };
    static const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
    std::string s;
    char b[512];
    std::snprintf(b, sizeof b,
                  "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
                  "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H);
    s += b;
    const std::string title = "zack eval " + r.task + " (" + r.baseline.score.metric + "): share of baseline vs KV held";
    std::snprintf(b, sizeof b, "<text x=\"%.0f\" y=\"22\" font-size=\"14\">%s</text>\n", L, xml_escape(title).c_str());
    s += b;
    // axes and ticks
    std::snprintf(b, sizeof b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"black\"/>\n",
                  L, T, pw, ph);
    s += b;
    for (int x = 0; x <= 100; x += 10) {
        std::snprintf(b, sizeof b,
                      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                      "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%d</text>\n",
                      X(x), T, X(x), T + ph, X(x), T + ph + 16, x);
        s += b;
    }
    const double ystep = (ymax - ymin) > 40 ? 10 : (ymax - ymin) > 15 ? 5 : 1;
    for (double y = std::ceil(ymin / ystep) * ystep; y <= ymax; y += ystep) {
        std::snprintf(b, sizeof b,
                      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                      "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
                      L, Y(y), L + pw, Y(y), L - 6, Y(y) + 4, y);
        s += b;
    }
    std::snprintf(b, sizeof b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">KV cache held at the task's context (%% of an f16 full-rank cache)</text>\n",
                  L + pw / 2, H - 18);
    s += b;
    std::snprintf(b, sizeof b,
                  "<text transform=\"translate(18,%.1f) rotate(-90)\" text-anchor=\"middle\">%% of baseline %s</text>\n",
                  T + ph / 2, xml_escape(r.baseline.score.metric).c_str());
    s += b;
    if (r.target > 0) {
        std::snprintf(b, sizeof b,
                      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\" stroke-dasharray=\"5,4\"/>"
                      "<text x=\"%.1f\" y=\"%.1f\" fill=\"#666\">target %g%%</text>\n",
                      L, Y(100 * r.target), L + pw, Y(100 * r.target), L + 4, Y(100 * r.target) - 4, 100 * r.target);
        s += b;
    }
    for (size_t i = 0; i < order.size(); i++) {
        const char* col = colors[i % (sizeof colors / sizeof *colors)];
        const auto& pts = curves[order[i]];
        std::string path;
        for (const auto& q : pts) {
            std::snprintf(b, sizeof b, "%s%.1f,%.1f", path.empty() ? "" : " ", X(q.first), Y(q.second));
            path += b;
        }
        std::snprintf(b, sizeof b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col);
        s += b + path + "\"/>\n";
        for (const auto& q : pts) {
            std::snprintf(b, sizeof b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", X(q.first), Y(q.second), col);
            s += b;
        }
        std::snprintf(b, sizeof b,
                      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>"
                      "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
                      L + pw + 14, T + 10 + 18.0 * i, L + pw + 34, T + 10 + 18.0 * i, col, L + pw + 40, T + 14 + 18.0 * i,
                      xml_escape(order[i]).c_str());
        s += b;
    }
    {
        // the Pareto front over every configuration, as a grey step line under the curves
        std::vector<eval_point> all{r.baseline};
        all.insert(all.end(), r.runs.begin(), r.runs.end());
        const std::vector<size_t> front = eval_pareto_front(all);
        if (front.size() > 1) {
            std::string path;
            double py = 0;
            for (size_t k = 0; k < front.size(); k++) {
                const double x = 100 * eval_point_held(all[front[k]]), y = 100 * all[front[k]].retention;
                if (k) {
                    std::snprintf(b, sizeof b, " %.1f,%.1f", X(x), Y(py));
                    path += b;
                }
                std::snprintf(b, sizeof b, "%s%.1f,%.1f", path.empty() ? "" : " ", X(x), Y(y));
                path += b;
                py = y;
            }
            s += "<polyline fill=\"none\" stroke=\"#555\" stroke-width=\"5\" stroke-opacity=\"0.25\" points=\"" + path +
                 "\"/>\n";
            std::snprintf(b, sizeof b,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#555\" stroke-width=\"5\" "
                          "stroke-opacity=\"0.25\"/><text x=\"%.1f\" y=\"%.1f\">Pareto front</text>\n",
                          L + pw + 14, T + 10 + 18.0 * order.size(), L + pw + 34, T + 10 + 18.0 * order.size(),
                          L + pw + 40, T + 14 + 18.0 * order.size());
            s += b;
        }
    }
    s += "</svg>\n";
    return s;
}

}  // namespace zk
