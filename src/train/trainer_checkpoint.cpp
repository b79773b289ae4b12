// The trainer's side of checkpoints: which part of every global tensor this rank holds.
#include <mpi.h>

#include "train/data_parallel.h"
#include "train/zero.h"
#include "trident/check.h"
#include "trident/grid.h"
#include "trident/train.h"

namespace trident {
namespace {

// wte and lmw: rows of the padded vocabulary, saved up to the real one.
bool vocab_rows(const ParamInfo& p) { return p.name == "wte" || p.name == "lmw"; }

// This rank's blocks of a parameter's global tensor (Note [Tensor-parallel shards]); wte's
// global tensor is cut to the real vocabulary, so the padding (which differs between layouts)
// is never saved.
std::vector<ShardBlock> blocks_of(const ParamInfo& p, int vocab, std::vector<int64_t>* global) {
  std::vector<int64_t> g(p.global_shape.begin(), p.global_shape.end());
  std::vector<int64_t> local(p.shape.begin(), p.shape.end());
  if (vocab_rows(p)) g[0] = vocab;
  *global = g;
  const int r = p.tp_rank;
  std::vector<ShardBlock> out;
  switch (p.shard) {
    case Shard::kReplicated:
      if (vocab_rows(p)) {
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
    case Shard::kPartRows: {
      int64_t global_begin = 0;
      for (int part : p.parts) {
        const int64_t rows = part / p.tp_size;
        ShardBlock b{std::vector<int64_t>(g.size(), 0), local};
        b.start[0] = global_begin + int64_t(r) * rows;
        b.count[0] = rows;
        out.push_back(b);
        global_begin += part;
      }
      break;
    }
    case Shard::kColumns: out.push_back({{0, int64_t(r) * local[1]}, local}); break;
  }
  return out;
}

// The blocks of a parameter's global tensor that hold local elements [lo, hi) (row-major in the
// local shard): a ZeRO piece (Note [ZeRO-1] in train/zero.h). The range is cut into a partial
// first row, whole rows and a partial last row; each is mapped as blocks_of maps the whole
// shard. The blocks follow the range's order, so its elements are contiguous in the data; wte's
// rows past the real vocabulary (the padding, always at the end) are left out.
std::vector<ShardBlock> range_blocks(const ParamInfo& p, int vocab, size_t lo, size_t hi) {
  const bool matrix = p.shape.size() > 1;
  const int64_t rows = p.shape[0], cols = matrix ? p.shape[1] : 1;
  const int64_t global_rows = vocab_rows(p) ? vocab : p.global_shape[0];
  std::vector<ShardBlock> out;
  // Local rows [r, r + n), columns [c, c + w) → global blocks.
  auto add = [&](int64_t r, int64_t n, int64_t c, int64_t w) {
    auto emit = [&](int64_t grow, int64_t count, int64_t gcol) {
      count = std::min(count, global_rows - grow);
      if (count <= 0) return;
      if (matrix) out.push_back({{grow, gcol}, {count, w}});
      else out.push_back({{grow}, {count}});
    };
    const int64_t t = p.tp_rank;
    switch (p.shard) {
      case Shard::kReplicated: emit(r, n, c); break;
      case Shard::kRows: emit(t * rows + r, n, c); break;
      case Shard::kColumns: emit(r, n, t * cols + c); break;
      case Shard::kPartRows: {
        // Local row `row` lies in the part whose local rows [local_begin, +part/tp) hold it.
        for (int64_t row = r; row < r + n;) {
          int64_t local_begin = 0, global_begin = 0, part_rows = 0;
          for (int part : p.parts) {
            part_rows = part / p.tp_size;
            if (row < local_begin + part_rows) break;
            local_begin += part_rows;
            global_begin += part;
          }
          const int64_t within = row - local_begin;
          const int64_t take = std::min(part_rows - within, r + n - row);
          emit(global_begin + t * part_rows + within, take, c);
          row += take;
        }
        break;
      }
    }
  };
  const auto a = int64_t(lo), b = int64_t(hi);
  int64_t r0 = a / cols, c0 = a % cols;
  const int64_t r1 = b / cols, c1 = b % cols;
  if (r0 == r1) {
    if (c1 > c0) add(r0, 1, c0, c1 - c0);
    return out;
  }
  if (c0 > 0) {
    add(r0, 1, c0, cols - c0);
    ++r0;
  }
  if (r1 > r0) add(r0, r1 - r0, 0, cols);
  if (c1 > 0) add(r1, 1, 0, c1);
  return out;
}

}  // namespace

std::vector<ShardTensor> Trainer::checkpoint_tensors(float* params, float* m, float* v) {
  const int tp_rank = model_->tensor_parallel().rank;
  const StageSpec& stage = model_->stage();
  // A tied wte is on the first and the last stage: the last one's copy is saved.
  const bool tied = model_->config().tied_head;
  std::vector<ShardTensor> out;
  struct Source {
    const char* prefix;
    float* base;
  };
  // ZeRO-3: the parameters too are pieces of the shard (Note [ZeRO-3 units]), from `params`,
  // then the shard buffer.
  const bool sharded = dp_ && dp_->sharded();
  const bool params_sharded = sharded && dp_->zero3();
  const Source sources[] = {{"params/", params}, {"adam_m/", m}, {"adam_v/", v}};
  for (const Source& src : sources)
    for (const ParamInfo& p : model_->params_info()) {
      if (sharded && (src.base != params || params_sharded)) continue;  // pieces, below
      ShardTensor t;
      t.name = src.prefix + p.name;
      t.blocks = blocks_of(p, model_->config().vocab, &t.global_shape);
      t.data = src.base + p.offset;
      const bool replicated = p.shard == Shard::kReplicated;
      // Experts split over ep (Note [Expert tensors]): the first expert-data-parallel replica
      // of each ep rank writes its experts.
      const bool first_replica =
          p.expert && ep_size_ > 1 ? expert_dp_rank_ == 0 : dp_rank_ == 0 && cp_rank_ == 0;
      t.owner = first_replica && ((!replicated && !p.expert) || tp_rank == 0) &&
                (p.name != "wte" || stage.has_head || !tied) && !t.blocks.empty();
      out.push_back(std::move(t));
    }
  // ZeRO: each rank saves (and loads) the pieces of m and v it owns (ZeRO-3: of the parameters
  // too).
  // A parameter in several buckets (wte's head gradient in pieces, Note [Head gradient in pieces])
  // has a piece in each, next to each other in the shard: one tensor whose blocks are the
  // pieces' in shard order.
  std::vector<Source> sharded_sources;
  if (params_sharded) sharded_sources.push_back(sources[0]);
  if (sharded) sharded_sources.insert(sharded_sources.end(), {sources[1], sources[2]});
  for (const Source& src : sharded_sources) {
    size_t prev_param = SIZE_MAX, prev_end = 0;  // the last tensor's piece, in the shard
    for (const OwnedPiece& piece : dp_->owned()) {
      const ParamInfo& p = model_->params_info()[piece.param];
      std::vector<ShardBlock> blocks = range_blocks(
          p, model_->config().vocab, piece.flat - p.offset, piece.flat - p.offset + piece.count);
      if (blocks.empty()) continue;
      if (piece.param == prev_param) {
        TRIDENT_CHECK(piece.shard == prev_end, "the shard's pieces of {} are not adjacent", p.name);
        out.back().blocks.insert(out.back().blocks.end(), blocks.begin(), blocks.end());
        prev_end = piece.shard + piece.count;
        continue;
      }
      prev_param = piece.param;
      prev_end = piece.shard + piece.count;
      ShardTensor t;
      t.name = src.prefix + p.name;
      t.global_shape.assign(p.global_shape.begin(), p.global_shape.end());
      if (vocab_rows(p)) t.global_shape[0] = model_->config().vocab;
      t.blocks = std::move(blocks);
      t.data = src.base + piece.shard;
      t.owner = (p.shard != Shard::kReplicated || tp_rank == 0) &&
                (p.name != "wte" || stage.has_head || !tied) && dp_->writes_shard();
      out.push_back(std::move(t));
    }
  }
  return out;
}

CheckpointMeta Trainer::checkpoint_meta(int steps_done, const std::string& run_id) const {
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
  return meta;
}

std::string Trainer::save(const std::string& dir, int steps_done, const std::string& run_id,
                          int keep) {
  // HDF5 reads the tensors on the host (Note [Backend memory]). ZeRO-3 saves its shards as they
  // are: nothing is gathered.
  const bool zero3 = dp_ && dp_->zero3();
  if (!zero3) sync_params();
  Backend& be = *ctx_.backend;
  const size_t n = zero3 ? dp_->shard_size() : model_->num_params(), k = opt_->size();
  HostView<float> p(be, zero3 ? dp_->shard_params() : model_->params(), n, true),
      m(be, opt_->m(), k, true), v(be, opt_->v(), k, true);
  return save_checkpoint(dir, checkpoint_meta(steps_done, run_id),
                         checkpoint_tensors(p.data(), m.data(), v.data()), keep, MPI_COMM_WORLD,
                         deck_.comm.timeout_s);
}

size_t Trainer::snapshot_floats() const {
  const bool zero3 = dp_ && dp_->zero3();
  return (zero3 ? dp_->shard_size() : model_->num_params()) + 2 * opt_->size();
}

std::vector<ShardTensor> Trainer::snapshot_plan(float* dst, std::vector<HostCopy>* copies) {
  const bool zero3 = dp_ && dp_->zero3();
  if (!zero3) sync_params();
  const size_t n = zero3 ? dp_->shard_size() : model_->num_params(), k = opt_->size();
  *copies = {{dst, zero3 ? dp_->shard_params() : model_->params(), n},
             {dst + n, opt_->m(), k},
             {dst + n + k, opt_->v(), k}};
  return checkpoint_tensors(dst, dst + n, dst + n + k);
}

CheckpointMeta Trainer::load(const std::string& path) {
  const CheckpointMeta meta = read_checkpoint_meta(path);
  const bool zero3 = dp_ && dp_->zero3();
  if (zero3) dp_->release_params();  // the shards change: nothing gathered may stay
  else sync_params();
  Backend& be = *ctx_.backend;
  const size_t n = zero3 ? dp_->shard_size() : model_->num_params(), k = opt_->size();
  HostView<float> p(be, zero3 ? dp_->shard_params() : model_->params(), n, true),
      m(be, opt_->m(), k, true), v(be, opt_->v(), k, true);
  load_checkpoint(path, checkpoint_tensors(p.data(), m.data(), v.data()), MPI_COMM_WORLD,
                  deck_.comm.timeout_s);
  p.commit();
  m.commit();
  v.commit();
  return meta;
}

}  // namespace trident
