// The target table and what the targets share: the in-memory input file, the
// model path and a scratch directory.
#include "tests/fuzz/fuzz_targets.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>

namespace zk_fuzz {

const std::vector<fuzz_target>& fuzz_target_list() {
    static const std::vector<fuzz_target> list = {
        {"gguf", fuzz_gguf_init, fuzz_gguf_one, fuzz_gguf_seeds},
        {"zack", fuzz_zack_init, fuzz_zack_one, fuzz_zack_seeds},
        {"tokenizer", fuzz_tokenizer_init, fuzz_tokenizer_one, fuzz_tokenizer_seeds},
        {"chat", fuzz_chat_init, fuzz_chat_one, fuzz_chat_seeds},
        {"eval", fuzz_eval_init, fuzz_eval_one, fuzz_eval_seeds},
        {"cli", fuzz_cli_init, fuzz_cli_one, fuzz_cli_seeds},
    };
    return list;
}

const fuzz_target& fuzz_target_get(const std::string& name) {
    for (const fuzz_target& t : fuzz_target_list())
        if (name == t.name) return t;
    throw std::runtime_error("unknown fuzz target '" + name + "'");
}

const std::string& fuzz_file_set(const uint8_t* data, size_t size) {
    static int fd = -1;
    static std::string path;
    if (fd < 0) {
        fd = memfd_create("zack-fuzz-input", MFD_CLOEXEC);
        if (fd < 0) throw std::runtime_error("memfd_create failed");
        path = "/proc/self/fd/" + std::to_string(fd);
    }
    // Shrinking first drops pages a longer input left behind.
    if (ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != (ssize_t)size))
        throw std::runtime_error("cannot write the fuzz input file");
    return path;
}

std::string fuzz_model_path() {
    const char* e = std::getenv("ZACK_MODEL");
    const std::string p = e && *e ? e : ZACK_DEFAULT_MODEL;
    if (!std::filesystem::exists(p))
        throw std::runtime_error("model " + p + " is missing: run scripts/fetch_model.sh (or set ZACK_MODEL)");
    return p;
}

const std::string& fuzz_scratch_dir() {
    // The atexit handler must not touch a std::string that static destruction
    // may already have run over: it removes the directory named in this buffer.
    static char dir_c[32] = "/tmp/zack_fuzz_XXXXXX";
    static const std::string dir = [] {
        if (!mkdtemp(dir_c)) throw std::runtime_error("mkdtemp failed");
        std::atexit([] {
            std::error_code ec;
            std::filesystem::remove_all(dir_c, ec);
        });
        return std::string(dir_c);
    }();
    return dir;
}

}  // namespace zk_fuzz
