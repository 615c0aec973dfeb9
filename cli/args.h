// A small command-line parser: declared options, positional arguments, clear usage errors.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"

namespace xserv::cli {

using xserv::UsageError; // base/error.h: exit code 2

struct OptSpec {
  OptSpec(std::string n, std::string m, std::string h, std::string a = "")
      : name(std::move(n)), meta(std::move(m)), help(std::move(h)), alias(std::move(a)) {}
  std::string name; ///< "--max-seq" or "-o"
  std::string meta; ///< value placeholder ("N"); empty for a flag without a value
  std::string help;
  std::string alias; ///< optional second spelling ("--output")
};

struct CommandSpec {
  std::string name;
  std::string usage;   ///< "MODEL_DIR [-o PLAN] ..."
  std::string summary; ///< one line
  std::vector<OptSpec> options;
  size_t min_positional = 0;
  size_t max_positional = 0;
};

class ParsedArgs {
public:
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get(const std::string& name, const std::string& fallback = "") const;
  /// All values given for a repeatable option, comma lists split; UsageError on an empty
  /// element ("1,,2", "1,2,", "").
  std::vector<std::string> list(const std::string& name) const;
  int64_t get_int(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) const;
  /// UsageError unless the value is a finite number (nan and inf are refused).
  double get_double(const std::string& name, double fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

private:
  friend ParsedArgs parse_args(const CommandSpec&, const std::vector<std::string>&);
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

/// Parses `args` (after the command name) against `spec`; throws UsageError naming the
/// offending argument. `--name=value` and `--name value` are both accepted.
ParsedArgs parse_args(const CommandSpec& spec, const std::vector<std::string>& args);

/// The help text of one command.
std::string command_help(const CommandSpec& spec);

/// `text` as an integer in [lo, hi]; UsageError naming `what` otherwise.
int64_t parse_int(const std::string& text, const std::string& what, int64_t lo, int64_t hi);

/// Parses sizes like "5GB", "512MiB", "1000" (bytes). Throws UsageError.
uint64_t parse_size(const std::string& text, const std::string& what);

/// `text` when it is empty or a date YYYY-MM-DD (month 01-12, day 01-31); UsageError naming
/// `what` otherwise.
std::string parse_date(const std::string& text, const std::string& what);

} // namespace xserv::cli
