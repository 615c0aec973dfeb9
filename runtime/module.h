// Loading cubins and launching their kernels through the CUDA runtime's library API (no libcuda).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace xserv::runtime {

/// A kernel of a loaded Module. Valid while that Module lives.
struct Kernel {
  cudaKernel_t handle = nullptr;
  std::string name;
  /// Byte size of each parameter, as the cubin declares them; empty when the driver cannot say
  /// (then launches are not checked against it).
  std::vector<size_t> param_sizes;
  /// Static shared memory bytes (a launch whose dynamic bytes take the sum past 48 KB must
  /// raise the kernel's limit first).
  size_t static_smem = 0;
};

/// The SM version a cubin was compiled for (90 for sm_90 and sm_90a), read from its ELF header.
/// Throws xserv::Error when `cubin` is not a CUDA ELF image.
int cubin_sm(std::span<const char> cubin);

/// A cubin loaded into the CUDA runtime (cudaLibrary_t). Move-only; unloads on destruction.
class Module {
public:
  /// Loads `cubin` for the current GPU; `label` names the module in messages (the kernel or
  /// file it came from). Throws xserv::Error when there is no GPU, and, before asking the
  /// driver, when the cubin's architecture cannot run on the GPU: "kernels were compiled for
  /// sm_90 but GPU 0 is sm_80: recompile the plan".
  static Module load(std::span<const char> cubin, std::string label);

  Module() = default;
  Module(Module&& other) noexcept;
  Module& operator=(Module&& other) noexcept;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  ~Module();

  /// The kernel called `name` (declare it extern "C" so it keeps that name). Throws
  /// xserv::Error naming the module and the kernels it does have when there is none.
  Kernel kernel(const std::string& name) const;

  /// Names of the kernels in the module, sorted.
  std::vector<std::string> kernel_names() const;

  /// The device address and size of the module's __device__ variable `name` (declare it
  /// extern "C"); {nullptr, 0} when the module has none.
  std::pair<void*, size_t> global(const std::string& name) const;

  /// Launches `k` with `args`, whose types must match the kernel's parameters exactly (an int
  /// where the kernel takes int64_t is caught by size; a float* for a bf16* is not). Errors
  /// that the launch call reports throw xserv::Error naming the kernel and the geometry;
  /// faults inside the kernel surface at the next synchronisation.
  template <typename... Args>
  void launch(const Kernel& k, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
              const Args&... args) const {
    std::array<void*, sizeof...(Args)> ptrs = {
        const_cast<void*>(static_cast<const void*>(&args))...};
    std::array<size_t, sizeof...(Args)> sizes = {sizeof(Args)...};
    launch_raw(k, grid, block, smem, stream, ptrs.data(), sizes.data(), sizeof...(Args));
  }

  /// launch() without templates: `args[i]` points at a parameter of `sizes[i]` bytes. With
  /// `dependent`, the launch allows programmatic dependent launch (sm_90+): the grid may be
  /// scheduled while the stream's previous kernel finishes, so the kernel must wait for it
  /// (griddepcontrol.wait, as every generated kernel does first) before touching memory.
  void launch_raw(const Kernel& k, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                  void** args, const size_t* sizes, size_t count, bool dependent = false) const;

  const std::string& label() const { return label_; }
  int sm() const { return sm_; }
  explicit operator bool() const { return library_ != nullptr; }

private:
  cudaLibrary_t library_ = nullptr;
  std::vector<char> image_; ///< kept alive: a lazily loaded library may read it later
  std::string label_;
  int sm_ = 0;
};

} // namespace xserv::runtime
