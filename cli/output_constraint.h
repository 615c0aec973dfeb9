// The output constraint flags of `run` and `bench` (--json-schema FILE, --json, --regex RE,
// --grammar FILE) and the constraint they compile to.
#pragma once

#include <memory>
#include <optional>

#include "cli/args.h"
#include "engine/constraint.h"
#include "engine/model.h"

namespace xserv::cli {

/// --json-schema FILE, --json, --regex RE or --grammar FILE (at most one): what the output must
/// follow; the schema and grammar files are read here, so a bad path fails before loading.
std::optional<engine::GrammarSpec> output_grammar(const ParsedArgs& args);

/// The request's constraint for `spec` over the model's vocabulary: bound to harmony's final
/// message (a chat prompt), or to the whole output. A constraint that cannot be enforced is bad
/// input (exit 1), named by its flag.
std::shared_ptr<const engine::Constraint> compile_output(const engine::GrammarSpec& spec,
                                                         const models::Tokenizer& tok,
                                                         const engine::Model& model, bool harmony);

} // namespace xserv::cli
