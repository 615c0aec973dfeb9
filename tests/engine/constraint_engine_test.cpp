// Structured output through the Engine, harmony binding included: a model whose logits are
// random over the whole o200k vocabulary, except that it favours a scripted harmony frame (a
// strict tool call's header, or an analysis message and the final channel's header), so that
// what follows the frame comes from the constraint alone. The arguments of the strict call and
// the final answer must parse and satisfy their schemas, greedy and sampled, with 34 sequences
// in a step (masks filled on two threads while the model runs).
#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/constraint.h"
#include "engine/engine.h"
#include "models/harmony.h"
#include "tests/engine/fake_model.h"
#include "tests/test_util.h"

using namespace xserv;
using Json = nlohmann::json;

namespace {

constexpr int64_t kVocab = 201088;

/// FakeModel's paging under a vocabulary of 201,088: each row is noise seeded by what the fake
/// read (its hash row), plus a large bonus for the next id of the sequence's script while its
/// generated ids follow the script.
class ScriptedModel : public engine::Model {
public:
  ScriptedModel(int64_t rows, int64_t max_seq, size_t prompt_len,
                std::vector<std::vector<int32_t>> scripts)
      : inner_(rows, max_seq), prompt_len_(prompt_len), scripts_(std::move(scripts)) {
    config_ = inner_.config();
    config_.vocab_size = kVocab;
  }
  const models::ModelConfig& config() const override { return config_; }
  int64_t max_batch() const override { return inner_.max_batch(); }
  int64_t max_seq() const override { return inner_.max_seq(); }
  const models::KvGeometry& kv_geometry() const override { return inner_.kv_geometry(); }
  std::string backend() const override { return "scripted"; }
  void reset() override { inner_.reset(); }
  std::vector<std::vector<float>> step(const models::StepInput& in) override {
    // FakeModel's vocabulary is small: the step's own ids go in modulo it.
    models::StepInput small = in;
    for (auto& t : small.tokens)
      for (int32_t& id : t)
        id %= testing::FakeModel::kVocab;
    const std::vector<std::vector<float>> hashed = inner_.step(small);
    std::vector<std::vector<float>> out;
    for (size_t b = 0; b < in.tokens.size(); ++b) {
      // xorshift noise in [-2, 2): cheap enough for 201,088 logits a row.
      uint64_t s = ((uint64_t(hashed[b][0] * 1e6f) * 0x9e3779b97f4a7c15ull) ^
                    uint64_t(in.tokens[b].back())) | 1u;
      std::vector<float> row(static_cast<size_t>(kVocab));
      for (float& x : row) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        x = float(s >> 40) * (4.0f / 16777216.0f) - 2.0f;
      }
      // The script of this sequence (told apart by its prompt's first id), from the position
      // the row predicts.
      const size_t next = size_t(in.ctx_lens[b]) + in.tokens[b].size();
      const auto& script = scripts_[size_t(prompt_first(in, b)) % scripts_.size()];
      if (next >= prompt_len_ && next - prompt_len_ < script.size())
        row[size_t(script[next - prompt_len_])] += 1000.0f;
      out.push_back(std::move(row));
    }
    return out;
  }

private:
  /// The first id of sequence b's prompt: the test gives each script's requests their own.
  int32_t prompt_first(const models::StepInput& in, size_t b) {
    if (in.ctx_lens[b] == 0)
      first_[in.block_tables[b].empty() ? -1 : in.block_tables[b][0]] = in.tokens[b][0];
    return first_[in.block_tables[b].empty() ? -1 : in.block_tables[b][0]];
  }
  testing::FakeModel inner_;
  models::ModelConfig config_;
  size_t prompt_len_;
  std::vector<std::vector<int32_t>> scripts_;
  std::map<int32_t, int32_t> first_; ///< a sequence's first block -> its prompt's first id
};

std::vector<int32_t> ids(const models::Tokenizer& tok, const std::string& text) {
  std::vector<int32_t> out;
  for (models::TokenId t : tok.encode(text, models::AllowedSpecial::all()))
    out.push_back(int32_t(t));
  return out;
}

} // namespace

/// The scripted frame's constraint, its 34 requests (even: the strict call's script, odd: the
/// final channel's; 17 greedy then 17 sampled), run through the engine on `model`, every
/// output checked against its schema. Returns the generations.
std::vector<engine::Generation> run_frames(const models::Tokenizer& tok,
                                           const std::shared_ptr<const engine::Constraint>& constraint,
                                           engine::Model& model) {
  std::vector<engine::Request> reqs;
  for (int i = 0; i < 34; ++i) {
    engine::Request r;
    r.prompt = {i % 2, 11, 12, 13, 14, 15 + i}; // the first id picks the script
    r.max_tokens = 300;
    r.stop_ids = models::stop_token_ids(); // <|return|>, <|call|>
    r.constraint = constraint;
    if (i >= 17) { // sampled
      r.sampling.temperature = 1.0f;
      r.sampling.seed = uint64_t(i);
    }
    reqs.push_back(std::move(r));
  }
  const auto gens = engine::generate(model, reqs);
  REQUIRE(gens.size() == reqs.size());
  for (size_t i = 0; i < gens.size(); ++i) {
    CAPTURE(i);
    const engine::Generation& g = gens[i];
    REQUIRE(g.finish == engine::FinishReason::Stop); // ended by itself, before max_tokens
    std::vector<models::TokenId> out(g.tokens.begin(), g.tokens.end());
    const auto messages = models::parse_completion(tok, out);
    REQUIRE(!messages.empty());
    const models::Message& last = messages.back();
    CAPTURE(last.content);
    const Json v = Json::parse(last.content);
    if (i % 2 == 0) { // the strict call
      CHECK(last.recipient == "functions.lookup");
      CHECK(g.tokens.back() == 200012); // <|call|>
      REQUIRE(v.contains("city"));
      CHECK(v["city"].get<std::string>().size() <= 8 * 4); // 8 characters, UTF-8
      CHECK(v["days"].get<int>() >= 1);
      CHECK(v["days"].get<int>() <= 7);
    } else { // the final answer
      CHECK(last.channel == "final");
      CHECK(g.tokens.back() == 200002); // <|return|>
      CHECK(v["answer"].get<int>() >= 0);
      CHECK(v["answer"].get<int>() <= 999);
      CHECK(std::set<std::string>{"kg", "m", "s"}.count(v["unit"].get<std::string>()));
    }
    for (auto it = v.begin(); it != v.end(); ++it) // strict: no property the schema lacks
      CHECK(std::set<std::string>{"city", "days", "answer", "unit"}.count(it.key()));
  }
  return gens;
}

/// The frame's constraint (a strict tool and a final answer's schema).
std::shared_ptr<const engine::Constraint> frame_constraint(const engine::ConstraintCompiler& c) {
  engine::ConstraintRequest cr;
  cr.harmony = true;
  cr.output = engine::GrammarSpec{engine::GrammarSpec::Kind::JsonSchema, R"({
      "type": "object", "properties": {"answer": {"type": "integer", "minimum": 0,
      "maximum": 999}, "unit": {"enum": ["kg", "m", "s"]}}, "required": ["answer", "unit"]})",
                                  "response_format"};
  cr.tools.push_back({"lookup", {engine::GrammarSpec::Kind::JsonSchema, R"({
      "type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
      "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]})",
                                 "tools[0].function.parameters"}});
  return c.compile(cr);
}

/// Two scripts: a call to the strict tool, and a short analysis then the final channel.
std::vector<std::vector<int32_t>> frame_scripts(const models::Tokenizer& tok) {
  return {ids(tok, "<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>"),
          ids(tok, "<|channel|>analysis<|message|>Let me think.<|end|><|start|>assistant"
                   "<|channel|>final<|message|>")};
}

/// tool_choice required over `callable` (harmony, no strict tools).
engine::ConstraintRequest required_call(std::vector<std::string> callable) {
  engine::ConstraintRequest cr;
  cr.harmony = true;
  cr.tool_choice = engine::ConstraintRequest::ToolChoice::Required;
  cr.callable = std::move(callable);
  return cr;
}

/// A model that picks masked rows itself, as a GPU does (Model::step_masked with
/// picks_masked()): it asks for the masks only after its step, picks by a brute force over the
/// whole vocabulary, and records what the engine asked of it.
class MaskedPickModel : public ScriptedModel {
public:
  using ScriptedModel::ScriptedModel;
  bool picks_masked() const override { return true; }
  engine::StepOutput step_masked(const models::StepInput& in, const std::vector<bool>& need,
                                 const std::vector<bool>& masked,
                                 const engine::MaskSource& masks) override {
    std::vector<std::vector<float>> rows = step(in);
    const std::vector<std::vector<uint32_t>>& m = masks();
    engine::StepOutput out;
    for (size_t b = 0; b < rows.size(); ++b) {
      int32_t best = engine::greedy_pick(rows[b]);
      if (masked[b]) {
        ++masked_picks;
        wanted_rows_of_masked += need[b] ? 1 : 0;
        REQUIRE(m[b].size() == size_t((kVocab + 31) / 32));
        best = engine::kNoneAllowed;
        for (int32_t t = 0; t < int32_t(kVocab); ++t)
          if ((m[b][size_t(t) / 32] >> (t % 32) & 1u) &&
              (best < 0 || rows[b][size_t(t)] > rows[b][size_t(best)]))
            best = t;
        if (best >= 0 && none_allowed_at == masked_picks)
          best = engine::kNoneAllowed; // as a mask that allows nothing would give
      }
      out.greedy.push_back(best);
      out.logits.push_back(need[b] ? std::move(rows[b]) : std::vector<float>());
    }
    return out;
  }
  int64_t masked_picks = 0, wanted_rows_of_masked = 0;
  int64_t none_allowed_at = -1; ///< the masked pick (counting from 1) that finds nothing allowed
};

TEST_CASE("structured output through the engine: a strict tool call's arguments and the final "
          "answer follow their schemas after a scripted harmony frame") {
  XSERV_REQUIRE_DATA(data);
  const models::Tokenizer tok = models::Tokenizer::load(data / "o200k_base.tiktoken");
  const engine::ConstraintCompiler compiler(tok, kVocab, {200002, 199999, 200012});
  const size_t prompt_len = 6;
  // 34 sequences: the masks of a step are filled on two threads.
  ScriptedModel model(34, 512, prompt_len, frame_scripts(tok));
  run_frames(tok, frame_constraint(compiler), model);
}

TEST_CASE("structured output through the engine: a model that picks masked rows itself gets "
          "the greedy constrained rows without their logits, and the same tokens") {
  XSERV_REQUIRE_DATA(data);
  const models::Tokenizer tok = models::Tokenizer::load(data / "o200k_base.tiktoken");
  const engine::ConstraintCompiler compiler(tok, kVocab, {200002, 199999, 200012});
  const auto constraint = frame_constraint(compiler);
  ScriptedModel host(34, 512, 6, frame_scripts(tok));
  MaskedPickModel device(34, 512, 6, frame_scripts(tok));
  const auto want = run_frames(tok, constraint, host);
  const auto got = run_frames(tok, constraint, device);
  CHECK(device.masked_picks > 17 * 5); // every greedy request, each bound for many tokens
  CHECK(device.wanted_rows_of_masked == 0);
  for (size_t i = 0; i < 17; ++i) { // the greedy requests: the same picks either way
    CAPTURE(i);
    CHECK(got[i].tokens == want[i].tokens);
  }
}

TEST_CASE("structured output through the engine: a masked pick that finds nothing allowed ends "
          "its request with an error, the others go on") {
  XSERV_REQUIRE_DATA(data);
  const models::Tokenizer tok = models::Tokenizer::load(data / "o200k_base.tiktoken");
  const engine::ConstraintCompiler compiler(tok, kVocab, {200002, 199999, 200012});
  MaskedPickModel model(2, 512, 6, frame_scripts(tok));
  model.none_allowed_at = 3;
  std::vector<engine::Request> reqs(2);
  for (int i = 0; i < 2; ++i) {
    reqs[size_t(i)].prompt = {0, 11, 12, 13, 14, 15 + i};
    reqs[size_t(i)].max_tokens = 300;
    reqs[size_t(i)].stop_ids = models::stop_token_ids();
    reqs[size_t(i)].constraint = frame_constraint(compiler);
  }
  const auto gens = engine::generate(model, reqs);
  const size_t failed = gens[0].finish == engine::FinishReason::Error ? 0 : 1;
  CHECK(gens[failed].finish == engine::FinishReason::Error);
  CHECK(gens[failed].error.find("constraint allows no token") != std::string::npos);
  CHECK(gens[1 - failed].finish == engine::FinishReason::Stop);
}

TEST_CASE("Model::step_masked on the host: the best allowed id, kNoneAllowed for an empty mask, "
          "rows only where wanted") {
  testing::FakeModel model(3, 64);
  models::StepInput in;
  for (int b = 0; b < 3; ++b) {
    in.tokens.push_back({1 + b, 2, 3});
    in.ctx_lens.push_back(0);
    in.block_tables.push_back({b});
  }
  const std::vector<std::vector<float>> rows = model.step(in);
  model.reset();
  const size_t words = (size_t(testing::FakeModel::kVocab) + 31) / 32;
  std::vector<std::vector<uint32_t>> masks(3);
  masks[0].assign(words, 0u);
  masks[0][0] = 0b1010u; // ids 1 and 3
  masks[1].assign(words, 0u); // nothing allowed
  int calls = 0;
  const engine::MaskSource source = [&]() -> const std::vector<std::vector<uint32_t>>& {
    ++calls;
    return masks;
  };
  const engine::StepOutput out =
      model.step_masked(in, {false, false, true}, {true, true, false}, source);
  CHECK(calls >= 1);
  CHECK(out.greedy[0] == (rows[0][1] >= rows[0][3] ? 1 : 3));
  CHECK(out.greedy[1] == engine::kNoneAllowed);
  CHECK(out.greedy[2] == engine::greedy_pick(rows[2]));
  CHECK(out.logits[0].empty());
  CHECK(out.logits[1].empty());
  CHECK(out.logits[2] == rows[2]);
}

TEST_CASE("tool_choice required through the engine: after an analysis or straight away, every "
          "output ends in a call to an allowed tool with JSON arguments") {
  XSERV_REQUIRE_DATA(data);
  const models::Tokenizer tok = models::Tokenizer::load(data / "o200k_base.tiktoken");
  const engine::ConstraintCompiler compiler(tok, kVocab, {200002, 199999, 200012});
  // The scripts lead the random model to a call's header (its first ordinary id), with or
  // without an analysis message first; which tool, and everything after, is the constraint's.
  const int32_t commentary = ids(tok, "commentary to=functions.lookup ").at(0);
  auto with = [](std::vector<int32_t> v, int32_t id) {
    v.push_back(id);
    return v;
  };
  const std::vector<std::vector<int32_t>> scripts = {
      with(ids(tok, "<|channel|>"), commentary),
      with(ids(tok, "<|channel|>analysis<|message|>Let me think.<|end|><|start|>assistant"
                    "<|channel|>"),
           commentary)};
  engine::ConstraintRequest cr = required_call({"lookup", "other"});
  using Kind = engine::GrammarSpec::Kind;
  cr.tools.push_back({"lookup", {Kind::JsonSchema, R"({"type": "object", "properties": {"days":
      {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["days"]})", "lookup"}});
  cr.tools.push_back({"other", {Kind::JsonSchema, R"({"type": "object", "properties": {"q":
      {"enum": ["a", "b"]}}, "required": ["q"]})", "other"}});
  const auto constraint = compiler.compile(cr);
  ScriptedModel model(16, 512, 6, scripts);
  std::vector<engine::Request> reqs;
  for (int i = 0; i < 16; ++i) {
    engine::Request r;
    r.prompt = {i % 2, 11, 12, 13, 14, 15 + i};
    r.max_tokens = 300;
    r.stop_ids = models::stop_token_ids();
    r.constraint = constraint;
    if (i >= 8) {
      r.sampling.temperature = 1.0f;
      r.sampling.seed = uint64_t(i);
    }
    reqs.push_back(std::move(r));
  }
  const auto gens = engine::generate(model, reqs);
  std::set<std::string> called;
  for (size_t i = 0; i < gens.size(); ++i) {
    CAPTURE(i);
    std::vector<models::TokenId> out(gens[i].tokens.begin(), gens[i].tokens.end());
    REQUIRE(gens[i].finish == engine::FinishReason::Stop);
    CHECK(gens[i].tokens.back() == 200012); // <|call|>
    const auto messages = models::parse_completion(tok, out);
    REQUIRE(!messages.empty());
    CHECK(messages.size() == 1 + i % 2); // the odd ones' scripts wrote an analysis first
    for (size_t m = 0; m + 1 < messages.size(); ++m)
      CHECK(messages[m].channel == "analysis");
    const models::Message& call = messages.back();
    CAPTURE(call.content);
    called.insert(call.recipient);
    const Json v = Json::parse(call.content);
    REQUIRE(v.is_object());
    CHECK(v.size() == 1);
    if (call.recipient == "functions.lookup") {
      CHECK(v["days"].get<int>() >= 1);
      CHECK(v["days"].get<int>() <= 7);
    } else {
      CHECK(call.recipient == "functions.other");
      CHECK((v["q"] == "a" || v["q"] == "b"));
    }
  }
  CHECK(called == std::set<std::string>{"functions.lookup", "functions.other"});
}

TEST_CASE("tool_choice naming a tool that is not strict: its call's arguments are any JSON "
          "object, other headers are refused") {
  XSERV_REQUIRE_DATA(data);
  const models::Tokenizer tok = models::Tokenizer::load(data / "o200k_base.tiktoken");
  const engine::ConstraintCompiler compiler(tok, kVocab, {200002, 199999, 200012});
  engine::ConstraintRequest cr = required_call({"third"});
  // The first model calls the named tool with a JSON object; the second wants to answer on the
  // final channel, then to call another tool: the header is forced to the named call.
  const std::vector<std::vector<int32_t>> scripts = {
      ids(tok, "<|channel|>commentary to=functions.third <|constrain|>json<|message|>"
               "{\"q\": 1}<|call|>"), // the grammar's separators: ", " and ": "
      ids(tok, "<|channel|>final<|message|>{}")};
  ScriptedModel model(2, 512, 6, scripts);
  std::vector<engine::Request> reqs(2);
  for (int i = 0; i < 2; ++i) {
    reqs[size_t(i)].prompt = {i, 11, 12, 13, 14, 15};
    reqs[size_t(i)].max_tokens = 40;
    reqs[size_t(i)].stop_ids = models::stop_token_ids();
    reqs[size_t(i)].constraint = compiler.compile(cr);
  }
  const auto gens = engine::generate(model, reqs);
  std::vector<models::TokenId> out(gens[0].tokens.begin(), gens[0].tokens.end());
  INFO(tok.decode(out));
  REQUIRE(gens[0].finish == engine::FinishReason::Stop);
  const auto messages = models::parse_completion(tok, out);
  REQUIRE(messages.size() == 1);
  CHECK(messages[0].recipient == "functions.third");
  CHECK(Json::parse(messages[0].content) == Json{{"q", 1}});
  // The second never writes a final channel's header, and what it writes is the named call's.
  const std::vector<int32_t> header =
      ids(tok, "<|channel|>commentary to=functions.third <|constrain|>json<|message|>");
  REQUIRE(gens[1].tokens.size() > header.size());
  CHECK(std::vector<int32_t>(gens[1].tokens.begin(),
                             gens[1].tokens.begin() + std::ptrdiff_t(header.size())) == header);
}

TEST_CASE("tool_choice required: an analysis message cannot stop the output") {
  XSERV_REQUIRE_DATA(data);
  const models::Tokenizer tok = models::Tokenizer::load(data / "o200k_base.tiktoken");
  const engine::ConstraintCompiler compiler(tok, kVocab, {200002, 199999, 200012});
  engine::ConstraintRequest cr = required_call({"lookup"});
  // The model wants to answer in its analysis and stop (<|return|>), then to call (<|call|>).
  ScriptedModel model(1, 512, 6,
                      {ids(tok, "<|channel|>analysis<|message|>Done<|return|><|call|>")});
  engine::Request r;
  r.prompt = {0, 11, 12, 13, 14, 15};
  r.max_tokens = 40;
  r.stop_ids = models::stop_token_ids();
  r.constraint = compiler.compile(cr);
  const auto gens = engine::generate(model, {r});
  CHECK(gens[0].finish == engine::FinishReason::Length);
  CHECK(std::count(gens[0].tokens.begin(), gens[0].tokens.end(), 200002) == 0);
  CHECK(std::count(gens[0].tokens.begin(), gens[0].tokens.end(), 200012) == 0);
  // No required call without tools or outside the chat format.
  cr.callable.clear();
  CHECK_THROWS_WITH_AS(compiler.compile(cr), doctest::Contains("there are no tools"),
                       engine::ConstraintError);
  cr.callable = {"lookup"};
  cr.harmony = false;
  CHECK_THROWS_WITH_AS(compiler.compile(cr), doctest::Contains("needs the chat format"),
                       engine::ConstraintError);
}

TEST_CASE("tool_choice required: once a call is made nothing more is forced (the model may "
          "answer after it when <|call|> does not stop the output)") {
  XSERV_REQUIRE_DATA(data);
  const models::Tokenizer tok = models::Tokenizer::load(data / "o200k_base.tiktoken");
  const engine::ConstraintCompiler compiler(tok, kVocab, {200002, 199999, 200012});
  engine::ConstraintRequest cr = required_call({"third"});
  ScriptedModel model(
      1, 512, 6,
      {ids(tok, "<|channel|>commentary to=functions.third <|constrain|>json<|message|>"
                "{\"q\": 1}<|call|><|start|>assistant<|channel|>analysis<|message|>Seen."
                "<|end|><|start|>assistant<|channel|>final<|message|>It is 1.<|return|>")});
  engine::Request r;
  r.prompt = {0, 11, 12, 13, 14, 15};
  r.max_tokens = 80;
  r.stop_ids = {200002}; // <|return|> only: with tools, a call does not end the turn
  r.constraint = compiler.compile(cr);
  const auto gens = engine::generate(model, {r});
  REQUIRE(gens[0].finish == engine::FinishReason::Stop);
  std::vector<models::TokenId> out(gens[0].tokens.begin(), gens[0].tokens.end());
  const auto messages = models::parse_completion(tok, out);
  REQUIRE(messages.size() == 3);
  CHECK(messages[0].recipient == "functions.third");
  CHECK(messages[1].channel == "analysis");
  CHECK(messages[2].channel == "final");
  CHECK(messages[2].content == "It is 1.");
}
