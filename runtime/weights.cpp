// DeviceWeights: spec validation and arena layout, the device arena's ownership, and the summary.
// The streaming upload itself lives in runtime/weights_upload.cpp.
#include "runtime/weights.h"

#include "base/error.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <unordered_set>
#include <utility>

namespace xserv::runtime {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// "weight 'NAME' (tensor 'SRC' of FILE)", the prefix of every spec error.
std::string where(const WeightSpec& spec, const WeightSource& src) {
  return "weight '" + spec.name + "' (tensor '" + src.name + "' of " + src.file + ")";
}

/// The element count of `shape`; throws for negative dimensions or absurd sizes.
uint64_t numel_of(const std::vector<int64_t>& shape, const std::string& what) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > (uint64_t(1) << 60) / uint64_t(d)))
      throw Error(what + ": shape " + shape_str(shape) + " is negative or too large");
    n *= uint64_t(d);
  }
  return n;
}

uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

/// Checks a Copy spec and returns its device byte size.
uint64_t check_copy(const WeightSpec& spec) {
  const WeightSource& d = spec.data;
  if (spec.scales)
    throw Error(where(spec, d) + ": a Copy weight takes no scales tensor");
  int size = weight_dtype_bytes(d.dtype);
  if (size == 0)
    throw Error(where(spec, d) + ": unknown dtype '" + d.dtype + "'");
  uint64_t n = numel_of(d.shape, where(spec, d));
  if (d.bytes != n * size)
    throw Error(where(spec, d) + ": " + d.dtype + " " + shape_str(d.shape) + " needs " +
                std::to_string(n * size) + " bytes but the source holds " +
                std::to_string(d.bytes));
  if (numel_of(spec.shape, "weight '" + spec.name + "'") != n)
    throw Error(where(spec, d) + ": logical shape " + shape_str(spec.shape) +
                " does not have the " + std::to_string(n) + " elements of the stored shape " +
                shape_str(d.shape));
  return d.bytes;
}

/// Checks an Mxfp4ToBf16 or Mxfp4 spec and returns its device byte size as BF16.
uint64_t check_mxfp4(const WeightSpec& spec) {
  const WeightSource& b = spec.data;
  if (!spec.scales)
    throw Error(where(spec, b) + ": an MXFP4 weight needs its scales tensor");
  const WeightSource& s = *spec.scales;
  if (b.dtype != "U8" || s.dtype != "U8")
    throw Error(where(spec, b) + ": MXFP4 blocks and scales must be U8, found " + b.dtype +
                " and " + s.dtype + " ('" + s.name + "')");
  const auto &bs = b.shape, &ss = s.shape;
  if (bs.size() < 2 || bs.back() != 16 || ss.size() + 1 != bs.size() ||
      !std::equal(ss.begin(), ss.end(), bs.begin()))
    throw Error(where(spec, b) + ": blocks " + shape_str(bs) + " and scales " + shape_str(ss) +
                " ('" + s.name + "') are not MXFP4 [..., G, 16] and [..., G]");
  uint64_t nblocks = numel_of(ss, where(spec, s));
  if (b.bytes != nblocks * 16)
    throw Error(where(spec, b) + ": blocks " + shape_str(bs) + " need " +
                std::to_string(nblocks * 16) + " bytes but the source holds " +
                std::to_string(b.bytes));
  if (s.bytes != nblocks)
    throw Error(where(spec, s) + ": scales " + shape_str(ss) + " need " + std::to_string(nblocks) +
                " bytes but the source holds " + std::to_string(s.bytes));
  std::vector<int64_t> logical(ss.begin(), ss.end());
  logical.back() *= 32;
  if (spec.shape != logical)
    throw Error(where(spec, b) + ": logical shape " + shape_str(spec.shape) + " should be " +
                shape_str(logical) + " for blocks " + shape_str(bs));
  return nblocks * 64;
}

} // namespace

int weight_dtype_bytes(const std::string& dtype) {
  if (dtype == "BOOL" || dtype == "U8" || dtype == "I8" || dtype == "F8_E4M3" || dtype == "F8_E5M2")
    return 1;
  if (dtype == "BF16" || dtype == "F16" || dtype == "I16" || dtype == "U16")
    return 2;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32")
    return 4;
  if (dtype == "F64" || dtype == "I64" || dtype == "U64")
    return 8;
  return 0;
}

WeightLayout layout_weights(const std::vector<WeightSpec>& specs) {
  WeightLayout layout;
  std::unordered_set<std::string> names;
  for (const WeightSpec& spec : specs) {
    if (spec.name.empty())
      throw Error("a weight spec has no name (source tensor '" + spec.data.name + "' of " +
                  spec.data.file + ")");
    if (!names.insert(spec.name).second)
      throw Error("weight '" + spec.name + "' is listed twice");
    DeviceTensor t;
    t.name = spec.name;
    t.shape = spec.shape;
    if (spec.transform == WeightSpec::Transform::Copy) {
      t.bytes = check_copy(spec);
      t.dtype = spec.data.dtype;
      layout.source_bytes += spec.data.bytes;
    } else if (spec.transform == WeightSpec::Transform::Mxfp4ToBf16) {
      t.bytes = check_mxfp4(spec);
      t.dtype = "BF16";
      layout.source_bytes += spec.data.bytes + spec.scales->bytes;
    } else { // Mxfp4: blocks then scales, as stored
      check_mxfp4(spec);
      t.bytes = spec.data.bytes + spec.scales->bytes;
      t.dtype = "MXFP4";
      layout.source_bytes += t.bytes;
    }
    t.offset = align_up(layout.total_bytes, kWeightAlignment);
    layout.total_bytes = align_up(t.offset + t.bytes, kWeightAlignment);
    layout.tensors.push_back(std::move(t));
  }
  return layout;
}

std::string UploadStats::summary() const {
  auto gb = [](uint64_t b) { return double(b) / 1e9; };
  char line[512];
  std::snprintf(line, sizeof line,
                "[load] done: %.2f GB read from %llu file%s, %.2f GB on GPU in %llu tensors, "
                "%.2f s (map %.2f, gpu init %.2f, kernel %.2f%s, stream %.2f s: %.2f GB/s "
                "read, %.2f GB/s to GPU; fill %.2f s, wait %.2f s)",
                gb(bytes_read), (unsigned long long)files, files == 1 ? "" : "s", gb(device_bytes),
                (unsigned long long)tensors, total_s, map_s, gpu_init_s, kernel_s,
                kernel_compiled ? " compiled" : "", transfer_s,
                transfer_s > 0 ? gb(bytes_read) / transfer_s : 0.0,
                transfer_s > 0 ? gb(device_bytes) / transfer_s : 0.0, fill_s, wait_s);
  return line;
}

DeviceWeights::DeviceWeights(DeviceWeights&& other) noexcept
    : arena_(std::exchange(other.arena_, nullptr)), layout_(std::move(other.layout_)),
      index_(std::move(other.index_)), stats_(other.stats_) {
  other.layout_ = {};
  other.index_.clear();
}

DeviceWeights& DeviceWeights::operator=(DeviceWeights&& other) noexcept {
  if (this != &other) {
    release();
    arena_ = std::exchange(other.arena_, nullptr);
    layout_ = std::exchange(other.layout_, {});
    index_ = std::exchange(other.index_, {});
    stats_ = other.stats_;
  }
  return *this;
}

DeviceWeights::~DeviceWeights() {
  release();
}

void DeviceWeights::release() noexcept {
  if (arena_) {
    cudaFree(arena_);
    arena_ = nullptr;
  }
}

const DeviceTensor* DeviceWeights::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &layout_.tensors[it->second];
}

const DeviceTensor& DeviceWeights::tensor(const std::string& name) const {
  if (const DeviceTensor* t = find(name))
    return *t;
  throw Error("no weight named '" + name + "' on the GPU (" +
              std::to_string(layout_.tensors.size()) + " weights were uploaded)");
}

const void* DeviceWeights::get(const std::string& name) const {
  const DeviceTensor& t = tensor(name);
  return static_cast<const char*>(arena_) + t.offset;
}

} // namespace xserv::runtime
