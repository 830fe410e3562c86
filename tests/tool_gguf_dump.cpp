// Test helper for tests/test_gguf_model.py.
//   tool_gguf_dump FILE           prints the file as zk::gguf_file sees it, as JSON:
//     {version, alignment, data_offset, file_size,
//      kv: [{name, type, elem_type (arrays), value, display}],
//      tensors: [{name, dtype, shape, offset, n_bytes}]}
//   tool_gguf_dump --copy IN OUT  rewrites IN through zk::gguf_writer (same keys in
//                                 the same order, same tensors) so that an
//                                 independent reader can check the writer.
// Errors print one line on stderr and exit 1.
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "ggml-like/error.h"
#include "ggml-like/gguf.h"

namespace {

using nlohmann::json;

json value_to_json(const zk::gguf_value& v) {
    switch (v.type) {
        case zk::gguf_type::UINT8: case zk::gguf_type::UINT16: case zk::gguf_type::UINT32:
        case zk::gguf_type::UINT64:
            return json(v.u);
        case zk::gguf_type::INT8: case zk::gguf_type::INT16: case zk::gguf_type::INT32:
        case zk::gguf_type::INT64:
            return json(v.i);
        case zk::gguf_type::FLOAT32: case zk::gguf_type::FLOAT64: return json(v.f);
        case zk::gguf_type::BOOL: return json(v.u != 0);
        case zk::gguf_type::STRING: return json(v.s);
        case zk::gguf_type::ARRAY: {
            json a = json::array();
            for (const auto& e : v.arr) a.push_back(value_to_json(e));
            return a;
        }
    }
    return json();
}

int dump(const std::string& path) {
    auto f = zk::gguf_file::open(path);
    json out;
    out["version"] = f->version();
    out["alignment"] = f->alignment();
    out["data_offset"] = f->data_offset();
    out["file_size"] = f->file_size();
    json kv = json::array();
    for (const auto& e : f->kv()) {
        json j;
        j["name"] = e.first;
        j["type"] = zk::gguf_type_name(e.second.type);
        if (e.second.type == zk::gguf_type::ARRAY) j["elem_type"] = zk::gguf_type_name(e.second.arr_type);
        j["value"] = value_to_json(e.second);
        j["display"] = e.second.to_display();
        kv.push_back(std::move(j));
    }
    out["kv"] = std::move(kv);
    json ts = json::array();
    for (const auto& t : f->tensors()) {
        ts.push_back({{"name", t.name},
                      {"dtype", zk::dtype_name(t.type)},
                      {"shape", t.shape},
                      {"offset", t.offset},
                      {"n_bytes", t.n_bytes}});
    }
    out["tensors"] = std::move(ts);
    // Invalid UTF-8 in a string is replaced rather than aborting the dump.
    std::puts(out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
    return 0;
}

int copy(const std::string& in, const std::string& out) {
    auto f = zk::gguf_file::open(in);
    zk::gguf_writer w;
    for (const auto& e : f->kv()) w.set(e.first, e.second);
    for (const auto& t : f->tensors()) w.add_tensor_ref(t.name, t.type, t.shape, t.data, t.n_bytes);
    w.write(out);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        if (argc == 2) return dump(argv[1]);
        if (argc == 4 && std::strcmp(argv[1], "--copy") == 0) return copy(argv[2], argv[3]);
        std::fprintf(stderr, "usage: %s FILE | --copy IN OUT\n", argv[0]);
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
