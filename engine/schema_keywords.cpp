// The JSON schema keywords structured output enforces. xgrammar's converter logs a warning and
// goes on when a schema uses a keyword it cannot enforce (not, if/then/else, uniqueItems,
// contains, multipleOf on numbers, a length bound beside a pattern, an unknown format, ...):
// such a schema is refused here, naming the keyword and where it stands, so that no output is
// ever promised valid against a schema that was only partly applied.
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "engine/constraint.h"

namespace xserv::engine {

namespace {

using Json = nlohmann::json;

/// Keywords that say nothing about the value.
const std::set<std::string, std::less<>> kAnnotations = {
    "title",    "description", "default",  "examples",  "$schema", "$id",    "$comment",
    "deprecated", "readOnly",  "writeOnly", "$anchor", "contentMediaType", "contentEncoding"};

/// Formats with a grammar of their own in the grammar engine.
const std::set<std::string, std::less<>> kFormats = {"email", "date",     "time", "date-time",
                                                     "duration", "hostname", "uuid", "uri",
                                                     "ipv4"};

/// Formats whose rule in the grammar engine is looser than the standard's, as patterns that
/// only valid values match: its ipv4 takes octets with leading zeros ("064"), which dotted-quad
/// validators refuse; its date takes any day 01-31 of any month. The date pattern leaves out
/// February 29 (a leap year's date is valid, but no output needs it).
const std::map<std::string, std::string, std::less<>> kFormatPatterns = {
    {"ipv4", "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
             "(\\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}"},
    {"date", "[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|"
             "30)|02-(0[1-9]|1[0-9]|2[0-8]))"},
};

/// The largest count (length, items, properties) a schema may bound.
constexpr int64_t kMaxCount = 100000;

class Audit {
public:
  Audit(std::string field, int max_depth) : field_(std::move(field)), max_depth_(max_depth) {}

  void schema(const Json& s, const std::string& path, int depth) {
    if (depth > max_depth_)
      fail(path, fmt::format("nests deeper than {} schemas", max_depth_));
    if (s.is_boolean())
      return;
    if (!s.is_object())
      fail(path, "is neither a schema object nor a boolean");
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      const Json& v = it.value();
      const std::string at = path + "/" + k;
      if (kAnnotations.count(k))
        continue;
      if (k == "type" || k == "enum" || k == "const" || k == "required" || k == "minimum" ||
          k == "maximum" || k == "exclusiveMinimum" || k == "exclusiveMaximum" || k == "pattern")
        continue;
      if (k == "minItems" || k == "maxItems" || k == "minProperties" || k == "maxProperties" ||
          k == "minLength" || k == "maxLength") {
        // The grammar unrolls these counts: a bound on what one schema may ask for in time and
        // memory (a minLength of 10^6 takes seconds to compile).
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxCount)
          fail(at, fmt::format("must be an integer from 0 to {}", kMaxCount));
        if ((k == "minLength" || k == "maxLength") && (s.contains("pattern") || s.contains("format")))
          fail(at, "beside \"pattern\" or \"format\" is not enforced: the pattern or format "
                   "alone would be");
        continue;
      }
      if (k == "format") {
        if (!v.is_string() || !kFormats.count(v.get<std::string>()))
          fail(at, fmt::format("{} is not a format the grammar engine enforces (supported: {})",
                               v.dump(), fmt::join(kFormats, ", ")));
        if (kFormatPatterns.count(v.get<std::string>())) {
          if (s.contains("pattern"))
            fail(at, "beside \"pattern\" is not enforced: the pattern alone would be");
          rewrites_.push_back(&s);
        }
        continue;
      }
      if (k == "multipleOf") {
        if (!(s.contains("type") && s["type"] == "integer") || !v.is_number_integer())
          fail(at, "is enforced only as an integer on \"type\": \"integer\"");
        continue;
      }
      if (k == "$ref") {
        if (!v.is_string() || !v.get<std::string>().starts_with("#"))
          fail(at, "must refer inside the schema (\"#...\")");
        continue;
      }
      if (k == "properties" || k == "patternProperties" || k == "$defs" || k == "definitions") {
        if (!v.is_object())
          fail(at, "must be an object of schemas");
        for (auto p = v.begin(); p != v.end(); ++p)
          schema(p.value(), at + "/" + p.key(), depth + 1);
        continue;
      }
      if (k == "items" || k == "additionalProperties" || k == "propertyNames" ||
          k == "unevaluatedProperties" || k == "unevaluatedItems") {
        schema(v, at, depth + 1);
        continue;
      }
      if (k == "prefixItems" || k == "anyOf" || k == "allOf") {
        if (!v.is_array() || v.empty())
          fail(at, "must be a non-empty array of schemas");
        if (k == "allOf" && v.size() > 1)
          fail(at, "with more than one schema is not enforced");
        for (size_t i = 0; i < v.size(); ++i)
          schema(v[i], at + "/" + std::to_string(i), depth + 1);
        continue;
      }
      if (k == "oneOf")
        fail(at, "is not enforced (exactly one match cannot be guaranteed); use \"anyOf\"");
      fail(at, fmt::format("the keyword \"{}\" is not supported by structured output", k));
    }
  }

  /// Schemas whose format becomes a pattern (kFormatPatterns).
  std::vector<const Json*> rewrites_;

private:
  [[noreturn]] void fail(const std::string& path, const std::string& why) const {
    throw ConstraintError(field_, fmt::format("{} {}", path.empty() ? "#" : "#" + path, why));
  }
  std::string field_;
  int max_depth_;
};

} // namespace

std::string check_schema_keywords(const std::string& schema_json, const std::string& field,
                                  int max_depth) {
  Json schema;
  try {
    // Nesting is bounded before the tree is built (a hostile schema of 100,000 levels).
    int depth = 0;
    schema = Json::parse(schema_json, [&](int d, Json::parse_event_t e, Json&) {
      (void)e;
      depth = std::max(depth, d);
      if (depth > 4 * max_depth)
        throw ConstraintError(field, fmt::format("nests deeper than {} levels", 4 * max_depth));
      return true;
    });
  } catch (const ConstraintError&) {
    throw;
  } catch (const Json::exception& e) {
    throw ConstraintError(field, fmt::format("is not JSON: {}", e.what()));
  }
  Audit audit(field, max_depth);
  audit.schema(schema, "", 0);
  if (audit.rewrites_.empty())
    return schema_json;
  for (const Json* s : audit.rewrites_) {
    Json& m = const_cast<Json&>(*s); // a node of `schema`, which the audit only read
    const std::string pattern = kFormatPatterns.at(m["format"].get<std::string>());
    m.erase("format");
    m["pattern"] = pattern;
  }
  return schema.dump();
}

} // namespace xserv::engine
