// The same-device stage transport: a queue of device buffers through which one pipeline stage's
// sent activations reach the next stage on the same GPU (engine/pipeline/local.h), so any --pp
// plan runs on one GPU.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "runtime/device_stage.h"

namespace xserv::runtime {

/// One hop's activations in flight: stage s copies each sub-step's send value into the next free
/// slot (and synchronises, StageTransport::wait), stage s + 1 then copies the slots out in the
/// same order. Slots grow to the largest sub-step seen and are reused across steps; a step of
/// many sub-steps (a long prompt) holds all of its sub-steps' rows at once, since each stage runs
/// its whole step before the next starts (20b: 11.8 MB per 1024-token sub-step).
class DeviceQueue {
public:
  DeviceQueue() = default;
  DeviceQueue(const DeviceQueue&) = delete;
  DeviceQueue& operator=(const DeviceQueue&) = delete;
  ~DeviceQueue();
  /// Empties the queue for the next step (its buffers stay).
  void start_step() { sent_ = received_ = 0; }
  /// Bytes of device memory the slots hold.
  size_t capacity() const;
  /// Copies `bytes` at `src` (device) into the next slot on `stream`.
  void push(const void* src, size_t bytes, Stream stream);
  /// Copies the oldest slot not yet received to `dst` (device) on `stream`; throws xserv::Error
  /// when no slot is left or its size is not `bytes`.
  void pop(void* dst, size_t bytes, Stream stream);

private:
  struct Slot {
    void* data = nullptr;
    size_t capacity = 0, bytes = 0;
  };
  std::vector<Slot> slots_;
  size_t sent_ = 0, received_ = 0;
};

/// Waits for the work queued on `stream`; throws xserv::Error naming `what` on a CUDA error.
void synchronize_stream(Stream stream, const std::string& what);

} // namespace xserv::runtime
