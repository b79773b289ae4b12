#include "io/tensorboard.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "trident/check.h"

namespace trident {
namespace {

// The table of CRC-32C over one byte, built once (reflected: the low bit is shifted out first).
std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

// Protobuf's wire format, the few pieces the messages need: a key is (field << 3) | wire type;
// 0 varint, 1 fixed 64 bits, 2 length-delimited, 5 fixed 32 bits; little-endian fixed widths.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(v & 0x7F | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void put_key(std::string& out, int field, int wire) {
  put_varint(out, uint64_t(field) << 3 | wire);
}
template <typename T>
void put_fixed(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // x86 and arm64 Linux are little-endian, as the format
  out.append(bytes, sizeof(T));
}
void put_bytes(std::string& out, int field, std::string_view data) {
  put_key(out, field, 2);
  put_varint(out, data.size());
  out.append(data);
}

// Field numbers (tensorboard/compat/proto: event.proto, summary.proto, tensor.proto).
enum EventField { kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5, kSessionLog = 7 };
enum ValueField { kTag = 1, kSimpleValue = 2, kTensor = 8, kMetadata = 9 };
constexpr int kSummaryValue = 1;   // Summary.value
constexpr int kSessionStatus = 1;  // SessionLog.status; START = 1
constexpr int kPluginData = 1;     // SummaryMetadata.plugin_data
constexpr int kPluginName = 1;     // PluginData.plugin_name
constexpr int kDtype = 1;          // TensorProto.dtype; DT_STRING = 7
constexpr int kStringVal = 8;      // TensorProto.string_val

// What a step reports (step_record's keys) under the names TensorBoard users expect: grouped
// by what they measure, so the dashboard shows one section each. Not absent_is_zero: a key the
// step lacks (val_loss between validations) writes nothing.
struct StepTag {
  const char* key;
  const char* tag;
  bool absent_is_zero = false;  // a flag written only when true ("skipped")
};
constexpr StepTag kStepTags[] = {
    {"loss", "train/loss"},
    {"lr", "train/lr"},
    {"grad_norm", "train/grad_norm"},
    {"skipped", "train/skipped", true},
    {"val_loss", "val/loss"},
    {"tokens_per_s", "perf/tokens_per_s"},
    {"ms_per_step", "perf/ms_per_step"},
    {"mfu", "perf/mfu"},
    {"forward_ms", "time/forward_ms"},
    {"backward_ms", "time/backward_ms"},
    {"optimizer_ms", "time/optimizer_ms"},
    {"exposed_comm_ms", "time/exposed_comm_ms"},
    {"bubble", "time/bubble"},
    {"comm_ms", "comm/comm_ms"},
    {"overlap", "comm/overlap"},
    {"gather_comm_ms", "comm/gather_comm_ms"},
    {"gather_exposed_ms", "comm/gather_exposed_ms"},
    {"unit_gathers", "comm/unit_gathers"},
    {"late_unit_gathers", "comm/late_unit_gathers"},
    {"tp_comm_ms", "comm/tp_comm_ms"},
    {"tp_exposed_ms", "comm/tp_exposed_ms"},
    {"cp_comm_ms", "comm/cp_comm_ms"},
    {"cp_exposed_ms", "comm/cp_exposed_ms"},
    {"a2a_ms", "comm/a2a_ms"},
    {"a2a_exposed_ms", "comm/a2a_exposed_ms"},
    {"moe_aux_loss", "moe/aux_loss"},
    {"moe_z_loss", "moe/z_loss"},
    {"moe_load_max_over_mean", "moe/load_max_over_mean"},
    {"moe_dropped_fraction", "moe/dropped_fraction"},
    {"moe_ms", "time/moe_ms"},
    {"moe_route_ms", "time/moe_route_ms"},
    {"comm_cpu_ms", "comm/comm_cpu_ms"},
    {"param_mib", "memory/param_mib"},
    {"grad_mib", "memory/grad_mib"},
    {"grad_resident_mib", "memory/grad_resident_mib"},
    {"optimizer_mib", "memory/optimizer_mib"},
    {"activation_mib", "memory/activation_mib"},
    {"ckpt_block_ms", "ckpt/block_ms"},
    {"ckpt_write_ms", "ckpt/write_ms"},
    {"ckpt_writing", "ckpt/writing"},
    {"ckpt_failed", "ckpt/failed"},
};

// A number of the record, or NaN when absent, not a number, or not finite.
double number_of(const nlohmann::json& value) {
  if (value.is_boolean()) return value.get<bool>() ? 1.0 : 0.0;
  if (!value.is_number()) return NAN;
  const double v = value.get<double>();
  return std::isfinite(v) ? v : NAN;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t crc32c(const void* data, size_t bytes) {
  static const std::array<uint32_t, 256> table = make_crc32c_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < bytes; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t bytes) {
  const uint32_t c = crc32c(data, bytes);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

// Note [Restart in TensorBoard]
// A resumed run repeats the steps after its checkpoint that the earlier run had already logged.
// TensorBoard's convention: in a file whose file_version is brain.Event:2, a SessionLog START
// event at step s drops every event read before it with step >= s. So the resumed run's new
// file starts with START at the first step it will write (checkpoint step + 1), and each step
// shows once, with the values of the run that went on.
TensorBoardWriter::TensorBoardWriter(const std::string& dir, int resumed_after) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) input_error("log.tensorboard: cannot create the directory {}: {}", dir, ec.message());
  const long now = long(std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count());
  const std::string stem =
      fmt::format("{}/events.out.tfevents.{:010d}.{}.{}", dir, now, host_name(), getpid());
  // "x": never append to another writer's file; the next number if the name is taken.
  for (int n = 0; !file_ && n < 100; ++n) {
    path_ = fmt::format("{}.{}", stem, n);
    file_ = std::fopen(path_.c_str(), "wbx");
    if (!file_ && errno != EEXIST) break;
  }
  if (!file_)
    input_error("log.tensorboard: cannot create an event file in {}: {}", dir,
                std::strerror(errno));
  event_.reserve(1024);
  summary_.reserve(1024);
  frame_.reserve(1024);
  begin_event(0);
  put_bytes(event_, kFileVersion, "brain.Event:2");
  end_event();
  if (resumed_after > 0) {  // Note [Restart in TensorBoard]
    begin_event(resumed_after + 1);
    std::string session_log;
    put_key(session_log, kSessionStatus, 0);
    put_varint(session_log, 1);  // START
    put_bytes(event_, kSessionLog, session_log);
    end_event();
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::begin_event(long step) {
  step_ = step;
  event_.clear();
  summary_.clear();
  const double wall =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  put_key(event_, kWallTime, 1);
  put_fixed(event_, wall);
  put_key(event_, kStep, 0);
  put_varint(event_, uint64_t(step));
}

void TensorBoardWriter::add_scalar(std::string_view tag, float value) {
  // Summary.value is a Value message: its length first, so its size is counted here (a tag is
  // short: its length is one varint byte below 128).
  const size_t size = 1 + (tag.size() < 128 ? 1 : 2) + tag.size() + 1 + 4;
  put_key(summary_, kSummaryValue, 2);
  put_varint(summary_, size);
  put_bytes(summary_, kTag, tag);
  put_key(summary_, kSimpleValue, 5);
  put_fixed(summary_, value);
}

void TensorBoardWriter::end_event() {
  if (!summary_.empty()) put_bytes(event_, kSummary, summary_);
  write_record(event_);
}

void TensorBoardWriter::write_record(std::string_view data) {
  frame_.clear();
  put_fixed(frame_, uint64_t(data.size()));
  put_fixed(frame_, masked_crc32c(frame_.data(), 8));
  frame_.append(data);
  put_fixed(frame_, masked_crc32c(data.data(), data.size()));
  // One fwrite and a flush: a killed run leaves whole records (a torn last one is skipped by
  // TensorBoard's reader).
  if (std::fwrite(frame_.data(), 1, frame_.size(), file_) != frame_.size() ||
      std::fflush(file_) != 0)
    throw Error(fmt::format("log.tensorboard: write to {} failed: {}", path_, std::strerror(errno)),
                ExitCode::kInternal);
}

void TensorBoardWriter::write_step(const nlohmann::json& record) {
  begin_event(record.at("step").get<long>());
  for (const StepTag& t : kStepTags) {
    const auto it = record.find(t.key);
    const double v = it != record.end() ? number_of(*it) : t.absent_is_zero ? 0.0 : NAN;
    if (!std::isnan(v)) add_scalar(t.tag, float(v));
  }
  end_event();
}

void TensorBoardWriter::write_scalars(long step, const nlohmann::json& object,
                                      std::string_view prefix) {
  begin_event(step);
  for (const auto& [key, value] : object.items()) {
    const double v = number_of(value);
    if (!value.is_boolean() && !std::isnan(v))
      add_scalar(fmt::format("{}{}", prefix, key), float(v));
  }
  end_event();
}

void TensorBoardWriter::write_code_text(long step, std::string_view tag, std::string_view text) {
  // Value{tag, metadata{plugin_data{plugin_name "text"}}, tensor{dtype DT_STRING, string_val}};
  // markdown: a fenced block keeps YAML's indentation and line breaks.
  std::string plugin, metadata, tensor, value;
  put_bytes(plugin, kPluginName, "text");
  put_bytes(metadata, kPluginData, plugin);
  put_key(tensor, kDtype, 0);
  put_varint(tensor, 7);
  put_bytes(tensor, kStringVal, fmt::format("```\n{}\n```", text));
  put_bytes(value, kTag, tag);
  put_bytes(value, kMetadata, metadata);
  put_bytes(value, kTensor, tensor);
  begin_event(step);
  put_bytes(summary_, kSummaryValue, value);
  end_event();
}

}  // namespace trident
