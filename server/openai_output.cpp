// The tolerant harmony output parser behind chat responses, and stop-string matching.
//
// States: Header (ids after <|start|> or the prompt's `<|start|>assistant`, up to <|message|>),
// Content (message text, up to <|end|>/<|return|>/<|call|>), BetweenMessages. Unlike
// models::StreamParser, a header that goes wrong is not lost: its text becomes content, because
// users filed bugs against servers that failed or emptied the turn instead (llama.cpp#27720).
#include "server/openai_output.h"

#include <algorithm>
#include <cctype>

namespace xserv::server::openai {
namespace {

/// Headers of real harmony messages are a handful of ids; more means the model is not writing
/// one.
constexpr size_t kMaxHeaderIds = 64;

/// The word after `key` in `header` (up to whitespace or '<'); nullopt when `key` is absent.
std::optional<std::string> word_after(const std::string& header, std::string_view key) {
  size_t i = header.find(key);
  if (i == std::string::npos)
    return std::nullopt;
  size_t j = i + key.size(), k = j;
  while (k < header.size() && !std::isspace(static_cast<unsigned char>(header[k])) &&
         header[k] != '<')
    ++k;
  return header.substr(j, k - j);
}

} // namespace

HarmonyOutput::HarmonyOutput(models::Tokenizer tok, std::string call_id_prefix)
    : tok_(tok), decoder_(tok), call_id_prefix_(std::move(call_id_prefix)),
      start_(tok.special_id("<|start|>")), message_(tok.special_id("<|message|>")),
      end_(tok.special_id("<|end|>")), channel_(tok.special_id("<|channel|>")),
      constrain_(tok.special_id("<|constrain|>")), return_(tok.special_id("<|return|>")),
      call_(tok.special_id("<|call|>")) {}

void HarmonyOutput::emit(std::vector<OutputPiece>& out, std::string text) {
  if (text.empty() || target_ == Target::Drop)
    return;
  OutputPiece p;
  switch (target_) {
  case Target::Content:
    content_ += text;
    p.kind = OutputPiece::Kind::Content;
    break;
  case Target::Reasoning:
    reasoning_ += text;
    p.kind = OutputPiece::Kind::Reasoning;
    break;
  case Target::Tool:
    tool_calls_.back().arguments += text;
    p.kind = OutputPiece::Kind::ToolArguments;
    p.tool_index = static_cast<int>(tool_calls_.size()) - 1;
    break;
  case Target::Drop:
    return;
  }
  p.text = std::move(text);
  out.push_back(std::move(p));
}

void HarmonyOutput::degrade_header(std::vector<OutputPiece>& out) {
  target_ = Target::Content;
  std::string text;
  for (models::TokenId id : header_)
    if (!tok_.is_special(id))
      text += decoder_.push(id);
  header_.clear();
  emit(out, std::move(text));
}

void HarmonyOutput::open_message(std::vector<OutputPiece>& out) {
  const std::string header = tok_.decode(header_);
  const auto channel = word_after(header, "<|channel|>");
  const auto recipient = word_after(header, "to=");
  if (!channel && !recipient) {
    degrade_header(out); // no channel markup: the model wrote text, not a header
    state_ = State::Content;
    return;
  }
  header_.clear();
  state_ = State::Content;
  if (recipient && recipient->starts_with("functions.") && recipient->size() > 10) {
    ToolCall call;
    call.id = call_id_prefix_ + std::to_string(tool_calls_.size());
    call.name = recipient->substr(10);
    tool_calls_.push_back(std::move(call));
    target_ = Target::Tool;
    OutputPiece p;
    p.kind = OutputPiece::Kind::ToolStart;
    p.tool_index = static_cast<int>(tool_calls_.size()) - 1;
    out.push_back(std::move(p));
  } else if (channel == "analysis" && !recipient) {
    target_ = Target::Reasoning;
  } else {
    target_ = Target::Content; // final, a commentary preamble, or anything unexpected
  }
}

void HarmonyOutput::close_message(std::vector<OutputPiece>& out) {
  emit(out, decoder_.flush());
  target_ = Target::Content;
}

std::vector<OutputPiece> HarmonyOutput::push(models::TokenId id) {
  std::vector<OutputPiece> out;
  const bool ends = id == end_ || id == return_ || id == call_;
  if (ends) {
    if (state_ == State::Header && !header_.empty())
      degrade_header(out);
    else if (state_ == State::Content)
      close_message(out);
    header_.clear();
    state_ = State::BetweenMessages;
  } else if (id == start_ || (id == channel_ && state_ != State::Header)) {
    if (state_ == State::Header && !header_.empty())
      degrade_header(out);
    else if (state_ == State::Content)
      close_message(out);
    header_.clear();
    if (id == channel_)
      header_.push_back(id);
    state_ = State::Header;
  } else if (id == message_) {
    if (state_ == State::Header) {
      open_message(out);
    } else if (state_ == State::BetweenMessages) {
      target_ = Target::Content;
      state_ = State::Content;
    }
  } else if (state_ == State::Content) {
    if (!tok_.is_special(id))
      emit(out, decoder_.push(id));
  } else {
    if (state_ == State::BetweenMessages) {
      state_ = State::Header; // recover as if <|start|> had been generated
      header_.clear();
    }
    if (!tok_.is_special(id) || id == constrain_ || id == channel_)
      header_.push_back(id);
    if (header_.size() > kMaxHeaderIds) {
      degrade_header(out);
      state_ = State::Content;
    }
  }
  return out;
}

std::vector<OutputPiece> HarmonyOutput::finish() {
  std::vector<OutputPiece> out;
  if (state_ == State::Header && !header_.empty()) {
    // Cut inside what looks like a real header: nothing of the message was written yet.
    if (std::find(header_.begin(), header_.end(), channel_) != header_.end())
      header_.clear();
    else
      degrade_header(out);
  }
  if (state_ == State::Content)
    close_message(out);
  emit(out, decoder_.flush());
  state_ = State::BetweenMessages;
  return out;
}

std::string StopMatcher::push(std::string_view text) {
  if (matched_)
    return "";
  held_ += text;
  size_t first = std::string::npos;
  for (const std::string& s : stops_)
    first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    matched_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Keep the longest tail that is the start of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_)
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n)
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

} // namespace xserv::server::openai
