// What the CUDA model's GPU tests share: skipping cleanly without a GPU, and quiet options.
#pragma once

#include "cli/graph_model.h"
#include "runtime/device.h"

/// Skips the rest of a test case when there is no usable GPU, saying why.
#define XSERV_REQUIRE_GPU()                                                                        \
  if (const ::xserv::runtime::DeviceInfo dev = ::xserv::runtime::probe_device(); !dev.available) { \
    MESSAGE("skipped: no GPU (" << dev.reason << ")");                                             \
    return;                                                                                        \
  }

namespace xserv::testing {

/// The environment's GraphModelOptions (cli::graph_model_options) without the "[cuda] ..."
/// progress lines.
inline cli::GraphModelOptions quiet() {
  cli::GraphModelOptions o = cli::graph_model_options();
  o.quiet = true;
  return o;
}

} // namespace xserv::testing
