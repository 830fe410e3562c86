// tool_tokenize MODEL FILE... [--special] [--add-special] [--decode] [--time N]
//   Prints the token ids of each FILE's contents on one line, space separated
//   (the model is loaded once for all files).
//   --special      parse special-token texts (<|im_start|>, ...) into their ids
//   --add-special  add BOS/EOS as the GGUF flags say
//   --decode       also check decode(encode(text)) == text; prints a second line,
//                  "OK" or "MISMATCH at byte N: ..." (and exits 1 at the end)
//   --time N       encode N more times and print the mean time to stderr
//   --pretok       print the byte lengths of the pre-tokenizer's pieces instead
//                  of ids (the split tokenizer.ggml.pre selects; no special tokens)
// Used by tests/test_tokenizer_ref.py to compare against HF tokenizers.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/unicode.h"
#include "engine/vocab.h"
#include "ggml-like/error.h"
#include "ggml-like/gguf.h"

namespace {

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) ZK_THROW("%s: cannot open", path.c_str());
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::string printable(const std::string& s) {
    std::string out;
    for (unsigned char c : s) {
        if (c == '\n') {
            out += "\\n";
        } else if (c < 0x20 || c == 0x7F) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02X", c);
            out += buf;
        } else {
            out += (char)c;
        }
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    bool special = false, add_special = false, check_decode = false, pretok = false;
    int repeats = 0;
    std::vector<std::string> files;
    for (int i = 2; i < argc; i++) {
        if (!std::strcmp(argv[i], "--special")) {
            special = true;
        } else if (!std::strcmp(argv[i], "--add-special")) {
            add_special = true;
        } else if (!std::strcmp(argv[i], "--pretok")) {
            pretok = true;
        } else if (!std::strcmp(argv[i], "--decode")) {
            check_decode = true;
        } else if (!std::strcmp(argv[i], "--time") && i + 1 < argc) {
            repeats = std::atoi(argv[++i]);
        } else if (argv[i][0] == '-' && argv[i][1] == '-') {
            std::fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        } else {
            files.push_back(argv[i]);
        }
    }
    if (argc < 3 || files.empty()) {
        std::fprintf(stderr,
                     "usage: %s MODEL FILE... [--special] [--add-special] [--decode] [--time N] "
                     "[--pretok]\n",
                     argv[0]);
        return 2;
    }
    int status = 0;
    try {
        auto file = zk::gguf_file::open(argv[1]);
        auto voc = zk::vocab::from_gguf(*file);
        for (const std::string& path : files) {
            const std::string text = read_file(path);
            if (pretok) {
                zk::unicode_pre kind;
                if (!zk::unicode_pre_from_name(voc->pre(), kind)) {
                    ZK_THROW("no pre-tokenizer '%s'", voc->pre().c_str());
                }
                std::vector<std::pair<size_t, size_t>> pieces;
                zk::unicode_pre_split(kind, text, pieces);
                std::string line;
                for (const auto& pc : pieces) {
                    line += (line.empty() ? "" : " ") + std::to_string(pc.second - pc.first);
                }
                std::printf("%s\n", line.c_str());
                continue;
            }
            const std::vector<int32_t> ids = voc->encode(text, add_special, special);
            std::string line;
            for (size_t i = 0; i < ids.size(); i++) {
                if (i) line += ' ';
                line += std::to_string(ids[i]);
            }
            std::printf("%s\n", line.c_str());
            if (repeats > 0) {
                const auto t0 = std::chrono::steady_clock::now();
                size_t total = 0;
                for (int r = 0; r < repeats; r++)
                    total += voc->encode(text, add_special, special).size();
                const double s =
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                std::fprintf(stderr, "encode: %zu bytes -> %zu tokens in %.3f ms (%.1f MB/s)\n",
                             text.size(), total / repeats, 1e3 * s / repeats,
                             text.size() * repeats / s / 1e6);
            }
            if (check_decode) {
                const std::string back = voc->decode(ids, special);
                if (back == text) {
                    std::printf("OK\n");
                } else {
                    size_t k = 0;
                    while (k < back.size() && k < text.size() && back[k] == text[k]) k++;
                    const size_t from = k < 20 ? 0 : k - 20;
                    std::printf("MISMATCH at byte %zu: expected \"%s\" got \"%s\"\n", k,
                                printable(text.substr(from, 60)).c_str(),
                                printable(back.substr(from, 60)).c_str());
                    status = 1;
                }
            }
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return status;
}
