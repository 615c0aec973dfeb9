// How a request's header and body framing is judged: Beast's parser reads Content-Length and
// Transfer-Encoding strictly (digits only, one value, not both, chunked last) under the header
// and body limits; this names its refusals for the client and adds the two rules it leaves to the
// server. Also the API key check of the Authorization header.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/beast/core/error.hpp>

#include "server/api_error.h"

namespace xserv::server {

/// The answer to a request Beast's parser refused with `ec`: 431 for a header past
/// `max_header` bytes, 413 for a body past `max_body` (a Content-Length is refused before any
/// of the body is read, a chunked body as soon as it grows past), 400 naming what was malformed
/// otherwise. Every one closes its connection: what follows cannot be read as a request.
/// `head`: the bytes read so far (the header), to name the field at fault: a Content-Length of
/// digits past 2^64 is too large (413), a header line with a space before its colon is named.
openai::ApiError parser_refusal(const boost::beast::error_code& ec, size_t max_header,
                                size_t max_body, std::string_view head = {});

/// What the parser leaves to the server about a request of `method` whose header carries the
/// Content-Length values `lengths` and the Transfer-Encoding values `encodings` (each field as
/// written; empty when absent; several fields are one list, an empty one refused): a
/// Transfer-Encoding that does not end in chunked (400: RFC 9112
/// 6.3, the request's length cannot be known), chunked twice (400) or another coding before it
/// (501: the server decodes none); a Content-Length that is not one decimal number (400: a list
/// such as "1,1" is refused, not read as 1); and a POST, PUT or PATCH with neither field (411:
/// its body would be read as the next request). nullopt when the body can be read.
std::optional<openai::ApiError> framing_refusal(std::string_view method,
                                                const std::vector<std::string_view>& lengths,
                                                const std::vector<std::string_view>& encodings);

/// Whether an Authorization header value carries `key` as a Bearer token: the scheme without
/// regard to case (RFC 9110 11.1), one or more spaces, then the key compared in constant time.
bool bearer_matches(std::string_view authorization, std::string_view key);

/// The verdict on a request's `bytes` as a session reaches it: the header parsed by Beast
/// under `max_header` and `max_body`, then framing_refusal; nullopt when its body may be read.
/// Also nullopt for a header not yet complete. For tests and fuzz targets.
std::optional<openai::ApiError> head_refusal(std::string_view bytes, size_t max_header,
                                             size_t max_body);

} // namespace xserv::server
