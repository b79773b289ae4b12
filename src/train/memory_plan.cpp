#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>

#include "train/grad_pool.h"
#include "train/trainer_parts.h"
#include "train/zero3.h"
#include "trident/check.h"

namespace trident {

// Note [Memory plan] (src/backend/counting_backend.cpp): what this rank will allocate — the
// model built on a counting backend (parameters, gradients, activations and scratch, exactly
// as the real build will), plus AdamW's moments, ZeRO's shard gradients and, with device
// pipeline links, GPTStage's boundary gradients — against what the backend has free. Host memory is
// shared by the ranks on the machine, so there the sum over them is compared. The refusal is an
// input_error of this rank; setup_step (app) makes every rank exit 2 with the lowest failing rank's
// message.
size_t zero3_pool_bytes(const std::vector<ParamInfo>& layout, const StageSpec& stage, bool tied,
                        const Zero3Memory& zero3) {
  const std::vector<std::string> names = zero3_unit_names(layout);
  std::map<std::string, size_t> unit_floats;
  size_t total = 0, largest = 0;
  for (size_t i = 0; i < layout.size(); ++i) {
    unit_floats[names[i]] += layout[i].count;
    total += layout[i].count;
  }
  for (const auto& [name, n] : unit_floats) largest = std::max(largest, n);
  auto floats = [&](const std::string& u) {
    auto it = unit_floats.find(u);
    return it == unit_floats.end() ? size_t(0) : it->second;
  };
  // The groups forward announces (GPT::param_use_sequence), whole stage; backward's are the same.
  std::vector<size_t> groups;
  if (stage.has_embedding) groups.push_back(floats("wte") + floats("wpe"));
  for (const auto& [name, n] : unit_floats)
    if (name[0] == 'h') groups.push_back(n);
  if (stage.has_head) groups.push_back(floats("head") + (tied ? floats("wte") : 0));
  // A tied wte on a stage with both ends stays gathered from the embedding to the head: beside
  // every pair of blocks.
  const size_t kept = tied && stage.has_embedding && stage.has_head ? floats("wte") : 0;
  size_t pair = 0;
  for (size_t k = 0; k < groups.size(); ++k) {
    const bool blocks = k > 0 && k + 2 < groups.size();  // groups k and k + 1 are blocks
    pair = std::max(pair, groups[k] + (k + 1 < groups.size() ? groups[k + 1] : 0) +
                              (blocks && stage.has_embedding && stage.has_head ? kept : 0));
  }
  // A pass's first call releases what the last pass left before asking for more, so two
  // neighbouring groups are the most held at once (reshard_after_forward true).
  const size_t params = zero3.keeps_params ? total : std::min(total, pair);
  const size_t grads =
      zero3.keeps_grads ? total : std::min(total, largest + 2 * zero3.bucket_bytes / sizeof(float));
  return (params + grads) * sizeof(float);
}

// Note [Unit slots] (train/zero3_pool.h): the device pool, in the layout's (unpadded) floats.
size_t zero3_device_pool_bytes(const std::vector<ParamInfo>& layout, const Zero3Memory& zero3) {
  const std::vector<std::string> names = zero3_unit_names(layout);
  std::map<std::string, size_t> unit_floats;
  size_t total = 0;
  for (size_t i = 0; i < layout.size(); ++i) {
    unit_floats[names[i]] += layout[i].count;
    total += layout[i].count;
  }
  size_t others = 0, block = 0, blocks = 0;
  for (const auto& [name, n] : unit_floats) {
    if (name[0] == 'h' && name != "head") {
      block = std::max(block, n);
      ++blocks;
    } else {
      others += n;
    }
  }
  return (zero3.keeps_params ? total : others + std::min<size_t>(blocks, 3) * block) *
         sizeof(float);
}

void check_memory_plan(const GPTConfig& cfg, int B, int T, const GPTOptions& options,
                       Backend& backend, int shard_ranks, bool stage_gradients,
                       const Zero3Memory& zero3, bool snapshot) {
  size_t model_bytes = 0, stage_bytes = 0;
  {
    auto counter = make_counting_backend(backend, &model_bytes);
    GPTOptions whole = options;  // the full buffers counted, then taken out below
    whole.no_full_params = false;
    GPT probe(cfg, *counter, B, T, whole);
    if (stage_gradients) {  // per slot, a received and a sent one where the stage has them
      const StageSpec& st = options.stage;
      const size_t buffers =
          size_t(!st.has_embedding || st.chunks() > 1) + size_t(!st.has_head || st.chunks() > 1);
      stage_bytes = size_t(probe.num_slots()) * buffers * probe.boundary_rows(B, T) *
                    size_t(cfg.channels) * sizeof(float);
    }
  }
  model_bytes += stage_bytes;  // counted with the activations
  const std::vector<ParamInfo> layout = gpt_param_layout(cfg, options.tp.size, options.tp.rank,
                                                         options.stage, options.wte_after_head);
  size_t param_floats = options.param_total;
  if (param_floats == 0)
    for (const ParamInfo& p : layout) param_floats += p.count;
  const bool sharded = shard_ranks > 1;
  const size_t shard_floats = sharded ? param_floats / size_t(shard_ranks) : 0;
  double params = double(param_floats) * 4, shard = double(shard_floats) * 4;
  const double optimizer = 2.0 * double(sharded ? shard_floats : param_floats) * 4;
  // Note [Gradients in unit slots] (train/grad_pool.h): with pooled gradients the probe made
  // no gradient buffer; the pool (its own slots and two blocks, unpadded) holds them instead.
  const bool pooled = options.pooled_grads;
  const double pool_grads = pooled ? double(grad_pool_floats(layout)) * 4 : 0.0;
  double acts = double(model_bytes) - (pooled ? 1 : 2) * params;
  double need = double(model_bytes) + optimizer + shard + pool_grads;
  double grads = (pooled ? pool_grads : params) + shard;
  if (zero3.on) {
    // Note [ZeRO-3 units]: the shards of the parameters and gradients, and the pool; the full
    // buffers' address space takes no memory.
    const double pool = double(zero3_pool_bytes(layout, options.stage, cfg.tied_head, zero3));
    params = shard;
    grads = shard + pool;
    need = acts + params + grads + optimizer;
    if (backend.is_device()) {
      // Note [Weights in unit slots]: the unit pool; the gradients' pool, or the buffer whole
      // (Note [When gradients are pooled]). Note [No full weights on a device]: never the full
      // parameter buffer, model.init_from included.
      const double full = double(param_floats) * 4;
      params = shard + double(zero3_device_pool_bytes(layout, zero3));
      grads = (pooled ? pool_grads : full) + shard;
      need = acts + params + grads + optimizer;
    }
  }
  // Note [bf16 unit gathers] (train/zero3_pool.h): on a device the model makes no whole bf16
  // weight copy (the probe's, counted above as scratch; Note [No full weights on a device]);
  // the shards' bf16 copy and a tied head's cast are held. The pool is the fp32 pool's size.
  if (zero3.on && backend.is_device() && options.precision == Precision::kBf16) {
    const double copy16 = double(param_floats) * 2;
    const double kept16 = double(shard_floats) * 2 +
                          (cfg.tied_head && options.stage.has_head
                               ? double(cfg.padded_vocab / options.tp.size) * cfg.channels * 2
                               : 0.0);
    acts -= copy16;
    params += kept16;
    need += kept16 - copy16;
  }
  // Note [Asynchronous checkpoints]: the snapshot holds what the rank saves, its parameters
  // (ZeRO-3: their shard) and m and v, in host memory: on a host backend beside the rest; on a
  // device pinned host memory, which device memory does not hold.
  const double snap = snapshot && !backend.is_device() ? params + optimizer : 0.0;
  need += snap;
  // Ranks sharing this machine's memory, from the launcher (Open MPI sets it under mpirun and
  // srun); not a collective: ranks may have failed an earlier, rank-local check (their data),
  // and setup_step agrees on the outcome (a collective here would pair with its all-reduce).
  int local = 1;
  if (const char* n = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE"); n && !backend.is_device())
    local = std::max(1, std::atoi(n));
  const double free_bytes = double(backend.free_memory_bytes());
  if (free_bytes <= 0 || need * local <= free_bytes) return;
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
  const char* largest = acts >= params && acts >= optimizer ? "activations and scratch"
                        : optimizer >= params               ? "optimizer state"
                                                            : "parameters";
  input_error(
      "not enough memory: each rank needs {:.2f} GiB ({} here: parameters {:.2f}, "
      "gradients {:.2f}, optimizer state {:.2f}, activations and scratch {:.2f}{}; the "
      "largest: {}){}, but only {:.2f} GiB is free ({}); lower model.* or "
      "train.micro_batch, set train.recompute, or shard with parallel.tp/pp/zero",
      need / GiB, backend.name(), params / GiB, grads / GiB, optimizer / GiB, acts / GiB,
      snap > 0 ? fmt::format(", checkpoint.async's snapshot {:.2f}", snap / GiB) : std::string(),
      largest,
      local > 1
          ? fmt::format(", {:.2f} GiB for the {} ranks on this machine", need * local / GiB, local)
          : std::string(),
      free_bytes / GiB, backend.is_device() ? "device memory" : "MemAvailable in /proc/meminfo");
}

}  // namespace trident
