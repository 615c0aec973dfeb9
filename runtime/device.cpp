// GPU discovery: cudart is linked statically and loads libcuda itself, so this runs anywhere.
#include "runtime/device.h"

#include <cuda_runtime_api.h>

namespace xserv::runtime {

std::string DeviceInfo::arch() const {
  return "sm_" + std::to_string(sm_major) + std::to_string(sm_minor);
}

DeviceInfo probe_device() {
  DeviceInfo info;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    info.reason = err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice
                      ? std::string("no CUDA driver or GPU found (") + cudaGetErrorString(err) + ")"
                      : std::string("CUDA unavailable: ") + cudaGetErrorString(err);
    return info;
  }
  if (count == 0) {
    info.reason = "no CUDA GPU found";
    return info;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    info.reason = "cannot read the properties of GPU 0";
    return info;
  }
  info.available = true;
  info.count = count;
  info.name = prop.name;
  info.sm_major = prop.major;
  info.sm_minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  info.memory_bytes = prop.totalGlobalMem;
  return info;
}

std::pair<size_t, size_t> device_memory() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
    return {0, 0};
  return {free_b, total_b};
}

} // namespace xserv::runtime
