// Roofline arithmetic for gpt-oss: which bytes a decode step must read, which flops a prefill
// token costs. Used by `xserv inspect` and by docs/PERF.md's floors.
#include "engine/roofline.h"

#include <algorithm>

namespace xserv::engine {

WeightBytes weight_bytes(const models::ModelConfig& c, runtime::ExpertFormat experts) {
  const double d = static_cast<double>(c.hidden_size), q = static_cast<double>(c.q_width());
  const double kv = static_cast<double>(c.kv_width()), e = static_cast<double>(c.num_local_experts);
  const double inter = static_cast<double>(c.intermediate_size);
  const double v = static_cast<double>(c.vocab_size),
               layers = static_cast<double>(c.num_hidden_layers);
  const double bf16 = 2;
  WeightBytes w;
  const double attn_layer = (q * d + q) + 2 * (kv * d + kv) + (d * q + d) +
                            static_cast<double>(c.num_attention_heads) + 2 * d;
  w.attention = attn_layer * layers * bf16;
  w.router = (e * d + e) * layers * bf16;
  // Read by a decode step: MXFP4 unless the experts are BF16 only; held: both copies for Both.
  const double matrices = (2 * inter) * d + d * inter, biases = (2 * inter + d) * bf16;
  const double mx = matrices * 17.0 / 32.0;
  w.expert_one_layer_one = (experts == runtime::ExpertFormat::Bf16 ? matrices * bf16 : mx) + biases;
  w.experts = (experts == runtime::ExpertFormat::Mxfp4  ? mx
               : experts == runtime::ExpertFormat::Both ? matrices * bf16 + mx
                                                        : matrices * bf16) *
                  e * layers +
              biases * e * layers;
  w.embed = v * d * bf16;
  w.lm_head = v * d * bf16;
  w.final_norm = d * bf16;
  return w;
}

double kv_bytes_per_token(const models::ModelConfig& c) {
  return 2.0 * static_cast<double>(c.num_hidden_layers) * static_cast<double>(c.kv_width()) * 2;
}

DecodeEstimate decode_floor(const models::ModelConfig& c, int64_t batch, int64_t depth,
                            const Ceilings& ceil, runtime::ExpertFormat experts) {
  const WeightBytes w = weight_bytes(c, experts);
  const double layers = static_cast<double>(c.num_hidden_layers);
  // Experts touched: each sequence picks k per layer; a batch touches at most all of them
  // (expected distinct experts under uniform routing: E * (1 - (1 - k/E)^batch)).
  const double e = static_cast<double>(c.num_local_experts),
               k = static_cast<double>(c.num_experts_per_tok);
  double p_untouched = 1;
  for (int64_t i = 0; i < batch; ++i)
    p_untouched *= 1 - k / e;
  const double experts_touched = e * (1 - p_untouched);
  DecodeEstimate est;
  est.bytes = w.attention + w.router + w.lm_head + w.final_norm +
              experts_touched * layers * w.expert_one_layer_one;
  // KV read per sequence: full layers read depth+1 positions, sliding layers min(window, depth+1).
  double kv = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const double ctx = static_cast<double>(
        c.is_sliding(l) ? std::min<int64_t>(c.sliding_window, depth + 1) : depth + 1);
    kv += ctx * static_cast<double>(c.kv_width()) * 2 * 2;
  }
  est.bytes += kv * static_cast<double>(batch);
  est.seconds = est.bytes / ceil.bytes_per_s;
  est.tokens_per_s = static_cast<double>(batch) / est.seconds;
  return est;
}

double prefill_flops_per_token(const models::ModelConfig& c, int64_t depth) {
  const WeightBytes w = weight_bytes(c);
  // Multiply-adds per token = active weight values: attention, router, k experts per layer and
  // the lm_head once per sequence (ignored: prefill returns only the last token's logits).
  const double active = (w.attention + w.router +
                         static_cast<double>(c.num_experts_per_tok) *
                             static_cast<double>(c.num_hidden_layers) * w.expert_one_layer_one) /
                        2;
  double attn = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const double ctx = static_cast<double>(
        c.is_sliding(l) ? std::min<int64_t>(c.sliding_window, depth + 1) : depth + 1);
    attn += 2 * 2 * ctx * static_cast<double>(c.q_width()); // q.k and p.v
  }
  return 2 * active + attn;
}

} // namespace xserv::engine
