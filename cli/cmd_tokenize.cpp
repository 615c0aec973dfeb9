// `xserv tokenize`: print the token ids of a text (or decode ids back to text).
#include <cerrno>
#include <cstdlib>
#include <iostream>

#include <fmt/format.h>

#include "cli/commands.h"
#include "models/tokenizer.h"

namespace xserv::cli {

int cmd_tokenize(const ParsedArgs& args) {
  const std::filesystem::path where = args.positional()[0];
  if (!std::filesystem::exists(where))
    throw UsageError(fmt::format("'{}' does not exist", where.string()));
  models::Tokenizer tok = models::Tokenizer::load(where);
  const std::string text = args.positional().size() > 1 ? args.positional()[1] : "";
  if (args.has("--decode")) {
    std::vector<models::TokenId> ids;
    const auto vocab = static_cast<int64_t>(tok.vocab_size());
    for (const auto& s : args.list("--decode")) {
      char* end = nullptr;
      errno = 0;
      const long long id = std::strtoll(s.c_str(), &end, 10);
      if (*end != '\0' || errno != 0 || id < 0 || id >= vocab)
        throw UsageError(fmt::format("--decode: '{}' is not a token id (ids are integers in [0, "
                                     "{}), comma-separated)",
                                     s, vocab));
      ids.push_back(static_cast<models::TokenId>(id));
    }
    std::cout << tok.decode(ids) << std::endl;
    return 0;
  }
  auto ids = tok.encode(text, args.has("--allow-special") ? models::AllowedSpecial::all()
                                                          : models::AllowedSpecial::none());
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    line += i ? "," : "";
    line += std::to_string(ids[i]);
  }
  std::cout << line << std::endl;
  return 0;
}

} // namespace xserv::cli
