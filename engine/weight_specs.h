// Turning an opened gpt-oss checkpoint into the runtime's weight upload list (runtime/plan.h).
#pragma once

#include <string>
#include <vector>

#include "models/checkpoint.h"
#include "runtime/plan.h"

namespace xserv::engine {

/// One WeightSpec per logical tensor of `checkpoint`, in file order (index order of the shards,
/// then offset), so that an upload reads each file front to back. Every tensor other than an
/// MXFP4 pair is Copy with its stored dtype and shape; each `<base>_blocks` U8 [E, rows, G, 16]
/// with its `<base>_scales` U8 [E, rows, G] becomes one Mxfp4ToBf16 spec named `<base>` of
/// logical shape [E, rows, G * 32] (Mxfp4 instead, kept as stored, when `experts` is Mxfp4).
/// The checkpoint may be opened headers-only. Throws xserv::Error when a blocks tensor has no
/// scales (or the reverse) or the two disagree.
std::vector<runtime::WeightSpec>
weight_specs(const models::Checkpoint& checkpoint,
             runtime::ExpertFormat experts = runtime::ExpertFormat::Bf16);

/// weight_specs() restricted to the logical tensors `names` (a plan's stage layout: a pipeline
/// stage uploads only its own): throws
/// xserv::Error naming any the checkpoint lacks.
std::vector<runtime::WeightSpec>
weight_specs_named(const models::Checkpoint& checkpoint, const std::vector<std::string>& names,
                   runtime::ExpertFormat experts = runtime::ExpertFormat::Bf16);

} // namespace xserv::engine
