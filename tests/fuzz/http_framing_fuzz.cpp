// libFuzzer target: any byte string as a request's method, --max-body and headers goes through
// check_body_framing (cli/http_framing.h), serve's gate before cpp-httplib reads a body, and its
// verdict is held to the documented contract by an independent reading of the headers: what it
// accepts has at most one Content-Length value (decimal digits, at most max_body, 0 or none for
// GET and HEAD, present for POST, PUT, PATCH and DELETE) and no Transfer-Encoding; what it
// refuses breaks a rule, with 400, 411 (no Content-Length at all) or 413 (the size the only
// problem), and an error body that serialises strictly (the values it echoes are cut to ASCII).
//
// Input: line 1 the method, line 2 max_body in decimal (wrapping, so 2^64 - 1 is reachable), then
// one header a line, "name:value" split at the first ':' (no ':': the whole line is the name).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/http_framing.h"
#include "server/openai_request.h"

namespace {

bool same_name(const std::string& a, const char* b) {
  const std::string lower_b = b;
  if (a.size() != lower_b.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto x = static_cast<unsigned char>(a[i]), y = static_cast<unsigned char>(lower_b[i]);
    if ((x >= 'A' && x <= 'Z' ? x + 32 : x) != (y >= 'A' && y <= 'Z' ? y + 32 : y))
      return false;
  }
  return true;
}

bool all_digits(const std::string& v) {
  if (v.empty())
    return false;
  for (char c : v)
    if (c < '0' || c > '9')
      return false;
  return true;
}

/// Decimal digits without leading zeros ("0" for zero): equal numbers, equal strings.
std::string normalised(const std::string& digits) {
  const size_t first = digits.find_first_not_of('0');
  return first == std::string::npos ? "0" : digits.substr(first);
}

/// a <= b for normalised decimal strings of any length.
bool at_most(const std::string& a, const std::string& b) {
  return a.size() != b.size() ? a.size() < b.size() : a <= b;
}

[[noreturn]] void contract_broken() {
  std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> lines;
  for (size_t at = 0; at <= in.size();) {
    const size_t nl = std::min(in.find('\n', at), in.size());
    lines.push_back(in.substr(at, nl - at));
    at = nl + 1;
  }
  if (lines.size() < 2)
    return 0;
  const std::string& method = lines[0];
  uint64_t max_body = 0;
  for (char c : lines[1])
    if (c >= '0' && c <= '9')
      max_body = max_body * 10 + static_cast<uint64_t>(c - '0');
  httplib::Headers headers;
  std::vector<std::string> lengths, codings;
  for (size_t i = 2; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    const std::string name = lines[i].substr(0, colon);
    const std::string value = colon == std::string::npos ? "" : lines[i].substr(colon + 1);
    headers.emplace(name, value);
    if (same_name(name, "Content-Length"))
      lengths.push_back(value);
    else if (same_name(name, "Transfer-Encoding"))
      codings.push_back(value);
  }

  // The contract, read independently of the implementation.
  bool lengths_are_numbers = true;
  std::vector<std::string> distinct;
  for (const std::string& v : lengths) {
    if (!all_digits(v)) {
      lengths_are_numbers = false;
      continue;
    }
    const std::string n = normalised(v);
    if (distinct.empty() || distinct[0] != n)
      distinct.push_back(n);
  }
  const bool one_length = lengths_are_numbers && distinct.size() <= 1;
  const bool bodyless = method == "GET" || method == "HEAD";
  const bool wants_body =
      method == "POST" || method == "PUT" || method == "PATCH" || method == "DELETE";
  const bool framing_ok = one_length && codings.empty() &&
                          (!bodyless || distinct.empty() || distinct[0] == "0") &&
                          (!wants_body || !lengths.empty());
  const bool fits = distinct.empty() || at_most(distinct[0], std::to_string(max_body));

  const std::optional<xserv::server::openai::ApiError> e =
      xserv::server::check_body_framing(method, headers, max_body);
  if (!e) {
    if (!framing_ok || !fits)
      contract_broken();
    return 0;
  }
  if (framing_ok && fits)
    contract_broken();
  switch (e->status) {
  case 400:
    break;
  case 411: // no Content-Length: a chunked body, or a method that needs one
    if (!lengths.empty())
      contract_broken();
    break;
  case 413: // a well-framed request whose only problem is its size
    if (!framing_ok || fits)
      contract_broken();
    break;
  default:
    contract_broken();
  }
  if (std::string(e->what()).empty() || e->code != "invalid_body_framing")
    contract_broken();
  try {
    (void)xserv::server::openai::error_body(*e).dump(); // strict: throws on invalid UTF-8
  } catch (const nlohmann::json::exception&) {
    contract_broken();
  }
  return 0;
}
