// A fake engine::Model for scheduler tests: a KV "cache" of token ids per row, and logits that
// hash everything the step's attention could read, so any scheduling mistake changes tokens.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/model.h"

namespace xserv::testing {

class FakeModel : public engine::Model {
public:
  static constexpr int32_t kVocab = 97;

  FakeModel(int64_t rows, int64_t max_seq)
      : rows_(size_t(rows), std::vector<int32_t>(size_t(max_seq), -1)), max_seq_(max_seq) {
    config_.vocab_size = kVocab;
  }

  const models::ModelConfig& config() const override { return config_; }
  int64_t max_batch() const override { return int64_t(rows_.size()); }
  int64_t max_seq() const override { return max_seq_; }
  std::string backend() const override { return "fake"; }
  void reset() override {
    for (auto& r : rows_)
      std::fill(r.begin(), r.end(), -1);
  }

  /// Writes each sequence's tokens at positions ctx .. ctx + n - 1 of its row, then returns
  /// logits that hash the row's positions 0 .. ctx + n - 1 (what attention reads): a sequence
  /// that read another's or a stale row's tokens would get other logits.
  std::vector<std::vector<float>> step(const models::StepInput& in) override {
    steps_.push_back(in);
    if (in.tokens.size() != in.ctx_lens.size() || in.tokens.size() != in.cache_rows.size())
      throw std::logic_error("malformed step");
    std::vector<bool> seen(rows_.size(), false);
    std::vector<std::vector<float>> out;
    for (size_t b = 0; b < in.tokens.size(); ++b) {
      const size_t row = size_t(in.cache_rows[b]), ctx = size_t(in.ctx_lens[b]);
      if (row >= rows_.size() || seen[row])
        throw std::logic_error("bad or repeated cache row " + std::to_string(row));
      seen[row] = true;
      if (in.tokens[b].empty() || ctx + in.tokens[b].size() > size_t(max_seq_))
        throw std::logic_error("a sequence beyond max_seq or without tokens");
      for (size_t i = 0; i < in.tokens[b].size(); ++i)
        rows_[row][ctx + i] = in.tokens[b][i];
      uint64_t h = 0x9e3779b97f4a7c15ull;
      for (size_t p = 0; p < ctx + in.tokens[b].size(); ++p)
        h = mix(h ^ uint64_t(uint32_t(rows_[row][p]) + 1));
      std::vector<float> logits(kVocab);
      for (int32_t v = 0; v < kVocab; ++v)
        logits[size_t(v)] = float(mix(h + uint64_t(v)) >> 40) / float(1 << 22); // in [0, 4)
      if (const auto p = poison_.find(int32_t(row)); p != poison_.end())
        logits[3] = p->second;
      out.push_back(std::move(logits));
    }
    return out;
  }

  /// From now on the logits of the sequence in cache row `row` hold `value` (a NaN, an
  /// infinity) at id 3, as a model whose numbers broke down would.
  void poison(int32_t row, float value) { poison_[row] = value; }

  const std::vector<models::StepInput>& steps() const { return steps_; }
  size_t max_seqs_in_a_step() const {
    size_t n = 0;
    for (const auto& s : steps_)
      n = std::max(n, s.tokens.size());
    return n;
  }

private:
  static uint64_t mix(uint64_t x) { // splitmix64's finaliser
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }

  models::ModelConfig config_;
  std::vector<std::vector<int32_t>> rows_;
  int64_t max_seq_;
  std::vector<models::StepInput> steps_;
  std::map<int32_t, float> poison_;
};

} // namespace xserv::testing
