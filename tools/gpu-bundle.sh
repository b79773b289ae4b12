#!/usr/bin/env bash
# Packs what tools/gpu-check.sh needs to run trident on a machine without its Debian packages
# (the lent GPU machine: CUDA, cuDNN and NCCL present, MPI/HDF5/yaml-cpp maybe not) into
# .gpu-bundle/bundle.tar.xz (ignored by git; name .gpu-bundle in the device tool's `carry`;
# the whole working tree that travels must stay under 64 MiB, hence xz). The archive holds
#   bin/      trident, test_cuda, bench_kernels, built here for sm_90 with TRIDENT_NATIVE=OFF
#   lib/      every shared library they load that is not glibc, libstdc++ or CUDA's own
#   ompi/     Open MPI's and PMIx's plugin folders, so MPI_Init works without Open MPI installed
# Usage: bash tools/gpu-bundle.sh   (builds build-gpu/ first; about 8 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
# --hash: print the hash of the sources a bundle is built from (gpu-check.sh compares).
sources_hash() {
  find CMakeLists.txt src kernels include tests tools/cmake -type f | LC_ALL=C sort |
    xargs sha256sum | sha256sum | cut -c1-16
}
if [ "${1:-}" = "--hash" ]; then sources_hash; exit 0; fi
out=/tmp/trident-bundle-staging
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRIDENT_CUDA=ON \
      -DTRIDENT_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build build-gpu --target trident test_cuda bench_kernels
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib" "$out/ompi"
cp build-gpu/trident build-gpu/tests/test_cuda build-gpu/tests/bench_kernels "$out/bin/"

# Libraries the machine there has in its own versions (glibc, the C++ runtime, CUDA's).
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libresolv\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart|libcublas|libcudnn|libnccl|libnvrtc|libnvidia)'
ompi_plugins=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
pmix_plugins=/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
# Only the plugins a single-node run uses (shared memory, TCP, the collectives, singleton and
# mpirun start-up); the fabric ones (UCX, OFI, PSM, verbs) would pull in 100+ MB of libraries.
plugins=$(ls $ompi_plugins/mca_{btl_self,btl_vader,btl_tcp,pml_ob1,coll_*,osc_sm,osc_pt2pt,ess_*,pmix_*,schizo_*,rml_*,routed_*,oob_tcp,state_*,odls_*,plm_rsh,ras_simulator,rmaps_*,errmgr_*,grpcomm_*,iof_*,filem_raw,rtc_hwloc,reachable_weighted,shmem_*,patcher_*,sec_*,bml_r2,allocator_*,mpool_*,rcache_grdma,dfs_*,io_*,fbtl_posix,fcoll_*,fs_ufs,sharedfp_*,topo_*,vprotocol_*,op_*,pstat_*,timer_*,if_*,installdirs_*,memory_*,compress_*,event_*,hwloc_*,btl_sm}.so 2>/dev/null || true)
mkdir -p "$out/ompi/openmpi3" "$out/ompi/pmix"
cp $plugins "$out/ompi/openmpi3/"
cp $pmix_plugins/*.so "$out/ompi/pmix/"
cp -r /usr/share/openmpi "$out/ompi/share-openmpi" 2>/dev/null || true
cp -r /usr/share/pmix "$out/ompi/share-pmix" 2>/dev/null || true
# Transitive dependencies of the binaries and plugins.
for f in "$out"/bin/* "$out"/ompi/openmpi3/*.so "$out"/ompi/pmix/*.so; do
  ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] && continue
  cp -L "$path" "$out/lib/$name"
done
du -sh "$out"/*
mkdir -p .gpu-bundle
tar -C "$out" -cJf .gpu-bundle/bundle.tar.xz .
sources_hash > .gpu-bundle/sources.sha256
ls -la .gpu-bundle
