// libFuzzer target: any byte string parsed as graph.ir either fails with xserv::Error (naming
// FILE:LINE:COL) or gives a graph that prints, parses back to the same graph, and verifies or
// says why not; nothing else may happen.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "base/error.h"
#include "ir/graph.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace xserv;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ir::Graph g;
  try {
    g = ir::parse(text, "fuzz/graph.ir");
  } catch (const Error&) {
    return 0; // refused
  }
  (void)ir::verify(g); // a message or "", never a crash
  const std::string printed = ir::print(g);
  try {
    // The textual form is canonical: printing what parsed and parsing it back is the identity.
    if (!(ir::parse(printed, "fuzz/printed.ir") == g))
      std::abort();
  } catch (const Error&) {
    std::abort(); // the printer wrote text the parser refuses
  }
  return 0;
}
