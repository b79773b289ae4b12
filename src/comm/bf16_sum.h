// bf16 for the wire (comm.grad_dtype: bf16 on the CPU; Note [bf16 gradient compression]):
// float32 <-> bf16 conversion and the MPI reduction that sums bf16 values.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>

namespace trident::bf16 {

// Round to nearest, ties to even (as PyTorch's and CUDA's float -> bfloat16); NaN stays NaN.
void from_float(const float* in, uint16_t* out, size_t n);
void to_float(const uint16_t* in, float* out, size_t n);

// The MPI user function of a commutative MPI_Op (MPI_Op_create) over MPI_UINT16_T elements
// holding bf16: inout = bf16(float(in) + float(inout)). The MpiComm that compresses owns the op.
MPI_User_function* sum_function();

}  // namespace trident::bf16
