// Summary statistics of timing samples, for benchmarks and their reports.
#pragma once

#include <vector>

namespace xserv {

double mean(const std::vector<double>& v);
double stddev(const std::vector<double>& v); ///< sample standard deviation (0 for one value)
/// The q-quantile (0..1) by nearest rank of a copy of v.
double quantile(std::vector<double> v, double q);

} // namespace xserv
