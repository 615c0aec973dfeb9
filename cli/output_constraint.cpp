// The output constraint flags of `run` and `bench`.
#include "cli/output_constraint.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "cli/commands.h"

namespace xserv::cli {

std::optional<engine::GrammarSpec> output_grammar(const ParsedArgs& args) {
  using Kind = engine::GrammarSpec::Kind;
  const int given = int(args.has("--json-schema")) + int(args.has("--json")) +
                    int(args.has("--regex")) + int(args.has("--grammar"));
  if (given > 1)
    throw UsageError("give at most one of --json-schema, --json, --regex and --grammar");
  auto read = [](const std::string& flag, const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in)
      throw UsageError(fmt::format("{}: cannot read '{}'", flag, path));
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  };
  if (args.has("--json-schema"))
    return engine::GrammarSpec{Kind::JsonSchema,
                               read("--json-schema", args.get("--json-schema")), "--json-schema"};
  if (args.has("--json"))
    return engine::GrammarSpec{Kind::Json, "", "--json"};
  if (args.has("--regex"))
    return engine::GrammarSpec{Kind::Regex, args.get("--regex"), "--regex"};
  if (args.has("--grammar"))
    return engine::GrammarSpec{Kind::Ebnf, read("--grammar", args.get("--grammar")), "--grammar"};
  return std::nullopt;
}

std::shared_ptr<const engine::Constraint> compile_output(const engine::GrammarSpec& spec,
                                                         const models::Tokenizer& tok,
                                                         const engine::Model& model,
                                                         bool harmony) {
  const engine::ConstraintCompiler compiler(tok, model.config().vocab_size,
                                           model.config().eos_ids());
  engine::ConstraintRequest cr;
  cr.output = spec;
  cr.harmony = harmony;
  return compiler.compile(cr);
}

} // namespace xserv::cli
