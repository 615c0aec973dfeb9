// The launch timeline of a diagnostic plan (compile --timeline): each kernel's launches stamp the
// GPU clock as their first block passes the dependency wait (codegen/kernels/common.cuh
// timeline_stamp), and the gaps between consecutive stamps are each kernel's share of the
// step's critical path, overlap with its neighbours (programmatic dependent launch) included.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace xserv::runtime {

/// The symbol a timeline kernel's module holds its stamps in: two words (the latest launch's
/// %gridid, the launches stamped), then kTimelineSlots (launch, ns) slots taken in turn.
inline constexpr const char* kTimelineSymbol = "xserv_timeline";
inline constexpr size_t kTimelineSlots = 1024;
inline constexpr size_t kTimelineWords = 2 + 2 * kTimelineSlots;

/// One launch: its kernel (index into the names), %gridid and %globaltimer in ns.
struct TimelineStamp {
  int kernel = 0;
  uint64_t launch = 0, ns = 0;
};

/// A kernel's share: over its launches in the window, the time from its stamp to the next
/// launch's stamp (what the step waits on it, PDL overlap included).
struct TimelineRow {
  std::string name;
  int launches = 0;
  double mean_us = 0, median_us = 0, total_us = 0;
};

struct TimelineReport {
  std::vector<TimelineRow> rows; ///< by total, largest first
  double window_us = 0;          ///< first to last stamp counted
  double idle_us = 0;            ///< the gaps between steps, not counted
  int stamps = 0;                ///< launches in the window
};

/// The report of `stamps` (kernel indices into `names`; launch 0 marks an empty slot). Only the
/// window in which every kernel's stamps survive counts (each kernel's module keeps its last
/// kTimelineSlots launches): from the latest of the kernels' earliest stamps on. The gaps
/// between steps are idle, not a kernel's: with `step_ends` (the kernels that end a step: the
/// launch table's last), the gap after each of their stamps (their own time and the host's
/// until the next step), so that a long kernel elsewhere counts whole; without, every gap
/// longer than `idle_us`.
TimelineReport timeline_report(std::vector<TimelineStamp> stamps,
                               const std::vector<std::string>& names, double idle_us = 200.0,
                               const std::vector<int>& step_ends = {});

/// The report as the lines `xserv bench` prints ("[timeline] ...").
std::vector<std::string> timeline_lines(const TimelineReport& r);

} // namespace xserv::runtime
