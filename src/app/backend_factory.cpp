#include "app/backend_factory.h"

#include <mpi.h>

#include <cstdlib>

#include "trident/check.h"
#ifdef TRIDENT_HAVE_CUDA
#include <cuda_runtime.h>

#include "trident/cuda_backend.h"
#include "trident/nccl_comm.h"
#endif

namespace trident {
namespace {

#ifdef TRIDENT_HAVE_CUDA
// The rank's index among the ranks on its node: with one rank per GPU (the Slurm job's
// --gpus-per-task=1 or --ntasks-per-node = GPUs), rank k of a node takes GPU k.
int node_local_rank() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return 0;
  MPI_Comm node;
  TRIDENT_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int rank = 0;
  MPI_Comm_rank(node, &rank);
  MPI_Comm_free(&node);
  return rank;
}

// Profiling is asked for with log.trace, or by a profiler that injects an NVTX tool (Nsight
// Systems sets NVTX_INJECTION64_PATH): only then do collectives name and time themselves.
bool profiling(const Deck& deck) {
  return !deck.log.trace.empty() || std::getenv("NVTX_INJECTION64_PATH") != nullptr;
}

// What every device communicator takes from the deck: comm.timeout_s and profiling.
NcclCommOptions comm_options(const Deck& deck, bool on_compute_stream = false) {
  NcclCommOptions options;
  options.timeout_s = deck.comm.timeout_s;
  options.on_compute_stream = on_compute_stream;
  options.profile = profiling(deck);
  return options;
}

// A gradient sum's communicator: comm.grad_dtype bf16 sums float32 in bf16
// (Note [bf16 gradient compression]), with HSDP on both hops
// (Note [HSDP with bf16 gradients] in src/train/data_parallel.h).
NcclCommOptions grad_comm_options(const Deck& deck) {
  NcclCommOptions options = comm_options(deck);
  options.grad_bf16 = deck.comm.grad_dtype == "bf16";
  return options;
}
#endif

}  // namespace

std::unique_ptr<Backend> make_backend(const Deck& deck) {
  if (deck.run.backend == "cpu") return make_cpu_backend(deck.run.threads);
#ifdef TRIDENT_HAVE_CUDA
  std::string why;
  if (!cuda_device_available(&why))
    input_error("run.backend is cuda, but there is no usable GPU here ({})", why);
  int devices = 0;
  cudaGetDeviceCount(&devices);
  CudaBackendOptions options;
  options.device = node_local_rank() % devices;
  options.attention = deck.run.attention;
  return make_cuda_backend(options);
#else
  input_error("run.backend is cuda, but this trident was built without CUDA (no nvcc at "
              "configure time, or -DTRIDENT_CUDA=OFF)");
#endif
}

DeviceComms make_device_comms(const Deck& deck, Backend& backend, ProcessGrid& grid) {
  DeviceComms comms;
  if (!backend.is_device()) return comms;  // bf16 gradients on the CPU: the Trainer's MpiComm
#ifdef TRIDENT_HAVE_CUDA
  auto stream = static_cast<cudaStream_t>(cuda_compute_stream(backend));
  // Every rank creates the same communicators in the same order (each creation is collective
  // over its group; the groups partition the world).
  const bool cp = grid.layout().cp > 1;
  if (grid.layout().dp * grid.layout().cp > 1) {  // gradients reduce over dp × cp
    const NcclCommOptions options = grad_comm_options(deck);
    comms.dp = std::make_unique<NcclComm>(grid.gradients().raw(),
                                          cp ? "dp x cp (nccl)" : "dp (nccl)", stream, options);
    // Note [HSDP] (src/train/data_parallel.h): the shards' group and the replicas', each its own.
    const bool hsdp = deck.parallel.zero > 0 && grid.layout().dp_replicate > 1;
    if (hsdp) {
      comms.dp_shard = std::make_unique<NcclComm>(grid.gradient_shards().raw(), "dp_shard (nccl)",
                                                  stream, options);
      comms.dp_replicate = std::make_unique<NcclComm>(grid.dp_replicate().raw(),
                                                      "dp_replicate (nccl)", stream, options);
    }
    if (deck.parallel.zero == 3)  // Note [Weights in unit slots] in src/train/zero3_pool.h
      comms.dp_gather = std::make_unique<NcclComm>(
          (hsdp ? grid.gradient_shards() : grid.gradients()).raw(),
          hsdp ? "dp_shard gathers (nccl)" : "dp gathers (nccl)", stream, comm_options(deck));
  }
  if (grid.layout().tp > 1) {
    NcclCommOptions options = comm_options(deck, /*on_compute_stream=*/true);
    comms.tp = std::make_unique<NcclComm>(grid.tp().raw(), "tp (nccl)", stream, options);
    // Note [Chunks on the host] (src/model/tp_overlap.h): on a device only true turns it on.
    if (deck.parallel.tp_overlap == "true") {
      options.on_compute_stream = false;
      comms.tp_ring =
          std::make_unique<NcclComm>(grid.tp().raw(), "tp ring (nccl)", stream, options);
    }
  }
  if (grid.layout().pp > 1) {
    // Note [Stage transfers on a device] (trident/pipeline.h): a link of two ranks per
    // direction and neighbour, each on its own stream, made in link order on every rank.
    const NcclCommOptions options = comm_options(deck);
    comms.links = std::make_unique<StageLinks>();
    BackendBuffer<float> probe(backend, 1);
    backend.synchronize();  // its zeroing done before a link writes it
    for (const StageLinkGroup& link : split_stage_links(grid.pp().raw())) {
      const char* name =
          link.direction == 0
              ? (link.sending ? "pp activations out (nccl)" : "pp activations in (nccl)")
              : (link.sending ? "pp gradients out (nccl)" : "pp gradients in (nccl)");
      comms.pp_links.push_back(std::make_unique<NcclComm>(link.group, name, stream, options));
      MPI_Comm group = link.group;
      TRIDENT_MPI(MPI_Comm_free(&group));
      // One float over the new link, while both ranks are here: NCCL connects a pair at its
      // first transfer, so the link is connected at setup rather than in the first step.
      Communicator& c = *comms.pp_links.back();
      (link.sending ? c.send(probe.data(), 1, 1) : c.recv(probe.data(), 1, 0)).wait();
      (link.sending ? comms.links->send : comms.links->recv)[link.direction] =
          comms.pp_links.back().get();
    }
  }
  if (grid.layout().pp > 1 && grid.in_embedding_group()) {
    // Note [Stage sum in device memory] (train/tied_embedding.cpp): on the compute stream,
    // since the norm and AdamW need the sum right after it.
    const NcclCommOptions options = comm_options(deck, /*on_compute_stream=*/true);
    comms.embedding =
        std::make_unique<NcclComm>(grid.embedding().raw(), "embedding (nccl)", stream, options);
  }
  if (cp) {
    const NcclCommOptions options = comm_options(deck);
    comms.cp = std::make_unique<NcclComm>(grid.cp().raw(), "cp (nccl)", stream, options);
  }
  // The ep group on the compute stream (the tokens move between the layer's kernels); the
  // expert-data-parallel group as dp's, for the GradReducer.
  const NcclCommOptions group_options = grad_comm_options(deck);
  comms.group = [stream, group_options](MpiComm& group, const char* name, bool compute) {
    NcclCommOptions options = group_options;
    options.on_compute_stream = compute;
    if (compute) options.grad_bf16 = false;
    return std::unique_ptr<Communicator>(
        std::make_unique<NcclComm>(group.raw(), name, stream, options));
  };
#else
  (void)grid;
#endif
  return comms;
}

void attach_device_comms(const DeviceComms& comms, TrainContext& context) {
  context.dp_device = comms.dp.get();
  context.tp_device = comms.tp.get();
  context.pp_links = comms.links.get();
  context.embedding_device = comms.embedding.get();
  context.cp_device = comms.cp.get();
  context.tp_ring = comms.tp_ring.get();
  context.device_group = comms.group;
  context.dp_gather_device = comms.dp_gather.get();
  context.dp_shard_device = comms.dp_shard.get();
  context.dp_replicate_device = comms.dp_replicate.get();
}

}  // namespace trident
