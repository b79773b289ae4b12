// Whole-model tests: layout, initialisation, gradient against finite differences, ready events,
// llm.c checkpoint round trip.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "model_inputs.h"
#include "trident/check.h"
#include "trident/model.h"

namespace trident {
namespace {

using testing::random_tokens;

GPTConfig tiny_config() {
  GPTConfig c;
  c.layers = 2;
  c.channels = 16;
  c.heads = 2;
  c.vocab = 50;  // not a multiple of 128: exercises the padded columns
  c.padded_vocab = GPTConfig::pad_vocab(c.vocab);
  c.max_seq_len = 8;
  return c;
}

TEST(GptLayout, ContiguousInReadyOrder) {
  GPTConfig c = tiny_config();
  auto infos = gpt_param_layout(c);
  size_t offset = 0;
  for (const auto& p : infos) {
    EXPECT_EQ(p.offset, offset) << p.name;
    offset += p.count;
  }
  EXPECT_EQ(infos.front().name, "wte");
  EXPECT_EQ(infos[1].name, "lnfw");
  EXPECT_EQ(infos[3].name, "h1.fcprojw");  // last block first
  EXPECT_EQ(infos.back().name, "wpe");
  // 12·L·C² + 13·L·C from blocks, plus embeddings and final LayerNorm.
  const size_t C = c.channels, L = c.layers;
  EXPECT_EQ(offset, 12 * L * C * C + 13 * L * C + size_t(c.padded_vocab) * C +
                        size_t(c.max_seq_len) * C + 2 * C);
}

TEST(GptInit, SeededAndThreadCountIndependent) {
  GPTConfig c = tiny_config();
  auto be1 = make_cpu_backend(1);
  auto be2 = make_cpu_backend(2);
  GPT a(c, *be1, 2, 8), b(c, *be2, 2, 8), d(c, *be2, 2, 8);
  a.init_weights(7);
  b.init_weights(7);
  d.init_weights(8);
  ASSERT_EQ(0, std::memcmp(a.params(), b.params(), a.num_params() * 4));
  EXPECT_NE(0, std::memcmp(a.params(), d.params(), a.num_params() * 4));
  // Statistics: wte ~ N(0, 0.02) over its live rows, padded rows 0; fcproj scaled by 1/sqrt(2L).
  const ParamInfo& wte = a.param("wte");
  double sum2 = 0;
  const size_t live = size_t(c.vocab) * c.channels;
  for (size_t i = 0; i < live; ++i)
    sum2 += double(a.params()[wte.offset + i]) * a.params()[wte.offset + i];
  EXPECT_NEAR(std::sqrt(sum2 / live), 0.02, 0.002);  // 800 samples: ~2.5% standard error
  for (size_t i = live; i < wte.count; ++i) ASSERT_EQ(a.params()[wte.offset + i], 0.0f);
  const ParamInfo& fp = a.param("h0.fcprojw");
  sum2 = 0;
  for (size_t i = 0; i < fp.count; ++i)
    sum2 += double(a.params()[fp.offset + i]) * a.params()[fp.offset + i];
  EXPECT_NEAR(std::sqrt(sum2 / fp.count), 0.02 / 2.0, 0.001);  // 1024 samples
  EXPECT_EQ(a.params()[a.param("h1.ln1w").offset], 1.0f);
  EXPECT_EQ(a.params()[a.param("h1.qkvb").offset], 0.0f);
}

// The model is fp32, so finite differences use a large step and a loose bound:
// h = 1e-2 keeps the float rounding noise of the loss (~1e-7 relative on a loss ~4) at about
// 2e-5 absolute in the quotient, while the O(h²) truncation error stays near 1e-5 for these
// smooth functions. Every element of every tensor is checked against |fd−g| ≤ 2e-2·|g| + 1e-4.
TEST(GptGradient, MatchesFiniteDifferences) {
  GPTConfig c = tiny_config();
  auto be = make_cpu_backend(1);
  const int B = 2, T = 8;
  GPT m(c, *be, B, T);
  m.init_weights(3);
  // Larger weights than GPT-2's 0.02 so every path has a visible gradient.
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  for (const auto& p : m.params_info()) {
    if (p.name == "wte") {
      for (size_t i = 0; i < size_t(c.vocab) * c.channels; ++i) m.params()[p.offset + i] = nd(rng);
      continue;
    }
    for (size_t i = 0; i < p.count; ++i) m.params()[p.offset + i] += nd(rng);
  }
  auto in = random_tokens(B * T, c.vocab, 1), tg = random_tokens(B * T, c.vocab, 2);
  m.zero_grads();
  m.forward(in.data(), tg.data(), B, T);
  m.backward(1.0f);
  std::vector<float> g(m.grads(), m.grads() + m.num_params());

  const float h = 1e-2f;
  int checked = 0, bad = 0;
  for (const auto& p : m.params_info()) {
    // wte: only live rows (padded rows never get a gradient; asserted below).
    const size_t n = p.name == "wte" ? size_t(c.vocab) * c.channels : p.count;
    for (size_t i = 0; i < n; i += (p.count > 600 ? 7 : 1)) {
      float* w = m.params() + p.offset + i;
      const float saved = *w;
      *w = saved + h;
      const double lp = m.forward(in.data(), tg.data(), B, T);
      *w = saved - h;
      const double lm = m.forward(in.data(), tg.data(), B, T);
      *w = saved;
      const double fd = (lp - lm) / (2.0 * h);
      const double an = g[p.offset + i];
      ++checked;
      if (std::abs(fd - an) > 2e-2 * std::abs(an) + 1e-4) {
        if (++bad < 10) ADD_FAILURE() << p.name << "[" << i << "] fd " << fd << " analytic " << an;
      }
    }
  }
  EXPECT_EQ(bad, 0) << "of " << checked;
  EXPECT_GT(checked, 1000);
  const ParamInfo& wte = m.param("wte");
  for (size_t i = size_t(c.vocab) * c.channels; i < wte.count; ++i)
    ASSERT_EQ(g[wte.offset + i], 0.0f) << "padded vocabulary row got a gradient";
}

TEST(GptBackward, ReadyEventsCoverEveryParameterOnceAfterItsGradient) {
  GPTConfig c = tiny_config();
  auto be = make_cpu_backend(1);
  GPT m(c, *be, 2, 8);
  m.init_weights(5);
  auto in = random_tokens(16, c.vocab, 3), tg = random_tokens(16, c.vocab, 4);
  m.zero_grads();
  m.forward(in.data(), tg.data(), 2, 8);
  std::vector<int> order;
  std::vector<std::vector<float>> snapshot;
  m.backward(1.0f, [&](int i, int) {
    order.push_back(i);
    const ParamInfo& p = m.params_info()[i];
    snapshot.emplace_back(m.grads() + p.offset, m.grads() + p.offset + p.count);
  });
  ASSERT_EQ(order.size(), m.params_info().size());
  std::vector<int> seen(order.size(), 0);
  for (int i : order) ++seen[i];
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << m.params_info()[i].name;
  // A gradient reported ready must not change afterwards.
  for (size_t k = 0; k < order.size(); ++k) {
    const ParamInfo& p = m.params_info()[order[k]];
    ASSERT_EQ(0, std::memcmp(snapshot[k].data(), m.grads() + p.offset, p.count * 4)) << p.name;
  }
}

// Note [Tied embedding gradient]: with a sink, wte's buffer holds the dense LM-head part (ready
// first) and the sink the batch's rows; adding the rows back gives the plain gradient. The sums
// are the same fp32 additions in another order, so the bound is float rounding (1e-6 relative
// to the tensor's largest entry).
TEST(GptBackward, EmbeddingRowSinkSplitsTheTiedGradient) {
  GPTConfig c = tiny_config();
  auto be = make_cpu_backend(1);
  GPT m(c, *be, 2, 8);
  m.init_weights(5);
  auto in = random_tokens(16, c.vocab, 3), tg = random_tokens(16, c.vocab, 4);
  m.zero_grads();
  m.forward(in.data(), tg.data(), 2, 8);
  m.backward(1.0f);
  std::vector<float> plain(m.grads(), m.grads() + m.num_params());

  std::vector<int32_t> rows(in.begin(), in.end());
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  std::vector<int32_t> row_of_input(in.size());
  for (size_t i = 0; i < in.size(); ++i)
    row_of_input[i] = int32_t(std::lower_bound(rows.begin(), rows.end(), in[i]) - rows.begin());
  std::vector<float> row_grads(rows.size() * c.channels, 0.0f);
  EmbeddingRowSink sink{row_of_input.data(), row_grads.data()};
  m.zero_grads();
  m.forward(in.data(), tg.data(), 2, 8);
  std::vector<int> order;
  m.backward(
      1.0f, [&](int i, int) { order.push_back(i); }, &sink);
  ASSERT_EQ(order.front(), 0) << "wte must be ready first with a sink";
  ASSERT_EQ(order.size(), m.params_info().size());
  float* dwte = m.grads() + m.param("wte").offset;
  for (size_t k = 0; k < rows.size(); ++k)
    for (int j = 0; j < c.channels; ++j)
      dwte[size_t(rows[k]) * c.channels + j] += row_grads[k * c.channels + j];
  float maxabs = 0;
  for (float g : plain) maxabs = std::max(maxabs, std::abs(g));
  for (size_t i = 0; i < plain.size(); ++i)
    ASSERT_NEAR(m.grads()[i], plain[i], 1e-6f * maxabs) << i;
}

// Note [Head gradient in pieces]: the head's dwte computed a slice of rows at a time is the same
// GEMM on a slice of its output (each element the same dot product over the same 16 tokens);
// and each piece is reported once, in order, right after the LM head (before lnfb), the rest of
// the list as without pieces. Bitwise equal with OpenBLAS's Cooperlake and SkylakeX kernels;
// its Haswell kernel (OPENBLAS_CORETYPE=Haswell) blocks a slice of rows differently and moves
// a few elements by one ulp. So the bound is the rounding of a 16-term dot product, 1e-6 of the
// gradient's largest entry; a piece at the wrong rows or missing is off by the entries
// themselves.
TEST(GptBackward, HeadGradientInPiecesIsBitwiseTheWholeAndReportedPieceByPiece) {
  GPTConfig c = tiny_config();
  auto be = make_cpu_backend(1);
  auto in = random_tokens(16, c.vocab, 3), tg = random_tokens(16, c.vocab, 4);
  std::vector<int32_t> row_of_input(in.size());
  for (size_t i = 0; i < in.size(); ++i) row_of_input[i] = int32_t(i);  // one row per input
  std::vector<float> row_grads(in.size() * c.channels);
  std::vector<std::vector<float>> grads;
  std::vector<std::vector<std::pair<int, int>>> orders;
  const std::vector<int> whole, pieces{0, 7, 30, c.padded_vocab};  // uneven on purpose
  for (const std::vector<int>* rows : {&whole, &pieces}) {
    GPTOptions opt;
    opt.wte_piece_rows = *rows;
    GPT m(c, *be, 2, 8, opt);
    m.init_weights(5);
    m.zero_grads();
    std::fill(row_grads.begin(), row_grads.end(), 0.0f);
    EmbeddingRowSink sink{row_of_input.data(), row_grads.data()};
    m.forward(in.data(), tg.data(), 2, 8);
    orders.emplace_back();
    m.backward(
        1.0f,
        [&](int i, int k) {
          orders.back().push_back({i, k});
        },
        &sink);
    grads.emplace_back(m.grads(), m.grads() + m.num_params());
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  float maxabs = 0;
  for (float g : grads[0]) maxabs = std::max(maxabs, std::abs(g));
  ASSERT_GT(maxabs, 0.0f);
  for (size_t i = 0; i < grads[0].size(); ++i)
    ASSERT_NEAR(grads[1][i], grads[0][i], 1e-6f * maxabs) << i;
  const int wte = 0;  // first in ready order with a sink (the test above)
  std::vector<std::pair<int, int>> expected = orders[0];
  ASSERT_EQ(expected.front(), std::make_pair(wte, 0));
  expected.insert(expected.begin() + 1, {{wte, 1}, {wte, 2}});
  EXPECT_EQ(orders[1], expected);
}

// Recomputation re-runs the same ops on the same inputs: gradients must be bitwise those of
// keeping everything, with two micro-batches in flight (slots) as a pipeline stage has them,
// and each mode must keep less than the one before.
TEST(GptRecompute, BitwiseEqualGradientsWithLessMemory) {
  GPTConfig c = tiny_config();
  auto be = make_cpu_backend(1);
  auto in0 = random_tokens(16, c.vocab, 3), tg0 = random_tokens(16, c.vocab, 4);
  auto in1 = random_tokens(16, c.vocab, 5), tg1 = random_tokens(16, c.vocab, 6);
  std::vector<std::vector<float>> grads;
  std::vector<size_t> bytes;
  for (Recompute mode : {Recompute::kNone, Recompute::kMlp, Recompute::kFull}) {
    GPTOptions opt;
    opt.slots = 2;
    opt.recompute = mode;
    GPT m(c, *be, 2, 8, opt);
    m.init_weights(5);
    m.zero_grads();
    m.forward(0, in0.data(), tg0.data(), 2, 8);
    m.forward(1, in1.data(), tg1.data(), 2, 8);
    m.backward(0, 0.5f, nullptr, nullptr);
    m.backward(1, 0.5f, nullptr, nullptr);
    grads.emplace_back(m.grads(), m.grads() + m.num_params());
    bytes.push_back(m.activation_bytes());
  }
  ASSERT_EQ(0, std::memcmp(grads[0].data(), grads[1].data(), grads[0].size() * 4)) << "mlp";
  ASSERT_EQ(0, std::memcmp(grads[0].data(), grads[2].data(), grads[0].size() * 4)) << "full";
  EXPECT_GT(bytes[0], bytes[1]);
  EXPECT_GT(bytes[1], bytes[2]);
}

// The activation memory each mode saves, against a hand-written count for the tiny config
// (tp = 1, CPU attention saving the [B,NH,T,T] probabilities): mlp drops fch and fch_gelu
// (4·N·C each) per block and slot and keeps one shared pair to recompute into — nothing else,
// in particular no shared attention buffer; full keeps each block's output and shares one
// copy of every block buffer.
TEST(GptRecompute, ActivationBytesSaveExactlyWhatIsRecomputed) {
  GPTConfig c = tiny_config();
  auto be = make_cpu_backend(1);
  const int B = 2, T = 8, slots = 2;
  const size_t N = size_t(B) * T, C = size_t(c.channels), L = size_t(c.layers);
  const size_t att = size_t(B) * c.heads * T * T;
  // Per block: ln1 qkv atty residual2 ln2 fch fch_gelu residual3 (16·N·C), four LayerNorm
  // statistics of N rows, and att.
  const size_t block = 16 * N * C + 4 * N + att;
  auto bytes = [&](Recompute mode) {
    GPTOptions opt;
    opt.slots = slots;
    opt.recompute = mode;
    return GPT(c, *be, B, T, opt).activation_bytes();
  };
  const size_t none = bytes(Recompute::kNone), mlp = bytes(Recompute::kMlp),
               full = bytes(Recompute::kFull);
  EXPECT_EQ(none - mlp, ((slots * L - 1) * 8 * N * C) * sizeof(float));
  EXPECT_EQ(none - full, (slots * L * (block - N * C) - block) * sizeof(float));
}

// Backward reports each block's parameters while that block's backward runs (not all at the
// end): the last phase finished before the report is the one before the block's. lnf's are
// reported in the head's phase; wte and wpe in the embedding's (without a sink).
TEST(GptBackward, ReadyEventsArriveDuringTheirPhase) {
  GPTConfig c = tiny_config();
  auto be = make_cpu_backend(1);
  GPT m(c, *be, 2, 8);
  m.init_weights(5);
  auto in = random_tokens(16, c.vocab, 3), tg = random_tokens(16, c.vocab, 4);
  std::string last_phase;
  m.set_phase_recorder([&](const std::string& phase, auto, auto) { last_phase = phase; });
  m.forward(in.data(), tg.data(), 2, 8);
  std::vector<std::string> before;  // per parameter: the last phase ended before its report
  before.resize(m.params_info().size());
  std::vector<int> order;
  m.backward(1.0f, [&](int i, int) {
    order.push_back(i);
    before[size_t(i)] = last_phase;
  });
  std::vector<int> expected;  // ready order: the list front to back, wte (no sink) last
  for (int i = 1; i < int(m.params_info().size()); ++i) expected.push_back(i);
  expected.push_back(0);
  EXPECT_EQ(order, expected);
  for (size_t i = 0; i < before.size(); ++i) {
    const ParamInfo& p = m.params_info()[i];
    std::string want = "forward head+loss";  // lnf: inside the head's backward
    if (p.layer == c.layers - 1) want = "backward head+loss";
    if (p.layer >= 0 && p.layer < c.layers - 1)
      want = fmt::format("backward block {}", p.layer + 1);
    if (p.name == "wte" || p.name == "wpe") want = "backward block 0";
    EXPECT_EQ(before[i], want) << p.name;
  }
}

// Two stages run one after the other on one rank (the boundary tensor copied by hand) give
// the one-stage model's loss and gradients bitwise: the same ops in the same order.
TEST(GptStages, TwoStagesEqualOneStage) {
  GPTConfig c = tiny_config();
  auto be = make_cpu_backend(1);
  auto in = random_tokens(16, c.vocab, 3), tg = random_tokens(16, c.vocab, 4);
  GPT whole(c, *be, 2, 8);
  whole.init_weights(5);
  whole.zero_grads();
  const float loss = whole.forward(in.data(), tg.data(), 2, 8);
  whole.backward(1.0f);

  GPTOptions o0, o1;
  o0.stage = pipeline_stage(c.layers, 2, 0, {});
  o1.stage = pipeline_stage(c.layers, 2, 1, {});
  GPT s0(c, *be, 2, 8, o0), s1(c, *be, 2, 8, o1);
  s0.init_weights(5);
  s1.init_weights(5);
  s0.zero_grads();
  s1.zero_grads();
  s0.forward(0, in.data(), nullptr, 2, 8);
  const size_t n = s0.boundary_rows(2, 8) * c.channels;
  std::copy(s0.stage_output(0), s0.stage_output(0) + n, s1.stage_input(0));
  const float loss1 = s1.forward(0, nullptr, tg.data(), 2, 8);
  EXPECT_EQ(loss, loss1);
  std::vector<float> dboundary(n);
  s1.backward(0, 1.0f, nullptr, dboundary.data());
  s0.backward(0, 1.0f, dboundary.data(), nullptr);
  // wte: the one-stage gradient is the sum of the head's (stage 1) and the embedding's (stage 0).
  for (const GPT* st : {&s0, &s1})
    for (const ParamInfo& p : st->params_info()) {
      if (p.name == "wte") continue;
      const ParamInfo& q = whole.param(p.name);
      ASSERT_EQ(p.count, q.count);
      ASSERT_EQ(0, std::memcmp(const_cast<GPT*>(st)->grads() + p.offset, whole.grads() + q.offset,
                               p.count * 4))
          << p.name;
    }
  const ParamInfo& w0 = s0.param("wte");
  const ParamInfo& w1 = s1.param("wte");
  const ParamInfo& ww = whole.param("wte");
  for (size_t i = 0; i < ww.count; ++i)
    ASSERT_NEAR(s0.grads()[w0.offset + i] + s1.grads()[w1.offset + i], whole.grads()[ww.offset + i],
                1e-7f)
        << i;
}

// Causality and shorter inputs: the logits of a 1×4 prefix equal the first 4 positions of the
// first sequence of a 2×8 batch (same ops on the same rows; attention only looks back).
TEST(GptForward, ShorterPrefixGivesTheSameLogits) {
  GPTConfig c = tiny_config();
  auto be = make_cpu_backend(1);
  GPT m(c, *be, 2, 8);
  m.init_weights(5);
  auto in = random_tokens(16, c.vocab, 3);
  m.forward(in.data(), nullptr, 2, 8);
  std::vector<float> full(m.logits(), m.logits() + 4 * size_t(c.padded_vocab));
  m.forward(in.data(), nullptr, 1, 4);
  for (size_t i = 0; i < full.size(); ++i)
    ASSERT_NEAR(m.logits()[i], full[i], 1e-5f * (1.0f + std::abs(full[i]))) << i;
}

TEST(GptCheckpoint, LlmcRoundTripAndBadHeader) {
  GPTConfig c = tiny_config();
  auto be = make_cpu_backend(1);
  GPT a(c, *be, 1, 8), b(c, *be, 1, 8);
  a.init_weights(9);
  const auto dir = std::filesystem::temp_directory_path() / "trident_test_gpt";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "model.bin").string();
  save_llmc_weights(a, path);
  GPTConfig r = read_llmc_config(path);
  EXPECT_EQ(r.layers, c.layers);
  EXPECT_EQ(r.channels, c.channels);
  EXPECT_EQ(r.vocab, c.vocab);
  EXPECT_EQ(r.padded_vocab, c.padded_vocab);
  load_llmc_weights(b, path);
  EXPECT_EQ(0, std::memcmp(a.params(), b.params(), a.num_params() * 4));

  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  try {
    read_llmc_config(path);
    FAIL() << "truncated checkpoint accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find("bytes"), std::string::npos) << e.what();
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << std::string(2048, 'x');
  try {
    read_llmc_config(path);
    FAIL() << "bad magic accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("magic"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trident
