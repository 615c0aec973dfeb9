// Weights on the GPU: validating WeightSpecs against their files, laying them out in one device
// arena, and uploading them through pinned staging buffers, MXFP4 experts dequantised on the GPU.
#pragma once

#include "runtime/plan.h"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace xserv::runtime {

/// Byte alignment of every tensor in the device arena.
inline constexpr uint64_t kWeightAlignment = 256;

/// Bytes per element of a safetensors dtype name ("BF16" -> 2, "U8" -> 1); 0 when unknown.
int weight_dtype_bytes(const std::string& dtype);

/// Where one logical tensor lives in the device arena, and what it holds.
struct DeviceTensor {
  std::string name;
  std::string dtype;          ///< "BF16" for Mxfp4ToBf16, else the source's dtype
  std::vector<int64_t> shape; ///< WeightSpec::shape
  uint64_t offset = 0;        ///< byte offset in the arena, a multiple of kWeightAlignment
  uint64_t bytes = 0;         ///< byte size on the GPU
};

/// The device layout of a list of WeightSpecs.
struct WeightLayout {
  std::vector<DeviceTensor> tensors; ///< in spec order
  uint64_t total_bytes = 0;          ///< arena size: the last tensor's end, aligned
  uint64_t source_bytes = 0;         ///< bytes the upload reads from the files
};

/// Checks `specs` without touching any file and lays them out back to back, each at a
/// kWeightAlignment-aligned offset. Each spec must have a unique non-empty name; a Copy spec a
/// known dtype, no scales, `data.bytes` equal to its shape's bytes and a logical shape of the
/// same element count; an Mxfp4ToBf16 spec U8 blocks [..., G, 16], U8 scales [..., G] and the
/// logical shape [..., G * 32]. Throws xserv::Error naming the tensor and its file otherwise.
WeightLayout layout_weights(const std::vector<WeightSpec>& specs);

/// How DeviceWeights::upload moves the bytes.
struct UploadOptions {
  /// Kernel cache directory for the dequantisation kernel (get_or_compile); empty: compile in
  /// memory every time.
  std::filesystem::path cache_dir;
  /// Size of each pinned host staging buffer (and of its device twin, for MXFP4 chunks); at
  /// least 1 MiB. Tensors larger than one buffer are streamed in pieces.
  uint64_t staging_bytes = 32ull << 20;
  /// Number of staging buffers in flight (2..16): while the GPU drains one, the host fills the
  /// next.
  int staging_buffers = 4;
  /// Host threads copying from the mapped files into a staging buffer; 0: up to 12, bounded by
  /// the hardware's threads (copying from the page cache is the bottleneck: on the 16-core H200
  /// host, 4 threads gave 15 GB/s, 8 gave 22-25, 12-16 gave 28-31; docs/PERF.md).
  int host_threads = 0;
  /// Ask the kernel to read ahead the file ranges of the buffer after next (madvise WILLNEED);
  /// helps a cold page cache, costs little with a warm one.
  bool prefetch = true;
  /// Fill the arena with 0xFF bytes (BF16 NaN) before the upload, so that a byte the upload
  /// fails to write shows in a comparison (tests).
  bool poison = false;
  /// Refuse bad values, naming the tensor and its file: an MXFP4 scale byte 0xFF (E8M0's NaN)
  /// is found on the host before the GPU is touched; an infinity or NaN in any BF16 or F32
  /// tensor on the GPU (dequantised experts included, where a scale of 0xFE overflows) by one
  /// read of the arena at memory bandwidth after the transfer. false only for tests
  /// of the dequantisation itself.
  bool check_values = true;
  /// The largest MXFP4 scale byte the kernels take (StageLayout::mxfp4_max_scale: a plan whose
  /// MoE gemms scale with one multiply); a larger one is refused on the host, naming the
  /// tensor, whatever check_values says.
  int max_scale = 254;
  /// Receives "[load] 12.3 / 38.9 GB, 3.1 GB/s" lines about every `progress_interval_s`
  /// seconds, and a final "[load] done: ..." summary; called on the uploading thread.
  std::function<void(const std::string&)> progress;
  double progress_interval_s = 1.0;
};

/// What an upload did and how long each step took (wall seconds).
struct UploadStats {
  uint64_t bytes_read = 0;   ///< bytes copied out of the files
  uint64_t device_bytes = 0; ///< bytes written on the GPU (tensors, without alignment padding)
  uint64_t tensors = 0;
  uint64_t files = 0;
  uint64_t batches = 0;         ///< staging buffers filled
  double map_s = 0;             ///< opening, validating and mapping the files
  double gpu_init_s = 0;        ///< CUDA context, arena, staging buffers and streams
  double kernel_s = 0;          ///< building (or loading from the cache) the dequant kernel
  double fill_s = 0;            ///< host threads copying from the mappings into staging buffers
  double wait_s = 0;            ///< waiting for the GPU to release a staging buffer or finish
  double transfer_s = 0;        ///< the streaming loop, first byte to last byte on the GPU
  double total_s = 0;           ///< all of upload()
  bool kernel_compiled = false; ///< true when NVRTC ran (cache miss)

  /// The final summary line: "[load] done: 13.8 GB read from 3 files, ...".
  std::string summary() const;
};

/// Weights resident on the GPU: one device allocation (arena) holding every tensor of a list of
/// WeightSpecs. Move-only; frees the device memory on destruction.
class DeviceWeights {
public:
  /// Uploads `specs` to the current CUDA device. Steps: layout_weights(); open and mmap each
  /// file once (read-only, shared) and check every source range against the file's size; then,
  /// needing a GPU (xserv::Error "no GPU ..." otherwise), allocate the arena and stream the
  /// bytes through pinned staging buffers, Copy tensors straight into place and MXFP4 chunks
  /// through a device scratch buffer and the dequant kernel, whose BF16 output lands in place.
  /// The dequantised bits equal models::float_to_bf16 of models' MXFP4 decode for every scale
  /// byte 0..255 (infinities for the largest, exact subnormals for the smallest, -0.0 kept).
  /// Throws xserv::Error naming the file and tensor for a missing or short file, for values that
  /// options.check_values refuses, and for CUDA failures (out of memory says how much was asked
  /// and how much is free).
  static DeviceWeights upload(const std::vector<WeightSpec>& specs, const UploadOptions& options);

  DeviceWeights() = default;
  DeviceWeights(DeviceWeights&& other) noexcept;
  DeviceWeights& operator=(DeviceWeights&& other) noexcept;
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;
  ~DeviceWeights();

  /// Device address of tensor `name`; throws xserv::Error when there is none.
  const void* get(const std::string& name) const;
  /// The tensor called `name` (dtype, logical shape, place), or nullptr.
  const DeviceTensor* find(const std::string& name) const;
  /// The tensor called `name`; throws xserv::Error when there is none.
  const DeviceTensor& tensor(const std::string& name) const;
  /// Every tensor, in spec order.
  const std::vector<DeviceTensor>& tensors() const { return layout_.tensors; }
  /// Bytes of device memory held (the arena, alignment padding included).
  uint64_t device_bytes() const { return layout_.total_bytes; }
  const UploadStats& stats() const { return stats_; }

private:
  void release() noexcept;

  void* arena_ = nullptr;
  WeightLayout layout_;
  std::unordered_map<std::string, size_t> index_;
  UploadStats stats_;
};

/// The CUDA source of the MXFP4 -> BF16 kernel `xserv_mxfp4_to_bf16(const uint4* blocks, const
/// unsigned char* scales, uint4* out, unsigned long long nblocks)`: one thread per 16-byte
/// block, 64 bytes of BF16 out; and of `xserv_first_nonfinite(const void* data, unsigned long
/// long n, int bytes, unsigned long long* first)`, the upload's value check. Exposed for tests
/// and `--dump-dir`.
const std::string& mxfp4_dequant_source();

} // namespace xserv::runtime
