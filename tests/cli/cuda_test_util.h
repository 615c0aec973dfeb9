// What the CUDA model's GPU tests share: skipping cleanly without a GPU, and quiet options.
#pragma once

#include "cli/cuda_model.h"
#include "runtime/device.h"

/// Skips the rest of a test case when there is no usable GPU, saying why.
#define XSERV_REQUIRE_GPU()                                                                        \
  if (const ::xserv::runtime::DeviceInfo dev = ::xserv::runtime::probe_device();                   \
      !dev.available) {                                                                            \
    MESSAGE("skipped: no GPU (" << dev.reason << ")");                                             \
    return;                                                                                        \
  }

namespace xserv::testing {

/// CudaModelOptions without the "[cuda] ..." progress lines.
inline cli::CudaModelOptions quiet() {
  cli::CudaModelOptions o;
  o.quiet = true;
  return o;
}

} // namespace xserv::testing
