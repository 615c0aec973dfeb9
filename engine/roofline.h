// Bytes and flops of a gpt-oss step, and the times they imply at the GPU's measured ceilings.
#pragma once

#include <cstdint>

#include "models/config.h"
#include "runtime/plan.h"

namespace xserv::engine {

/// Ceilings measured on the H200 (shared docs/DEVICE.md): device copy bandwidth and dense BF16
/// matrix throughput.
struct Ceilings {
  double bytes_per_s = 4.3e12;
  double flops_per_s = 790e12;
};

/// Where a model's weight bytes go, as held on the GPU: the expert matrices in `experts` format
/// (BF16: 2 bytes a value; MXFP4: 17 bytes per 32 values; Both: the two), everything else BF16.
/// expert_one_layer_one is what a decode step reads of one expert (MXFP4 unless BF16 only).
struct WeightBytes {
  double attention = 0; ///< q/k/v/o weights and biases, sinks, both norms, all layers
  double router = 0;
  double experts = 0;              ///< every expert's gate_up and down, with biases
  double expert_one_layer_one = 0; ///< one expert of one layer
  double embed = 0, lm_head = 0, final_norm = 0;
  double total() const { return attention + router + experts + embed + lm_head + final_norm; }
};

WeightBytes weight_bytes(const models::ModelConfig& cfg,
                         runtime::ExpertFormat experts = runtime::ExpertFormat::Bf16);

/// Bytes of KV cache per token of context, over all layers (k and v, BF16); sliding layers only
/// while the context is within their window.
double kv_bytes_per_token(const models::ModelConfig& cfg);

/// The floor of one decode step of `batch` sequences at context `depth`: every weight a step
/// touches read once (attention, router, lm_head; the selected experts, at most all of them),
/// the KV cache each sequence attends to, all at the bandwidth ceiling.
struct DecodeEstimate {
  double bytes = 0;
  double seconds = 0;
  double tokens_per_s = 0; ///< batch / seconds
};
DecodeEstimate decode_floor(const models::ModelConfig& cfg, int64_t batch, int64_t depth,
                            const Ceilings& c = {},
                            runtime::ExpertFormat experts = runtime::ExpertFormat::Bf16);

/// Flops of one prompt token (2 per active weight multiply-add, plus attention over `depth`
/// earlier tokens) and the compute floor of a prefill of `tokens` tokens.
double prefill_flops_per_token(const models::ModelConfig& cfg, int64_t depth);

} // namespace xserv::engine
