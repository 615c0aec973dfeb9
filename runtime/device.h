// GPU discovery through the statically linked CUDA runtime: works, and says so, without a driver.
#pragma once

#include <string>
#include <utility>

namespace xserv::runtime {

struct DeviceInfo {
  bool available = false;
  std::string reason; ///< why no GPU is usable, when !available
  int count = 0;
  std::string name; ///< device 0
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  size_t memory_bytes = 0;

  /// "sm_90" for device 0.
  std::string arch() const;
};

/// Probes the CUDA driver. Never throws: a machine without a driver or GPU yields
/// available = false and a one-line reason ("no CUDA driver found").
DeviceInfo probe_device();

/// Free and total bytes of the current GPU's memory (cudaMemGetInfo); zeros without a GPU.
std::pair<size_t, size_t> device_memory();

} // namespace xserv::runtime
