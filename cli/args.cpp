// Command-line parsing shared by every xserv command.
#include "cli/args.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

namespace xserv::cli {

std::string ParsedArgs::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() || it->second.empty() ? fallback : it->second.back();
}

std::vector<std::string> ParsedArgs::list(const std::string& name) const {
  std::vector<std::string> out;
  auto it = values_.find(name);
  if (it == values_.end())
    return out;
  for (const auto& v : it->second) {
    size_t start = 0;
    while (start <= v.size()) {
      size_t end = v.find(',', start);
      if (end == std::string::npos)
        end = v.size();
      if (end == start)
        throw UsageError(
            fmt::format("{}: empty element in '{}' (a list is VALUE,VALUE,...)", name, v));
      out.push_back(v.substr(start, end - start));
      start = end + 1;
    }
  }
  return out;
}

int64_t ParsedArgs::get_int(const std::string& name, int64_t fallback, int64_t lo,
                            int64_t hi) const {
  if (!has(name))
    return fallback;
  return parse_int(get(name), name, lo, hi);
}

int64_t parse_int(const std::string& v, const std::string& what, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0)
    throw UsageError(fmt::format("{} expects an integer, got '{}'", what, v));
  if (x < lo || x > hi)
    throw UsageError(fmt::format("{} must be in [{}, {}], got {}", what, lo, hi, x));
  return x;
}

double ParsedArgs::get_double(const std::string& name, double fallback) const {
  if (!has(name))
    return fallback;
  const std::string v = get(name);
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0')
    throw UsageError(fmt::format("{} expects a number, got '{}'", name, v));
  if (!std::isfinite(x))
    throw UsageError(fmt::format("{} expects a finite number, got '{}'", name, v));
  return x;
}

ParsedArgs parse_args(const CommandSpec& spec, const std::vector<std::string>& args) {
  ParsedArgs out;
  auto find = [&](const std::string& name) -> const OptSpec* {
    for (const auto& o : spec.options)
      if (o.name == name || (!o.alias.empty() && o.alias == name))
        return &o;
    return nullptr;
  };
  bool only_positional = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (only_positional || a.size() < 2 || a[0] != '-' ||
        (std::isdigit(static_cast<unsigned char>(a[1])) && spec.max_positional > 0)) {
      out.positional_.push_back(a);
      continue;
    }
    if (a == "--") {
      only_positional = true;
      continue;
    }
    std::string name = a, value;
    bool inline_value = false;
    if (auto eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      inline_value = true;
    }
    const OptSpec* o = find(name);
    if (!o)
      throw UsageError(fmt::format("unknown option '{}' (see xserv {} --help)", name, spec.name));
    if (o->meta.empty()) {
      if (inline_value)
        throw UsageError(fmt::format("option {} takes no value", name));
      out.values_[o->name].push_back("1");
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= args.size())
        throw UsageError(fmt::format("option {} needs a value ({})", name, o->meta));
      value = args[++i];
    }
    out.values_[o->name].push_back(value);
  }
  if (out.positional_.size() < spec.min_positional)
    throw UsageError(fmt::format("missing argument; usage: xserv {} {}", spec.name, spec.usage));
  if (out.positional_.size() > spec.max_positional)
    throw UsageError(fmt::format("unexpected argument '{}'; usage: xserv {} {}",
                                 out.positional_[spec.max_positional], spec.name, spec.usage));
  return out;
}

std::string command_help(const CommandSpec& spec) {
  std::string out = fmt::format("usage: xserv {} {}\n\n{}\n", spec.name, spec.usage, spec.summary);
  if (!spec.options.empty())
    out += "\noptions:\n";
  for (const auto& o : spec.options) {
    std::string left =
        o.name + (o.alias.empty() ? "" : ", " + o.alias) + (o.meta.empty() ? "" : " " + o.meta);
    out += fmt::format("  {:<28} {}\n", left, o.help);
  }
  return out;
}

uint64_t parse_size(const std::string& text, const std::string& what) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0)
    throw UsageError(fmt::format("{}: expected a size like 5GB or 512MiB, got '{}'", what, text));
  double n = std::strtod(text.substr(0, i).c_str(), nullptr);
  std::string unit = text.substr(i);
  for (char& c : unit)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "B")
    mult = 1;
  else if (unit == "KB" || unit == "K")
    mult = 1e3;
  else if (unit == "MB" || unit == "M")
    mult = 1e6;
  else if (unit == "GB" || unit == "G")
    mult = 1e9;
  else if (unit == "KIB")
    mult = 1024.0;
  else if (unit == "MIB")
    mult = 1024.0 * 1024;
  else if (unit == "GIB")
    mult = 1024.0 * 1024 * 1024;
  else
    throw UsageError(fmt::format("{}: unknown size unit '{}' in '{}'", what, text.substr(i), text));
  if (n * mult < 1 || n * mult > 1e15)
    throw UsageError(fmt::format("{}: size '{}' out of range", what, text));
  return static_cast<uint64_t>(n * mult);
}

std::string parse_date(const std::string& v, const std::string& what) {
  if (v.empty())
    return v;
  auto digits = [&](size_t at, size_t n) {
    int x = 0;
    for (size_t i = at; i < at + n; ++i) {
      if (i >= v.size() || v[i] < '0' || v[i] > '9')
        return -1;
      x = x * 10 + (v[i] - '0');
    }
    return x;
  };
  const int month = digits(5, 2), day = digits(8, 2);
  if (v.size() != 10 || digits(0, 4) < 0 || v[4] != '-' || v[7] != '-' || month < 1 ||
      month > 12 || day < 1 || day > 31)
    throw UsageError(fmt::format("{} must be a date YYYY-MM-DD, got '{}'", what, v));
  return v;
}

} // namespace xserv::cli
