#!/usr/bin/env bash
# Installs trident's build and test dependencies from Debian's packages.
# `tools/setup.sh fuzz` adds the fuzz build's compiler (tools/run-fuzz.sh).
# Idempotent: prints nothing and installs nothing when everything is present.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config clang-format
  libopenmpi-dev openmpi-bin libhdf5-openmpi-dev
  libeigen3-dev libopenblas-dev libyaml-cpp-dev
  libisal-dev  # ISA-L's CRC-32 of checkpoint datasets (src/io/checkpoint_format.cpp)
  libgtest-dev libbenchmark-dev libcli11-dev libfmt-dev nlohmann-json3-dev
  python3-h5py python3-matplotlib python3-numpy python3-torch python3-yaml
  slurmctld slurmd slurm-client munge
  chromium  # headless browser of tests/cli/test_tensorboard.sh (122 MB download, about 40 s)
)
# `tools/setup.sh fuzz`: also clang 14 and its libFuzzer, ASan and OpenMP runtimes (tools/run-fuzz.sh).
if [ "${1:-}" = fuzz ]; then
  packages+=(clang-14 libclang-rt-14-dev libomp-14-dev)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "tools/setup.sh: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "tools/setup.sh: done"
