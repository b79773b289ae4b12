// The user's own model: residual MLP blocks with a hand-written forward and backward, plain
// loops (the sizes are tiny), and the tensor-parallel split described in residual_mlp.h.
#include "residual_mlp.h"

#include <algorithm>
#include <cmath>

namespace own_model {

const char* part_name(Part part) {
  switch (part) {
    case Part::kW2: return "w2";
    case Part::kB2: return "b2";
    case Part::kW1: return "w1";
    case Part::kB1: return "b1";
  }
  return "?";
}

size_t part_count(Part part, const MlpShape& s, int tp_size) {
  const size_t width = s.width, hs = s.hidden / tp_size;
  switch (part) {
    case Part::kW2: return width * hs;
    case Part::kB2: return width;
    case Part::kW1: return hs * width;
    case Part::kB1: return hs;
  }
  return 0;
}

size_t block_param_count(const MlpShape& s, int tp_size) {
  size_t n = 0;
  for (Part p : kParts) n += part_count(p, s, tp_size);
  return n;
}

size_t global_index(Part part, size_t local, const MlpShape& s, int tp_size, int tp_rank) {
  const size_t hs = s.hidden / tp_size, first = size_t(tp_rank) * hs;
  switch (part) {
    case Part::kW2: return (local / hs) * s.hidden + first + local % hs;  // a column slice
    case Part::kB2: return local;                                         // whole
    case Part::kW1: return first * s.width + local;                       // a row slice
    case Part::kB1: return first + local;
  }
  return 0;
}

float* BlockParams::part(Part p) const {
  switch (p) {
    case Part::kW2: return w2;
    case Part::kB2: return b2;
    case Part::kW1: return w1;
    case Part::kB1: return b1;
  }
  return nullptr;
}

BlockParams block_at(float* base, const MlpShape& s, int tp_size) {
  BlockParams p;
  p.w2 = base;
  p.b2 = p.w2 + part_count(Part::kW2, s, tp_size);
  p.w1 = p.b2 + part_count(Part::kB2, s, tp_size);
  p.b1 = p.w1 + part_count(Part::kW1, s, tp_size);
  return p;
}

namespace {

// A uniform number in [-1, 1) from a 64-bit key (splitmix64), the same on every rank.
float uniform(uint64_t key) {
  uint64_t z = key + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return float(z >> 40) * (2.0f / float(1 << 24)) - 1.0f;
}

uint64_t key(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  return seed * 0x100000001b3ull ^ (a << 48) ^ (b << 40) ^ c;
}

}  // namespace

void init_block(const BlockParams& p, int block, const MlpShape& s, int tp_size, int tp_rank,
                uint64_t seed) {
  for (Part part : kParts) {
    const float scale = part == Part::kW1   ? 1.0f / std::sqrt(float(s.width))
                        : part == Part::kW2 ? 0.5f / std::sqrt(float(s.hidden))
                                            : 0.1f;
    for (size_t i = 0; i < part_count(part, s, tp_size); ++i)
      p.part(part)[i] =
          scale * uniform(key(seed, block, int(part), global_index(part, i, s, tp_size, tp_rank)));
  }
}

void make_sample(float* x, float* y, int width, uint64_t index, uint64_t seed) {
  for (int i = 0; i < width; ++i) x[i] = uniform(key(seed + 1, 0, 0, index * width + i));
  // A smooth target the blocks can fit: mixes each feature with its neighbour.
  for (int i = 0; i < width; ++i) y[i] = std::sin(2.0f * x[i]) - 0.5f * x[(i + 1) % width];
}

void block_forward(float* out, float* pre, const float* x, const BlockParams& p, const MlpShape& s,
                   int rows, const TensorParallel& tp) {
  const int D = s.width, H = s.hidden / tp.size;
  for (int n = 0; n < rows; ++n) {
    const float* xn = x + size_t(n) * D;
    float* pn = pre + size_t(n) * H;
    for (int j = 0; j < H; ++j) {
      float acc = p.b1[j];
      for (int c = 0; c < D; ++c) acc += p.w1[size_t(j) * D + c] * xn[c];
      pn[j] = acc;
    }
    for (int i = 0; i < D; ++i) {
      float acc = 0;
      for (int j = 0; j < H; ++j) acc += p.w2[size_t(i) * H + j] * std::max(pn[j], 0.0f);
      out[size_t(n) * D + i] = acc;
    }
  }
  // Row-parallel W2: each tp rank holds a partial sum of the output.
  if (tp.size > 1) tp.comm->all_reduce(out, size_t(rows) * D).wait();
  for (int n = 0; n < rows; ++n)
    for (int i = 0; i < D; ++i) out[size_t(n) * D + i] += x[size_t(n) * D + i] + p.b2[i];
}

void block_backward(float* dx, const BlockParams& g, const float* dout, const float* x,
                    const float* pre, const BlockParams& p, const MlpShape& s, int rows,
                    const TensorParallel& tp) {
  const int D = s.width, H = s.hidden / tp.size;
  std::vector<float> dpre(size_t(rows) * H);
  for (int n = 0; n < rows; ++n) {
    const float* dn = dout + size_t(n) * D;
    const float* pn = pre + size_t(n) * H;
    for (int i = 0; i < D; ++i) {
      g.b2[i] += dn[i];
      for (int j = 0; j < H; ++j) g.w2[size_t(i) * H + j] += dn[i] * std::max(pn[j], 0.0f);
    }
    for (int j = 0; j < H; ++j) {
      float acc = 0;
      for (int i = 0; i < D; ++i) acc += p.w2[size_t(i) * H + j] * dn[i];
      dpre[size_t(n) * H + j] = pn[j] > 0 ? acc : 0.0f;
    }
  }
  for (int n = 0; n < rows; ++n) {
    const float* xn = x + size_t(n) * D;
    const float* dp = dpre.data() + size_t(n) * H;
    for (int j = 0; j < H; ++j) {
      g.b1[j] += dp[j];
      for (int c = 0; c < D; ++c) g.w1[size_t(j) * D + c] += dp[j] * xn[c];
    }
    for (int c = 0; c < D; ++c) {
      float acc = 0;
      for (int j = 0; j < H; ++j) acc += p.w1[size_t(j) * D + c] * dp[j];
      dx[size_t(n) * D + c] = acc;
    }
  }
  // Column-parallel W1: each tp rank's hidden units give a partial input gradient.
  if (tp.size > 1) tp.comm->all_reduce(dx, size_t(rows) * D).wait();
  for (size_t i = 0; i < size_t(rows) * D; ++i) dx[i] += dout[i];  // the residual path
}

double mse_forward_backward(float* dout, const float* out, const float* y, size_t n, float scale) {
  double loss = 0;
  for (size_t i = 0; i < n; ++i) {
    const float d = out[i] - y[i];
    loss += double(d) * d;
    dout[i] = 2.0f * scale * d;
  }
  return loss * scale;
}

Reference train_reference(const MlpShape& s, int global_batch, int steps, float lr, uint64_t seed) {
  const size_t per_block = block_param_count(s, 1), D = s.width, H = s.hidden;
  const size_t rows = global_batch;
  Reference ref;
  ref.params.resize(per_block * s.blocks);
  std::vector<float> grads(ref.params.size());
  for (int b = 0; b < s.blocks; ++b)
    init_block(block_at(&ref.params[b * per_block], s, 1), b, s, 1, 0, seed);
  // xs[b]: block b's input (xs[blocks] the output); pre[b]; dxs[b]: the gradient of xs[b].
  std::vector<std::vector<float>> xs(s.blocks + 1, std::vector<float>(rows * D));
  std::vector<std::vector<float>> pre(s.blocks, std::vector<float>(rows * H));
  std::vector<std::vector<float>> dxs(s.blocks + 1, std::vector<float>(rows * D));
  std::vector<float> y(rows * D);
  for (int step = 0; step < steps; ++step) {
    for (size_t n = 0; n < rows; ++n)
      make_sample(&xs[0][n * D], &y[n * D], s.width, uint64_t(step) * rows + n, seed);
    for (int b = 0; b < s.blocks; ++b)
      block_forward(xs[b + 1].data(), pre[b].data(), xs[b].data(),
                    block_at(&ref.params[b * per_block], s, 1), s, int(rows), {});
    ref.losses.push_back(mse_forward_backward(dxs[s.blocks].data(), xs[s.blocks].data(), y.data(),
                                              rows * D, 1.0f / float(rows * D)));
    std::fill(grads.begin(), grads.end(), 0.0f);
    for (int b = s.blocks - 1; b >= 0; --b)
      block_backward(dxs[b].data(), block_at(&grads[b * per_block], s, 1), dxs[b + 1].data(),
                     xs[b].data(), pre[b].data(), block_at(&ref.params[b * per_block], s, 1), s,
                     int(rows), {});
    for (size_t i = 0; i < ref.params.size(); ++i) ref.params[i] -= lr * grads[i];
  }
  return ref;
}

}  // namespace own_model
