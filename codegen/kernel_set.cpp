// KernelSet (the generated kernels of a lowering, each once) and the lowering's sizes.
#include "codegen/cuda_lower.h"

#include <algorithm>

namespace xserv::codegen {

int KernelSet::add(codegen::KernelSource src) {
  if (auto it = by_name_.find(src.name); it != by_name_.end()) {
    ++uses_[static_cast<size_t>(it->second)];
    return it->second;
  }
  const int i = static_cast<int>(sources_.size());
  by_name_[src.name] = i;
  if (!prelude_.empty()) // after the header comments, before the first include
    src.source.insert(std::min(src.source.find("#include"), src.source.size()), prelude_);
  sources_.push_back(std::move(src));
  uses_.push_back(1);
  return i;
}

std::vector<runtime::PlanKernel> KernelSet::plan_kernels() const {
  std::vector<runtime::PlanKernel> out;
  for (const codegen::KernelSource& s : sources_) {
    const codegen::LaunchRule& r = s.launch;
    runtime::PlanKernel k;
    k.name = s.name;
    k.block = r.block;
    k.blocks_x = r.blocks_x;
    k.y_per_token = r.y_per_token;
    k.z_splits = r.z_splits;
    k.blocks_z = r.blocks_z;
    k.y_tile = r.y_tile;
    k.y_extra = r.y_extra;
    k.smem_per_row = r.smem_per_token;
    k.smem_fixed = r.smem_fixed;
    out.push_back(std::move(k));
  }
  return out;
}

int step_token_capacity(int64_t max_batch, int prefill_chunk) {
  return static_cast<int>(std::max<int64_t>({8, max_batch, prefill_chunk}));
}

} // namespace xserv::codegen
