// The one place the backend includes Eigen. EIGEN_DONT_PARALLELIZE: Eigen must never start its
// own OpenMP team; every parallel split in the backend is ours (see gemm.cpp).
#pragma once

#ifndef EIGEN_DONT_PARALLELIZE
#define EIGEN_DONT_PARALLELIZE
#endif
#include <Eigen/Core>

namespace trident::cpu {

// Row-major views of strided tensors (a head's [T, hs] slice of q|k|v rows, say), for the
// attention kernels.
template <typename Real>
using RowMajor = Eigen::Matrix<Real, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename Real>
using View = Eigen::Map<RowMajor<Real>, 0, Eigen::OuterStride<>>;
template <typename Real>
using ConstView = Eigen::Map<const RowMajor<Real>, 0, Eigen::OuterStride<>>;

}  // namespace trident::cpu
