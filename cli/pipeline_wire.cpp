// The pipeline's wire protocol (cli/pipeline_wire.h).
#include "cli/pipeline_wire.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "ir/error.h"

namespace xserv::cli::wire {

std::string encode(const nlohmann::json& head, const Named& tensors) {
  nlohmann::json h = head;
  h["tensors"] = nlohmann::json::array();
  std::string data;
  for (const auto& [name, t] : tensors) {
    const bool ints = t.is_int();
    h["tensors"].push_back(
        {{"name", name}, {"dtype", std::string(ir::dtype_name(t.dtype))}, {"shape", t.shape}});
    if (ints)
      data.append(reinterpret_cast<const char*>(t.i.data()), t.i.size() * sizeof(int32_t));
    else
      data.append(reinterpret_cast<const char*>(t.f.data()), t.f.size() * sizeof(float));
  }
  const std::string text = h.dump();
  const uint64_t len = text.size();
  std::string out(reinterpret_cast<const char*>(&len), sizeof(len));
  return out + text + data;
}

nlohmann::json decode(const std::string& payload, Named* tensors) {
  uint64_t len = 0;
  if (payload.size() < sizeof(len))
    throw Error("pipeline message too short");
  std::memcpy(&len, payload.data(), sizeof(len));
  if (len > payload.size() - sizeof(len))
    throw Error("pipeline message header overruns the message");
  nlohmann::json h = nlohmann::json::parse(payload.substr(sizeof(len), len));
  size_t at = sizeof(len) + len;
  if (tensors)
    for (const auto& d : h.value("tensors", nlohmann::json::array())) {
      const std::optional<ir::DType> dt = ir::parse_dtype(d.at("dtype").get<std::string>());
      if (!dt)
        throw Error("pipeline message: unknown dtype");
      const std::vector<int64_t> shape = d.at("shape").get<std::vector<int64_t>>();
      ir::Tensor t = ir::Tensor::zeros(*dt, shape);
      const size_t bytes = t.is_int() ? t.i.size() * 4 : t.f.size() * 4;
      if (at + bytes > payload.size())
        throw Error("pipeline message: tensor data overruns the message");
      std::memcpy(t.is_int() ? static_cast<void*>(t.i.data()) : static_cast<void*>(t.f.data()),
                  payload.data() + at, bytes);
      at += bytes;
      tensors->emplace_back(d.at("name").get<std::string>(), std::move(t));
    }
  return h;
}

runtime::Frame message(uint8_t type, const nlohmann::json& head, const Named& tensors) {
  return runtime::Frame{type, encode(head, tensors)};
}

nlohmann::json step_header(const models::StepInput& in, int64_t step, bool greedy) {
  return {{"step", step},
          {"tokens", in.tokens},
          {"ctx_lens", in.ctx_lens},
          {"cache_rows", in.cache_rows},
          {"greedy", greedy}};
}

models::StepInput step_from_header(const nlohmann::json& h) {
  models::StepInput in;
  in.tokens = h.at("tokens").get<std::vector<std::vector<int32_t>>>();
  in.ctx_lens = h.at("ctx_lens").get<std::vector<int32_t>>();
  in.cache_rows = h.at("cache_rows").get<std::vector<int32_t>>();
  return in;
}

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string from_hex(const std::string& hex) {
  auto nibble = [](char c) -> int {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    const int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0)
      throw Error("pipeline handshake: the NCCL id is not hex");
    out += static_cast<char>(hi * 16 + lo);
  }
  return out;
}

Heartbeat::Heartbeat(runtime::Connection& c, std::mutex& send_lock)
    : thread_([this, &c, &send_lock] {
        std::unique_lock<std::mutex> lock(mu_);
        while (!wake_.wait_for(lock, std::chrono::seconds(1), [this] { return done_; })) {
          std::lock_guard<std::mutex> g(send_lock);
          try {
            c.send(message(kAlive, nlohmann::json::object()));
          } catch (const Error&) {
            return;
          }
        }
      }) {}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void maybe_fault(int rank, int64_t step) {
  const char* f = std::getenv("XSERV_PIPELINE_FAULT");
  if (!f)
    return;
  int r = -1;
  long long at = -1;
  char what[8] = {0};
  if (std::sscanf(f, "%d:%7[a-z]@%lld", &r, what, &at) != 3 || r != rank || at != step)
    return;
  if (std::string(what) == "exit")
    std::_Exit(3);
  for (;;) // hang: no heartbeats, no reply
    std::this_thread::sleep_for(std::chrono::hours(1));
}

} // namespace xserv::cli::wire
