// The pipeline's wire protocol (engine/pipeline/wire.h).
#include "engine/pipeline/wire.h"

#include <algorithm>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>

#include <fmt/format.h>

#include "base/error.h"
#include "runtime/sha256.h"

namespace xserv::engine::pipeline::wire {

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
  nlohmann::json h = nlohmann::json::parse(payload.substr(sizeof(len), len), nullptr, false);
  if (h.is_discarded() || !h.is_object())
    throw Error("pipeline message: the header is not a JSON object");
  size_t at = sizeof(len) + len;
  if (tensors) {
    const auto it = h.find("tensors");
    if (it != h.end() && !it->is_array())
      throw Error("pipeline message: 'tensors' is not a list");
    for (const auto& d : it == h.end() ? nlohmann::json::array() : *it) {
      if (!d.is_object() || !d.contains("name") || !d["name"].is_string() || !d.contains("dtype") ||
          !d["dtype"].is_string() || !d.contains("shape") || !d["shape"].is_array())
        throw Error("pipeline message: a tensor entry needs a name, a dtype and a shape");
      const std::optional<ir::DType> dt = ir::parse_dtype(d["dtype"].get<std::string>());
      if (!dt)
        throw Error("pipeline message: unknown dtype");
      // The shape must describe no more bytes than the message still holds, checked before
      // anything is allocated (every element travels as 4 bytes: fp32 or int32).
      std::vector<int64_t> shape;
      uint64_t elems = 1;
      const uint64_t room = (payload.size() - at) / 4;
      for (const auto& x : d["shape"]) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0)
          throw Error("pipeline message: a tensor dimension is not a non-negative integer");
        const auto n = static_cast<uint64_t>(x.get<int64_t>());
        if (n != 0 && elems > room / n)
          throw Error("pipeline message: tensor data overruns the message");
        elems *= n;
        shape.push_back(static_cast<int64_t>(n));
      }
      if (elems > room)
        throw Error("pipeline message: tensor data overruns the message");
      ir::Tensor t = ir::Tensor::zeros(*dt, shape);
      const size_t bytes = t.is_int() ? t.i.size() * 4 : t.f.size() * 4;
      if (at + bytes > payload.size())
        throw Error("pipeline message: tensor data overruns the message");
      if (bytes > 0) // an empty tensor's data() may be null, which memcpy may not be given
        std::memcpy(t.is_int() ? static_cast<void*>(t.i.data()) : static_cast<void*>(t.f.data()),
                    payload.data() + at, bytes);
      at += bytes;
      tensors->emplace_back(d["name"].get<std::string>(), std::move(t));
    }
  }
  return h;
}

uint64_t header_bound(uint64_t ints, const std::vector<BoundaryTensor>& tensors) {
  uint64_t bytes = 4096; // the length, braces, field names, the step number, "greedy"
  bytes += 12 * std::min<uint64_t>(ints, uint64_t{1} << 56);
  for (const BoundaryTensor& t : tensors)
    bytes += 128 + 2 * t.name.size() + 24 * t.shape.size();
  return bytes;
}

namespace {

/// worker_frame_bound over the stage's receives, whatever describes the stage.
template <typename Stage>
runtime::FrameBound frame_bound_of(const Stage& stage, int64_t max_batch, int64_t max_seq) {
  const auto seqs = static_cast<uint64_t>(std::max<int64_t>(max_batch, 1));
  const uint64_t tokens = seqs * static_cast<uint64_t>(std::max<int64_t>(max_seq, 1));
  const std::vector<BoundaryTensor> recv = stage_receives(stage, static_cast<int64_t>(tokens));
  // Every token id; per sequence its context length and list brackets; its two block tables,
  // at most one entry a position each; at most two block copies (three ints each) a sequence.
  const uint64_t data = boundary_bytes(recv), head = header_bound(3 * tokens + 9 * seqs, recv);
  const uint64_t step = data > UINT64_MAX - head ? UINT64_MAX : data + head;
  return [step](uint8_t type) {
    return type == kStep ? step : type == kFail ? kMaxFailBytes : kMaxControlBytes;
  };
}

} // namespace

runtime::FrameBound worker_frame_bound(const ir::Graph& stage, int64_t max_batch, int64_t max_seq) {
  return frame_bound_of(stage, max_batch, max_seq);
}

runtime::FrameBound worker_frame_bound(const runtime::PlanStage& stage, int64_t max_batch,
                                       int64_t max_seq) {
  return frame_bound_of(stage, max_batch, max_seq);
}

uint64_t result_frame_bytes(const models::StepInput& in, const std::vector<BoundaryTensor>& sends,
                            bool last, bool greedy, int64_t vocab) {
  const auto seqs = static_cast<uint64_t>(in.tokens.size());
  if (!last)
    return header_bound(0, sends) + boundary_bytes(sends);
  if (greedy)
    return header_bound(seqs, {});
  const auto rows = std::max(seqs, static_cast<uint64_t>(token_count(in)));
  const std::vector<BoundaryTensor> logits = {
      {"out.0", ir::DType::F32, {static_cast<int64_t>(rows), vocab}}};
  return header_bound(0, logits) + boundary_bytes(logits);
}

runtime::FrameBound reply_frame_bound(uint8_t want, uint64_t want_bytes) {
  return [want, want_bytes](uint8_t type) {
    return type == want ? want_bytes : type == kFail ? kMaxFailBytes : kMaxControlBytes;
  };
}

std::string hmac_sha256(const std::string& key, const std::string& msg) {
  constexpr size_t kBlock = 64;
  std::string k = key;
  if (k.size() > kBlock) {
    runtime::Sha256 h;
    h.update(k);
    const auto d = h.digest();
    k.assign(reinterpret_cast<const char*>(d.data()), d.size());
  }
  k.resize(kBlock, '\0');
  std::string ipad(kBlock, '\0'), opad(kBlock, '\0');
  for (size_t i = 0; i < kBlock; ++i) {
    ipad[i] = static_cast<char>(k[i] ^ 0x36);
    opad[i] = static_cast<char>(k[i] ^ 0x5c);
  }
  runtime::Sha256 inner;
  inner.update(ipad);
  inner.update(msg);
  const auto id = inner.digest();
  runtime::Sha256 outer;
  outer.update(opad);
  outer.update(reinterpret_cast<const char*>(id.data()), id.size());
  const auto od = outer.digest();
  return to_hex(std::string(reinterpret_cast<const char*>(od.data()), od.size()));
}

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  std::ifstream in("/dev/urandom", std::ios::binary);
  if (!in.read(out.data(), static_cast<std::streamsize>(n)))
    throw Error("cannot read /dev/urandom for a pipeline nonce");
  return out;
}

bool same_digest(const std::string& a, const std::string& b) {
  if (a.size() != b.size())
    return false;
  unsigned char diff = 0; // constant time: no early exit on the first difference
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string hello_proof(const std::string& token, const std::string& challenge, int rank, int world,
                        const std::string& digest, const std::string& nonce) {
  return hmac_sha256(token, fmt::format("xserv-pipeline hello\n{}\n{}\n{}\n{}\n{}", challenge, rank,
                                        world, digest, nonce));
}

std::string welcome_proof(const std::string& token, const std::string& nonce, int rank) {
  return hmac_sha256(token, fmt::format("xserv-pipeline welcome\n{}\n{}", nonce, rank));
}

std::string pipeline_token(const std::string& given, bool spawned_here) {
  if (!given.empty())
    return given;
  if (spawned_here)
    return to_hex(random_bytes(32)); // given to the spawned workers only, in their environment
  throw UsageError("no pipeline token: neither --pipeline-token nor XSERV_PIPELINE_TOKEN is set. "
                   "Ranks on other hosts prove they belong to this run with a shared secret; give "
                   "every rank the same value (e.g. `openssl rand -hex 32`)");
}

runtime::Frame message(uint8_t type, const nlohmann::json& head, const Named& tensors) {
  return runtime::Frame{type, encode(head, tensors)};
}

nlohmann::json step_header(const models::StepInput& in, int64_t step, bool greedy) {
  std::vector<int32_t> copies; // (src, dst, window) triples
  for (const models::StepInput::BlockCopy& c : in.copies)
    copies.insert(copies.end(), {c.src, c.dst, c.window ? 1 : 0});
  return {{"step", step},
          {"tokens", in.tokens},
          {"ctx_lens", in.ctx_lens},
          {"block_tables", in.block_tables},
          {"window_tables", in.window_tables},
          {"copies", copies},
          {"greedy", greedy}};
}

namespace {

/// A step header's list of int32 `field`, or Error naming the field.
std::vector<int32_t> int_list(const nlohmann::json& v, const std::string& field) {
  if (!v.is_array())
    throw Error(fmt::format("pipeline step: '{}' is not a list", field));
  std::vector<int32_t> out;
  out.reserve(v.size());
  for (const auto& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < INT32_MIN || x.get<int64_t>() > INT32_MAX)
      throw Error(fmt::format("pipeline step: '{}' holds {}, not a 32-bit integer", field,
                              x.dump().substr(0, 40)));
    out.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return out;
}

const nlohmann::json& field_of(const nlohmann::json& h, const char* name) {
  const auto it = h.find(name);
  if (it == h.end())
    throw Error(fmt::format("pipeline step: no '{}'", name));
  return *it;
}

} // namespace

models::StepInput step_from_header(const nlohmann::json& h) {
  models::StepInput in;
  const nlohmann::json& tokens = field_of(h, "tokens");
  if (!tokens.is_array())
    throw Error("pipeline step: 'tokens' is not a list");
  for (const auto& seq : tokens)
    in.tokens.push_back(int_list(seq, "tokens"));
  in.ctx_lens = int_list(field_of(h, "ctx_lens"), "ctx_lens");
  for (const char* name : {"block_tables", "window_tables"}) {
    const nlohmann::json& tables = field_of(h, name);
    if (!tables.is_array())
      throw Error(fmt::format("pipeline step: '{}' is not a list", name));
    auto& out = name[0] == 'b' ? in.block_tables : in.window_tables;
    for (const auto& t : tables)
      out.push_back(int_list(t, name));
  }
  const std::vector<int32_t> copies = int_list(field_of(h, "copies"), "copies");
  if (copies.size() % 3 != 0)
    throw Error("pipeline step: 'copies' is not a list of (source, destination, pool) triples");
  for (size_t i = 0; i < copies.size(); i += 3) {
    if (copies[i + 2] != 0 && copies[i + 2] != 1)
      throw Error("pipeline step: a copy's pool is neither 0 (full) nor 1 (window)");
    in.copies.push_back({copies[i], copies[i + 1], copies[i + 2] == 1});
  }
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

namespace {

/// What `f` makes `rank` do at `step`, or "".
std::string fault_at(const std::optional<Fault>& f, int rank, int64_t step) {
  return f && f->rank == rank && f->step == step ? f->what : std::string();
}

} // namespace

void maybe_fault(const std::optional<Fault>& f, int rank, int64_t step) {
  const std::string what = fault_at(f, rank, step);
  if (what.empty() || what == "stall" || what == "narrow") // maybe_stall's and maybe_corrupt's
    return;
  if (what == "exit")
    std::_Exit(3);
  if (what == "stop") {
    std::raise(SIGSTOP); // the whole process frozen, heartbeat threads included
    return;
  }
  for (;;) // hang: no heartbeats, no reply
    std::this_thread::sleep_for(std::chrono::hours(1));
}

void maybe_corrupt(const std::optional<Fault>& f, int rank, int64_t step, Named& out,
                   nlohmann::json& reply) {
  if (fault_at(f, rank, step) != "narrow")
    return;
  if (reply.contains("ids"))
    reply["ids"] = nlohmann::json::array({int64_t{1} << 30});
  for (auto& [name, t] : out)
    if (!t.is_int() && t.shape.size() == 2 && t.shape[1] > 10) { // keep 10 columns of each row
      std::vector<float> narrow;
      for (int64_t row = 0; row < t.shape[0]; ++row)
        narrow.insert(narrow.end(), t.f.begin() + row * t.shape[1],
                      t.f.begin() + row * t.shape[1] + 10);
      t.f = std::move(narrow);
      t.shape[1] = 10;
    }
}

void maybe_stall(const std::optional<Fault>& f, int rank, int64_t step) {
  if (fault_at(f, rank, step) != "stall")
    return;
  for (;;) // heartbeats go on (the caller holds a Heartbeat), a result never comes
    std::this_thread::sleep_for(std::chrono::hours(1));
}

} // namespace xserv::engine::pipeline::wire
