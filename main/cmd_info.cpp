// `zack info FILE`: what a GGUF/.zack file holds: summary, metadata, tensors.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "ggml-like/error.h"
#include "ggml-like/file_out.h"
#include "ggml-like/gguf.h"
#include "main/commands.h"

namespace zk {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
    std::string o = "[";
    for (size_t i = 0; i < s.size(); i++) o += (i ? ", " : "") + std::to_string(s[i]);
    return o + "]";
}

std::string human_bytes(double b) {
    const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) b /= 1024, i++;
    return strfmt(i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

bool supported(const gguf_tensor& t) { return dtype_is_supported((uint32_t)t.type); }

int count_unsupported(const gguf_file& f) {
    int n = 0;
    for (const auto& t : f.tensors()) n += !supported(t);
    return n;
}

// Summary lines for the keys users look for first.
void print_summary(const gguf_file& f) {
    const std::string arch = f.get_str("general.architecture", "?");
    std::printf("architecture: %s\n", arch.c_str());
    if (f.find("general.name")) std::printf("name: %s\n", f.get_str("general.name").c_str());
    const char* keys[][2] = {
        {"block_count", "layers"}, {"embedding_length", "embedding"},
        {"attention.head_count", "heads"}, {"attention.head_count_kv", "kv heads"},
        {"feed_forward_length", "ffn"}, {"context_length", "trained context"},
        {"rope.dimension_count", "rope dims"}, {"rope.freq_base", "rope base"},
        {"attention.layer_norm_rms_epsilon", "rms eps"},
    };
    for (auto& k : keys) {
        const gguf_value* v = f.find(arch + "." + k[0]);
        if (v) std::printf("%s: %s\n", k[1], v->to_display().c_str());
    }
    if (f.find("tokenizer.ggml.model")) {
        const gguf_value* toks = f.find("tokenizer.ggml.tokens");
        std::printf("tokenizer: %s, pre %s, %zu tokens\n", f.get_str("tokenizer.ggml.model").c_str(),
                    f.get_str("tokenizer.ggml.pre", "default").c_str(), toks ? toks->arr.size() : (size_t)0);
    }
    std::map<std::string, std::pair<int, size_t>> by_type;
    size_t total = 0;
    for (const auto& t : f.tensors()) {
        auto& e = by_type[dtype_name(t.type)];
        e.first++;
        e.second += t.n_bytes;
        total += t.n_bytes;
    }
    std::printf("tensors: %zu, %s of data (", f.tensors().size(), human_bytes((double)total).c_str());
    bool first = true;
    for (auto& kv : by_type) {
        std::printf("%s%d x %s", first ? "" : ", ", kv.second.first, kv.first.c_str());
        first = false;
    }
    std::printf(")\n");
    const int n_bad = count_unsupported(f);
    if (n_bad)
        std::printf("unsupported: %d tensor%s of types zack cannot compute with (marked *); run/eval/bench "
                    "refuse this file\n", n_bad, n_bad == 1 ? "" : "s");
}

// A metadata value as JSON: numbers, strings and booleans as themselves; arrays
// of up to k_info_array_max elements as arrays, longer ones (a vocabulary, merges)
// as {"array_length": N, "elem_type": "string", "first": [the first 16]}.
constexpr size_t k_info_array_max = 16;

nlohmann::json value_json(const gguf_value& v) {
    switch (v.type) {
        case gguf_type::BOOL: return v.u != 0;
        case gguf_type::UINT8: case gguf_type::UINT16: case gguf_type::UINT32: case gguf_type::UINT64: return v.u;
        case gguf_type::INT8: case gguf_type::INT16: case gguf_type::INT32: case gguf_type::INT64: return v.i;
        case gguf_type::FLOAT32: {  // the shortest decimal that reads back as the same float (1e-05, not 9.99e-06)
            if (!std::isfinite(v.f)) return v.to_display();
            char buf[32];
            const auto r = std::to_chars(buf, buf + sizeof buf, (float)v.f);
            return nlohmann::json::parse(std::string(buf, r.ptr));
        }
        case gguf_type::FLOAT64: return std::isfinite(v.f) ? nlohmann::json(v.f) : nlohmann::json(v.to_display());
        case gguf_type::STRING: return v.s;
        case gguf_type::ARRAY: {
            nlohmann::json a = nlohmann::json::array();
            for (size_t k = 0; k < v.arr.size() && k < k_info_array_max; k++) a.push_back(value_json(v.arr[k]));
            if (v.arr.size() <= k_info_array_max) return a;
            return {{"array_length", v.arr.size()}, {"elem_type", gguf_type_name(v.arr_type)}, {"first", a}};
        }
    }
    return v.to_display();
}

}  // namespace

int cmd_info(const std::string& path, bool json) {
    auto f = gguf_file::open(path);
    if (json) {
        nlohmann::json j;
        j["path"] = path;
        j["file_size"] = f->file_size();
        j["version"] = f->version();
        j["alignment"] = f->alignment();
        for (const auto& kv : f->kv()) j["metadata"][kv.first] = value_json(kv.second);
        for (const auto& t : f->tensors())
            j["tensors"].push_back({{"name", t.name}, {"type", dtype_name(t.type)}, {"shape", t.shape},
                                    {"offset", t.offset}, {"bytes", t.n_bytes}, {"supported", supported(t)}});
        j["unsupported_tensors"] = count_unsupported(*f);
        file_out_stdout(j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
        return 0;
    }
    std::printf("file: %s\nsize: %s (%zu bytes), GGUF v%u, alignment %zu\n", path.c_str(),
                human_bytes((double)f->file_size()).c_str(), f->file_size(), f->version(), f->alignment());
    print_summary(*f);
    std::printf("\nmetadata (%zu keys):\n", f->kv().size());
    for (const auto& kv : f->kv())
        std::printf("  %-44s %-8s %s\n", kv.first.c_str(), gguf_type_name(kv.second.type),
                    kv.second.to_display().c_str());
    std::printf("\n  %-40s %-11s %-18s %12s\n", "tensor", "type", "shape", "bytes");
    for (const auto& t : f->tensors()) {
        const std::string type = std::string(dtype_name(t.type)) + (supported(t) ? "" : "*");
        std::printf("  %-40s %-11s %-18s %12zu\n", t.name.c_str(), type.c_str(), shape_str(t.shape).c_str(),
                    t.n_bytes);
    }
    if (count_unsupported(*f))
        std::printf("* a type zack cannot compute with (it computes with %s)\n", dtype_weight_names().c_str());
    return 0;
}

}  // namespace zk
