// timeline_report(): a diagnostic plan's launch stamps as each kernel's share of the step.
#include <doctest/doctest.h>

#include "runtime/timeline.h"

using namespace xserv::runtime;

TEST_CASE("timeline: each kernel gets the time from its stamp to the next launch's") {
  const std::vector<std::string> names = {"qkv", "attention", "moe"};
  // Two steps of qkv (3 us), attention (5 us), moe (12 us); the host takes 500 us between them.
  std::vector<TimelineStamp> s;
  uint64_t t = 1'000'000, id = 100;
  for (int step = 0; step < 2; ++step) {
    for (auto [k, us] : {std::pair{0, 3}, std::pair{1, 5}, std::pair{2, 12}}) {
      s.push_back({k, id++, t});
      t += uint64_t(us) * 1000;
    }
    if (step == 0)
      t += 500'000 - 12'000; // the host's 500 us from the first moe's stamp to the next qkv's
  }
  s.push_back({0, id++, t}); // the third step's first launch, 12 us after the second moe
  // An older qkv stamp that survived its module's ring while the others were overwritten: it
  // lies before the window in which every kernel has stamps, so it is not counted.
  s.push_back({0, 5, 1'000});
  // Empty slots (launch 0) and an out-of-range kernel index are ignored.
  s.push_back({1, 0, 0});
  s.push_back({7, 999, t + 1});
  const TimelineReport r = timeline_report(s, names);
  // The window opens at the latest of the kernels' first stamps (moe's, in the first step):
  // before it a kernel's launches may have been overwritten, so the first step's qkv and
  // attention, and the stale qkv stamp, are left out.
  REQUIRE(r.rows.size() == 3);
  CHECK(r.stamps == 5);
  CHECK(r.idle_us == doctest::Approx(500.0)); // the first moe's stamp to the next qkv's
  CHECK(r.window_us == doctest::Approx(500 + 3 + 5 + 12));
  CHECK(r.rows[0].name == "moe");
  CHECK(r.rows[0].launches == 1);
  CHECK(r.rows[0].mean_us == doctest::Approx(12.0));
  CHECK(r.rows[1].name == "attention");
  CHECK(r.rows[1].median_us == doctest::Approx(5.0));
  CHECK(r.rows[2].name == "qkv");
  CHECK(r.rows[2].total_us == doctest::Approx(3.0));
  const std::vector<std::string> lines = timeline_lines(r);
  REQUIRE(lines.size() == 2 + 3);
  CHECK(lines[2].find("moe") != std::string::npos);
  CHECK(lines[2].find("60.0%") != std::string::npos); // 12 of the kernels' 20 us
}

TEST_CASE("timeline: many steps give each kernel's median and mean") {
  // qkv 4 us and moe 10 or 14 us alternately, over 9 steps with no host gap.
  std::vector<TimelineStamp> s;
  uint64_t t = 0, id = 1;
  for (int step = 0; step < 9; ++step) {
    s.push_back({0, id++, t += 1});
    t += 4000;
    s.push_back({1, id++, t});
    t += step % 2 ? 14'000 : 10'000;
  }
  s.push_back({0, id++, t});
  const TimelineReport r = timeline_report(s, {"qkv", "moe"});
  REQUIRE(r.rows.size() == 2);
  CHECK(r.rows[0].name == "moe");
  CHECK(r.rows[0].launches == 9);
  CHECK(r.rows[0].median_us == doctest::Approx(10.001)); // five of 10 (+1 ns), four of 14
  CHECK(r.rows[0].mean_us == doctest::Approx((5 * 10.001 + 4 * 14.001) / 9));
  CHECK(r.rows[1].launches == 8); // the first step's qkv lies before moe's first stamp
  CHECK(r.rows[1].mean_us == doctest::Approx(4.0));
  CHECK(r.idle_us == 0);
}

TEST_CASE("timeline: with the step's last kernel named, a long kernel counts whole") {
  // Three steps of attention (300 us: past the 200 us bound), lm_head (900 us) and argmax (the
  // step's last launch), the host 50 us between steps (under the bound).
  const std::vector<std::string> names = {"attention", "lm_head", "argmax"};
  std::vector<TimelineStamp> s;
  uint64_t t = 1'000, id = 1;
  for (int step = 0; step < 3; ++step)
    for (auto [k, us] : {std::pair{0, 300}, std::pair{1, 900}, std::pair{2, 60}}) {
      s.push_back({k, id++, t});
      t += uint64_t(us) * 1000;
    }
  s.push_back({0, id++, t}); // the fourth step's first launch
  // The window opens at the first argmax (the latest of the kernels' first stamps): steps 2 and
  // 3's attention and lm_head count.
  const TimelineReport by_kernel = timeline_report(s, names, 200.0, {2});
  REQUIRE(by_kernel.rows.size() == 2);
  CHECK(by_kernel.rows[0].name == "lm_head");
  CHECK(by_kernel.rows[0].launches == 2);
  CHECK(by_kernel.rows[0].mean_us == doctest::Approx(900.0));
  CHECK(by_kernel.rows[1].name == "attention");
  CHECK(by_kernel.rows[1].total_us == doctest::Approx(600.0));
  CHECK(by_kernel.idle_us == doctest::Approx(3 * 60.0)); // after each argmax
  // By the bound alone both long kernels would have been taken for the host.
  const TimelineReport by_bound = timeline_report(s, names);
  REQUIRE(by_bound.rows.size() == 1);
  CHECK(by_bound.rows[0].name == "argmax");
  CHECK(by_bound.idle_us == doctest::Approx(2 * 1200.0));
}

TEST_CASE("timeline: too few stamps give an empty report") {
  CHECK(timeline_report({}, {"a"}).rows.empty());
  CHECK(timeline_report({{0, 1, 10}}, {"a"}).rows.empty());
  CHECK(timeline_report({{0, 0, 10}, {0, 0, 20}}, {"a"}).stamps == 0);
}
