// The one place the backend includes Eigen. EIGEN_DONT_PARALLELIZE: Eigen must never start its
// own OpenMP team; every parallel split in the backend is ours (see gemm.cpp).
#pragma once

#ifndef EIGEN_DONT_PARALLELIZE
#define EIGEN_DONT_PARALLELIZE
#endif
#include <Eigen/Core>
