// GPT's mixture layers (src/model/moe.h): built where the config asks for them, fed the block's
// second norm, their figures and the sigmoid router's bias step.
//
// Note [Mixtures in the layouts]
// A mixture runs in fp32 (on a device too, Note [Mixture ops]) on this rank's tokens (with cp
// its chunks), so dp, cp, pp (1f1b, gpipe, interleaved, zb-h1: Note [Mixtures in B]), recompute
// and ZeRO need only the gradient groups (Note [Expert parallelism], Note [ZeRO-3 with experts]).
// The balance losses and the capacity count this rank's tokens: with cp (or tp) they are the
// ranks' own, not one loss over the sequence as Megatron-Core sums the counts over tp × cp. bf16
// widens ln2 for it (gpt_bf16_widen.cpp). The hf form's totals cross the stages with the
// activations (Note [Transformers' totals across stages]).
//
// Note [Mixtures and tp]
// With tp a mixture needs sequence parallelism, as in Megatron-Core: each tp rank normalises
// and routes its own Nr = N/tp rows, with every expert whole (expert tensor parallelism 1), and
// its output is final on those rows (no gather before, no reduce-scatter after). Its weights'
// gradients are then partial sums over tp: the step's last micro-batch sums the layer's span
// over tp before reporting it ready. The auxiliary and z terms are per tp rank's rows, their
// gradients scaled by 1/tp: the z-loss is exactly the mean over all rows, the load-balancing
// losses the mean of each rank's (as the dp ranks' are).
//
// Under recompute (Note [Mixture memory]) `full` runs a mixture's forward again (the same
// routing, bit for bit) without counting its figures twice; mlp recomputes the experts' h and
// act in the layer's backward.
#include <cmath>

#include "model/gpt_state.h"
#include "model/moe.h"
#include "trident/check.h"

namespace trident {

void GPT::make_moe_layers(int B, int T, int slots) {
  moe_.resize(size_t(stage_.num_layers));
  if (!cfg_.has_moe()) return;
  const int E = cfg_.moe.experts;
  moe_hf_ = std::make_unique<MoeHfTotals>();
  moe_hf_->count.assign(size_t(slots) * E, 0.0);
  moe_hf_->psum.assign(size_t(slots) * E, 0.0);
  moe_hf_->layers.assign(size_t(slots), 0);
  moe_hf_->count_device = BackendBuffer<int32_t>(be_, size_t(slots) * E);
  moe_hf_->carried.assign(size_t(slots), 0);
  moe_hf_->message.assign(size_t(slots) * (2 * E + 1), 0.0);
  moe_hf_->count_host.assign(size_t(slots) * E, 0);
  // Note [Mixture memory]: this rank's rows; one backward scratch for every mixture layer.
  const MoeLayer* first = nullptr;
  for (int i = 0; i < stage_.num_layers; ++i) {
    if (!table_->layers[size_t(i)].moe) continue;
    moe_[size_t(i)] =
        std::make_unique<MoeLayer>(cfg_, be_, stage_.global_layer(i), slots, B * T / rows_divisor_,
                                   ep_, moe_hf_.get(), recompute_mode_, first);
    if (!first) first = moe_[size_t(i)].get();
    ++moe_count_;
  }
  moe_loads_.assign(size_t(moe_count_) * E, 0.0);
  if (cfg_.moe.router == MoeRouter::kSigmoid) {
    moe_bias_step_.assign(size_t(moe_count_) * E, 0.0f);
    moe_bias_step_device_ = BackendBuffer<float>(be_, size_t(moe_count_) * E);
  }
}

namespace {

// A mixture layer's tensors in the buffer at `base` (LayerTable::moe_offset, MoeWeights order).
MoeWeights moe_weights(float* base, const std::array<size_t, 7>& o) {
  return {at(base, o[0]), at(base, o[1]), at(base, o[2]), at(base, o[3]),
          at(base, o[4]), at(base, o[5]), at(base, o[6])};
}

}  // namespace

void GPT::moe_forward(int slot, int local_layer, float* out, const float* ln2, int N) {
  // Note [Weights in unit slots]: the block's weights where its unit is (ZeRO-3 on a device).
  const MoeWeights w =
      moe_weights(layer_weights(local_layer), table_->layers[size_t(local_layer)].moe_offset);
  moe_[size_t(local_layer)]->forward(slot, out, ln2, w, N, !recomputing_);
}

void GPT::moe_backward(int slot, int local_layer, float* dln2, const float* dout, const float* ln2,
                       int N, float loss_scale, bool last_micro_batch) {
  const LayerTable& lt = table_->layers[size_t(local_layer)];
  const auto& o = lt.moe_offset;
  const MoeWeights w = moe_weights(layer_weights(local_layer), o);
  float* G = layer_grads(local_layer);  // the choice bias (o[3]) has no gradient
  const MoeGrads g{at(G, o[0]), at(G, o[1]), at(G, o[2]), at(G, o[4]), at(G, o[5]), at(G, o[6])};
  // Note [Mixtures and tp]: the auxiliary terms' mean over the tp ranks' rows.
  moe_[size_t(local_layer)]->backward(slot, dln2, dout, ln2, w, g, N, loss_scale / float(tp_.size));
  if (tp_.size == 1 || !last_micro_batch) return;
  const size_t begin = infos_[size_t(lt.uses.front())].offset;
  const size_t end = infos_[size_t(lt.ready_moe)].offset + infos_[size_t(lt.ready_moe)].count;
  tp_wait(tp_.comm->all_reduce(G + begin, end - begin));
}

void GPT::moe_begin_forward(int slot) {
  if (!moe_hf_) return;
  const size_t E = size_t(cfg_.moe.experts);
  be_.fill_zero(moe_hf_->count_device.data() + slot * E, E * sizeof(int32_t));
  if (moe_hf_->carried[size_t(slot)]) return;  // the earlier chunks' totals, received
  std::fill(moe_hf_->count.begin() + slot * E, moe_hf_->count.begin() + (slot + 1) * E, 0.0);
  std::fill(moe_hf_->psum.begin() + slot * E, moe_hf_->psum.begin() + (slot + 1) * E, 0.0);
  moe_hf_->layers[size_t(slot)] = 0;
}

// transformers' form is known only when every mixture layer of the micro-batch has routed: on
// the chunk with the head (Note [Transformers' totals across stages]).
void GPT::moe_end_forward(int slot, int N) {
  if (!moe_hf_ || cfg_.moe.aux_loss != MoeAux::kHF || !head_chunk(slots_[size_t(slot)])) return;
  const size_t E = size_t(cfg_.moe.experts);
  const double LN = double(moe_hf_->layers[size_t(slot)]) * N;
  if (LN == 0) return;
  double sum = 0;
  for (size_t i = 0; i < E; ++i) sum += moe_hf_->count[slot * E + i] * moe_hf_->psum[slot * E + i];
  moe_hf_aux_ += double(cfg_.moe.aux_coeff) * double(E) * sum / (LN * LN);
}

// Note [Transformers' totals across stages]
// With pp (interleaved too) a micro-batch's mixture layers sit in several chunks, but the hf
// loss and every layer's router gradient need the totals over all of them (counts, psums, L).
// So they travel as one more tensor of the boundary messages: forward, each chunk adds its own
// to the ones received, and the head's chunk, holding them all, counts the loss (once); back,
// every chunk takes the whole micro-batch's with the gradient before its backward and passes
// them on. They are per micro-batch and slot, so any schedule's order works; an all-reduce over
// pp could not (the stages run different micro-batches at a time). 2E + 1 doubles, their bytes
// in the fp32 message as they are: the same sums as one rank, and counts exact past 2^24.
size_t GPT::moe_totals_floats() const {
  if (!moe_hf_ || cfg_.moe.aux_loss != MoeAux::kHF) return 0;
  return 2 * (2 * size_t(cfg_.moe.experts) + 1);
}

void GPT::receive_moe_totals(int slot, const float* message) {
  const size_t E = size_t(cfg_.moe.experts), W = 2 * E + 1;
  double* m = moe_hf_->message.data() + size_t(slot) * W;
  be_.copy(m, message, W * sizeof(double));  // done on return (Note [Backend memory])
  std::copy(m, m + E, moe_hf_->count.begin() + slot * E);
  std::copy(m + E, m + 2 * E, moe_hf_->psum.begin() + slot * E);
  moe_hf_->layers[size_t(slot)] = int(m[2 * E]);
  moe_hf_->carried[size_t(slot)] = 1;
}

void GPT::send_moe_totals(int slot, float* message) {
  const size_t E = size_t(cfg_.moe.experts), W = 2 * E + 1;
  double* m = moe_hf_->message.data() + size_t(slot) * W;
  std::copy(moe_hf_->count.begin() + slot * E, moe_hf_->count.begin() + (slot + 1) * E, m);
  std::copy(moe_hf_->psum.begin() + slot * E, moe_hf_->psum.begin() + (slot + 1) * E, m + E);
  m[2 * E] = double(moe_hf_->layers[size_t(slot)]);
  be_.copy(message, m, W * sizeof(double));
}

// The router's backward reads count_device: where the totals were carried, the micro-batch's
// counts replace this chunk's own.
void GPT::moe_begin_backward(int slot) {
  if (!moe_hf_ || !moe_hf_->carried[size_t(slot)]) return;
  moe_hf_->carried[size_t(slot)] = 0;
  const size_t E = size_t(cfg_.moe.experts);
  int32_t* counts = moe_hf_->count_host.data() + size_t(slot) * E;
  for (size_t i = 0; i < E; ++i) counts[i] = int32_t(moe_hf_->count[size_t(slot) * E + i]);
  be_.copy(moe_hf_->count_device.data() + size_t(slot) * E, counts, E * sizeof(int32_t));
}

MoeStats GPT::take_moe_stats() {
  MoeStats s;
  for (auto& m : moe_)
    if (m) m->take_stats(s);
  s.aux_loss += moe_hf_aux_;
  moe_hf_aux_ = 0;
  return s;
}

void GPT::discard_moe_stats() {
  take_moe_stats();
  for (auto& m : moe_)
    if (m) std::fill(m->step_load().begin(), m->step_load().end(), 0.0);
}

// DeepSeek-V3's loss-free balancing: each expert's bias moves by rate · sign(mean − load), the
// loads summed over the step's micro-batches and the ranks of `group` and `tp` (host
// communicators: on a device, tp_.comm is the device's, which cannot sum host memory).
void GPT::update_router_biases(Communicator* group, Communicator* tp, const ParamAddFn& add) {
  if (cfg_.moe.router != MoeRouter::kSigmoid) return;
  const size_t E = size_t(cfg_.moe.experts);
  // Every layer's loads in one buffer, so each group sums them in one collective.
  std::vector<double>& loads = moe_loads_;
  size_t n = 0;
  for (auto& m : moe_)
    if (m) std::copy(m->step_load().begin(), m->step_load().end(), loads.begin() + n), n += E;
  if (group && group->size() > 1) group->all_reduce(loads.data(), n).wait();
  // Note [Mixtures and tp]: each tp rank routed its own rows.
  if (tp_.size > 1) {
    TRIDENT_CHECK(tp && tp->size() == tp_.size, "the router's loads need the host's tp group");
    tp->all_reduce(loads.data(), n).wait();
  }
  // The steps on the host, then into the biases in backend memory: one copy, an add a layer.
  float* step = moe_bias_step_.data();
  for (size_t l = 0; l < size_t(moe_count_); ++l) {
    const double* load = loads.data() + l * E;
    double mean = 0;
    for (size_t e = 0; e < E; ++e) mean += load[e] / double(E);
    for (size_t e = 0; e < E; ++e) {
      const double d = mean - load[e];
      step[l * E + e] = float(cfg_.moe.bias_update_rate * double((d > 0) - (d < 0)));
    }
  }
  float* device_step = moe_bias_step_device_.data();
  be_.copy(device_step, step, moe_bias_step_.size() * sizeof(float));
  n = 0;
  for (size_t i = 0; i < moe_.size(); ++i) {
    if (!moe_[i]) continue;
    const LayerTable& lt = table_->layers[i];
    if (add) {
      add(infos_[size_t(lt.router_bias)], device_step + n);
    } else {
      float* bias = params_.data() + lt.moe_offset[3];
      be_.add(bias, bias, device_step + n, E);
    }
    n += E;
    std::fill(moe_[i]->step_load().begin(), moe_[i]->step_load().end(), 0.0);
  }
}

}  // namespace trident
