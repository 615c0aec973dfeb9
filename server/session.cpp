// Engine events -> chat deltas, messages, completion text and logprobs.
#include "server/session.h"

#include <fmt/format.h>

#include "base/utf8.h"

namespace xserv::server {

using openai::Json;
using openai::OutputPiece;

namespace {

Json bytes_of(std::string_view s) {
  Json b = Json::array();
  for (unsigned char c : s)
    b.push_back(int(c));
  return b;
}

/// A chat logprobs entry for one token and its alternatives.
Json chat_logprob(const models::Tokenizer& tok, const engine::Event& ev) {
  auto text = tok.id_to_token(static_cast<models::TokenId>(ev.token));
  Json top = Json::array();
  for (const auto& t : ev.top_logprobs) {
    auto s = tok.id_to_token(static_cast<models::TokenId>(t.token));
    top.push_back({{"token", std::string(s)}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}});
  }
  return {{"token", std::string(text)},
          {"logprob", ev.logprob},
          {"bytes", bytes_of(text)},
          {"top_logprobs", top}};
}

} // namespace

std::string finish_reason_name(engine::FinishReason r) {
  return std::string(engine::finish_name(r));
}

Json usage_json(int64_t prompt, int64_t completion) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion}};
}

ChatSession::ChatSession(models::Tokenizer tok, const openai::GenParams& params,
                         const std::string& id)
    : tok_(tok), out_(tok, "call_" + id.substr(id.size() > 12 ? id.size() - 12 : 0) + "_"),
      stop_(params.stop), top_logprobs_(params.top_logprobs), call_id_(tok.special_id("<|call|>")),
      start_id_(tok.special_id("<|start|>")), message_id_(tok.special_id("<|message|>")) {}

void ChatSession::add_pieces(std::vector<OutputPiece> pieces, std::vector<Json>& deltas) {
  for (OutputPiece& p : pieces) {
    if (stop_.matched())
      return;
    switch (p.kind) {
    case OutputPiece::Kind::Content: {
      std::string text = stop_.push(p.text);
      content_ += text;
      if (!text.empty())
        deltas.push_back({{"content", text}});
      break;
    }
    case OutputPiece::Kind::Reasoning:
      deltas.push_back({{"reasoning", p.text}});
      break;
    case OutputPiece::Kind::ToolStart: {
      const auto& call = out_.tool_calls()[size_t(p.tool_index)];
      Json tc = {{"index", p.tool_index},
                 {"id", call.id},
                 {"type", "function"},
                 {"function", {{"name", call.name}, {"arguments", ""}}}};
      deltas.push_back({{"tool_calls", Json::array({tc})}});
      break;
    }
    case OutputPiece::Kind::ToolArguments: {
      Json tc = {{"index", p.tool_index}, {"function", {{"arguments", p.text}}}};
      deltas.push_back({{"tool_calls", Json::array({tc})}});
      break;
    }
    }
  }
}

void ChatSession::take(const engine::Event& ev, std::vector<Json>& deltas, Json& logprobs) {
  if (stop_.matched())
    return;
  if (top_logprobs_ >= 0)
    logprobs.push_back(chat_logprob(tok_, ev));
  const bool reasoning = out_.in_reasoning();
  add_pieces(out_.push(static_cast<models::TokenId>(ev.token)), deltas);
  if (reasoning || out_.in_reasoning())
    ++reasoning_tokens_;
}

bool ChatSession::next_call_header() const {
  // pending_: <|start|>, the header's ids, <|message|>.
  std::vector<models::TokenId> ids;
  for (size_t i = 1; i + 1 < pending_.size(); ++i)
    ids.push_back(static_cast<models::TokenId>(pending_[i].token));
  const std::string header = tok_.decode(ids);
  const size_t to = header.find("to=");
  return header.starts_with("assistant") && to != std::string::npos &&
         header.compare(to + 3, 10, "functions.") == 0;
}

std::vector<Json> ChatSession::on_event(const engine::Event& ev, Json& logprobs) {
  std::vector<Json> deltas;
  // The id that ended a Stop finish is a stop id: it closes the output, it is not text.
  const bool stop_id = ev.finish == engine::FinishReason::Stop;
  if (ev.token >= 0 && !stop_id && !calls_done_) {
    if (after_call_) { // what follows a tool call: <|start|> may begin another
      after_call_ = false;
      if (ev.token == static_cast<int32_t>(start_id_))
        pending_.push_back(ev);
      else // not another message: the turn ends here, without this id
        calls_done_ = true;
    } else if (!pending_.empty()) { // the next message's header, held back
      pending_.push_back(ev);
      if (ev.token == static_cast<int32_t>(message_id_)) {
        if (next_call_header()) {
          for (const engine::Event& held : pending_)
            take(held, deltas, logprobs);
        } else {
          calls_done_ = true; // anything but the assistant's next call (a tool's reply the
                              // model made up, a final answer without the result) ends it
        }
        pending_.clear();
      } else if (pending_.size() > kMaxCallHeader) {
        calls_done_ = true;
        pending_.clear();
      }
    } else {
      take(ev, deltas, logprobs);
    }
    if (ev.token == static_cast<int32_t>(call_id_) && !calls_done_ && pending_.empty())
      after_call_ = true;
  }
  if (ev.finish != engine::FinishReason::None && !pending_.empty()) {
    calls_done_ = true; // the output ended inside the next message's header
    pending_.clear();
  }
  if (ev.finish != engine::FinishReason::None) {
    add_pieces(out_.finish(), deltas);
    if (!stop_.matched()) {
      std::string rest = stop_.flush();
      content_ += rest;
      if (!rest.empty())
        deltas.push_back({{"content", rest}});
    }
    if (stop_.matched())
      finish_ = "stop";
    else if ((ev.finish == engine::FinishReason::Stop || calls_done_) && !out_.tool_calls().empty())
      finish_ = "tool_calls";
    else
      finish_ = finish_reason_name(ev.finish);
  }
  return deltas;
}

Json ChatSession::message() const {
  Json m = {{"role", "assistant"}};
  const bool calls = !out_.tool_calls().empty();
  m["content"] = content_.empty() && calls ? Json(nullptr) : Json(content_);
  if (!out_.reasoning().empty())
    m["reasoning"] = out_.reasoning();
  if (calls) {
    Json list = Json::array();
    for (const auto& c : out_.tool_calls())
      list.push_back({{"id", c.id},
                      {"type", "function"},
                      {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    m["tool_calls"] = list;
  }
  return m;
}

CompletionSession::CompletionSession(models::Tokenizer tok, const openai::GenParams& params,
                                     std::vector<int32_t> echo)
    : tok_(tok), decoder_(tok), stop_(params.stop), top_logprobs_(params.top_logprobs),
      echo_(std::move(echo)), echoed_(!echo_.empty()) {}

namespace {

/// A token as the legacy logprobs arrays name it: its text, or "bytes:\\xNN..." where its bytes
/// are a piece of a character (OpenAI's completions write them so), so that distinct tokens keep
/// distinct names in top_logprobs' keys.
std::string legacy_token(const models::Tokenizer& tok, int32_t id) {
  const std::string_view b = tok.id_to_token(static_cast<models::TokenId>(id));
  if (valid_utf8(b))
    return std::string(b);
  std::string out = "bytes:";
  for (unsigned char c : b)
    out += fmt::format("\\x{:02x}", c);
  return out;
}

/// The legacy completions logprobs object, its arrays empty.
Json legacy_logprobs() {
  return {{"tokens", Json::array()},
          {"token_logprobs", Json::array()},
          {"top_logprobs", Json::array()},
          {"text_offset", Json::array()}};
}

} // namespace

std::string CompletionSession::on_event(const engine::Event& ev, Json& logprobs) {
  std::string text;
  if (!echo_.empty()) { // the prompt as its tokens spell it, each token's bytes at its offset
    if (top_logprobs_ >= 0 && logprobs.is_null())
      logprobs = legacy_logprobs();
    for (size_t i = 0; i < echo_.size(); ++i) {
      const auto id = static_cast<models::TokenId>(echo_[i]);
      const std::string_view bytes = tok_.id_to_token(id);
      if (top_logprobs_ >= 0) {
        const engine::PromptLogprob* lp =
            i >= 1 && i <= ev.prompt_logprobs.size() ? &ev.prompt_logprobs[i - 1] : nullptr;
        Json top = nullptr;
        if (lp) {
          top = Json::object();
          for (const auto& t : lp->top)
            top[legacy_token(tok_, t.token)] = t.logprob;
        }
        logprobs["tokens"].push_back(legacy_token(tok_, echo_[i]));
        logprobs["token_logprobs"].push_back(lp ? Json(lp->logprob) : Json(nullptr));
        logprobs["top_logprobs"].push_back(std::move(top));
        logprobs["text_offset"].push_back(text_.size() + text.size());
      }
      text += bytes;
    }
    echo_.clear();
  }
  // A stop id adds no text; an echoed completion lists it among the tokens all the same, so
  // that a scoring client finds one entry per prompt token, then one per generated token.
  const bool stop_id = ev.finish == engine::FinishReason::Stop;
  if (ev.token >= 0 && (!stop_id || echoed_) && !stop_.matched()) {
    const auto id = static_cast<models::TokenId>(ev.token);
    const size_t offset = text_.size() + text.size();
    if (!tok_.is_special(id) && !stop_id)
      text += stop_.push(decoder_.push(id));
    if (top_logprobs_ >= 0) {
      if (logprobs.is_null())
        logprobs = legacy_logprobs();
      Json top = Json::object();
      for (const auto& t : ev.top_logprobs)
        top[legacy_token(tok_, t.token)] = t.logprob;
      logprobs["tokens"].push_back(legacy_token(tok_, ev.token));
      logprobs["token_logprobs"].push_back(ev.logprob);
      logprobs["top_logprobs"].push_back(top);
      logprobs["text_offset"].push_back(offset);
    }
  }
  if (ev.finish != engine::FinishReason::None) {
    if (!stop_.matched())
      text += stop_.push(decoder_.flush());
    if (!stop_.matched())
      text += stop_.flush();
    finish_ = stop_.matched() ? "stop" : finish_reason_name(ev.finish);
  }
  text_ += text;
  return text;
}

} // namespace xserv::server
