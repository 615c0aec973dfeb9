// The batch fixtures (tests/fixtures/NAME with "prompts"): loading HF's rows and judging logits.
//
// tools/make_fixtures.py ran each prompt alone through HF transformers in float32 and kept, per
// prompt, the greedy continuation and the teacher-forced logits at some positions of prompt +
// continuation, over every vocabulary column or a fixed sample of them (hf_float32.json
// describes hf_float32.f32, float32 rows). The CPU and GPU tests run the prompts together and
// hold every row they produce at a stored position to HF's.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/config.h"
#include "models/synth.h"
#include "tests/run_xserv.h"
#include "tests/test_util.h"

namespace xserv::testing {

/// One prompt of a batch fixture and HF's answers for it.
struct HfSequence {
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;       ///< HF's greedy continuation
  std::vector<double> greedy_margin; ///< its top-1 minus top-2 logit at each step
  /// Stored position -> index of its row in HfBatch::rows (positions of prompt + greedy).
  std::map<int64_t, size_t> row_of;
  /// prompt followed by greedy: what a teacher-forced run feeds.
  std::vector<int32_t> tokens() const {
    std::vector<int32_t> t = prompt;
    t.insert(t.end(), greedy.begin(), greedy.end());
    return t;
  }
};

/// A batch fixture: its checkpoint recipe, prompts and HF float32 rows.
struct HfBatch {
  std::string name;
  std::filesystem::path dir;
  nlohmann::json fixture;
  std::vector<HfSequence> seqs;
  int64_t vocab = 0;
  std::vector<int64_t> columns;               ///< the stored columns, ascending; empty: all of them
  std::vector<float> rows;                    ///< [stored rows, columns.size() or vocab]
  std::vector<double> logsumexp, top2_margin; ///< per stored row, over the full vocabulary
  std::vector<int32_t> argmax;                ///< per stored row, over the full vocabulary

  size_t width() const { return columns.empty() ? static_cast<size_t>(vocab) : columns.size(); }
  const float* row(size_t r) const { return rows.data() + r * width(); }
  int64_t max_len() const {
    size_t n = 0;
    for (const auto& s : seqs)
      n = std::max(n, s.prompt.size() + s.greedy.size());
    return static_cast<int64_t>(n);
  }
};

inline nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  return nlohmann::json::parse(in);
}

/// Reads tests/fixtures/NAME: fixture.json, hf_float32.json and the rows file, checked for
/// agreeing sizes.
inline HfBatch load_hf_batch(const std::string& name) {
  HfBatch b;
  b.name = name;
  b.dir = source_dir() / "tests/fixtures" / name;
  b.fixture = read_json_file(b.dir / "fixture.json");
  const nlohmann::json hf = read_json_file(b.dir / "hf_float32.json");
  b.vocab = hf.at("vocab_size").get<int64_t>();
  if (!hf.at("columns").is_null())
    b.columns = hf.at("columns").get<std::vector<int64_t>>();
  const auto prompts = b.fixture.at("prompts").get<std::vector<std::vector<int32_t>>>();
  REQUIRE(prompts.size() == hf.at("sequences").size());
  size_t next_row = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const nlohmann::json& s = hf.at("sequences")[i];
    HfSequence seq;
    seq.prompt = prompts[i];
    REQUIRE(s.at("prompt_tokens").get<size_t>() == seq.prompt.size());
    seq.greedy = s.at("greedy").get<std::vector<int32_t>>();
    seq.greedy_margin = s.at("greedy_margin").get<std::vector<double>>();
    for (int64_t p : s.at("positions").get<std::vector<int64_t>>())
      seq.row_of[p] = next_row++;
    const auto append = [](auto& to, const nlohmann::json& from) {
      for (const auto& v : from)
        to.push_back(v.get<typename std::decay_t<decltype(to)>::value_type>());
    };
    append(b.logsumexp, s.at("logsumexp"));
    append(b.top2_margin, s.at("top2_margin"));
    append(b.argmax, s.at("argmax"));
    b.seqs.push_back(std::move(seq));
  }
  b.rows = read_floats(b.dir / hf.at("logits_file").get<std::string>());
  REQUIRE(b.rows.size() == next_row * b.width());
  REQUIRE(b.logsumexp.size() == next_row);
  REQUIRE(b.argmax.size() == next_row);
  return b;
}

/// The synth options fixture.json's synth_args give (the `xserv synth` flags make_fixtures.py
/// passed), so a test without the binary writes the same bytes.
inline models::SynthOptions synth_options(const nlohmann::json& fx) {
  models::SynthOptions o;
  o.seed = fx.at("seed").get<uint64_t>();
  const auto args = fx.at("synth_args").get<std::vector<std::string>>();
  for (size_t i = 0; i + 1 < args.size(); i += 2) {
    const std::string& flag = args[i];
    const std::string& v = args[i + 1];
    if (flag == "--expert-scale-range") {
      const size_t comma = v.find(',');
      REQUIRE(comma != std::string::npos);
      o.expert_scale_lo = std::stoi(v.substr(0, comma));
      o.expert_scale_hi = std::stoi(v.substr(comma + 1));
    } else if (flag == "--matrix-std") {
      o.matrix_std = std::stof(v);
    } else if (flag == "--bias-std") {
      o.bias_std = std::stof(v);
    } else if (flag == "--norm-std") {
      o.norm_std = std::stof(v);
    } else if (flag == "--sink-std") {
      o.sink_std = std::stof(v);
    } else if (flag == "--router-std") {
      o.router_std = std::stof(v);
    } else {
      FAIL("synth_args flag " << flag << " is not known to tests/engine/hf_batch_fixture.h");
    }
  }
  REQUIRE(args.size() % 2 == 0);
  return o;
}

/// Writes the fixture's checkpoint into `out` and checks every file's sha256 against the one HF
/// ran on.
inline void synthesize_hf_batch(const HfBatch& b, const std::filesystem::path& out) {
  models::synth_checkpoint(models::ModelConfig::load(b.dir / "config.json"), out,
                           synth_options(b.fixture));
  const nlohmann::json& files = b.fixture.at("files");
  size_t written = 0;
  for (const auto& entry : std::filesystem::directory_iterator(out)) {
    const std::string name = entry.path().filename().string();
    ++written;
    REQUIRE_MESSAGE(files.contains(name), "synth wrote " << name << ", absent from fixture.json");
    const RunResult h = run_shell("sha256sum '" + entry.path().string() + "'");
    REQUIRE(h.code == 0);
    CHECK_MESSAGE(h.out.substr(0, 64) == files.at(name).get<std::string>(),
                  name << " differs from the checkpoint the HF reference was made from");
  }
  CHECK(written == files.size());
}

/// Judges full-vocabulary logits rows against a fixture's stored rows: relative L2 over the
/// stored columns and, where columns were sampled, the logsumexp over the full row; the
/// argmax must equal HF's wherever HF's top-2 margin is wider than `argmax_margin`.
struct HfJudge {
  const HfBatch* b;
  double tol, lse_tol, argmax_margin;
  double worst = 0, worst_lse = 0;
  double worst_past_4096 = 0; ///< over positions past YaRN's original_max_position_embeddings
  std::string worst_at;
  size_t rows = 0, failures = 0, argmax_checked = 0, argmax_failures = 0;

  HfJudge(const HfBatch& batch, double rel_l2_tol, double logsumexp_tol, double margin)
      : b(&batch), tol(rel_l2_tol), lse_tol(logsumexp_tol), argmax_margin(margin) {}

  /// `got` is sequence `seq`'s row at `pos`, `vocab` values; positions HF did not store are
  /// ignored.
  void add(size_t seq, int64_t pos, const float* got, size_t vocab) {
    const auto it = b->seqs.at(seq).row_of.find(pos);
    if (it == b->seqs.at(seq).row_of.end())
      return;
    REQUIRE(vocab == static_cast<size_t>(b->vocab));
    const size_t r = it->second;
    std::vector<float> picked;
    const float* cmp = got;
    if (!b->columns.empty()) {
      for (int64_t c : b->columns)
        picked.push_back(got[c]);
      cmp = picked.data();
    }
    const double e = rel_l2(cmp, b->row(r), b->width());
    double lse_err = 0;
    if (!b->columns.empty()) {
      double m = *std::max_element(got, got + vocab), sum = 0;
      for (size_t i = 0; i < vocab; ++i)
        sum += std::exp(double(got[i]) - m);
      lse_err = std::abs(m + std::log(sum) - b->logsumexp[r]);
    }
    ++rows;
    if (!(e <= tol) || !(lse_err <= lse_tol)) {
      if (++failures <= 5)
        MESSAGE(fmt::format("{} prompt {} position {}: rel L2 {:.3g}, |logsumexp diff| {:.3g}",
                            b->name, seq, pos, e, lse_err));
    }
    if (std::isnan(e) || e > worst) {
      worst = std::isnan(e) ? INFINITY : e;
      worst_at = fmt::format("prompt {} position {}", seq, pos);
    }
    worst_lse = std::max(worst_lse, lse_err);
    if (pos >= 4096)
      worst_past_4096 = std::isnan(e) ? INFINITY : std::max(worst_past_4096, e);
    if (b->top2_margin[r] > argmax_margin) {
      ++argmax_checked;
      const auto top = static_cast<int32_t>(std::max_element(got, got + vocab) - got);
      if (top != b->argmax[r]) {
        ++argmax_failures;
        MESSAGE(fmt::format("{} prompt {} position {}: argmax {} != HF's {} (margin {:.3g})",
                            b->name, seq, pos, top, b->argmax[r], b->top2_margin[r]));
      }
    }
  }
  std::string summary() const {
    return fmt::format("{} rows: worst rel L2 {:.3g} at {} (limit {:.3g}; past position 4096: "
                       "{:.3g}), worst |logsumexp diff| {:.3g} (limit {:.3g}), {} over; argmax "
                       "equal in {} of {} rows with HF margin > {:.3g}",
                       rows, worst, worst_at, tol, worst_past_4096, worst_lse, lse_tol, failures,
                       argmax_checked - argmax_failures, argmax_checked, argmax_margin);
  }
  /// Every stored row was seen, none over its limits.
  void check(size_t expected_rows) const {
    CHECK(rows == expected_rows);
    CHECK(failures == 0);
    CHECK(argmax_failures == 0);
  }
};

/// Stored rows of the fixture, all prompts.
inline size_t stored_rows(const HfBatch& b) {
  size_t n = 0;
  for (const auto& s : b.seqs)
    n += s.row_of.size();
  return n;
}

} // namespace xserv::testing
