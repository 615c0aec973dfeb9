// libFuzzer target: any byte string parsed as a whole safetensors file either validates, with
// tensors that tile the data section exactly, or throws xserv::Error; nothing else may happen.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "base/error.h"
#include "models/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace xserv::models;
  try {
    SafetensorsHeader h = parse_safetensors(std::span<const uint8_t>(data, size), "<fuzz>");
    // A header that validated must describe tensors inside the file, back to back.
    uint64_t at = h.data_start;
    for (const TensorInfo& t : h.tensors) {
      if (t.offset != at || t.size > size || t.offset > size - t.size)
        std::abort();
      at += t.size;
    }
    if (at != size)
      std::abort();
  } catch (const xserv::Error&) {
    // Rejected input: the expected outcome for most fuzz inputs.
  }
  return 0;
}
