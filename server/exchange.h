// A request running in the engine as its connection sees it: the engine's events become a
// stream of Server-Sent Events (chat and text completions: `data: JSON`, then `data: [DONE]`;
// the Responses API: named, numbered events) or, at the end, one JSON body.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/http_connection.h"
#include "server/jobs.h"

namespace xserv::server {

/// Appends `j` as JSON text to `out` (invalid UTF-8 replaced by U+FFFD, never a throw), without
/// a temporary string.
void append_json(std::string& out, const openai::Json& j);
/// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD).
std::string dump_json(const openai::Json& j);

/// How a stream puts its events on the wire.
struct StreamFormat {
  bool named = false; ///< `event: TYPE` lines and sequence numbers (Responses), no [DONE]
  std::function<openai::Json(const openai::ApiError&)> error = openai::error_body;
};

/// Drives one request to its end, streaming or not; a handler fills in the hooks. Its end:
/// the finish event (the closing events, or the `result()` body), a failure of the request
/// (an error event, or the error's status and body), or an abort the request did not ask for
/// (the drain's grace ran out): 503 "the server is shutting down", as an error event once a
/// stream began, because no OpenAI finish reason says that a response was cut short.
class Exchange : public Pending {
public:
  explicit Exchange(std::string id) : id(std::move(id)) {}

  std::string id;
  std::unique_ptr<Job> job;
  /// The chunks (stream) an event adds; updates the handler's session of the event's choice.
  std::function<std::vector<openai::Json>(const engine::Event&)> on_event;
  /// A stop string matched or the last tool call came in `choice`: it is aborted in the engine.
  std::function<bool(int choice)> stop_hit = [](int) { return false; };
  /// The finish reason the client sees, after the last event.
  std::function<std::string()> finish_reason;
  bool stream = false;
  std::vector<openai::Json> first;                 ///< a stream's opening events
  std::function<std::vector<openai::Json>()> last; ///< a stream's closing events
  StreamFormat format;
  std::function<openai::Json()> result; ///< the body without a stream

  bool streaming() const override { return stream; }
  void start(std::function<void()> wake) override { job->set_wake(std::move(wake)); }
  bool take(std::string& out, unsigned& status) override;
  void cancel() override;

private:
  void send(openai::Json&& event, std::string& out);
  /// The request ended with `e`: an error event (stream) or the error's body.
  void fail(const openai::ApiError& e, std::string& out, unsigned& status);
  void close_stream(std::string& out);

  std::vector<TimedEvent> events_; ///< reused between takes
  int64_t seq_ = 0;                ///< the next sequence_number (named events)
  std::vector<char> stopped_;      ///< per choice: aborted here after its stop_hit
  bool opened_ = false, done_ = false;
};

} // namespace xserv::server
