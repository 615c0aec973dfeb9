// Module: cudaLibraryLoadData / cudaLibraryGetKernel / cudaLaunchKernel, with errors that name
// the module, the kernel and the architectures involved.
#include "runtime/module.h"

#include "base/error.h"
#include "runtime/device.h"

#include <algorithm>
#include <cstring>
#include <elf.h>
#include <utility>

namespace xserv::runtime {
namespace {

constexpr uint16_t kElfMachineCuda = 190; // EM_CUDA
constexpr size_t kDefaultSmemLimit = 48 * 1024;

std::string sm_name(int sm) {
  return "sm_" + std::to_string(sm);
}

std::string join_sizes(const size_t* sizes, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i)
    s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + (n == 1 ? " byte" : " bytes");
}

std::string geometry(dim3 grid, dim3 block, size_t smem) {
  auto d = [](dim3 v) {
    return std::to_string(v.x) + "x" + std::to_string(v.y) + "x" + std::to_string(v.z);
  };
  return "grid " + d(grid) + ", block " + d(block) + ", " + std::to_string(smem) +
         " bytes of dynamic shared memory";
}

/// True for the driver's ways of saying "this image is not for this GPU".
bool wrong_image(cudaError_t err) {
  return err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidKernelImage ||
         err == cudaErrorInvalidPtx || err == cudaErrorUnsupportedPtxVersion;
}

std::string arch_mismatch(int cubin, int device, int device_sm, const std::string& label) {
  return "kernels were compiled for " + sm_name(cubin) + " but GPU " + std::to_string(device) +
         " is " + sm_name(device_sm) + ": recompile the plan (module " + label + ")";
}

} // namespace

int cubin_sm(std::span<const char> cubin) {
  Elf64_Ehdr h;
  if (cubin.size() < sizeof h || std::memcmp(cubin.data(), ELFMAG, SELFMAG) != 0)
    throw Error("not a cubin: the data does not start with an ELF header");
  std::memcpy(&h, cubin.data(), sizeof h);
  if (h.e_ident[EI_CLASS] != ELFCLASS64 || h.e_machine != kElfMachineCuda)
    throw Error("not a cubin: an ELF file, but not a 64-bit CUDA one (machine " +
                std::to_string(h.e_machine) + ")");
  // ELF ABI version 8 (CUDA 12.8 on) moved the SM number from bits 0-7 of e_flags to bits 8-15.
  return h.e_ident[EI_ABIVERSION] >= 8 ? (h.e_flags >> 8) & 0xff : h.e_flags & 0xff;
}

Module Module::load(std::span<const char> cubin, std::string label) {
  Module m;
  m.label_ = std::move(label);
  m.sm_ = cubin_sm(cubin);

  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    throw Error("cannot load module " + m.label_ + ": " + probe_device().reason);
  }
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  const int device_sm = major * 10 + minor;
  // SASS runs on its own major version at an equal or higher minor, never across majors.
  if (m.sm_ / 10 != major || m.sm_ % 10 > minor)
    throw Error(arch_mismatch(m.sm_, device, device_sm, m.label_));

  m.image_.assign(cubin.begin(), cubin.end());
  cudaError_t err =
      cudaLibraryLoadData(&m.library_, m.image_.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (err != cudaSuccess) {
    cudaGetLastError();
    m.library_ = nullptr;
    if (wrong_image(err))
      throw Error(arch_mismatch(m.sm_, device, device_sm, m.label_) + " [" +
                  cudaGetErrorString(err) + "]");
    throw Error("cannot load module " + m.label_ + ": " + cudaGetErrorString(err));
  }
  return m;
}

Module::Module(Module&& other) noexcept
    : library_(std::exchange(other.library_, nullptr)), image_(std::move(other.image_)),
      label_(std::move(other.label_)), sm_(other.sm_) {}

Module& Module::operator=(Module&& other) noexcept {
  if (this != &other) {
    if (library_)
      cudaLibraryUnload(library_);
    library_ = std::exchange(other.library_, nullptr);
    image_ = std::move(other.image_);
    label_ = std::move(other.label_);
    sm_ = other.sm_;
  }
  return *this;
}

Module::~Module() {
  if (library_)
    cudaLibraryUnload(library_);
}

std::vector<std::string> Module::kernel_names() const {
  std::vector<std::string> names;
  unsigned count = 0;
  if (!library_ || cudaLibraryGetKernelCount(&count, library_) != cudaSuccess) {
    cudaGetLastError();
    return names;
  }
  std::vector<cudaKernel_t> kernels(count);
  if (count == 0 || cudaLibraryEnumerateKernels(kernels.data(), count, library_) != cudaSuccess) {
    cudaGetLastError();
    return names;
  }
  for (cudaKernel_t k : kernels) {
    const char* name = nullptr;
    if (cudaFuncGetName(&name, reinterpret_cast<const void*>(k)) == cudaSuccess && name)
      names.emplace_back(name);
    else
      cudaGetLastError();
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::pair<void*, size_t> Module::global(const std::string& name) const {
  void* p = nullptr;
  size_t bytes = 0;
  if (!library_ || cudaLibraryGetGlobal(&p, &bytes, library_, name.c_str()) != cudaSuccess) {
    cudaGetLastError();
    return {nullptr, 0};
  }
  return {p, bytes};
}

Kernel Module::kernel(const std::string& name) const {
  if (!library_)
    throw Error("kernel " + name + " requested from an empty module");
  Kernel k;
  k.name = name;
  cudaError_t err = cudaLibraryGetKernel(&k.handle, library_, name.c_str());
  if (err != cudaSuccess) {
    cudaGetLastError();
    std::string have;
    for (const auto& n : kernel_names())
      have += (have.empty() ? "" : ", ") + n;
    throw Error("module " + label_ + " has no kernel '" + name + "' (" + cudaGetErrorString(err) +
                "; it has: " + (have.empty() ? "none" : have) +
                "; declare kernels extern \"C\" to keep their names)");
  }
  cudaFuncAttributes attrs{};
  if (cudaFuncGetAttributes(&attrs, reinterpret_cast<const void*>(k.handle)) == cudaSuccess)
    k.static_smem = attrs.sharedSizeBytes;
  else
    cudaGetLastError();
  // The parameter list, so launches with the wrong arguments fail here, not inside the kernel.
  // The runtime has no parameter count: we ask for indices until cudaErrorInvalidValue, which
  // compute-sanitizer lists as an API error (one per lookup; harmless).
  for (size_t i = 0;; ++i) {
    size_t offset = 0, size = 0;
    if (cudaFuncGetParamInfo(reinterpret_cast<const void*>(k.handle), i, &offset, &size) !=
        cudaSuccess) {
      cudaGetLastError();
      break;
    }
    k.param_sizes.push_back(size);
  }
  return k;
}

void Module::launch_raw(const Kernel& k, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                        void** args, const size_t* sizes, size_t count, bool dependent) const {
  if (!k.handle)
    throw Error("launching kernel '" + k.name + "': the kernel handle is empty");
  if (!k.param_sizes.empty() && (k.param_sizes.size() != count ||
                                 !std::equal(k.param_sizes.begin(), k.param_sizes.end(), sizes)))
    throw Error("kernel '" + k.name + "' of module " + label_ + " takes " +
                std::to_string(k.param_sizes.size()) + " parameters (" +
                join_sizes(k.param_sizes.data(), k.param_sizes.size()) +
                ") but the launch passed " + std::to_string(count) + " (" +
                join_sizes(sizes, count) + ")");
  const void* func = reinterpret_cast<const void*>(k.handle);
  if (smem > 0 && smem + k.static_smem > kDefaultSmemLimit) {
    cudaError_t err =
        cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw Error("kernel '" + k.name + "' cannot have " + std::to_string(smem) +
                  " bytes of dynamic shared memory: " + cudaGetErrorString(err));
    }
  }
  cudaError_t err;
  if (dependent) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = &attr;
    config.numAttrs = 1;
    err = cudaLaunchKernelExC(&config, func, args);
  } else {
    err = cudaLaunchKernel(func, grid, block, args, smem, stream);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Error("launching kernel '" + k.name + "' of module " + label_ + " (" +
                geometry(grid, block, smem) + ") failed: " + cudaGetErrorString(err));
  }
}

} // namespace xserv::runtime
