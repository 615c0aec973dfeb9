// The "# Tools" section of harmony system/developer messages: JSON schemas as TypeScript types.
//
// Follows openai/harmony's json_schema_to_typescript (src/encoding.rs) for what gpt-oss saw in
// training: objects become `{ key?: type, ... }` with descriptions, titles and examples as `//`
// comments above a property and defaults after it; enums become string unions; oneOf
// properties list one `| variant` per line.
#include "models/harmony.h"

#include <algorithm>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "models/json_error.h"

namespace xserv::models {
namespace {

using Json = nlohmann::ordered_json;

bool is_enum(const Json& s) {
  auto it = s.find("enum");
  return it != s.end() && it->is_array() && !it->empty();
}

bool nullable(const Json& s) {
  auto it = s.find("nullable");
  return it != s.end() && it->is_boolean() && it->get<bool>();
}

std::string str_of(const Json& s, const char* key) {
  auto it = s.find(key);
  return it != s.end() && it->is_string() ? it->get<std::string>() : std::string();
}

/// "default: ..." as harmony words it: strings quoted unless the schema is an enum.
std::string default_comment(const Json& schema) {
  const Json& d = schema["default"];
  if (d.is_string())
    return is_enum(schema) ? "default: " + d.get<std::string>()
                           : "default: \"" + d.get<std::string>() + "\"";
  return "default: " + d.dump();
}

std::string to_typescript(const Json& schema, const std::string& indent);

/// One `| variant` of a oneOf with its trailing comments.
std::string variant_text(const Json& variant, const std::string& indent, bool skip_desc,
                         const std::string& property_desc) {
  std::string type = to_typescript(variant, indent + "   ");
  if (nullable(variant) && type.find("null") == std::string::npos)
    type += " | null";
  std::vector<std::string> comments;
  std::string desc = str_of(variant, "description");
  if (!skip_desc && !desc.empty() && desc != property_desc)
    comments.push_back(desc);
  if (variant.contains("default"))
    comments.push_back(default_comment(variant));
  if (!comments.empty())
    type += " // " + fmt::format("{}", fmt::join(comments, " "));
  return type;
}

std::string object_to_typescript(const Json& schema, const std::string& indent) {
  std::string out;
  if (std::string d = str_of(schema, "description"); !d.empty())
    out += indent + "// " + d + "\n";
  out += "{\n";
  auto props = schema.find("properties");
  if (props != schema.end() && props->is_object()) {
    std::vector<std::string> required;
    if (auto r = schema.find("required"); r != schema.end() && r->is_array())
      for (const auto& x : *r)
        if (x.is_string())
          required.push_back(x.get<std::string>());
    for (auto it = props->begin(); it != props->end(); ++it) {
      const Json& val = it.value();
      const char* optional =
          std::find(required.begin(), required.end(), it.key()) != required.end() ? "" : "?";
      if (std::string t = str_of(val, "title"); !t.empty())
        out += indent + "// " + t + "\n" + indent + "//\n";
      const std::string desc = str_of(val, "description");
      auto one_of = val.find("oneOf");
      bool has_one_of = one_of != val.end();
      if (!has_one_of && !desc.empty())
        out += indent + "// " + desc + "\n";
      if (auto ex = val.find("examples"); ex != val.end() && ex->is_array() && !ex->empty()) {
        out += indent + "// Examples:\n";
        for (const auto& e : *ex)
          if (e.is_string())
            out += indent + "// - \"" + e.get<std::string>() + "\"\n";
      }
      if (has_one_of && one_of->is_array()) {
        bool skip_desc =
            !desc.empty() && !one_of->empty() && str_of((*one_of)[0], "description") == desc;
        bool desc_above = !skip_desc && !desc.empty();
        if (desc_above)
          out += indent + "// " + desc + "\n";
        if (val.contains("default"))
          out += indent + "// " + default_comment(val) + "\n";
        out += indent + it.key() + optional + ":\n";
        for (size_t i = 0; i < one_of->size(); ++i)
          out += indent + " | " + variant_text((*one_of)[i], indent, i == 0 && desc_above, desc) +
                 "\n";
        out += indent + ",\n";
        continue;
      }
      std::string type = to_typescript(val, indent + "    ");
      if (nullable(val) && type.find("null") == std::string::npos)
        type += " | null";
      out += indent + it.key() + optional + ": " + type + ",";
      if (!has_one_of && val.contains("default"))
        out += " // " + default_comment(val);
      out += "\n";
    }
  }
  out += indent + "}";
  return out;
}

std::string to_typescript(const Json& schema, const std::string& indent) {
  if (!schema.is_object())
    return "any";
  if (auto one_of = schema.find("oneOf"); one_of != schema.end() && one_of->is_array()) {
    std::string out;
    for (const auto& variant : *one_of)
      out += "\n" + indent + " | " + variant_text(variant, indent, false, "");
    return out;
  }
  auto type = schema.find("type");
  if (type == schema.end())
    return "any";
  if (type->is_array()) {
    std::vector<std::string> names;
    for (const auto& t : *type)
      if (t.is_string())
        names.push_back(t.get<std::string>() == "integer" ? "number" : t.get<std::string>());
    return names.empty() ? "any" : fmt::format("{}", fmt::join(names, " | "));
  }
  if (!type->is_string())
    return "any";
  const std::string t = type->get<std::string>();
  if (t == "object")
    return object_to_typescript(schema, indent);
  if (t == "string") {
    std::vector<std::string> values;
    if (is_enum(schema))
      for (const auto& v : schema["enum"])
        if (v.is_string())
          values.push_back("\"" + v.get<std::string>() + "\"");
    return values.empty() ? "string" : fmt::format("{}", fmt::join(values, " | "));
  }
  if (t == "number" || t == "integer")
    return "number";
  if (t == "boolean")
    return "boolean";
  if (t == "array")
    return schema.contains("items") ? to_typescript(schema["items"], indent) + "[]" : "Array<any>";
  return "any";
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

} // namespace

std::string render_tools_section(std::span<const ToolNamespace> namespaces) {
  std::vector<const ToolNamespace*> sorted;
  for (const auto& ns : namespaces)
    sorted.push_back(&ns);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto* a, const auto* b) { return a->name < b->name; });
  std::vector<std::string> sections = {"# Tools"};
  for (const ToolNamespace* ns : sorted) {
    std::vector<std::string> lines = {"## " + ns->name + "\n"};
    for (const auto& line : split_lines(ns->description))
      lines.push_back(ns->tools.empty() ? line : "// " + line);
    if (!ns->tools.empty()) {
      lines.push_back("namespace " + ns->name + " {\n");
      for (const auto& tool : ns->tools) {
        for (const auto& line : split_lines(tool.description))
          lines.push_back("// " + line);
        if (tool.parameters.empty()) {
          lines.push_back("type " + tool.name + " = () => any;\n");
          continue;
        }
        Json params;
        try {
          params = Json::parse(tool.parameters);
        } catch (const nlohmann::json::exception& e) {
          throw Error(fmt::format("tool {}.{}: parameters are not valid JSON: {}", ns->name,
                                  tool.name, json_error_text(e.what())));
        }
        lines.push_back("type " + tool.name + " = (_: " + to_typescript(params, "") +
                        ") => any;\n");
      }
      lines.push_back("} // namespace " + ns->name);
    }
    sections.push_back(fmt::format("{}", fmt::join(lines, "\n")));
  }
  return fmt::format("{}", fmt::join(sections, "\n\n"));
}

} // namespace xserv::models
