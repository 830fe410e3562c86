# Sourced by the build scripts: cmake_generator DIR prints the generator
# arguments for configuring DIR: "-G Ninja" when ninja is installed and DIR is
# new or already a Ninja build, nothing otherwise (cmake refuses to switch an
# existing build's generator, and keeps the one it has when given none).
# Ninja schedules compiles across targets: the sanitizer build of .ci/sanitize.sh
# takes 306 s on two cores against 419 s with CMake's Makefiles, at the same CPU time.
cmake_generator() {
    local dir="$1"
    command -v ninja >/dev/null 2>&1 || return 0
    if [ ! -f "$dir/CMakeCache.txt" ] || grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$dir/CMakeCache.txt"; then
        echo "-G Ninja"
    fi
}
