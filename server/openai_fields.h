// Typed access to the fields of an OpenAI request body: every field typed, ranged and known
// (the chat, completion and Responses parsers).
#pragma once

#include <cmath>
#include <optional>
#include <set>
#include <string>

#include <fmt/format.h>

#include "server/api_error.h"

namespace xserv::server::openai {

inline std::string type_name(const Json& v) {
  if (v.is_number_integer() || v.is_number_unsigned())
    return "an integer";
  if (v.is_number())
    return "a number";
  if (v.is_string())
    return "a string";
  if (v.is_boolean())
    return "a boolean";
  if (v.is_array())
    return "an array";
  if (v.is_object())
    return "an object";
  return "null";
}

[[noreturn]] inline void bad(const std::string& param, const std::string& what) {
  throw ApiError(400, fmt::format("'{}' {}", param, what), param);
}

/// Typed access to the fields of one JSON object; fields never read are unknown to the schema.
class Fields {
public:
  Fields(const Json& obj, std::string prefix) : obj_(obj), prefix_(std::move(prefix)) {
    if (!obj.is_object())
      throw ApiError(400, fmt::format("'{}' must be an object, not {}", prefix_, type_name(obj)),
                     prefix_);
  }
  std::string path(const std::string& key) const {
    return prefix_.empty() ? key : prefix_ + "." + key;
  }
  /// The field, or nullptr when absent or null. Marks it known.
  const Json* get(const std::string& key) {
    known_.insert(key);
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  std::optional<double> number(const std::string& key, double lo, double hi) {
    const Json* v = get(key);
    if (!v)
      return std::nullopt;
    if (!v->is_number())
      bad(path(key), "must be a number, not " + type_name(*v));
    double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi)
      bad(path(key), fmt::format("must be in [{}, {}], not {}", lo, hi, v->dump()));
    return x;
  }
  std::optional<int64_t> integer(const std::string& key, int64_t lo, int64_t hi) {
    const Json* v = get(key);
    if (!v)
      return std::nullopt;
    if (!v->is_number_integer() && !v->is_number_unsigned())
      bad(path(key), "must be an integer, not " + type_name(*v));
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX))
      bad(path(key), fmt::format("must be in [{}, {}], not {}", lo, hi, v->dump()));
    int64_t x = v->get<int64_t>();
    if (x < lo || x > hi)
      bad(path(key), fmt::format("must be in [{}, {}], not {}", lo, hi, x));
    return x;
  }
  std::optional<bool> boolean(const std::string& key) {
    const Json* v = get(key);
    if (!v)
      return std::nullopt;
    if (!v->is_boolean())
      bad(path(key), "must be a boolean, not " + type_name(*v));
    return v->get<bool>();
  }
  std::optional<std::string> string(const std::string& key) {
    const Json* v = get(key);
    if (!v)
      return std::nullopt;
    if (!v->is_string())
      bad(path(key), "must be a string, not " + type_name(*v));
    return v->get<std::string>();
  }
  /// Throws for the first field that no accessor asked for.
  void reject_unknown() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it)
      if (!known_.count(it.key()))
        throw ApiError(400, fmt::format("unknown field '{}'", path(it.key())), path(it.key()));
  }

private:
  const Json& obj_;
  std::string prefix_;
  std::set<std::string> known_;
};

/// The text of a `content` field: a string, or an array of parts, each read by `part` (a
/// Fields of the part, returning its text; the part's unknown fields are refused after it).
template <class F> std::string text_of_parts(const Json& v, const std::string& param, F part) {
  if (v.is_string())
    return v.get<std::string>();
  if (!v.is_array())
    bad(param, "must be a string or an array of text parts, not " + type_name(v));
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    Fields f(v[i], fmt::format("{}[{}]", param, i));
    out += part(f);
    f.reject_unknown();
  }
  return out;
}

} // namespace xserv::server::openai
