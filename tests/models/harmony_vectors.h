// The harmony render vectors of the shared data, by name, for the harmony tests.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "models/tokenizer.h"

namespace xserv::testing {

/// name -> ids of every line of DATA/harmony_render_vectors.jsonl.
inline std::map<std::string, std::vector<models::TokenId>>
harmony_vector_ids(const std::filesystem::path& data) {
  std::ifstream in(data / "harmony_render_vectors.jsonl");
  REQUIRE(in);
  std::map<std::string, std::vector<models::TokenId>> out;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    out[j["name"].get<std::string>()] = j["ids"].get<std::vector<models::TokenId>>();
  }
  return out;
}

} // namespace xserv::testing
