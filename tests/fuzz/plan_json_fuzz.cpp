// libFuzzer target: any byte string read as plan.json is either refused with xserv::Error (a
// message naming the field) or accepted as a Plan that plan_to_json writes back losslessly;
// nothing else may happen (an nlohmann exception escaping would be a message without the field).
// An accepted plan's config block then goes through check_plan_config: it must pass against
// itself, and against the config.json ModelConfig writes for it (when the block reads as one)
// exactly when the two documents are equal, refusing with xserv::Error otherwise.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "models/config.h"
#include "runtime/plan_checkpoint.h"
#include "runtime/plan_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json doc = nlohmann::json::parse(data, data + size, nullptr, false);
  if (doc.is_discarded())
    return 0; // read_plan's "not valid JSON"
  const char* file = "fuzz/plan.json";
  try {
    const xserv::runtime::Plan plan = xserv::runtime::plan_from_json(doc, file);
    // What the reader accepts, the writer writes back as the same plan.
    if (!(xserv::runtime::plan_from_json(xserv::runtime::plan_to_json(plan), file) == plan))
      std::abort();
    const char* config_file = "fuzz/model/config.json";
    try {
      xserv::runtime::check_plan_config("fuzz", plan, config_file, plan.config);
    } catch (const xserv::Error&) {
      std::abort(); // a block refused against itself
    }
    const nlohmann::json checkpoint =
        xserv::models::ModelConfig::from_json(plan.config, config_file).to_json();
    bool passed = true;
    try {
      xserv::runtime::check_plan_config("fuzz", plan, config_file, checkpoint);
    } catch (const xserv::Error&) {
      passed = false;
    }
    if (passed != (checkpoint == plan.config))
      std::abort();
  } catch (const xserv::Error&) {
    // Refused: the expected outcome for most inputs.
  }
  return 0;
}
