// timeline_report(): a diagnostic plan's launch stamps as each kernel's share of the step.
#include "runtime/timeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace xserv::runtime {

TimelineReport timeline_report(std::vector<TimelineStamp> stamps,
                               const std::vector<std::string>& names, double idle_us,
                               const std::vector<int>& step_ends) {
  std::erase_if(stamps, [&](const TimelineStamp& s) {
    return s.launch == 0 || s.kernel < 0 || size_t(s.kernel) >= names.size();
  });
  TimelineReport r;
  if (stamps.size() < 2)
    return r;
  std::map<int, uint64_t> first; // each kernel's earliest surviving stamp
  for (const TimelineStamp& s : stamps) {
    auto [it, fresh] = first.emplace(s.kernel, s.ns);
    if (!fresh)
      it->second = std::min(it->second, s.ns);
  }
  uint64_t from = 0;
  for (const auto& [k, ns] : first)
    from = std::max(from, ns);
  std::erase_if(stamps, [&](const TimelineStamp& s) { return s.ns < from; });
  std::sort(stamps.begin(), stamps.end(), [](const TimelineStamp& a, const TimelineStamp& b) {
    return a.ns != b.ns ? a.ns < b.ns : a.launch < b.launch;
  });
  r.stamps = static_cast<int>(stamps.size());
  if (stamps.size() < 2)
    return r;
  r.window_us = double(stamps.back().ns - stamps.front().ns) / 1e3;
  std::map<int, std::vector<double>> gaps;
  for (size_t i = 0; i + 1 < stamps.size(); ++i) {
    const double us = double(stamps[i + 1].ns - stamps[i].ns) / 1e3;
    const bool ends =
        std::find(step_ends.begin(), step_ends.end(), stamps[i].kernel) != step_ends.end();
    if (step_ends.empty() ? us > idle_us : ends)
      r.idle_us += us;
    else
      gaps[stamps[i].kernel].push_back(us);
  }
  for (auto& [k, v] : gaps) {
    TimelineRow row;
    row.name = names[size_t(k)];
    row.launches = static_cast<int>(v.size());
    for (double us : v)
      row.total_us += us;
    row.mean_us = row.total_us / double(v.size());
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    row.median_us = v[v.size() / 2];
    r.rows.push_back(std::move(row));
  }
  std::sort(r.rows.begin(), r.rows.end(), [](const TimelineRow& a, const TimelineRow& b) {
    return a.total_us != b.total_us ? a.total_us > b.total_us : a.name < b.name;
  });
  return r;
}

std::vector<std::string> timeline_lines(const TimelineReport& r) {
  std::vector<std::string> out;
  const double busy = r.window_us - r.idle_us;
  out.push_back(fmt::format("[timeline] {} launches over {:.1f} us ({:.1f} us between steps, "
                            "not counted); each kernel: stamp to the next launch's stamp",
                            r.stamps, r.window_us, r.idle_us));
  out.push_back(fmt::format("[timeline] {:<64} {:>8} {:>10} {:>10} {:>7}", "kernel", "launches",
                            "mean us", "median us", "share"));
  for (const TimelineRow& row : r.rows)
    out.push_back(fmt::format("[timeline] {:<64} {:>8} {:>10.2f} {:>10.2f} {:>6.1f}%", row.name,
                              row.launches, row.mean_us, row.median_us,
                              busy > 0 ? 100.0 * row.total_us / busy : 0.0));
  return out;
}

} // namespace xserv::runtime
