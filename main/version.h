// `zack --version`: the version, the git commit it was built from, the CPU
// features the build targets and this CPU has, and whether CUDA is built in.
#pragma once
#include <string>
#include <vector>

namespace zk {

std::string version_text();  // several lines, ending in '\n'

}  // namespace zk
