// Bring your own model: how to put a model of your own on trident's data × tensor × pipeline
// grid. The model (residual_mlp.h) is a stack of residual MLP blocks with its own forward,
// backward and tensor-parallel split; this file adds the parallelism around it in six steps:
//
//   1. Start MPI with MPI_THREAD_MULTIPLE and build a trident::ProcessGrid: it is the "mpu".
//      grid.dp(), grid.tp(), grid.pp() are the three communicators, grid.coord() this rank's
//      place (rank order: tp fastest, then dp, then pp).
//   2. Build this rank's part of the model: the contiguous blocks of its pipeline stage
//      (coord().pp), each split over grid.tp() the way your layers split; parameters and
//      gradients in one flat buffer each, in the order backward finishes them.
//   3. Wrap the stage in a trident::PipelineStage: per micro-batch it names the tensors that
//      cross the stage boundary (buffers it owns, one slot per micro-batch in flight) and runs
//      forward/backward on them. The runner moves them over grid.pp() and checks their names
//      and shapes on arrival.
//   4. Give the gradient buffer to a trident::GradReducer on grid.dp(); in the last
//      micro-batch's backward call grad_ready(i) as each parameter's gradient is final, so
//      the all-reduce of late blocks overlaps the backward of early ones.
//   5. Each step: zero the gradients, trident::run_pipeline(1F1B, grid.pp(), ...),
//      reducer.finish() (gradients now hold the dp sum), then your optimizer on your shard.
//   6. (This example only) check the result against the same model trained on one rank.
//
//     mpirun -n 8 build/examples/own_model --dp 2 --tp 2 --pp 2
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "residual_mlp.h"
#include "trident/check.h"
#include "trident/grad_reducer.h"
#include "trident/grid.h"
#include "trident/pipeline.h"

using namespace own_model;

struct Options {
  int dp = 0, tp = 1, pp = 1;  // dp 0: world / (tp·pp)
  int blocks = 4, width = 32, hidden = 64;
  int batch = 32;         // global batch: samples per step over all dp ranks
  int micro_batches = 4;  // per dp rank and step
  int steps = 30;
  float lr = 1.0f;  // SGD on a mean-squared error
  std::string schedule = "1f1b";
};

constexpr uint64_t kSeed = 1234;  // initial parameters and data, the same in every layout

// Step 3: this rank's blocks as one pipeline stage.
class MlpStage final : public trident::PipelineStage {
 public:
  MlpStage(const Options& o, const MlpShape& shape, trident::ProcessGrid& grid, int num_blocks,
           float* params, float* grads, trident::GradReducer& reducer)
      : o_(o), shape_(shape), grid_(grid), num_blocks_(num_blocks), params_(params), grads_(grads),
        reducer_(reducer),
        rows_(o.batch / grid.layout().dp / o.micro_batches), tp_{&grid.tp(), grid.layout().tp,
                                                                 grid.coord().tp} {
    const int stages = grid.layout().pp, stage = grid.coord().pp;
    const auto schedule = trident::parse_pipe_schedule(o.schedule, "--schedule");
    slots_.resize(trident::max_in_flight(schedule, stages, stage, o.micro_batches));
    const size_t d = size_t(rows_) * shape.width, h = size_t(rows_) * (shape.hidden / tp_.size);
    for (Slot& s : slots_) {
      s.xs.assign(num_blocks + 1, std::vector<float>(d));
      s.dxs.assign(num_blocks + 1, std::vector<float>(d));
      s.pre.assign(num_blocks, std::vector<float>(h));
      s.y.resize(d);
    }
  }

  int step = 0;         // set before each run_pipeline
  double loss_sum = 0;  // last stage: this dp rank's loss, summed over its micro-batches

  // Receives the previous stage's output into the slot's input buffer.
  std::vector<trident::StageTensor> forward_inputs(int m, int /*chunk*/) override {
    return {boundary("x", slot(m).xs.front())};
  }

  void forward(int m, int /*chunk*/) override {
    Slot& s = slot(m);
    if (is_first() || is_last()) load_micro_batch(m, s);  // inputs / targets of the data set
    for (int b = 0; b < num_blocks_; ++b)
      block_forward(s.xs[b + 1].data(), s.pre[b].data(), s.xs[b].data(), params_of(b), shape_,
                    rows_, tp_);
    if (is_last()) {
      // Mean over the global batch (every dp rank's samples): the reducer sums over dp, so
      // each rank's seed carries the 1/dp of the average.
      const float scale =
          1.0f / float(size_t(rows_) * o_.micro_batches * grid_.layout().dp * shape_.width);
      loss_sum += mse_forward_backward(s.dxs.back().data(), s.xs.back().data(), s.y.data(),
                                       s.y.size(), scale);
    }
  }

  std::vector<trident::StageTensor> forward_outputs(int m, int /*chunk*/) override {
    return {boundary("x", slot(m).xs.back())};
  }
  std::vector<trident::StageTensor> backward_inputs(int m, int /*chunk*/) override {
    return {boundary("dx", slot(m).dxs.back())};
  }

  void backward(int m, int /*chunk*/) override {
    Slot& s = slot(m);
    // Gradient accumulation: only the last micro-batch's backward reduces (and overlaps).
    reducer_.begin_step(m == o_.micro_batches - 1);
    for (int b = num_blocks_ - 1; b >= 0; --b) {
      block_backward(s.dxs[b].data(), grads_of(b), s.dxs[b + 1].data(), s.xs[b].data(),
                     s.pre[b].data(), params_of(b), shape_, rows_, tp_);
      for (int k = 0; k < 4; ++k) reducer_.grad_ready(ready_index(b, k));  // no-op unless last
    }
  }

  std::vector<trident::StageTensor> backward_outputs(int m, int /*chunk*/) override {
    return {boundary("dx", slot(m).dxs.front())};
  }

  // Step 2: block b of this stage sits at ready position num_blocks − 1 − b (backward finishes
  // the last block first), its four parameters in kParts order.
  int ready_index(int b, int k) const { return (num_blocks_ - 1 - b) * 4 + k; }
  size_t block_offset(int b) const {
    return size_t(num_blocks_ - 1 - b) * block_param_count(shape_, tp_.size);
  }

 private:
  struct Slot {
    std::vector<std::vector<float>> xs, dxs, pre;  // xs[b]: block b's input; xs.back(): output
    std::vector<float> y;                          // targets (last stage)
  };

  Slot& slot(int m) { return slots_[m % slots_.size()]; }
  bool is_first() const { return grid_.is_first_stage(); }
  bool is_last() const { return grid_.is_last_stage(); }
  BlockParams params_of(int b) const {
    return block_at(params_ + block_offset(b), shape_, tp_.size);
  }
  BlockParams grads_of(int b) const { return block_at(grads_ + block_offset(b), shape_, tp_.size); }

  trident::StageTensor boundary(const char* name, std::vector<float>& v) {
    return {name, {rows_, shape_.width}, v.data()};
  }

  // Micro-batch m of dp rank r: samples r·(batch/dp) + m·rows onwards of this step's batch.
  void load_micro_batch(int m, Slot& s) {
    std::vector<float> x(shape_.width);
    const uint64_t first = uint64_t(step) * o_.batch +
                           uint64_t(grid_.coord().dp) * (o_.batch / grid_.layout().dp) +
                           uint64_t(m) * rows_;
    for (int n = 0; n < rows_; ++n) {
      float* xn = is_first() ? &s.xs[0][size_t(n) * shape_.width] : x.data();
      make_sample(xn, &s.y[size_t(n) * shape_.width], shape_.width, first + n, kSeed);
    }
  }

  const Options& o_;
  MlpShape shape_;
  trident::ProcessGrid& grid_;
  int num_blocks_;
  float *params_, *grads_;
  trident::GradReducer& reducer_;
  int rows_;
  TensorParallel tp_;
  std::vector<Slot> slots_;
};

static Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) trident::input_error("{}: missing value", a);
    const std::string v = argv[++i];
    auto as_int = [&] {
      try {
        return std::stoi(v);
      } catch (...) {
        trident::input_error("{} {}: not an integer", a, v);
      }
    };
    auto as_float = [&] {
      try {
        return std::stof(v);
      } catch (...) {
        trident::input_error("{} {}: not a number", a, v);
      }
    };
    if (a == "--dp") o.dp = as_int();
    else if (a == "--tp") o.tp = as_int();
    else if (a == "--pp") o.pp = as_int();
    else if (a == "--blocks") o.blocks = as_int();
    else if (a == "--width") o.width = as_int();
    else if (a == "--hidden") o.hidden = as_int();
    else if (a == "--batch") o.batch = as_int();
    else if (a == "--micro-batches") o.micro_batches = as_int();
    else if (a == "--steps") o.steps = as_int();
    else if (a == "--lr") o.lr = as_float();
    else if (a == "--schedule") o.schedule = v;
    else trident::input_error("unknown option {}; see examples/own_model/README.md", a);
  }
  return o;
}

static int run(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  const MlpShape shape{o.width, o.hidden, o.blocks};
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);

  // Step 1: the grid. make_layout refuses a layout that does not fit the world, naming it.
  trident::ProcessGrid grid(trident::make_layout(world, o.dp, o.tp, o.pp));
  const trident::GridLayout L = grid.layout();
  const trident::GridCoord me = grid.coord();
  if (o.steps < 1 || o.width < 1 || o.hidden < 1)
    trident::input_error("--steps, --width and --hidden must be at least 1");
  if (o.hidden % L.tp) trident::input_error("--hidden {} must divide by tp {}", o.hidden, L.tp);
  if (o.blocks < L.pp) trident::input_error("--blocks {}: fewer than pp {} stages", o.blocks, L.pp);
  if (o.micro_batches < 1 || o.batch % (L.dp * o.micro_batches))
    trident::input_error("--batch {} must divide by dp {} × --micro-batches {}", o.batch, L.dp,
                         o.micro_batches);
  const auto schedule = trident::parse_pipe_schedule(o.schedule, "--schedule");

  // Step 2: this stage's blocks (the first blocks % pp stages take one more), this tp rank's
  // shard of each, in one flat buffer in ready order.
  const int per_stage = o.blocks / L.pp, extra = o.blocks % L.pp;
  const int num_blocks = per_stage + (me.pp < extra);
  const int first_block = me.pp * per_stage + std::min(me.pp, extra);
  const size_t per_block = block_param_count(shape, L.tp);
  std::vector<float> params(per_block * num_blocks), grads(params.size());
  std::vector<trident::GradParam> ready_order;
  for (int r = 0; r < num_blocks; ++r) {  // ready position r holds block num_blocks − 1 − r
    const int b = num_blocks - 1 - r;
    init_block(block_at(&params[r * per_block], shape, L.tp), first_block + b, shape, L.tp, me.tp,
               kSeed);
    size_t offset = r * per_block;
    for (Part p : kParts) {
      const size_t n = part_count(p, shape, L.tp);
      ready_order.push_back({fmt::format("block{}.{}", first_block + b, part_name(p)), offset, n});
      offset += n;
    }
  }

  // Step 4: data-parallel averaging, one bucket per block.
  trident::GradReducerOptions ro;
  ro.first_bucket_bytes = ro.bucket_bytes = per_block * sizeof(float);
  trident::GradReducer reducer(grid.dp(), grads.data(), ready_order, ro);

  // Step 3 + 5: the stage, and the training loop.
  MlpStage stage(o, shape, grid, num_blocks, params.data(), grads.data(), reducer);
  std::vector<double> losses;
  double pipe_wait_ms = 0, exposed_ms = 0;
  for (int step = 0; step < o.steps; ++step) {
    std::fill(grads.begin(), grads.end(), 0.0f);
    stage.step = step;
    stage.loss_sum = 0;
    const trident::PipelineStats ps =
        trident::run_pipeline(schedule, grid.pp(), L.pp, me.pp, o.micro_batches, stage);
    reducer.finish();
    for (size_t i = 0; i < params.size(); ++i) params[i] -= o.lr * grads[i];  // SGD
    pipe_wait_ms += ps.wait_ms;
    exposed_ms += reducer.stats().exposed_comm_ms;
    // The loss lives on the last stage (once per tp group, each dp rank's share of the
    // global-batch mean): sum it over dp, share it.
    double loss = grid.is_last_stage() && me.tp == 0 ? stage.loss_sum : 0.0;
    grid.world().all_reduce(&loss, 1).wait();
    losses.push_back(loss);
  }

  // Step 6: the same model on one rank, same global batch, same steps (every rank runs it).
  const Reference ref = train_reference(shape, o.batch, o.steps, o.lr, kSeed);
  float param_err = 0;  // max |parallel − reference| / (1 + |reference|) over this rank's shard
  for (int b = 0; b < num_blocks; ++b) {
    const BlockParams mine = block_at(&params[stage.block_offset(b)], shape, L.tp);
    const BlockParams full = block_at(
        const_cast<float*>(&ref.params[(first_block + b) * block_param_count(shape, 1)]), shape, 1);
    for (Part p : kParts)
      for (size_t i = 0; i < part_count(p, shape, L.tp); ++i) {
        const float r = full.part(p)[global_index(p, i, shape, L.tp, me.tp)];
        param_err = std::max(param_err, std::abs(mine.part(p)[i] - r) / (1 + std::abs(r)));
      }
  }
  std::vector<float> errs(L.world);
  grid.world().all_gather(&param_err, errs.data(), 1).wait();
  param_err = *std::max_element(errs.begin(), errs.end());
  double loss_err = 0;
  for (int s = 0; s < o.steps; ++s)
    loss_err = std::max(loss_err, std::abs(losses[s] - ref.losses[s]) / ref.losses[s]);

  // fp32 with a different summation order (micro-batches, dp sum, tp partial sums).
  constexpr double kTolerance = 1e-5;
  const bool learned = losses.back() < 0.67 * losses.front();
  const bool pass = param_err <= kTolerance && loss_err <= kTolerance && learned;
  if (grid.world_rank() == 0) {
    std::printf("own_model: dp %d × tp %d × pp %d, %d blocks on %d stage(s), %s, %d micro-batches "
                "of %d samples per dp rank\n",
                L.dp, L.tp, L.pp, o.blocks, L.pp, o.schedule.c_str(), o.micro_batches,
                o.batch / L.dp / o.micro_batches);
    for (int s = 0; s < o.steps; s += std::max(1, o.steps / 5))
      std::printf("step %3d  loss %.6f  (one rank: %.6f)\n", s, losses[s], ref.losses[s]);
    std::printf("final loss %.6f (one rank %.6f); pipeline wait %.1f ms, exposed dp comm %.1f ms "
                "(rank 0)\n",
                losses.back(), ref.losses.back(), pipe_wait_ms, exposed_ms);
    std::printf("max relative difference to one rank: loss %.2e, parameters %.2e (tolerance "
                "%.0e)%s\n",
                loss_err, param_err, kTolerance,
                learned ? "" : "; but the loss did not fall by a third");
    std::printf("%s\n", pass ? "PASS" : "FAIL");
  }
  return pass ? 0 : 1;
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {  // the GradReducer's thread calls MPI
    std::fprintf(stderr, "own_model: MPI_THREAD_MULTIPLE not provided\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int rc = 0;
  try {
    rc = run(argc, argv);
  } catch (const trident::Error& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    // Bad arguments are the same on every rank: every rank stops here, rank 0 says why.
    // Anything else may have left a neighbour waiting, so it ends the job.
    if (e.code() == trident::ExitCode::kBadInput) {
      if (rank == 0) std::fprintf(stderr, "own_model: %s\n", e.what());
    } else {
      std::fprintf(stderr, "own_model: error (rank %d): %s\n", rank, e.what());
      MPI_Abort(MPI_COMM_WORLD, int(e.code()));
    }
    rc = int(e.code());
  }
  MPI_Finalize();
  return rc;
}
