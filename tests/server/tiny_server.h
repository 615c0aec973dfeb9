// Fixtures of the `xserv serve` tests: the tiny checkpoint, a model whose steps a test can hold,
// fail or break, an in-process server over it, and `xserv serve` as a child process.
#pragma once

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cpu_model.h"
#include "server/server.h"
#include "tests/run_xserv.h"
#include "tests/server/serve_client.h"
#include "tests/test_util.h"

namespace xserv::testing {

/// The tiny example checkpoint, synthesized once per test binary.
inline const std::filesystem::path& tiny_model() {
  static const TempDir dir("serve_test");
  static const std::filesystem::path model = [] {
    const std::filesystem::path out = dir.path / "tiny";
    RunResult r =
        run_xserv("synth --config " + (source_dir() / "examples/tiny/config.json").string() +
                  " -o " + out.string() + " --seed 1");
    REQUIRE(r.code == 0);
    return out;
  }();
  return model;
}

/// A model whose steps wait while its gate is closed, so a test can hold requests in place; it
/// can also fail one step, poison one, or break for good (as a pipeline that lost a rank).
class GatedModel : public engine::Model {
public:
  GatedModel(int64_t rows, int64_t max_seq) : inner_(tiny_model(), rows, max_seq) {}
  const models::ModelConfig& config() const override { return inner_.config(); }
  int64_t max_batch() const override { return inner_.max_batch(); }
  int64_t max_seq() const override { return inner_.max_seq(); }
  const models::KvGeometry& kv_geometry() const override { return inner_.kv_geometry(); }
  std::string backend() const override { return "cpu"; }
  void reset() override { inner_.reset(); }
  std::vector<std::vector<float>> step(const models::StepInput& in) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++blocked_;
      ++entered_;
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_ || passes_ > 0; });
      if (!open_)
        --passes_;
      --blocked_;
      if (!broken_.empty())
        throw Error("the pipeline is broken: " + broken_);
    }
    if (fail_once_.exchange(false))
      throw std::runtime_error("injected model failure");
    std::vector<std::vector<float>> rows = inner_.step(in);
    if (poison_once_.exchange(false)) // a NaN in the first sequence's row
      rows.at(0).at(7) = std::nanf("");
    return rows;
  }
  std::string broken() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }
  /// From now on the model is broken for `why` (steps throw, broken() says it).
  void set_broken(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = why;
  }
  /// Makes the next step's first logits row hold a NaN.
  void poison_next_step() { poison_once_ = true; }
  void set_open(bool open) {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = open;
    cv_.notify_all();
  }
  /// Waits until a step is held at the closed gate.
  void wait_blocked() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return blocked_ > 0; });
  }
  /// Makes the next step throw.
  void fail_next_step() { fail_once_ = true; }
  /// Lets one step through the closed gate.
  void release_one() {
    std::lock_guard<std::mutex> lock(mu_);
    ++passes_;
    cv_.notify_all();
  }
  /// Waits until `n` steps have reached the gate in all.
  void wait_entered(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return entered_ >= n; });
  }

private:
  engine::CpuModel inner_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  int blocked_ = 0, entered_ = 0, passes_ = 0;
  std::string broken_;
  std::atomic<bool> fail_once_{false};
  std::atomic<bool> poison_once_{false};
};

/// An in-process server on a free port over the tiny model.
struct TinyServer {
  GatedModel model;
  server::Server server;
  int port = 0;
  explicit TinyServer(server::ServeOptions opt = {}, int64_t rows = 2, int64_t max_seq = 160)
      : model(rows, max_seq), server([&] {
          opt.log_requests = false;
          return opt;
        }()) {
    port = server.listen("127.0.0.1", 0);
    auto data = data_dir();
    REQUIRE(data.has_value());
    server.attach(model, models::Tokenizer::load(*data / "o200k_base.tiktoken"));
  }
  ~TinyServer() {
    model.set_open(true);
    server.drain(std::chrono::milliseconds(0));
  }
  HttpResponse post(const std::string& path, const std::string& body,
                    const std::string& headers = "") {
    return http(port, "POST", path, body, headers);
  }
};

inline const std::string kChat = R"({"model": "gpt-oss", "messages": [{"role": "user",
  "content": "Hi"}], "max_tokens": 6, "temperature": 0})";

/// The error object of an OpenAI error body (each of its four fields present).
inline nlohmann::json error_of(const HttpResponse& r) {
  nlohmann::json j = nlohmann::json::parse(r.body);
  REQUIRE(j.contains("error"));
  for (const char* k : {"message", "type", "param", "code"})
    CHECK(j["error"].contains(k));
  return j["error"];
}

/// The whole text of `file`.
inline std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// `xserv serve PLAN --port 0 --backend cpu --tokenizer T ARGS...` in a child process (stderr to
/// `log`, environment assignments `env` added): its pid and port once it says it is ready.
inline std::pair<pid_t, int> serve_process(const std::filesystem::path& plan,
                                           const std::filesystem::path& log,
                                           const std::filesystem::path& tokenizer,
                                           std::vector<std::string> args = {},
                                           const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv = {XSERV_BINARY, "serve", plan.string(), "--port",          "0",
                                   "--backend",  "cpu",   "--tokenizer", tokenizer.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    FILE* f = std::freopen(log.c_str(), "w", stderr);
    (void)f;
    for (const std::string& e : env)
      ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> c;
    for (std::string& a : argv)
      c.push_back(a.data());
    c.push_back(nullptr);
    execv(XSERV_BINARY, c.data());
    std::_Exit(127);
  }
  int port = 0;
  REQUIRE(eventually([&] {
    const std::string text = read_text(log);
    const size_t at = text.find("[serve] ready: model 'gpt-oss' at http://127.0.0.1:");
    if (at == std::string::npos)
      return false;
    port = std::stoi(text.substr(at + 51));
    return true;
  }));
  return {pid, port};
}

/// Waits up to `limit` for child `pid` to exit; its exit status, or -1 when it did not exit
/// (then it is killed) or ended on a signal.
inline int wait_exit(pid_t pid, std::chrono::milliseconds limit) {
  int status = 0;
  const bool exited = eventually([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, limit);
  if (!exited) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

} // namespace xserv::testing
