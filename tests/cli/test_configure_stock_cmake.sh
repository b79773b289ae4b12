#!/usr/bin/env bash
# Configure with CUDA against stock CMake 3.25.1's FindCUDAToolkit module
# (Note [CUDA 13 and CMake 3.25.1's FindCUDAToolkit] in CMakeLists.txt). Development machines
# may carry a patched module that hides the failure, so this test rebuilds the stock condition
# from the installed module: Debian's 3.25.1 sets the nvToolsExt deprecation without checking
# the target exists; a patched copy has "TARGET CUDA::nvToolsExt AND" in that condition, which
# is taken out here.
# Exit 77 (skipped) without nvcc or with a CMake whose module has neither form.
# usage: test_configure_stock_cmake.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
set -uo pipefail
src=$2 scratch=$3
rm -rf "$scratch" && mkdir -p "$scratch/modules"
cd "$scratch"
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$nvcc" ] || { echo "skipped: no nvcc (the CUDA toolkit is not installed)"; exit 77; }

echo 'message("${CMAKE_ROOT}")' > root.cmake
root=$(cmake -P root.cmake 2>&1)
module=$root/Modules/FindCUDAToolkit.cmake
stock='if(CMAKE_MINIMUM_REQUIRED_VERSION VERSION_GREATER_EQUAL 3.25)'
patched='if(TARGET CUDA::nvToolsExt AND CMAKE_MINIMUM_REQUIRED_VERSION VERSION_GREATER_EQUAL 3.25)'
if grep -qF "$patched" "$module"; then
  echo "this machine's $module is patched; testing against the stock condition"
elif ! grep -qF "$stock" "$module"; then
  echo "skipped: $module has neither form of the nvToolsExt condition (another CMake version)"
  exit 77
fi
sed "s/if(TARGET CUDA::nvToolsExt AND CMAKE_MINIMUM_REQUIRED_VERSION/if(CMAKE_MINIMUM_REQUIRED_VERSION/" \
  "$module" > modules/FindCUDAToolkit.cmake
grep -qF "$stock" modules/FindCUDAToolkit.cmake || { echo "FAIL: could not make the stock module"; exit 1; }
cp "$root/Modules/FindPackageHandleStandardArgs.cmake" "$root/Modules/FindPackageMessage.cmake" modules/

if cmake -S "$src" -B build -DTRIDENT_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" \
     -DCMAKE_MODULE_PATH="$scratch/modules" > configure.log 2>&1; then
  echo "ok: configures with CUDA against the stock FindCUDAToolkit"
  exit 0
fi
echo "FAIL: configure failed against the stock FindCUDAToolkit module:"
grep -A4 "CMake Error" configure.log | head -20
exit 1
