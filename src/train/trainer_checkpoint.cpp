// The trainer's side of checkpoints: which part of every global tensor this rank holds.
#include <mpi.h>

#include "trident/check.h"
#include "trident/grid.h"
#include "trident/train.h"

namespace trident {
namespace {

// This rank's blocks of a parameter's global tensor (Note [Tensor-parallel shards]); wte's
// global tensor is cut to the real vocabulary, so the padding (which differs between layouts)
// is never saved.
std::vector<ShardBlock> blocks_of(const ParamInfo& p, int vocab, std::vector<int64_t>* global) {
  std::vector<int64_t> g(p.global_shape.begin(), p.global_shape.end());
  std::vector<int64_t> local(p.shape.begin(), p.shape.end());
  if (p.name == "wte") g[0] = vocab;
  *global = g;
  const int r = p.tp_rank;
  std::vector<ShardBlock> out;
  switch (p.shard) {
    case Shard::kReplicated:
      if (p.name == "wte") {
        out.push_back({{0, 0}, {vocab, g[1]}});
      } else {
        out.push_back({std::vector<int64_t>(g.size(), 0), g});
      }
      break;
    case Shard::kRows: {
      const int64_t begin = int64_t(r) * local[0];
      const int64_t rows = std::min<int64_t>(local[0], g[0] - begin);  // wte: padding cut
      if (rows <= 0) break;
      ShardBlock b{std::vector<int64_t>(g.size(), 0), local};
      b.start[0] = begin;
      b.count[0] = rows;
      out.push_back(b);
      break;
    }
    case Shard::kQkvRows: {
      const int64_t block = local[0] / 3, global_block = g[0] / 3;
      for (int part = 0; part < 3; ++part) {
        ShardBlock b{std::vector<int64_t>(g.size(), 0), local};
        b.start[0] = part * global_block + int64_t(r) * block;
        b.count[0] = block;
        out.push_back(b);
      }
      break;
    }
    case Shard::kColumns:
      out.push_back({{0, int64_t(r) * local[1]}, local});
      break;
  }
  return out;
}

}  // namespace

std::vector<ShardTensor> Trainer::checkpoint_tensors(float* params, float* m, float* v) {
  const int tp_rank = model_->tensor_parallel().rank;
  const StageSpec& stage = model_->stage();
  std::vector<ShardTensor> out;
  struct Source {
    const char* prefix;
    float* base;
  };
  const Source sources[] = {{"params/", params}, {"adam_m/", m}, {"adam_v/", v}};
  for (const Source& src : sources)
    for (const ParamInfo& p : model_->params_info()) {
      ShardTensor t;
      t.name = src.prefix + p.name;
      t.blocks = blocks_of(p, model_->config().vocab, &t.global_shape);
      t.data = src.base + p.offset;
      const bool replicated = p.shard == Shard::kReplicated;
      t.owner = dp_rank_ == 0 && (!replicated || tp_rank == 0) &&
                (p.name != "wte" || stage.has_head) && !t.blocks.empty();
      out.push_back(std::move(t));
    }
  return out;
}

std::string Trainer::save(const std::string& dir, int steps_done, const std::string& run_id,
                          int keep) {
  CheckpointMeta meta;
  meta.step = steps_done;
  meta.run_id = run_id;
  meta.deck_yaml = deck_.to_yaml();
  if (ctx_.grid) {
    const GridLayout& g = ctx_.grid->layout();
    meta.world = g.world;
    meta.dp = g.dp;
    meta.tp = g.tp;
    meta.pp = g.pp;
  }
  // HDF5 reads the tensors on the host (Note [Backend memory]).
  Backend& be = *ctx_.backend;
  const size_t n = model_->num_params();
  HostView<float> p(be, model_->params(), n, true), m(be, opt_->m(), n, true),
      v(be, opt_->v(), n, true);
  return save_checkpoint(dir, meta, checkpoint_tensors(p.data(), m.data(), v.data()), keep,
                         MPI_COMM_WORLD);
}

CheckpointMeta Trainer::load(const std::string& path) {
  const CheckpointMeta meta = read_checkpoint_meta(path);
  Backend& be = *ctx_.backend;
  const size_t n = model_->num_params();
  HostView<float> p(be, model_->params(), n, true), m(be, opt_->m(), n, true),
      v(be, opt_->v(), n, true);
  load_checkpoint(path, checkpoint_tensors(p.data(), m.data(), v.data()), MPI_COMM_WORLD);
  p.commit();
  m.commit();
  v.commit();
  return meta;
}

}  // namespace trident
