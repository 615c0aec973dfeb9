// DeviceQueue: device-to-device copies through growing staging buffers.
#include "runtime/device_queue.h"

#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include "base/error.h"

namespace xserv::runtime {
namespace {

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess)
    throw Error(fmt::format("same-device transport: {}: {}", what, cudaGetErrorString(e)));
}

} // namespace

DeviceQueue::~DeviceQueue() {
  for (const Slot& s : slots_)
    cudaFree(s.data);
}

size_t DeviceQueue::capacity() const {
  size_t total = 0;
  for (const Slot& s : slots_)
    total += s.capacity;
  return total;
}

void DeviceQueue::push(const void* src, size_t bytes, Stream stream) {
  if (sent_ == slots_.size())
    slots_.push_back({});
  Slot& slot = slots_[sent_++];
  if (slot.capacity < bytes) {
    check(cudaFree(slot.data), "freeing a staging buffer");
    slot.data = nullptr;
    slot.capacity = 0;
    check(cudaMalloc(&slot.data, bytes), "allocating a staging buffer");
    slot.capacity = bytes;
  }
  slot.bytes = bytes;
  check(cudaMemcpyAsync(slot.data, src, bytes, cudaMemcpyDeviceToDevice, stream),
        "copying a sent activation");
}

void DeviceQueue::pop(void* dst, size_t bytes, Stream stream) {
  if (received_ >= sent_)
    throw Error(fmt::format("same-device transport: sub-step {} receives, but the previous "
                            "stage sent only {} sub-steps",
                            received_, sent_));
  if (slots_[received_].bytes != bytes)
    throw Error(fmt::format("same-device transport: sub-step {} receives {} bytes, the previous "
                            "stage sent {}",
                            received_, bytes, slots_[received_].bytes));
  check(cudaMemcpyAsync(dst, slots_[received_++].data, bytes, cudaMemcpyDeviceToDevice, stream),
        "copying a received activation");
}

void synchronize_stream(Stream stream, const std::string& what) {
  check(cudaStreamSynchronize(stream), what);
}

} // namespace xserv::runtime
