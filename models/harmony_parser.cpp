// Streaming parser of generated harmony ids into messages, channel by channel.
//
// States: ExpectStart --<|start|>--> Header --<|message|>--> Content --<|end|>/<|return|>/
// <|call|>--> ExpectStart. Header ids are decoded and split as openai/harmony does:
// "{role|tool name} [to=recipient]<|channel|>{channel} [to=recipient] [content type]".
#include "models/harmony.h"

#include <cctype>

#include <fmt/format.h>

#include "base/error.h"

namespace xserv::models {
namespace {

std::optional<Role> role_from_name(std::string_view name) {
  for (auto r : {Role::System, Role::Developer, Role::User, Role::Assistant, Role::Tool})
    if (role_name(r) == name)
      return r;
  return std::nullopt;
}

std::vector<std::string> split_ascii_whitespace(const std::string& s) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i])))
      ++i;
    size_t j = i;
    while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j])))
      ++j;
    if (j > i)
      parts.push_back(s.substr(i, j - i));
    i = j;
  }
  return parts;
}

std::string strip_to(const std::string& s) {
  return s.starts_with("to=") ? s.substr(3) : s;
}

} // namespace

StreamParser::StreamParser(Tokenizer tok, std::optional<Role> role, bool strict)
    : tok_(tok), start_(tok.special_id("<|start|>")), message_(tok.special_id("<|message|>")),
      end_(tok.special_id("<|end|>")), channel_(tok.special_id("<|channel|>")),
      decoder_(std::move(tok)), strict_(strict), state_(role ? State::Header : State::ExpectStart),
      next_role_(role) {}

std::optional<Role> StreamParser::current_role() const {
  if (state_ == State::Content)
    return current_.role;
  return next_role_;
}

void StreamParser::fail(const std::string& why) const {
  throw Error("harmony: cannot parse generated tokens: " + why);
}

void StreamParser::parse_header() {
  std::string h = tok_.decode(header_);
  const std::string text = h;
  header_.clear();
  Message m;
  constexpr std::string_view kChannel = "<|channel|>", kConstrain = "<|constrain|>";
  if (size_t i = h.find(kChannel); i != std::string::npos) {
    size_t j = i + kChannel.size(), k = j;
    while (k < h.size() && !std::isspace(static_cast<unsigned char>(h[k])) && h[k] != '<')
      ++k;
    if (k == j && strict_)
      fail(fmt::format("header '{}' has a channel marker but no channel", text));
    m.channel = h.substr(j, k - j);
    h = h.substr(0, i) + h.substr(k);
  }
  // "to=x<|constrain|>json" has no space before the marker; split it off anyway.
  for (size_t i = h.find(kConstrain); i != std::string::npos; i = h.find(kConstrain, i + 2)) {
    h.insert(i, 1, ' ');
    i += 1;
  }
  std::vector<std::string> parts = split_ascii_whitespace(h);
  Role role = Role::Assistant;
  if (next_role_) {
    role = *next_role_;
  } else if (parts.empty()) {
    if (strict_)
      fail(fmt::format("header '{}' has no role", text));
  } else if (auto r = role_from_name(parts.front())) {
    role = *r;
  } else {
    // Not a role: a tool speaking, e.g. "functions.lookup_weather" or "browser.search to=...".
    role = Role::Tool;
    m.name = parts.front();
    parts.erase(parts.begin());
  }
  if (!parts.empty() && parts.front() == role_name(role))
    parts.erase(parts.begin());
  if (!parts.empty()) {
    size_t n = parts.size();
    std::string last = parts.back();
    parts.pop_back();
    if (last.starts_with("to=")) {
      m.recipient = last.substr(3);
    } else if (n == 1 && !last.starts_with(kConstrain)) {
      m.recipient = last;
    } else {
      m.content_type = last;
      if (!parts.empty()) {
        m.recipient = strip_to(parts.back());
        parts.pop_back();
      }
    }
    if (!parts.empty() && strict_)
      fail(fmt::format("unexpected text '{}' in header '{}'", parts.front(), text));
  }
  m.role = role;
  current_ = std::move(m);
  next_role_.reset();
}

void StreamParser::complete_message() {
  current_.content += decoder_.flush();
  messages_.push_back(std::move(current_));
  current_ = Message();
  state_ = State::ExpectStart;
}

std::string StreamParser::push(TokenId id) {
  const bool ends = id == end_ || is_stop_token(id);
  if (is_stop_token(id))
    stopped_ = true;
  switch (state_) {
  case State::ExpectStart:
    if (id == start_) {
      state_ = State::Header;
      return "";
    }
    if (strict_)
      fail(fmt::format("expected <|start|>, got {} ({})", id, tok_.id_to_token(id)));
    if (ends)
      return ""; // a stray end marker between messages carries nothing
    // Recover as if "<|start|>assistant" had been generated.
    state_ = State::Header;
    next_role_ = Role::Assistant;
    if (id == channel_) {
      header_.push_back(id);
      return "";
    }
    parse_header();
    state_ = State::Content;
    return push(id);
  case State::Header:
    if (id == message_) {
      parse_header();
      state_ = State::Content;
    } else if (ends) {
      if (strict_)
        fail(fmt::format("message ended inside its header '{}'", tok_.decode(header_)));
      parse_header();
      complete_message();
    } else {
      header_.push_back(id);
    }
    return "";
  case State::Content:
    if (ends) {
      complete_message();
      return "";
    }
    std::string delta = decoder_.push(id);
    current_.content += delta;
    return delta;
  }
  return "";
}

void StreamParser::finish() {
  if (state_ == State::Content) {
    complete_message();
  } else if (state_ == State::Header && !header_.empty()) {
    if (strict_)
      fail(fmt::format("stream ended inside the header '{}'", tok_.decode(header_)));
    parse_header();
    complete_message();
  }
}

std::vector<Message> parse_completion(const Tokenizer& tok, std::span<const TokenId> ids,
                                      std::optional<Role> role, bool strict) {
  StreamParser parser(tok, role, strict);
  for (TokenId id : ids)
    parser.push(id);
  parser.finish();
  return parser.messages();
}

} // namespace xserv::models
