// Pipeline partitioning: a model graph split into N stages of contiguous layers, balanced by a
// cost model, with explicit send/recv ops where values cross a stage boundary.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/interpreter.h"
#include "ir/shape.h"

namespace xserv::compiler {

/// The machine the cost model balances for (the H200's measured copy bandwidth and dense BF16
/// tensor throughput, as cli/roofline.h).
struct PartitionCostModel {
  double bytes_per_s = 4.3e12;
  double flops_per_s = 790e12;
  /// Bytes per value of an MXFP4 weight as the GPU holds it and as a decode step reads it
  /// (compile --expert-format): bf16 2 and 2, mxfp4 17/32 and 17/32, both 2 + 17/32 and 17/32.
  double mxfp4_held_bytes = 2.0, mxfp4_read_bytes = 2.0;
};

/// What one stage holds and costs.
struct StageInfo {
  int first_layer = -1, last_layer = -1; ///< inclusive range of decoder layers
  bool embedding = false;                ///< the token embedding (always stage 0)
  bool head = false;                     ///< final norm and lm_head (always the last stage)
  int64_t weight_bytes = 0;              ///< resident, experts as the GPU holds them
  int64_t decode_bytes = 0;   ///< weights read per decode token (k of E experts, all dense)
  double prefill_flops = 0;   ///< matrix FLOPs per prefill token (lm_head excluded)
  int64_t kv_bytes = 0;       ///< KV caches at the bound block counts (1: bytes of a block)
  double decode_seconds = 0;  ///< decode_bytes at the model's bandwidth
  double prefill_seconds = 0; ///< per prefill token, prefill_flops at the model's FLOP rate
  double cost = 0;            ///< decode_seconds + prefill_seconds: what the split balances
  int sends = 0, recvs = 0;   ///< boundary values it sends on and receives
};

/// A partitioned model: stage s's graph receives from stage s-1 and sends to stage s+1 (recv /
/// send nodes named after the value that crosses), the last one returns the original outputs;
/// the others return their send nodes.
struct Partition {
  std::vector<ir::Graph> stages;
  std::vector<StageInfo> info;
  /// max stage cost / mean stage cost - 1 (0 = perfectly balanced).
  double imbalance = 0;
};

/// Splits `g` (a gpt-oss graph, before or after fusion) into `stages` contiguous ranges of
/// decoder layers minimising the most expensive stage: the embedding goes with the first stage,
/// the final norm and lm_head with the last. A node belongs to the latest layer among its
/// operands (weights and caches by their "model.layers.N." names); params are copied into every
/// stage that reads them. `dims` binds the caches' block counts for StageInfo::kv_bytes.
/// Throws xserv::Error for fewer than one stage or more stages than layers, naming the limit.
Partition partition_pipeline(const ir::Graph& g, int stages, const ir::DimBindings& dims = {},
                             const PartitionCostModel& model = {});

/// One line per stage: layers, weights, KV, decode and prefill estimates; then the imbalance.
std::string describe(const Partition& p);

} // namespace xserv::compiler
