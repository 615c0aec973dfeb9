// Answer extraction for GSM8K and AIME: numbers in free text, \boxed{} contents, references.
#include "models/answers.h"

#include <cctype>
#include <vector>

namespace xserv::eval {
namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_alnum(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
    s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
    s.remove_suffix(1);
  return s;
}

/// LaTeX spellings of digit grouping ("1{,}234", "1\,234", "1\!234") become plain "1,234"/"1234".
std::string unlatex(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.substr(i, 3) == "{,}") {
      out += ',';
      i += 2;
    } else if (s.substr(i, 2) == "\\," || s.substr(i, 2) == "\\!") {
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string canonical(bool negative, std::string digits, std::string frac) {
  size_t nz = digits.find_first_not_of('0');
  digits = nz == std::string::npos ? "0" : digits.substr(nz);
  while (!frac.empty() && frac.back() == '0')
    frac.pop_back();
  std::string out = digits + (frac.empty() ? "" : "." + frac);
  return negative && out != "0" ? "-" + out : out;
}

struct Number {
  size_t begin, end; // [begin, end) of the digits, fraction included; the sign lies before
  std::string value; // canonical
};

/// Every number of `s` in order. A '-' (or U+2212) directly before the digits (or before a '$'
/// that precedes them) is a sign unless it follows a letter, digit or ')' ("5-3" is a difference).
std::vector<Number> scan_numbers(std::string_view s) {
  std::vector<Number> out;
  size_t i = 0;
  while (i < s.size()) {
    if (!is_digit(s[i])) {
      ++i;
      continue;
    }
    size_t begin = i;
    std::string digits;
    while (i < s.size() && is_digit(s[i]))
      digits += s[i++];
    // Thousands groups: ",ddd" not followed by another digit.
    while (i + 3 < s.size() && s[i] == ',' && is_digit(s[i + 1]) && is_digit(s[i + 2]) &&
           is_digit(s[i + 3]) && (i + 4 >= s.size() || !is_digit(s[i + 4]))) {
      digits += s.substr(i + 1, 3);
      i += 4;
    }
    std::string frac;
    if (i + 1 < s.size() && s[i] == '.' && is_digit(s[i + 1])) {
      ++i;
      while (i < s.size() && is_digit(s[i]))
        frac += s[i++];
    }
    size_t k = begin;
    if (k > 0 && s[k - 1] == '$')
      --k;
    bool negative = false;
    if (k > 0 && s[k - 1] == '-')
      negative = k < 2 || !(is_alnum(s[k - 2]) || s[k - 2] == ')');
    else if (k >= 3 && s.substr(k - 3, 3) == "\xE2\x88\x92") // U+2212 MINUS SIGN
      negative = true;
    out.push_back({begin, i, canonical(negative, digits, frac)});
  }
  return out;
}

std::optional<std::string> last_of(std::string_view s) {
  auto nums = scan_numbers(unlatex(s));
  if (nums.empty())
    return std::nullopt;
  return nums.back().value;
}

/// The number an "answer" marker introduces, read from `rest` (the text after the marker): the
/// first number of its line, or, when that line states a computation ("7 + 4 = 11"), the first
/// number after its last '='. "The answer is 7 apples, from 3 + 4." gives 7, not 4.
std::optional<std::string> answer_after_marker(std::string_view rest) {
  std::string_view line = rest.substr(0, rest.find('\n'));
  if (size_t eq = line.rfind('='); eq != std::string_view::npos)
    line = line.substr(eq + 1);
  auto nums = scan_numbers(unlatex(line));
  if (nums.empty())
    return std::nullopt;
  return nums.front().value;
}

bool is_integer(const std::string& canonical_value) {
  return canonical_value.find('.') == std::string::npos;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

} // namespace

std::string gsm8k_prompt(std::string_view question) {
  std::string out = "Solve this math problem. Give the reasoning steps before giving the final "
                    "answer on the last line by itself in the format of \"Answer:\". Do not add "
                    "anything other than the integer answer after \"Answer:\".\n\n";
  out += question;
  return out;
}

std::string aime_prompt(std::string_view question) {
  std::string out = "\n";
  out += question;
  out += "\nPlease reason step by step, and put your final answer within \\boxed{}.\n";
  return out;
}

std::optional<std::string> normalize_number(std::string_view text) {
  std::string s = unlatex(trim(text));
  if (!s.empty() && s.back() == '%')
    s.pop_back();
  bool plus = !s.empty() && s.front() == '+';
  if (plus)
    s.erase(0, 1);
  auto nums = scan_numbers(s);
  if (nums.size() != 1 || nums[0].end != s.size())
    return std::nullopt;
  // Only a sign and/or '$' may precede the digits.
  std::string_view prefix = std::string_view(s).substr(0, nums[0].begin);
  if (!(prefix.empty() || prefix == "$" || prefix == "-" || prefix == "-$" || prefix == "$-" ||
        prefix == "\xE2\x88\x92") ||
      (plus && !prefix.empty()))
    return std::nullopt;
  return nums[0].value;
}

std::optional<std::string> last_boxed(std::string_view text) {
  std::optional<std::string> best;
  size_t best_at = 0;
  for (std::string_view macro : {"\\boxed{", "\\framebox{"}) {
    for (size_t at = text.find(macro); at != std::string_view::npos;
         at = text.find(macro, at + 1)) {
      int depth = 1;
      size_t i = at + macro.size();
      for (; i < text.size() && depth > 0; ++i)
        depth += text[i] == '{' ? 1 : text[i] == '}' ? -1 : 0;
      // Unclosed (the generation was cut off): take the rest of the text.
      size_t stop = depth == 0 ? i - 1 : text.size();
      std::string_view content = text.substr(at + macro.size(), stop - at - macro.size());
      if (!trim(content).empty() && (!best || at > best_at)) {
        best = std::string(content);
        best_at = at;
      }
    }
  }
  return best;
}

std::optional<std::string> last_number(std::string_view text) {
  return last_of(text);
}

std::optional<std::string> extract_gsm8k_answer(std::string_view text) {
  if (auto box = last_boxed(text))
    if (auto n = last_of(*box))
      return n;
  // The last "answer" marker whose line carries a number ("Answer: 18", "The answer is 7
  // apples, ..."); markers without one ("I hope this answer helps!") are passed over.
  const std::string low = lower(text);
  for (size_t at = low.rfind("answer"); at != std::string::npos;
       at = at == 0 ? std::string::npos : low.rfind("answer", at - 1))
    if (auto n = answer_after_marker(text.substr(at + 6)))
      return n;
  return last_of(text);
}

std::optional<std::string> parse_gsm8k_reference(std::string_view answer_field) {
  size_t at = answer_field.rfind("#### ");
  if (at == std::string_view::npos)
    return std::nullopt;
  std::string_view rest = answer_field.substr(at + 5);
  if (auto n = normalize_number(rest))
    return n;
  return last_of(rest);
}

std::optional<std::string> extract_aime_answer(std::string_view text) {
  if (auto box = last_boxed(text)) {
    std::string content = unlatex(*box);
    if (auto n = normalize_number(content))
      return is_integer(*n) ? n : std::nullopt;
    // "\text{70}", "70^\circ", "x = 70": accept exactly one integer, nothing more numeric.
    auto nums = scan_numbers(content);
    if (nums.size() == 1 && is_integer(nums[0].value))
      return nums[0].value;
    return std::nullopt;
  }
  auto nums = scan_numbers(text);
  for (auto it = nums.rbegin(); it != nums.rend(); ++it)
    if (is_integer(it->value))
      return it->value;
  return std::nullopt;
}

std::optional<std::string> parse_aime_reference(std::string_view answer) {
  auto n = normalize_number(answer);
  if (!n || !is_integer(*n))
    return std::nullopt;
  return n;
}

} // namespace xserv::eval
