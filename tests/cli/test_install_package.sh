#!/usr/bin/env bash
# trident as a CMake package (tools/cmake/install.cmake): `cmake --install` of this build into a
# fresh prefix, then examples/own_model configured and built as a project of its own with
# -DCMAKE_PREFIX_PATH=<prefix> (find_package(trident), trident::train), and run on 2 ranks:
#   - the prefix has the headers, the part libraries, the binary and the package files, and
#     the package names no path of the source or build tree;
#   - the example compiles against the prefix's headers, not the source tree's;
#   - it passes its own check against one rank as tp 2 and as pp 2;
#   - with the CUDA backend built, a program using trident::cuda builds and runs;
#   - a version the package does not offer (find_package(trident 9.9)) is refused.
# usage: test_install_package.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
# (the build directory is the binary's; every target must be built: `cmake --install` copies them)
source "$(dirname "$0")/lib.sh" "$@"

build=$(cd "$(dirname "$bin")" && pwd)
prefix=$scratch/prefix
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

if ! cmake --install "$build" --prefix "$prefix" >install.log 2>&1; then
  fail "cmake --install: $(tail -3 install.log)"; finish; exit
fi
missing=()
for f in include/trident/grid.h include/trident/pipeline.h include/trident/model.h \
         lib/libtrident_core.a lib/libtrident_train.a bin/trident \
         lib/cmake/trident/tridentConfig.cmake lib/cmake/trident/tridentConfigVersion.cmake \
         lib/cmake/trident/tridentTargets.cmake; do
  [ -e "$prefix/$f" ] || missing+=("$f")
done
if [ ${#missing[@]} -eq 0 ]; then ok "installed: headers, libraries, binary, package files"
else fail "not installed: ${missing[*]}"; fi
if grep -lF -e "$src/" -e "$build/" "$prefix"/lib/cmake/trident/*.cmake >leaks.txt; then
  fail "the package names the source or build tree: $(cat leaks.txt | tr '\n' ' ')"
else
  ok "the package names no path of the source or build tree"
fi

# The example as a project of its own, against the prefix only.
if cmake -S "$src/examples/own_model" -B example "${generator[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
     >configure.log 2>&1 && cmake --build example -j 2 -v >build.log 2>&1; then
  ok "examples/own_model configured and built against $prefix"
else
  fail "examples/own_model out of tree:"; tail -15 configure.log build.log; finish; exit
fi
compiles=$(grep -E "residual_mlp\.cpp" build.log | grep -E -- "-c |-o " | head -1)
if [[ "$compiles" == *"$prefix/include"* && "$compiles" != *"$src/include"* ]]; then
  ok "it compiles against the prefix's headers"
else
  fail "its compile line does not use $prefix/include alone: $compiles"
fi
for layout in "--tp 2" "--pp 2"; do
  timeout 120 mpirun -n 2 example/own_model $layout >run.log 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -qx PASS run.log; then
    ok "own_model $layout on 2 ranks: PASS, $(grep -m1 'max relative difference' run.log)"
  else
    fail "own_model $layout on 2 ranks: exit $rc"; tail -5 run.log
  fi
done

# A CUDA build's package also has trident::cuda: a program that includes both CUDA headers
# (cuda_runtime.h, nccl.h through nccl_comm.h) and makes a CUDA backend where a GPU is usable
# compiles and links against it; it runs without a GPU too (and says why there is none).
if [ -e "$prefix/lib/libtrident_cuda.a" ]; then
  mkdir -p cuda_app
  cat >cuda_app/CMakeLists.txt <<'EOF'
cmake_minimum_required(VERSION 3.25)
project(cuda_app LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(trident REQUIRED)
add_executable(cuda_app main.cpp)
target_link_libraries(cuda_app PRIVATE trident::cuda trident::train)
EOF
  cat >cuda_app/main.cpp <<'EOF'
#include <cstdio>
#include <string>

#include "trident/cuda_backend.h"
#include "trident/nccl_comm.h"

int main() {
  std::string reason;
  if (!trident::cuda_device_available(&reason)) {
    std::printf("cuda_app: no usable GPU: %s\n", reason.c_str());
    return 0;
  }
  auto backend = trident::make_cuda_backend();
  std::printf("cuda_app: CUDA backend made, stream %p\n", trident::cuda_compute_stream(*backend));
  return 0;
}
EOF
  if cmake -S cuda_app -B cuda_app/build "${generator[@]}" -DCMAKE_PREFIX_PATH="$prefix" >cuda_app.log 2>&1 \
     && cmake --build cuda_app/build -j 2 >>cuda_app.log 2>&1 && cuda_app/build/cuda_app >>cuda_app.log 2>&1; then
    ok "trident::cuda: a program built against it runs: $(grep -m1 '^cuda_app:' cuda_app.log)"
  else
    fail "trident::cuda from the package:"; tail -15 cuda_app.log
  fi
fi

# The version file: an interface version the package does not have is refused.
mkdir -p wants_9
cat >wants_9/CMakeLists.txt <<'EOF'
cmake_minimum_required(VERSION 3.25)
project(wants_9 LANGUAGES CXX)
find_package(trident 9.9 REQUIRED)
EOF
if cmake -S wants_9 -B wants_9/build "${generator[@]}" -DCMAKE_PREFIX_PATH="$prefix" >wants_9.log 2>&1; then
  fail "find_package(trident 9.9) was accepted"
elif grep -q "tridentConfigVersion.cmake" wants_9.log || grep -q "version: 0.1" wants_9.log; then
  ok "find_package(trident 9.9) refused (the package is 0.1)"
else
  fail "find_package(trident 9.9) failed for another reason: $(tail -5 wants_9.log)"
fi

finish
