// The backend a deck asks for (run.backend), made the same way by every subcommand.
#pragma once

#include <memory>

#include "trident/backend.h"
#include "trident/comm.h"
#include "trident/deck.h"
#include "trident/grid.h"

namespace trident {

// cpu: run.threads OpenMP threads. cuda: the GPU numbered (node-local rank mod GPUs per node).
// input_error naming run.backend when the build or the machine has no CUDA.
std::unique_ptr<Backend> make_backend(const Deck& deck);

// The GradReducer's communicator for device gradients (TrainContext::dp_device): an NcclComm
// over the grid's dp ranks, ordered after the backend's stream. Null for a host backend or
// dp = 1. Collective over dp. input_error for comm.grad_dtype bf16 on a host backend.
std::unique_ptr<Communicator> make_device_dp_comm(const Deck& deck, Backend& backend,
                                                  ProcessGrid& grid);

// One line for the log: "cpu (2 threads)" or "cuda (NVIDIA H200, device 0, ...)".
std::string describe_backend(const Backend& backend);

}  // namespace trident
