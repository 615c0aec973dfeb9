// Prompts and answer extraction for the GSM8K and AIME evaluations of gpt-oss.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace xserv::eval {

/// The GSM8K user message: simple-evals' English MGSM instruction (openai/simple-evals
/// mgsm_eval.py; gpt-oss's own evals have no GSM8K), then the question.
std::string gsm8k_prompt(std::string_view question);

/// The AIME user message exactly as openai/gpt-oss gpt_oss/evals/aime_eval.py builds it:
/// "\n{question}\nPlease reason step by step, and put your final answer within \boxed{}.\n".
std::string aime_prompt(std::string_view question);

/// A number in canonical form: no thousands commas, no '+', no leading zeros, no trailing
/// fractional zeros ("1,234.50" -> "1234.5", "18.00" -> "18", "-0" -> "0"). nullopt unless
/// `text` is exactly one number (surrounding spaces allowed).
std::optional<std::string> normalize_number(std::string_view text);

/// The contents of the last non-empty \boxed{...} or \framebox{...}, braces matched (so
/// "\boxed{\frac{1}{2}}" gives "\frac{1}{2}"); nullopt when there is none.
std::optional<std::string> last_boxed(std::string_view text);

/// The canonical last number of `text` (see normalize_number), reading "$1,234", "18 dollars",
/// "45%", "-3", "12.0"; nullopt when `text` has no number.
std::optional<std::string> last_number(std::string_view text);

/// The model's GSM8K answer from its final-channel text, first match wins: the last \boxed{}
/// with a number; the last number after the last "answer" (case-insensitive, as in
/// "Answer: 18" or "The answer is 18."); the last number of the whole text.
std::optional<std::string> extract_gsm8k_answer(std::string_view text);

/// The reference answer of a GSM8K record's "answer" field: the number after the last "#### ",
/// canonical ("1,600" -> "1600"). nullopt when the marker or the number is missing.
std::optional<std::string> parse_gsm8k_reference(std::string_view answer_field);

/// The model's AIME answer: the integer in the last non-empty \boxed{} (" 70 ", "070",
/// "70^\circ", "\text{70}" all give "70"; a box without exactly one integer gives nullopt, as in
/// the reference grader); without any box, the last integer of the text.
std::optional<std::string> extract_aime_answer(std::string_view text);

/// The AIME reference as an integer string: "70.0", "70" or "070" -> "70"; nullopt when it is not
/// an integer value.
std::optional<std::string> parse_aime_reference(std::string_view answer);

} // namespace xserv::eval
