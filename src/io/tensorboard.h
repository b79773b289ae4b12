// TensorBoard event files (log.tensorboard): what `tensorboard --logdir` and its event
// accumulator read. A file is a sequence of TFRecords (little-endian u64 length, masked CRC-32C
// of those 8 bytes, the data, masked CRC-32C of the data) around Event protobufs, encoded here
// by hand (docs/decisions.md, "TensorBoard events"): Event{wall_time, step, file_version |
// summary | session_log}, Summary{Value{tag, simple_value | metadata + string tensor}}.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace trident {

// CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, init and final xor 0xffffffff).
uint32_t crc32c(const void* data, size_t bytes);
// The CRC as TFRecord stores it: rotated right by 15 bits plus 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t bytes);

// One run start's event file, written by rank 0 only. Every write is flushed, so a killed run
// leaves a readable file with every step it finished.
class TensorBoardWriter {
 public:
  // Creates `dir` and a new file in it, events.out.tfevents.<unix seconds>.<host>.<pid>.<n>,
  // starting with the file_version event. resumed_after > 0: the run goes on after that many
  // steps of a checkpoint, so a SessionLog START at step resumed_after + 1 follows
  // (Note [Restart in TensorBoard]).
  TensorBoardWriter(const std::string& dir, int resumed_after);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One step of metrics.jsonl (step_record's object, its "step" the event's step): each number
  // of the tag table (tensorboard.cpp) present and finite becomes a scalar; no allocation once
  // the buffers have grown to a step's size.
  void write_step(const nlohmann::json& record);
  // Every finite number of a flat object as the scalar <prefix><key> at `step` (bench's figures).
  void write_scalars(long step, const nlohmann::json& object, std::string_view prefix);
  // Text for the text plugin (markdown; `text` is shown in a code block, as written).
  void write_code_text(long step, std::string_view tag, std::string_view text);
  const std::string& path() const { return path_; }

 private:
  void begin_event(long step);
  void add_scalar(std::string_view tag, float value);
  void end_event();  // frames the event as a TFRecord, writes and flushes it
  void write_record(std::string_view data);

  std::string path_;
  std::FILE* file_ = nullptr;
  long step_ = 0;
  std::string event_, summary_, frame_;  // reused: they keep their capacity
};

}  // namespace trident
