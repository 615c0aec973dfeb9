// parse(): the text form back into a Graph, with line:column errors.
#include <cctype>
#include <charconv>
#include <fstream>
#include <iterator>
#include <map>

#include <fmt/format.h>

#include "base/error.h"
#include "ir/graph.h"

namespace xserv::ir {
namespace {

/// A cursor over the text that knows its line and column for error messages.
class Parser {
public:
  Parser(std::string_view text, std::string where) : s_(text), where_(std::move(where)) {}

  Graph run() {
    Graph g;
    while (true) {
      skip_space_and_comments();
      if (eof())
        break;
      if (peek_word() == "return") {
        take_word();
        parse_return(g);
        continue;
      }
      if (!g.outputs.empty() || saw_return_)
        error("nothing may follow `return`");
      parse_node(g);
    }
    return g;
  }

private:
  [[noreturn]] void error(const std::string& msg) const {
    throw Error(fmt::format("{}{}:{}: {}", where_, line_, col_, msg));
  }
  bool eof() const { return pos_ >= s_.size(); }
  char peek() const { return eof() ? '\0' : s_[pos_]; }
  void advance() {
    if (s_[pos_] == '\n') {
      ++line_;
      col_ = 1;
    } else {
      ++col_;
    }
    ++pos_;
  }
  // Spaces within a line; newlines are significant only as statement ends, which the grammar
  // does not need, so they are skipped too.
  void skip_space_and_comments() {
    while (!eof()) {
      char c = peek();
      if (c == '/' && pos_ + 1 < s_.size() && s_[pos_ + 1] == '/') {
        while (!eof() && peek() != '\n')
          advance();
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        advance();
      } else {
        break;
      }
    }
  }
  void expect(char c) {
    skip_space_and_comments();
    if (peek() != c)
      error(fmt::format("expected '{}', found {}", c, describe()));
    advance();
  }
  bool accept(char c) {
    skip_space_and_comments();
    if (peek() != c)
      return false;
    advance();
    return true;
  }
  std::string describe() const {
    if (eof())
      return "end of input";
    return fmt::format("'{}'", peek());
  }
  static bool ident_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
  }
  std::string_view peek_word() {
    skip_space_and_comments();
    size_t e = pos_;
    while (e < s_.size() && ident_char(s_[e]))
      ++e;
    return s_.substr(pos_, e - pos_);
  }
  std::string take_word() {
    std::string_view w = peek_word();
    if (w.empty())
      error(fmt::format("expected a name, found {}", describe()));
    for (size_t i = 0; i < w.size(); ++i)
      advance();
    return std::string(w);
  }

  ValueId use_value() {
    skip_space_and_comments();
    int line = line_, col = col_;
    if (peek() != '%')
      error(fmt::format("expected a value like %3, found {}", describe()));
    advance();
    std::string name = take_word();
    auto it = names_.find(name);
    if (it == names_.end())
      throw Error(fmt::format("{}{}:{}: use of undefined value %{}", where_, line, col, name));
    return it->second;
  }

  int64_t parse_int() {
    skip_space_and_comments();
    size_t b = pos_;
    if (peek() == '-')
      advance();
    while (std::isdigit(static_cast<unsigned char>(peek())))
      advance();
    int64_t v = 0;
    auto r = std::from_chars(s_.data() + b, s_.data() + pos_, v);
    if (r.ec != std::errc() || r.ptr != s_.data() + pos_)
      error("expected an integer");
    return v;
  }

  Attr parse_attr_value() {
    skip_space_and_comments();
    if (peek() == '"') {
      advance();
      std::string out;
      while (!eof() && peek() != '"') {
        char c = peek();
        advance();
        if (c == '\\') {
          if (eof())
            break;
          c = peek() == 'n' ? '\n' : peek();
          advance();
        }
        out += c;
      }
      if (eof())
        error("unterminated string");
      advance();
      return out;
    }
    if (peek() == '[') {
      advance();
      std::vector<int64_t> l;
      if (!accept(']')) {
        do
          l.push_back(parse_int());
        while (accept(','));
        expect(']');
      }
      return l;
    }
    size_t b = pos_, e = pos_;
    while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '-' ||
                             s_[e] == '+' || s_[e] == '.'))
      ++e;
    std::string tok(s_.substr(b, e - b));
    if (tok.empty())
      error(fmt::format("expected an attribute value, found {}", describe()));
    bool is_float = tok.find_first_of(".eEn") != std::string::npos;
    if (!is_float)
      return parse_int();
    char* end = nullptr;
    double d = std::strtod(tok.c_str(), &end);
    if (end != tok.c_str() + tok.size())
      error(fmt::format("bad number '{}'", tok));
    for (size_t i = b; i < e; ++i)
      advance();
    return d;
  }

  Type parse_type() {
    skip_space_and_comments();
    const int line = line_, col = col_;
    std::string dt = take_word();
    auto t = parse_dtype(dt);
    if (!t)
      throw Error(fmt::format("{}{}:{}: unknown element type '{}'", where_, line, col, dt));
    Type out{*t, {}};
    expect('[');
    if (!accept(']')) {
      do {
        skip_space_and_comments();
        if (std::isdigit(static_cast<unsigned char>(peek())))
          out.shape.emplace_back(parse_int());
        else if (std::isalpha(static_cast<unsigned char>(peek())))
          out.shape.push_back(Dim::dynamic(take_word()));
        else
          error(fmt::format("expected a dimension, found {}", describe()));
      } while (accept(','));
      expect(']');
    }
    return out;
  }

  void parse_node(Graph& g) {
    skip_space_and_comments();
    int line = line_, col = col_;
    if (peek() != '%')
      error(fmt::format("expected `%name = op(...)` or `return`, found {}", describe()));
    advance();
    std::string name = take_word();
    if (names_.count(name))
      throw Error(fmt::format("{}{}:{}: value %{} is defined twice", where_, line, col, name));
    expect('=');
    skip_space_and_comments();
    int op_line = line_, op_col = col_;
    std::string opname = take_word();
    Node n;
    if (!parse_op(opname, n.op))
      throw Error(fmt::format("{}{}:{}: unknown op '{}'", where_, op_line, op_col, opname));
    expect('(');
    if (!accept(')')) {
      do
        n.inputs.push_back(use_value());
      while (accept(','));
      expect(')');
    }
    if (accept('{')) {
      do {
        std::string key = take_word();
        if (n.has_attr(key))
          error(fmt::format("attribute '{}' given twice", key));
        expect('=');
        n.set_attr(key, parse_attr_value());
      } while (accept(','));
      expect('}');
    }
    expect(':');
    if (accept('(')) {
      do
        n.types.push_back(parse_type());
      while (accept(','));
      expect(')');
    } else {
      n.types.push_back(parse_type());
    }
    names_[name] = static_cast<ValueId>(g.nodes.size());
    g.nodes.push_back(std::move(n));
  }

  void parse_return(Graph& g) {
    saw_return_ = true;
    skip_space_and_comments();
    if (peek() != '%')
      return;
    do
      g.outputs.push_back(use_value());
    while (accept(','));
  }

  std::string_view s_;
  std::string where_; ///< "FILE:" or empty: the prefix of every position in a message
  size_t pos_ = 0;
  int line_ = 1, col_ = 1;
  bool saw_return_ = false;
  std::map<std::string, ValueId, std::less<>> names_;
};

} // namespace

Graph parse(std::string_view text, std::string_view source) {
  return Parser(text, source.empty() ? std::string() : std::string(source) + ":").run();
}

Graph parse_file(const std::filesystem::path& file, std::string_view what) {
  std::ifstream in(file);
  if (!in)
    throw Error(fmt::format("{}: {} missing", file.string(), what));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse(text, file.string());
}

} // namespace xserv::ir
