// The backend a deck asks for (run.backend), made the same way by every subcommand.
#pragma once

#include <memory>

#include "trident/backend.h"
#include "trident/deck.h"

namespace trident {

// cpu: run.threads OpenMP threads. cuda: the GPU numbered (node-local rank mod GPUs per node).
// input_error naming run.backend when the build or the machine has no CUDA.
std::unique_ptr<Backend> make_backend(const Deck& deck);

// One line for the log: "cpu (2 threads)" or "cuda (NVIDIA H200, device 0, ...)".
std::string describe_backend(const Backend& backend);

}  // namespace trident
