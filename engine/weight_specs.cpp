// weight_specs(): checkpoint tensors -> WeightSpecs, pairing MXFP4 blocks with their scales.
#include "engine/weight_specs.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.h"
#include "models/mxfp4.h"

namespace xserv::engine {
namespace {

constexpr std::string_view kBlocks = "_blocks", kScales = "_scales";

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() > suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

runtime::WeightSource source_of(const models::TensorInfo& t, const std::filesystem::path& file) {
  return {t.name, file.string(), t.offset, t.size, t.dtype, t.shape};
}

/// True when `blocks` and `scales` have the MXFP4 layout: U8 [..., G, 16] and U8 [..., G].
bool is_mxfp4_pair(const models::TensorInfo& blocks, const models::TensorInfo& scales) {
  const auto &b = blocks.shape, &s = scales.shape;
  return blocks.dtype == "U8" && scales.dtype == "U8" && b.size() >= 2 &&
         s.size() + 1 == b.size() && b.back() == models::kMxfp4BlockBytes &&
         std::equal(s.begin(), s.end(), b.begin());
}

} // namespace

std::vector<runtime::WeightSpec> weight_specs(const models::Checkpoint& checkpoint,
                                              runtime::ExpertFormat experts) {
  const std::string dir = checkpoint.dir().string();
  std::vector<runtime::WeightSpec> specs;
  for (const models::SafetensorsFile& file : checkpoint.files()) {
    for (const models::TensorInfo& t : file.tensors()) {
      const std::string_view name = t.name;
      if (ends_with(name, kScales)) {
        std::string blocks =
            std::string(name.substr(0, name.size() - kScales.size())) + std::string(kBlocks);
        if (!checkpoint.find(blocks))
          throw Error(fmt::format("{}: {} has no matching {} (MXFP4 scales come with blocks)", dir,
                                  t.name, blocks));
        continue; // emitted with its blocks
      }
      runtime::WeightSpec spec;
      if (!ends_with(name, kBlocks)) {
        spec.name = t.name;
        spec.transform = runtime::WeightSpec::Transform::Copy;
        spec.data = source_of(t, file.path());
        spec.shape = t.shape;
        specs.push_back(std::move(spec));
        continue;
      }
      const std::string base(name.substr(0, name.size() - kBlocks.size()));
      const std::string scales_name = base + std::string(kScales);
      const models::TensorInfo* scales = checkpoint.find(scales_name);
      if (!scales)
        throw Error(fmt::format("{}: {} has no matching {} (MXFP4 blocks need their scales)", dir,
                                t.name, scales_name));
      if (!is_mxfp4_pair(t, *scales))
        throw Error(fmt::format("{}: {} ({} {}) and {} ({} {}) are not an MXFP4 pair (U8 "
                                "[..., G, 16] and U8 [..., G])",
                                dir, t.name, t.dtype, fmt::join(t.shape, "x"), scales_name,
                                scales->dtype, fmt::join(scales->shape, "x")));
      spec.name = base;
      spec.transform = experts == runtime::ExpertFormat::Mxfp4
                           ? runtime::WeightSpec::Transform::Mxfp4
                           : runtime::WeightSpec::Transform::Mxfp4ToBf16;
      if (experts == runtime::ExpertFormat::Both) { // the MXFP4 copy too, same bytes
        runtime::WeightSpec copy;
        copy.name = runtime::mxfp4_copy_name(base);
        copy.transform = runtime::WeightSpec::Transform::Mxfp4;
        copy.data = source_of(t, file.path());
        copy.scales = source_of(*scales, checkpoint.file_of(scales_name));
        copy.shape.assign(t.shape.begin(), t.shape.end() - 1);
        copy.shape.back() *= models::kMxfp4BlockValues;
        specs.push_back(std::move(copy));
      }
      spec.data = source_of(t, file.path());
      spec.scales = source_of(*scales, checkpoint.file_of(scales_name));
      spec.shape.assign(t.shape.begin(), t.shape.end() - 1);
      spec.shape.back() *= models::kMxfp4BlockValues;
      specs.push_back(std::move(spec));
    }
  }
  return specs;
}

std::vector<runtime::WeightSpec> weight_specs_named(const models::Checkpoint& checkpoint,
                                                    const std::vector<std::string>& names,
                                                    runtime::ExpertFormat experts) {
  std::set<std::string> wanted(names.begin(), names.end());
  std::vector<runtime::WeightSpec> specs = weight_specs(checkpoint, experts);
  std::erase_if(specs, [&](const runtime::WeightSpec& s) { return !wanted.count(s.name); });
  if (specs.size() != wanted.size()) {
    for (const runtime::WeightSpec& s : specs)
      wanted.erase(s.name);
    throw Error(fmt::format("{}: the model reads weights the checkpoint lacks: {}",
                            checkpoint.dir().string(), fmt::join(wanted, ", ")));
  }
  return specs;
}

} // namespace xserv::engine
