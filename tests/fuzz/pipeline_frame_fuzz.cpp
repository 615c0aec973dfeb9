// libFuzzer target: any byte string as the payload of a pipeline frame (engine/pipeline/wire.h)
// either fails with xserv::Error or decodes into a header and tensors whose data matches their
// shapes; a step decoded from it is then checked (validate_step, check_boundary against a stage
// that receives f32[T, 8]) with xserv::Error as the only way to refuse. The first byte picks how
// much of that runs, so the fuzzer also reaches the checks behind a valid header.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "engine/pipeline/boundary.h"
#include "engine/pipeline/wire.h"
#include "engine/step_split.h"
#include "ir/graph.h"

namespace {

const xserv::ir::Graph& stage() {
  static const xserv::ir::Graph g = xserv::ir::parse(R"(
    %h = recv() {name="act.7", peer=0} : f32[T,8]
    %w = weight() {name="model.layers.1.w"} : bf16[8,8]
    %y = linear(%h, %w) : f32[T,8]
    %s = send(%y) {name="act.9", peer=2} : f32[T,8]
    return %s
  )");
  return g;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace xserv;
  const std::string payload(reinterpret_cast<const char*>(data), size);
  engine::pipeline::Named tensors;
  nlohmann::json head;
  try {
    head = engine::pipeline::wire::decode(payload, &tensors);
  } catch (const Error&) {
    return 0;
  }
  uint64_t bytes = 0;
  for (const auto& [name, t] : tensors) {
    uint64_t elems = 1;
    for (int64_t d : t.shape) {
      if (d < 0)
        std::abort();
      elems *= static_cast<uint64_t>(d);
    }
    const size_t held = t.is_int() ? t.i.size() : t.f.size();
    if (held != elems)
      std::abort();
    bytes += elems * 4;
  }
  if (bytes > payload.size()) // every byte of a tensor came from the payload
    std::abort();
  try {
    const models::StepInput in = engine::pipeline::wire::step_from_header(head);
    engine::validate_step(in, 4, 64, 1000, {16, 4, 8, 16, 12});
    engine::pipeline::check_boundary(
        tensors, engine::pipeline::stage_receives(stage(), engine::pipeline::token_count(in)),
        "fuzz");
    engine::pipeline::check_boundary(
        tensors, engine::pipeline::stage_sends(stage(), engine::pipeline::token_count(in)), "fuzz");
  } catch (const Error&) {
  }
  return 0;
}
