#include "engine/eval/eval_sweep.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "ggml-like/error.h"

namespace zk {

std::string eval_config::cli() const {
    std::string s;
    for (const auto& [f, v] : flags) {
        if (!s.empty()) s += ' ';
        s += f;
        if (!v.empty()) s += ' ' + v;
    }
    return s;
}

nlohmann::json eval_config::to_json() const {
    nlohmann::json fl = nlohmann::json::object();
    for (const auto& [f, v] : flags) fl[f] = v;
    return {{"name", name}, {"method", method}, {"strength", strength}, {"flags", fl}, {"cli", cli()}};
}

namespace {

std::string fmt(const char* f, double v) {
    char b[64];
    std::snprintf(b, sizeof b, f, v);
    return b;
}

}  // namespace

eval_config eval_method::at(double t) const {
    ZK_ASSERT(t >= 0 && t <= 1);
    eval_config c;
    c.method = name;
    c.strength = continuous() ? t : 1.0;
    std::vector<std::string> parts;
    if (zack) {
        // Rates on a 1/1024 grid so that equal strengths give equal flags.
        const double rate = std::round(t * lim.zack_max_rate * 1024.0) / 1024.0;
        c.flags.push_back({"--kv-rate", fmt("%.6g", rate)});
        parts.push_back(fmt("zack %.3f", rate));
    }
    if (evict) {
        const double keep = this->keep > 0 ? this->keep : 1.0 - t * (1.0 - lim.evict_min_keep);
        const int64_t budget = std::max<int64_t>(1, (int64_t)std::llround(keep * (double)lim.n_tokens));
        c.flags.push_back({"--kv-evict", lim.evict_policy});
        c.flags.push_back({"--kv-budget", std::to_string(budget)});
        parts.push_back(lim.evict_policy + " " + std::to_string(budget));
    }
    if (quant) {
        c.flags.push_back({"--kv-bits", std::to_string(lim.quant_bits)});
        parts.push_back(std::to_string(lim.quant_bits) + "-bit");
    }
    if (plan) {
        // targets on a 1/1024 grid so that equal strengths give equal flags
        const double hi = lim.plan_max_fraction, lo = lim.plan_min_fraction;
        const double target = std::round((hi - t * (hi - lo)) * 1024.0) / 1024.0;
        c.flags.push_back({"--kv-target", fmt("%.6g", target)});
        parts.insert(parts.begin(), fmt("plan %.3f", target));
    }
    if (tier > 0) {
        c.flags.push_back({"--kv-tier", std::to_string(tier)});
        parts.push_back("tier " + std::to_string(tier));
    }
    for (size_t i = 0; i < parts.size(); i++) c.name += (i ? " + " : "") + parts[i];
    return c;
}

void eval_limits_check(const eval_method_limits& lim) {
    if (!(lim.plan_min_fraction < lim.plan_max_fraction))
        ZK_THROW("--plan-min (%g) must be below --plan-max (%g)", lim.plan_min_fraction, lim.plan_max_fraction);
}

std::vector<eval_method> eval_methods(const std::vector<std::string>& names, const eval_method_limits& lim) {
    eval_limits_check(lim);
    static const struct { const char* name; bool z, e, q, p, tier; } k_all[] = {
        {"zack", true, false, false, false, false},      {"evict", false, true, false, false, false},
        {"q4", false, false, true, false, false},        {"zack+evict", true, true, false, false, false},
        {"zack+q4", true, false, true, false, false},    {"zack+evict+q4", true, true, true, false, false},
        {"plan", false, false, false, true, false},      {"plan+evict", false, true, false, true, false},
        {"plan+tier", false, false, false, true, true}};
    std::vector<eval_method> out;
    for (const std::string& n : names) {
        bool hit = false;
        for (const auto& a : k_all) {
            if ((n == "all" && !a.tier) || n == a.name) {
                hit = true;
                const std::string nm = a.name;
                if (std::any_of(out.begin(), out.end(), [&](const eval_method& m) {
                        return m.name == nm || m.name.rfind(nm + " ", 0) == 0;  // the family or one of its levels
                    }))
                    continue;
                if (a.p && a.e) {  // plans x eviction levels
                    for (int den = 2; 1.0 / den >= lim.evict_min_keep - 1e-12; den *= 2)
                        out.push_back({std::string(a.name) + " 1/" + std::to_string(den), a.z, a.e, a.q, a.p, lim,
                                       1.0 / den});
                    continue;
                }
                if (a.tier) {  // plans x tier levels (each a multiple of the group, distinct)
                    const int64_t g = std::max(1, lim.tier_group);
                    int64_t last = 0;
                    for (int den = 4; den <= 16; den *= 2) {
                        const int64_t tier = lim.n_tokens / den / g * g;
                        if (tier < g || tier == last) continue;
                        eval_method m{std::string(a.name) + " " + std::to_string(tier), a.z, a.e, a.q, a.p, lim};
                        m.tier = last = tier;
                        out.push_back(m);
                    }
                    if (last == 0)
                        ZK_THROW("plan+tier: items of %lld tokens are too short for a tier (a quarter of them is "
                                 "less than one %d-token group)", (long long)lim.n_tokens, lim.tier_group);
                    continue;
                }
                out.push_back({a.name, a.z, a.e, a.q, a.p, lim});
            }
        }
        if (!hit)
            ZK_THROW("unknown method '%s' (zack, evict, q4, zack+evict, zack+q4, zack+evict+q4, plan, plan+evict, "
                     "plan+tier, all)",
                     n.c_str());
    }
    return out;
}

const eval_point& eval_run_cache::get(const eval_config& c) {
    const std::string key = c.cli();
    auto it = index_.find(key);
    if (it != index_.end()) return points_[it->second];
    points_.push_back(run_(c));
    index_[key] = points_.size() - 1;
    return points_.back();
}

std::vector<eval_point> eval_run_cache::all() const { return points_; }

std::vector<eval_point> eval_sweep_grid(const std::vector<eval_method>& methods, int points, eval_run_cache& runs) {
    if (points < 1) ZK_THROW("sweep points must be >= 1, got %d", points);
    std::vector<eval_point> out;
    for (const eval_method& m : methods) {
        const int n = m.continuous() ? points : 1;
        for (int k = 1; k <= n; k++) {
            const eval_point& p = runs.get(m.at((double)k / n));
            out.push_back(p);
            if (!p.available) break;  // the family is not in this build: one error says it
        }
    }
    return out;
}

std::vector<eval_config> eval_grid_configs(const std::vector<std::pair<std::string, std::vector<std::string>>>& axes) {
    std::vector<eval_config> out(1);
    out[0].method = "grid";
    for (const auto& [flag, values] : axes) {
        if (values.empty()) ZK_THROW("grid axis %s has no values", flag.c_str());
        std::vector<eval_config> next;
        for (const eval_config& c : out)
            for (const std::string& v : values) {
                eval_config d = c;
                d.flags.push_back({flag, v});
                next.push_back(d);
            }
        out = std::move(next);
    }
    for (eval_config& c : out) c.name = c.cli();
    return out;
}

eval_bisect_result eval_bisect(const std::function<bool(double)>& pass, int steps, bool check_zero) {
    if (steps < 0 || steps > 30) ZK_THROW("bisection steps must be in 0..30, got %d", steps);
    eval_bisect_result r;
    auto test = [&](double t) {
        const bool ok = pass(t);
        r.tried.push_back({t, ok});
        return ok;
    };
    if (test(1.0)) {
        r.found = true;
        r.t = 1.0;
        return r;
    }
    if (check_zero && !test(0.0)) return r;
    // Invariant: pass(lo), !pass(hi); both on the grid k / 2^steps.
    double lo = 0, hi = 1;
    for (int i = 0; i < steps; i++) {
        const double mid = 0.5 * (lo + hi);
        if (test(mid)) lo = mid;
        else hi = mid;
    }
    r.found = true;
    r.t = lo;
    return r;
}

eval_bisect_result eval_dense_scan(const std::function<bool(double)>& pass, int steps) {
    eval_bisect_result r;
    const int64_t n = int64_t(1) << steps;
    for (int64_t k = 0; k <= n; k++) {
        const double t = (double)k / (double)n;
        const bool ok = pass(t);
        r.tried.push_back({t, ok});
        if (ok) {
            r.found = true;
            r.t = t;
        }
    }
    return r;
}

eval_target_result eval_find_target(const eval_method& m, double target, int steps, eval_run_cache& runs) {
    eval_target_result r;
    r.method = m.name;
    std::string error;
    auto pass = [&](double t) {
        if (!error.empty()) return false;  // the family is not available: stop running it
        const eval_point& p = runs.get(m.at(t));
        r.tried.push_back(p);
        if (!p.available) error = p.error;  // stop: nothing of this family can run
        if (!p.ok()) return false;           // e.g. a budget too small for the policy: fails
        return std::isfinite(p.retention) && p.retention >= target;
    };
    if (!m.continuous()) {
        const bool ok = pass(1.0);
        if (ok) {
            r.found = true;
            r.best = r.tried.back();
        }
        r.note = !error.empty() ? error : ok ? "" : !r.tried.back().ok() ? r.tried.back().error : "does not keep the target";
        return r;
    }
    // t = 0 is the uncompressed cache only for pure ZACK/eviction families.
    const eval_bisect_result b = eval_bisect(pass, steps, m.quant);
    if (!error.empty()) {
        r.note = error;
        return r;
    }
    r.found = b.found;
    if (b.found) {
        r.best = runs.get(m.at(b.t));
        if (b.t == 0 && !m.quant) r.note = "no compression keeps the target at this resolution";
    } else {
        r.note = "does not keep the target even at the weakest setting";
    }
    return r;
}

}  // namespace zk

namespace zk {

double eval_point_held(const eval_point& p) { return p.kv_held_fraction * p.score.tokens_kept; }

std::vector<size_t> eval_pareto_front(const std::vector<eval_point>& pts) {
    std::vector<size_t> ok;
    for (size_t i = 0; i < pts.size(); i++)
        if (pts[i].ok() && std::isfinite(pts[i].retention) && std::isfinite(eval_point_held(pts[i]))) ok.push_back(i);
    // smallest first; at equal size the best first, so one pass keeps the front
    std::sort(ok.begin(), ok.end(), [&](size_t a, size_t b) {
        const double sa = eval_point_held(pts[a]), sb = eval_point_held(pts[b]);
        if (sa != sb) return sa < sb;
        return pts[a].retention > pts[b].retention;
    });
    std::vector<size_t> front;
    double best = -INFINITY;
    for (size_t i : ok)
        if (pts[i].retention > best) front.push_back(i), best = pts[i].retention;
    return front;
}

int64_t eval_smallest_passing(const std::vector<eval_point>& pts, double target) {
    int64_t best = -1;
    for (size_t i = 0; i < pts.size(); i++) {
        const eval_point& p = pts[i];
        if (!p.ok() || !(p.retention >= target)) continue;
        const double sp = eval_point_held(p), sb = best < 0 ? 0 : eval_point_held(pts[best]);
        if (best < 0 || sp < sb || (sp == sb && p.retention > pts[best].retention))
            best = (int64_t)i;
    }
    return best;
}

}  // namespace zk
