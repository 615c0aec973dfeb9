// Exchange: engine events -> SSE bytes or a JSON body, with the request's end and its failures.
#include "server/exchange.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace xserv::server {

using openai::ApiError;
using openai::Json;

void append_json(std::string& out, const Json& j) {
  // nlohmann's serializer writes straight into `out` (dump() would build a string to copy).
  nlohmann::detail::serializer<Json> s(nlohmann::detail::output_adapter<char>(out), ' ',
                                       nlohmann::json::error_handler_t::replace);
  s.dump(j, false, false, 0);
}

std::string dump_json(const Json& j) {
  std::string out;
  append_json(out, j);
  return out;
}

void Exchange::send(Json&& event, std::string& out) {
  if (format.named) {
    event["sequence_number"] = seq_++;
    out += "event: ";
    const auto type = event.find("type");
    if (type != event.end() && type->is_string())
      out += type->get_ref<const std::string&>();
    out += "\ndata: ";
  } else {
    out += "data: ";
  }
  append_json(out, event);
  out += "\n\n";
}

void Exchange::close_stream(std::string& out) {
  if (!format.named)
    out += "data: [DONE]\n\n";
}

void Exchange::fail(const ApiError& e, std::string& out, unsigned& status) {
  done_ = true;
  if (stream) {
    send(format.error(e), out);
    close_stream(out);
    return;
  }
  status = static_cast<unsigned>(e.status);
  out = dump_json(openai::error_body(e));
}

bool Exchange::take(std::string& out, unsigned& status) {
  if (done_)
    return true;
  if (stream && !opened_)
    for (Json& e : first)
      send(std::move(e), out);
  opened_ = true;
  first.clear();
  std::optional<ApiError> error;
  try {
    error = job->take(events_);
    stopped_.resize(size_t(job->choices()), 0);
    for (const TimedEvent& t : events_) {
      for (Json& chunk : on_event(t.event))
        if (stream)
          send(std::move(chunk), out);
      const int c = std::clamp(t.event.choice, 0, job->choices() - 1);
      if (!stopped_[size_t(c)] && stop_hit(c)) {
        job->abort(job->choices() > 1 ? c : -1);
        stopped_[size_t(c)] = 1;
      }
    }
  } catch (const ApiError& e) { // from the handler's conversion: the request cannot go on
    job->abort();
    job->complete(id, "error");
    fail(e, out, status);
    return true;
  } catch (const std::exception& e) {
    job->abort();
    job->complete(id, "error");
    fail(ApiError(500, std::string("internal error: ") + e.what(), "", "server_error"), out,
         status);
    return true;
  }
  if (error) {
    job->complete(id, "error");
    fail(*error, out, status);
    return true;
  }
  if (!job->finished())
    return false;
  if (job->cut_short()) {
    // Nobody here asked for it: the drain's grace period ran out.
    job->complete(id, "abort");
    fail(ApiError(503, "the server is shutting down: the request was stopped before its end", "",
                  "service_unavailable", "server_shutting_down"),
         out, status);
    return true;
  }
  job->complete(id, finish_reason());
  done_ = true;
  if (stream) {
    for (Json& e : last())
      send(std::move(e), out);
    close_stream(out);
  } else {
    status = 200;
    out = dump_json(result());
  }
  return true;
}

void Exchange::cancel() {
  done_ = true;
  job.reset(); // unfinished: aborted and counted as a client that went away
}

} // namespace xserv::server
