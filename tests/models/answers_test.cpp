// Tests of GSM8K / AIME answer extraction on realistic model outputs and the reference files.
#include <doctest/doctest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "models/answers.h"
#include "tests/test_util.h"

using xserv::eval::extract_aime_answer;
using xserv::eval::extract_gsm8k_answer;
using xserv::eval::last_boxed;
using xserv::eval::normalize_number;

TEST_CASE("normalize_number gives one canonical spelling") {
  CHECK(normalize_number("1,234") == "1234");
  CHECK(normalize_number(" $18 ") == "18");
  CHECK(normalize_number("18.00") == "18");
  CHECK(normalize_number("12.50") == "12.5");
  CHECK(normalize_number("-10") == "-10");
  CHECK(normalize_number("$-5") == "-5");
  CHECK(normalize_number("-$5") == "-5");
  CHECK(normalize_number("+7") == "7");
  CHECK(normalize_number("070") == "70");
  CHECK(normalize_number("45%") == "45");
  CHECK(normalize_number("-0") == "0");
  CHECK(normalize_number("1{,}234") == "1234");
  CHECK_FALSE(normalize_number("18 dollars").has_value());
  CHECK_FALSE(normalize_number("abc").has_value());
  CHECK_FALSE(normalize_number("1/2").has_value());
  CHECK_FALSE(normalize_number("").has_value());
}

TEST_CASE("GSM8K answers from final-channel text") {
  CHECK(extract_gsm8k_answer("Janet sells 16 - 3 - 4 = 9 eggs.\nShe makes 9 * $2 = $18 every "
                             "day.\nAnswer: 18") == "18");
  CHECK(extract_gsm8k_answer("The answer is 42.") == "42");
  CHECK(extract_gsm8k_answer("**Answer:** $1,234.00") == "1234");
  CHECK(extract_gsm8k_answer("She makes 18 dollars per day.") == "18");
  CHECK(extract_gsm8k_answer("So the total is 1,450,000 dollars.") == "1450000");
  CHECK(extract_gsm8k_answer("The temperature dropped to -10 degrees.\nAnswer: -10") == "-10");
  CHECK(extract_gsm8k_answer("Change: 5-3 = 2") == "2");
  CHECK(extract_gsm8k_answer("Growth is 45%.") == "45");
  CHECK(extract_gsm8k_answer("Total = 12.0") == "12");
  CHECK(extract_gsm8k_answer("Each costs 2.50, so \\boxed{70} in total, not 80.") == "70");
  // A later mention of "answer" without a number does not hide the answer line.
  CHECK(extract_gsm8k_answer("Answer: 18\n\nI hope this answer helps!") == "18");
  // The number an "answer" marker introduces, not the last number of its line.
  CHECK(extract_gsm8k_answer("The answer is 7 apples, from 3 + 4.") == "7");
  CHECK(extract_gsm8k_answer("Answer: 18 (9 eggs at $2 each)") == "18");
  // A computation after the marker: its result.
  CHECK(extract_gsm8k_answer("The answer is 7 + 4 = 11.") == "11");
  // An earlier marker with a number is used when the last one has none on its line.
  CHECK(extract_gsm8k_answer("Answer: 18\nThat is my answer.") == "18");
  // Without any marker: the last number.
  CHECK(extract_gsm8k_answer("3 + 4 makes 7") == "7");
  CHECK_FALSE(extract_gsm8k_answer("I cannot solve this.").has_value());
  CHECK_FALSE(extract_gsm8k_answer("").has_value());
}

TEST_CASE("AIME answers from \\boxed{}") {
  CHECK(extract_aime_answer("Thus the sum is \\(\\boxed{70}\\).") == "70");
  CHECK(extract_aime_answer("\\boxed{ 70 }") == "70");
  CHECK(extract_aime_answer("\\boxed{070}") == "70");
  CHECK(extract_aime_answer("First \\boxed{12}, corrected: \\boxed{588}") == "588");
  CHECK(extract_aime_answer("\\boxed{588} and an empty \\boxed{}") == "588");
  CHECK(extract_aime_answer("\\boxed{\\text{70}}") == "70");
  CHECK(extract_aime_answer("angle \\boxed{70^\\circ}") == "70");
  CHECK(extract_aime_answer("\\framebox{117}") == "117");
  CHECK(extract_aime_answer("$\\boxed{1{,}000}$") == "1000");
  CHECK_FALSE(extract_aime_answer("\\boxed{\\frac{1}{2}}").has_value());
  CHECK_FALSE(extract_aime_answer("\\boxed{3.5}").has_value());
  // No box: the last integer of the text, as the reference grader does.
  CHECK(extract_aime_answer("so m + n = 279.") == "279");
  CHECK_FALSE(extract_aime_answer("no idea").has_value());
  // Cut off inside the box: take what is there.
  CHECK(extract_aime_answer("\\boxed{821") == "821");
}

TEST_CASE("last_boxed matches nested braces and takes the last box") {
  CHECK(last_boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}");
  CHECK(last_boxed("\\boxed{1} \\framebox{2} \\boxed{3}") == "3");
  CHECK(last_boxed("\\boxed{1} \\framebox{2}") == "2");
  CHECK_FALSE(last_boxed("no box").has_value());
}

TEST_CASE("prompts follow the reference evals") {
  CHECK(xserv::eval::aime_prompt("Q?") ==
        "\nQ?\nPlease reason step by step, and put your final answer within \\boxed{}.\n");
  CHECK(xserv::eval::gsm8k_prompt("Q?").ends_with("after \"Answer:\".\n\nQ?"));
}

TEST_CASE("reference answers of the shared GSM8K and AIME files") {
  XSERV_REQUIRE_DATA(data);
  std::ifstream gsm(data / "gsm8k_test.jsonl");
  REQUIRE(gsm);
  size_t n = 0;
  std::vector<std::string> refs;
  for (std::string line; std::getline(gsm, line); ++n) {
    auto ref = xserv::eval::parse_gsm8k_reference(
        nlohmann::json::parse(line)["answer"].get<std::string>());
    REQUIRE(ref.has_value());
    refs.push_back(*ref);
  }
  CHECK(n == 1319);
  CHECK(refs[0] == "18");
  CHECK(std::count(refs.begin(), refs.end(), "-10") == 1);
  CHECK(std::find(refs.begin(), refs.end(), "1450000") != refs.end());
  for (const auto& r : refs) // every reference survives its own extraction
    CHECK(extract_gsm8k_answer("Answer: " + r) == r);

  std::ifstream aime(data / "aime2025.jsonl");
  REQUIRE(aime);
  std::vector<std::string> answers;
  for (std::string line; std::getline(aime, line);) {
    auto j = nlohmann::json::parse(line);
    auto ref = xserv::eval::parse_aime_reference(j["answer"].dump());
    REQUIRE(ref.has_value());
    CHECK(extract_aime_answer("\\boxed{" + *ref + "}") == ref);
    answers.push_back(*ref);
  }
  REQUIRE(answers.size() == 30);
  CHECK(answers[0] == "70");
  CHECK(answers[1] == "588");
  CHECK(xserv::eval::parse_aime_reference("70.0") == "70");
  CHECK_FALSE(xserv::eval::parse_aime_reference("70.5").has_value());
  CHECK(xserv::eval::parse_gsm8k_reference("work\n#### 2,125") == "2125");
  CHECK_FALSE(xserv::eval::parse_gsm8k_reference("no marker").has_value());
}
