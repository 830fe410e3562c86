// Writes the seed corpus of every fuzz target: fuzz_seeds DIR creates
// DIR/<target>/<seed name> for each (scripts/fuzz.sh runs it before fuzzing).
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>

#include "tests/fuzz/fuzz_targets.h"

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: fuzz_seeds DIR\n");
        return 2;
    }
    try {
        for (const zk_fuzz::fuzz_target& t : zk_fuzz::fuzz_target_list()) {
            const std::filesystem::path dir = std::filesystem::path(argv[1]) / t.name;
            std::filesystem::create_directories(dir);
            size_t n = 0;
            for (const auto& [name, bytes] : t.seeds()) {
                std::ofstream f(dir / name, std::ios::binary);
                f.write(bytes.data(), (std::streamsize)bytes.size());
                if (!f) throw std::runtime_error("cannot write " + (dir / name).string());
                n++;
            }
            std::printf("%s: %zu seeds\n", t.name, n);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "fuzz_seeds: %s\n", e.what());
        return 1;
    }
    return 0;
}
