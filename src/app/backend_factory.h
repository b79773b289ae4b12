// The backend a deck asks for (run.backend), made the same way by every subcommand.
#pragma once

#include <functional>
#include <memory>

#include "trident/backend.h"
#include "trident/comm.h"
#include "trident/deck.h"
#include "trident/grid.h"
#include "trident/pipeline.h"
#include "trident/train.h"

namespace trident {

// cpu: run.threads OpenMP threads. cuda: the GPU numbered (node-local rank mod GPUs per node).
// input_error naming run.backend when the build or the machine has no CUDA.
std::unique_ptr<Backend> make_backend(const Deck& deck);

// Communicators for device buffers (TrainContext::dp_device, tp_device, pp_links,
// embedding_device, cp_device): NcclComms over the grid's gradient ranks, dp × cp (its own
// stream, ordered after the backend's), tp ranks (on the backend's stream), this stage's
// pipeline links (two ranks each, own streams: Note [Stage transfers on a device] in
// trident/pipeline.h), the embedding group (on the backend's stream) and the cp ranks (own
// stream, ordered by marks: Note [Ring on a device]), and with parallel.tp_overlap true the tp
// ranks again on their own stream for the overlap's rings
// (Note [Tensor-parallel ring on a device]). Null (empty) for a host backend or a group of one.
// Collective over the world.
struct DeviceComms {
  std::unique_ptr<Communicator> dp, tp;
  std::unique_ptr<Communicator> dp_gather;               // ZeRO-3's unit gathers (TrainContext)
  std::unique_ptr<Communicator> dp_shard, dp_replicate;  // HSDP (TrainContext)
  std::vector<std::unique_ptr<Communicator>> pp_links;   // owned; `links` points into them
  std::unique_ptr<StageLinks> links;                     // null without pp_links
  std::unique_ptr<Communicator> embedding;
  std::unique_ptr<Communicator> cp;
  std::unique_ptr<Communicator> tp_ring;
  // TrainContext::device_group: an NcclComm over a group the Trainer splits (ep, expert dp).
  std::function<std::unique_ptr<Communicator>(MpiComm&, const char*, bool)> group;
};
DeviceComms make_device_comms(const Deck& deck, Backend& backend, ProcessGrid& grid);
// Points every device communicator of `context` at `comms`' (null where there is none), so that
// each subcommand that builds a Trainer hands it the same set.
void attach_device_comms(const DeviceComms& comms, TrainContext& context);

}  // namespace trident
