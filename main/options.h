// The CLI option table: every flag is registered here once, with its help text,
// its default and its help group; each subcommand adds the groups that apply to
// it (run: model + run + sampling; eval: model + its own; bench and calibrate keep
// their own tables in their cmd_*.cpp).
//
// llama.cpp spellings: the long names llama.cpp uses (--n-gpu-layers,
// --cache-type-k, --system-prompt, --presence-penalty, ...) are names of the
// same options here; its multi-letter single-dash flags (-ngl, -ctk, -sys, -cnv,
// ...) are listed in options.cpp's alias table and rewritten to their long
// names before CLI11 parses (CLI11 would read "-ngl" as "-n gl").
#pragma once
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/session.h"

// CLI11 is included only where option tables are built (options.cpp, cli.cpp and
// three cmd_*.cpp): as a header-only library it costs every file that includes
// it ~10 s of compile time.
namespace CLI {
class App;
}

namespace zk {

// Help groups, so that `zack run --help` shows zack's own KV flags apart.
extern const char* const k_group_model;   // model, threads, context
extern const char* const k_group_kv;      // zack's KV cache flags (--kv-*)
extern const char* const k_group_llama;   // llama.cpp spellings that map onto zack's options
extern const char* const k_group_run;     // prompt, chat
extern const char* const k_group_sample;  // sampling

struct model_opts {
    std::string model_path;
    int n_threads = 0;  // 0 = all hardware threads
    std::string device = "auto";  // engine/backend.h: auto | cpu | cuda
    int64_t n_ctx = 4096;
    int64_t n_batch = 256;
    std::string kv_type = "f16";
    // KV cache precision and eviction (engine/kv_cache.h, engine/evict/evict.h)
    int kv_bits = 16;
    int kv_group = 0;  // 0: 32, or a KV plan's
    int kv_residual = 0;
    int kv_tier = 0;
    bool kv_gear = false;
    int kv_key_tail = 0;
    int kv_key_zero = 0;
    int kv_key_mid = 0;
    int64_t kv_select = 0;  // decode-time key-group selection budget in tokens (0 = off)
    int kv_select_every = k_select_every;  // steps one choice serves
    int kv_gear_rank = 2;
    float kv_gear_outliers = 0.02f;
    std::string kv_evict = "none";
    int64_t kv_budget = -1;  // -1 = not given (0 tokens); an explicit value needs --kv-evict
    int kv_sinks = 4;
    int64_t kv_recent = -1;
    float kv_crush = 0.0f;
    std::string kv_crush_anchor = "mean";
    // ZACK compressed attention (a .zack model): overall rate, or removal rate eps
    double kv_rate = -1;   // < 0: not set
    double kv_eps = -1;    // < 0: not set
    bool kv_uniform = false;
    std::string kv_alloc;      // sensitivity | sigma | uniform; "" = sensitivity when the .zack has curves
    std::string kv_key_basis = "auto";  // auto | pca | score | pairs
    double kv_target = -1;     // a plan for this fraction of the f16 cache (calib/plan.h); < 0: not set
    double kv_rank_weight = -1;  // --kv-target's rank weight (plan_inputs::rank_weight); < 0: the .zack's
    std::string kv_plan;       // a plan file, or the target of a plan the .zack recorded
    bool verbose = false;
    // llama.cpp spellings (k_group_llama): empty = not given
    std::string cache_type_k, cache_type_v;  // -ctk/-ctv: f32 f16 q8_0 q4_0 -> --kv-type/--kv-bits
    std::string n_gpu_layers;                // -ngl: accepted; CPU build: no effect (said with -v)
    std::string flash_attn;                  // -fa: accepted; zack's attention is always fused
};

struct run_opts {
    std::string prompt;
    bool has_prompt = false;
    std::string prompt_file;  // -f: the prompt from a file
    int64_t n_predict = -1;
    bool raw = false;
    std::string system;
    std::string chat_template;
    bool interactive = false;  // -i / -if / -cnv: with -p, the prompt is the first turn of a chat
    bool escape = false;       // -e: \n \t \\ ... in -p, -f, --system and -r
    bool no_escape = false;
    std::string color;                     // --color [on|off|auto]; "" = off, a bare --color = on (main.cpp)
    std::vector<std::string> reverse;      // -r: stop a reply when it produces this text
    bool multiline = false;                // -mli: accepted (multi-line input is always on)
};

void options_add_model(CLI::App& app, model_opts& o);
// --device alone (options_add_model adds it; bench, which has its own -t list, too).
void options_add_device(CLI::App& app, model_opts& o);
// The KV flags (k_group_kv) alone, into o's kv_* fields; options_add_model adds
// them. lists_elsewhere: leave out --kv-bits, --kv-rate, --kv-evict, --kv-budget,
// --kv-plan and --kv-target, which `zack bench` takes as comma lists to sweep.
void options_add_kv(CLI::App& app, model_opts& o, bool lists_elsewhere);
void options_add_sampling(CLI::App& app, sampler_params& p);
void options_add_run(CLI::App& app, run_opts& o);

// llama.cpp's multi-letter single-dash flags and the long names they stand for.
struct option_alias {
    const char* short_name;  // "-ngl"
    const char* long_name;   // "--n-gpu-layers"
};
const std::vector<option_alias>& options_aliases();

// argv[1..] with the aliases rewritten ("-ngl 99" -> "--n-gpu-layers 99",
// "-ctk=q8_0" -> "--cache-type-k=q8_0"), ready for CLI11 (in order; the caller
// reverses for CLI::App::parse(std::vector)). A letters-only single-dash word of
// two or more letters that is not an alias ("-nkvo") throws CLI::ExtrasError
// naming it, instead of being read as bundled one-letter flags. Rewriting stops
// after "--".
std::vector<std::string> options_expand_aliases(int argc, const char* const* argv);

// Resolves --kv-rate / --kv-eps / --kv-uniform / --kv-alloc / --kv-key-basis
// into per-head ranks and key bases for model m (a .zack file), or --kv-plan /
// --kv-target into a whole plan (precision, ranks, eviction: calib/plan.h);
// leaves p.ranks_* empty when none is set. Throws for a plain GGUF given a
// rate, values out of range (NaN included), or conflicting flags.
void options_resolve_ranks(const model_opts& o, const model& m, session_params& p);

// Turns model options into session parameters (validates thread count, maps
// -ctk/-ctv onto the KV type and bits, checks --kv-budget against --kv-evict).
session_params options_session_params(const model_opts& o);
// An engine message with its parameter names ("kv.bits", "evict.budget", ...,
// see zk::param_error) spelled as this CLI's flags ("--kv-bits", "--kv-budget").
std::string options_flag_spelling(const std::string& msg);

// What the accepted-but-inert llama.cpp flags (-ngl, -fa) did, one line each, for -v.
std::vector<std::string> options_llama_notes(const model_opts& o);

// Maps a llama.cpp cache type name onto zack's (kv_type, kv_bits): f32 -> (f32, 16),
// f16 -> (f16, 16), q8_0 -> (f16, 8), q4_0 -> (f16, 4). Throws for other names,
// listing these. `flag` names the option in the message.
void options_cache_type(const std::string& name, const char* flag, std::string* kv_type, int* kv_bits);

// Processes llama.cpp's escapes in s: \n \r \t \a \b \f \v \\ \' \" \? \0, \xHH
// (one byte); an unknown escape is kept as written.
std::string options_unescape(const std::string& s);

}  // namespace zk
