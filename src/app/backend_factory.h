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

// Communicators for device buffers (TrainContext::dp_device, tp_device): NcclComms over the
// grid's dp ranks (its own stream, ordered after the backend's) and tp ranks (on the
// backend's stream). Null for a host backend or a group of one. Collective over the world.
struct DeviceComms {
  std::unique_ptr<Communicator> dp, tp;
};
DeviceComms make_device_comms(const Deck& deck, Backend& backend, ProcessGrid& grid);

}  // namespace trident
