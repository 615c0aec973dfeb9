// Pipelined plans on the CPU backend: one process per stage (xserv run spawns `xserv worker`s, or
// they are started by hand with --coordinator), the same tokens as the whole model, a handshake
// that refuses another compile's plan or token, a dead or hung rank ending the run with its name,
// and forged frames (the test in a rank's place) refused against the plan's stage boundaries.
#include <doctest/doctest.h>

#include <csignal>
#include <cstring>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/pipeline/coordinator.h"
#include "engine/pipeline/stage.h"
#include "engine/pipeline/wire.h"
#include "runtime/net.h"
#include "runtime/plan_io.h"
#include "tests/run_xserv.h"
#include "tests/test_util.h"

using xserv::testing::read_floats;
using xserv::testing::run_shell;
using xserv::testing::run_xserv;
using xserv::testing::RunResult;
namespace fs = std::filesystem;

namespace {

/// The digest every rank of the pipelined plan in `plan` agrees on.
std::string plan_digest(const std::string& plan) {
  return xserv::engine::pipeline::pipeline_plan_digest(
      {plan, {}, std::make_shared<const xserv::runtime::Plan>(xserv::runtime::read_plan(plan))});
}

/// A tiny checkpoint with plans for pp 1 and 2 (and a pp 2 plan of another compile).
struct Plans {
  xserv::testing::TempDir tmp{"pipeline"};
  std::string model = (tmp.path / "model").string();
  std::string pp1 = (tmp.path / "pp1").string(), pp2 = (tmp.path / "pp2").string();
  std::string other = (tmp.path / "pp2_other").string();
  Plans() {
    REQUIRE(run_xserv("synth --config " +
                      (xserv::testing::source_dir() / "examples/tiny/config.json").string() +
                      " -o " + model + " --seed 3")
                .code == 0);
    REQUIRE(run_xserv(fmt::format("compile {} -o {} --no-cubins", model, pp1)).code == 0);
    REQUIRE(run_xserv(fmt::format("compile {} -o {} --pp 2 --no-cubins", model, pp2)).code == 0);
    REQUIRE(
        run_xserv(fmt::format("compile {} -o {} --pp 2 --max-seq 2048 --no-cubins", model, other))
            .code == 0);
  }
};

const char* kPrompt = " --backend cpu --prompt-ids 5,6,7,8,9 --max-tokens 5";

std::string read_file(const fs::path& f) {
  std::ifstream in(f);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// `xserv ARGS` with environment assignments `env` in front; stderr kept apart.
RunResult run_with_env(const std::string& env, const std::string& args, const fs::path& dir) {
  return xserv::testing::run_binary(XSERV_BINARY, args, dir, env);
}

} // namespace

TEST_CASE("pipelined plan, one process per stage: the tokens of the whole model") {
  Plans p;
  RunResult whole = run_xserv("run " + p.pp1 + kPrompt, "", true);
  RunResult ranks = run_xserv("run " + p.pp2 + kPrompt, "", true);
  RunResult local = run_xserv("run " + p.pp2 + kPrompt + " --pp-local", "", true);
  REQUIRE(whole.code == 0);
  REQUIRE(ranks.code == 0);
  REQUIRE(local.code == 0);
  CHECK(!whole.out.empty());
  CHECK(ranks.out == whole.out);
  CHECK(local.out == whole.out);
  CHECK(ranks.err.find("[pipeline] 2 ranks ready") != std::string::npos);
  CHECK(local.err.find("run one after another in this process") != std::string::npos);
}

TEST_CASE("run --logits-out: each step's logits, the pipeline's equal the whole model's") {
  Plans p;
  const fs::path f1 = p.tmp.path / "pp1.f32", f2 = p.tmp.path / "pp2.f32";
  RunResult whole = run_xserv("run " + p.pp1 + kPrompt + " --logits-out " + f1.string(), "", true);
  RunResult ranks = run_xserv("run " + p.pp2 + kPrompt + " --logits-out " + f2.string(), "", true);
  RunResult plain = run_xserv("run " + p.pp1 + kPrompt, "", true);
  REQUIRE(whole.code == 0);
  REQUIRE(ranks.code == 0);
  CHECK(whole.out == plain.out); // greedy on the host picks what the engine's greedy path picks
  CHECK(whole.err.find("[run] 5 logits rows of 201088 float32 values in") != std::string::npos);
  const std::vector<float> a = read_floats(f1), b = read_floats(f2);
  REQUIRE(a.size() == size_t(5) * 201088);
  CHECK(a == b); // the CPU interpreter's stages chain bit for bit
  // Each row's arg-max (lowest id on ties) is the token generated at that step.
  std::vector<std::string> ids;
  std::string cur;
  for (char c : whole.out + ",")
    if (c == ',' || c == '\n') {
      if (!cur.empty())
        ids.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  REQUIRE(ids.size() == 5);
  for (size_t r = 0; r < 5; ++r) {
    const auto row = a.begin() + static_cast<std::ptrdiff_t>(r * 201088);
    const auto best = std::max_element(row, row + 201088) - row;
    CHECK(std::to_string(best) == ids[r]);
  }
  RunResult text =
      run_xserv("run " + p.pp1 + " --backend cpu --prompt hi --logits-out x.f32", "", true);
  CHECK(text.code == 2);
  CHECK(text.err.find("--logits-out goes with --prompt-ids") != std::string::npos);
}

TEST_CASE("pipelined plan: a rank holding another compile's plan is refused at the handshake") {
  Plans p;
  // A port held bound for the test (no fixed number): rank 0's listener takes it over.
  xserv::testing::ReservedPort held;
  REQUIRE(held.port != 0);
  const int port = held.port;
  const fs::path log0 = p.tmp.path / "rank0.log";
  // Rank 0 waits for its worker; the worker (whose connect retries until rank 0 listens) brings
  // a plan compiled with other options.
  RunResult w = run_shell(fmt::format(
      "export XSERV_PIPELINE_TOKEN=test-secret; "
      "({x} run {plan} {prompt} --coordinator 127.0.0.1:{port} --world 2 > {log} 2>&1; "
      "echo rc=$? >> {log}) & {x} worker {other} --rank 1 --world 2 "
      "--coordinator 127.0.0.1:{port} 2>&1; echo worker_rc=$?; wait",
      fmt::arg("x", XSERV_BINARY), fmt::arg("plan", p.pp2), fmt::arg("prompt", kPrompt),
      fmt::arg("port", port), fmt::arg("log", log0.string()), fmt::arg("other", p.other)));
  CHECK(w.out.find("refused by rank 0: rank 1 holds a plan from another compile") !=
        std::string::npos);
  CHECK(w.out.find("worker_rc=1") != std::string::npos);
  const std::string r0 = read_file(log0);
  CHECK(r0.find("pipeline handshake: rank 1 holds a plan from another compile") !=
        std::string::npos);
  CHECK(r0.find("rc=1") != std::string::npos);
}

TEST_CASE("pipelined plan, micro-batches: a batch of prompts gives the whole model's outputs") {
  // eval decodes 3 problems together: the prefill step and every decode step are cut into
  // micro-batches (3 per step with XSERV_PIPELINE_MICROBATCHES=3; pieces of one sequence cross
  // micro-batches during the prefill), so the two ranks work on different ones at once.
  XSERV_REQUIRE_DATA(data);
  Plans p;
  const std::string args = " --task gsm8k --data " + (data / "gsm8k_test.jsonl").string() +
                           " --limit 3 --batch 3 --max-tokens 6 --backend cpu --tokenizer " +
                           (data / "o200k_base.tiktoken").string() + " --out ";
  const fs::path whole = p.tmp.path / "whole.jsonl", ranks = p.tmp.path / "ranks.jsonl";
  const fs::path autom = p.tmp.path / "auto.jsonl";
  REQUIRE(run_with_env("", "eval " + p.pp1 + args + whole.string(), p.tmp.path).code == 0);
  const RunResult r = run_with_env("XSERV_PIPELINE_MICROBATCHES=3",
                                   "eval " + p.pp2 + args + ranks.string(), p.tmp.path);
  INFO(r.err);
  REQUIRE(r.code == 0);
  REQUIRE(run_with_env("", "eval " + p.pp2 + args + autom.string(), p.tmp.path).code == 0);
  // Each line has the problem, the generated tokens and text, and its timing: all but the
  // timing must agree.
  auto outputs = [](const fs::path& f) {
    std::string all;
    std::ifstream in(f);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      all += j.at("completion").dump() + j.at("tokens").dump() + "\n";
    }
    return all;
  };
  CHECK(!outputs(whole).empty());
  CHECK(outputs(ranks) == outputs(whole));
  CHECK(outputs(autom) == outputs(whole));
}

TEST_CASE("pipelined plan: the NCCL transport is for the CUDA backend, a bad transport name") {
  Plans p;
  RunResult cpu =
      run_with_env("XSERV_PIPELINE_TRANSPORT=nccl", "run " + p.pp2 + kPrompt, p.tmp.path);
  CHECK(cpu.code == 1);
  CHECK(cpu.err.find("NCCL transport") != std::string::npos);
  CHECK(cpu.err.find("--backend cuda") != std::string::npos);
  RunResult bad =
      run_with_env("XSERV_PIPELINE_TRANSPORT=carrier-pigeon", "run " + p.pp2 + kPrompt, p.tmp.path);
  CHECK(bad.code == 2);
  CHECK(bad.err.find("XSERV_PIPELINE_TRANSPORT must be auto, tcp or nccl") != std::string::npos);
}

TEST_CASE("pipelined plan: a worker that dies or hangs ends the run with its rank named") {
  // Not timed here (no wall-clock assertions in unit tests): a run that never ended would hit
  // ctest's timeout, and XSERV_PIPELINE_TIMEOUT=2 below bounds the hung case.
  Plans p;
  RunResult dead =
      run_with_env("XSERV_PIPELINE_FAULT=1:exit@2", "run " + p.pp2 + kPrompt, p.tmp.path);
  CHECK(dead.code == 1);
  CHECK(dead.err.find("pipeline rank 1 (pid") != std::string::npos);
  CHECK(dead.err.find("exited with status 3") != std::string::npos);

  RunResult hung = run_with_env("XSERV_PIPELINE_FAULT=1:hang@1 XSERV_PIPELINE_TIMEOUT=2",
                                "run " + p.pp2 + kPrompt, p.tmp.path);
  CHECK(hung.code == 1);
  CHECK(hung.err.find("pipeline rank 1 stopped") != std::string::npos);
  CHECK(hung.err.find("sent nothing for 2 s") != std::string::npos);
}

TEST_CASE("pipelined plan: a rank that only sends heartbeats ends the run at the step deadline") {
  Plans p;
  RunResult stalled = run_with_env("XSERV_PIPELINE_FAULT=1:stall@1 XSERV_PIPELINE_TIMEOUT=2 "
                                   "XSERV_PIPELINE_STEP_TIMEOUT=4",
                                   "run " + p.pp2 + kPrompt, p.tmp.path);
  CHECK(stalled.code == 1);
  CHECK(stalled.err.find("pipeline rank 1 stopped: no result within the step deadline of 4 s") !=
        std::string::npos);
}

namespace {

/// `xserv run PLAN --coordinator 127.0.0.1:0 --world N` in the background (XSERV_PIPELINE_TOKEN
/// `token`, `extra` arguments), its output in `log`; port() waits for the port it listens on, as
/// it reports.
struct Rank0 {
  pid_t pid = -1;
  fs::path log;
  Rank0(const std::string& plan, const fs::path& log_file, const std::string& token,
        const std::string& extra = "", int world = 2) {
    log = log_file;
    const std::string cmd =
        fmt::format("XSERV_PIPELINE_TOKEN={} exec {} run {} {} {} "
                    "--coordinator 127.0.0.1:0 --world {} > {} 2>&1",
                    token, XSERV_BINARY, plan, kPrompt, extra, world, log.string());
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  int port() const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) { // rank 0 logs its port, then waits
      const std::string text = read_file(log);
      if (const size_t at = text.find(" on port ");
          at != std::string::npos && text.find('\n', at) != std::string::npos)
        return std::stoi(text.substr(at + 9));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    FAIL("rank 0 never reported its port: " << read_file(log));
    return 0;
  }
  int wait() {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ~Rank0() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

/// Whether 127.0.0.1:`port` (and no other address) is listening, per /proc/net/tcp.
bool listens_on_loopback_only(int port) {
  std::ifstream in("/proc/net/tcp");
  const std::string want_port = fmt::format(":{:04X}", port);
  bool loopback = false, other = false;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ss(line);
    std::string slot, local, remote, state;
    ss >> slot >> local >> remote >> state;
    if (state != "0A" || local.size() < 13 || local.substr(8) != want_port)
      continue;
    (local.substr(0, 8) == "0100007F" ? loopback : other) = true;
  }
  return loopback && !other;
}

} // namespace

TEST_CASE("pipelined plan: stray, garbage and unauthenticated peers are dropped, never fatal") {
  using xserv::runtime::Connection;
  namespace wire = xserv::engine::pipeline::wire;
  Plans p;
  Rank0 r0(p.pp2, p.tmp.path / "rank0.log", "right-secret");
  const int port = r0.port();
  CHECK(listens_on_loopback_only(port)); // --coordinator 127.0.0.1:0, not 0.0.0.0
  const std::string address = fmt::format("127.0.0.1:{}", port);
  auto connect = [&] {
    return Connection::connect(address,
                               std::chrono::steady_clock::now() + std::chrono::seconds(10));
  };
  { // closed at once
    Connection c = connect();
  }
  { // garbage instead of a frame
    Connection c = connect();
    CHECK(c.receive(std::chrono::seconds(10)).type == wire::kChallenge);
    const std::string junk = "GET / HTTP/1.0\r\n\r\n";
    REQUIRE(::write(c.fd_for_tests(), junk.data(), junk.size()) == ssize_t(junk.size()));
    CHECK_THROWS_AS(c.receive(std::chrono::seconds(10)), xserv::Error); // closed or reset
  }
  { // a frame header announcing 2 GiB: refused before anything is allocated
    Connection c = connect();
    CHECK(c.receive(std::chrono::seconds(10)).type == wire::kChallenge);
    char head[13];
    const uint32_t magic = 0x46505358;
    const uint64_t len = uint64_t{1} << 31;
    std::memcpy(head, &magic, 4);
    head[4] = wire::kHello;
    std::memcpy(head + 5, &len, 8);
    REQUIRE(::write(c.fd_for_tests(), head, sizeof(head)) == ssize_t(sizeof(head)));
    CHECK_THROWS_AS(c.receive(std::chrono::seconds(10)), xserv::Error);
  }
  { // a well-formed hello under another token: told why, then dropped
    Connection c = connect();
    const xserv::runtime::Frame ch = c.receive(std::chrono::seconds(10));
    REQUIRE(ch.type == wire::kChallenge);
    const std::string nonce = wire::decode(ch.payload, nullptr)["nonce"];
    const std::string digest = plan_digest(p.pp2);
    c.send(wire::message(
        wire::kHello, {{"rank", 1},
                       {"world", 2},
                       {"digest", digest},
                       {"nonce", "00"},
                       {"proof", wire::hello_proof("wrong-secret", nonce, 1, 2, digest, "00")}}));
    const xserv::runtime::Frame f = c.receive(std::chrono::seconds(10));
    CHECK(f.type == wire::kFail);
    CHECK(wire::decode(f.payload, nullptr)["message"].get<std::string>().find(
              "authentication failed") != std::string::npos);
  }
  // A worker without the token is refused; one with it completes the run.
  RunResult bad = run_shell(fmt::format("XSERV_PIPELINE_TOKEN=nope {} worker {} --rank 1 --world 2 "
                                        "--coordinator {} 2>&1",
                                        XSERV_BINARY, p.pp2, address));
  CHECK(bad.code == 1);
  CHECK(bad.out.find("refused by rank 0: authentication failed") != std::string::npos);
  RunResult good = run_shell(fmt::format("XSERV_PIPELINE_TOKEN=right-secret {} worker {} --rank 1 "
                                         "--world 2 --coordinator {} 2>&1",
                                         XSERV_BINARY, p.pp2, address));
  CHECK(good.code == 0);
  CHECK(r0.wait() == 0);
  const std::string log = read_file(r0.log);
  size_t dropped = 0; // closed at once, garbage, 2 GiB, wrong proof, worker without the token
  for (size_t at = 0;
       (at = log.find("dropped a connection from 127.0.0.1", at)) != std::string::npos; ++at)
    ++dropped;
  CHECK(dropped == 5);
  CHECK(log.find("malformed frame") != std::string::npos);
  CHECK(log.find("announced a frame of 2147483648 bytes") != std::string::npos);
  CHECK(log.find("claims rank 1 but does not hold the pipeline token") != std::string::npos);
  const std::string whole = run_xserv("run " + p.pp1 + kPrompt, "", true).out;
  CHECK(log.find(whole.substr(0, whole.find('\n'))) != std::string::npos); // same tokens
}

TEST_CASE("pipelined plan: idle strays do not use up the connect window (7 and 50 of them)") {
  // Handshakes run side by side, each under its own 5 s deadline: strays that connect and
  // never send (one after another they would take 5 s each of the 30 s window) do not hold
  // the rank that comes after them.
  using xserv::runtime::Connection;
  Plans p;
  for (const int strays : {7, 50}) {
    INFO(strays);
    Rank0 r0(p.pp2, p.tmp.path / fmt::format("strays{}.log", strays), "right-secret");
    const std::string address = fmt::format("127.0.0.1:{}", r0.port());
    std::vector<Connection> idle;
    for (int i = 0; i < strays; ++i)
      idle.push_back(Connection::connect(address, std::chrono::steady_clock::now() +
                                                      std::chrono::seconds(10)));
    const auto t0 = std::chrono::steady_clock::now();
    RunResult good = run_shell(fmt::format("XSERV_PIPELINE_TOKEN=right-secret {} worker {} --rank "
                                           "1 --world 2 --coordinator {} 2>&1",
                                           XSERV_BINARY, p.pp2, address));
    CHECK(good.code == 0);
    CHECK(r0.wait() == 0);
    // Not a timing bound: one stray's deadline is 5 s, 7 in a row would be 35.
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
    const std::string log = read_file(r0.log);
    CHECK(log.find("[pipeline] 2 ranks ready") != std::string::npos);
    CHECK(log.find("rank(s) connected within") == std::string::npos);
  }
}

TEST_CASE("pipelined plan: --coordinator without a pipeline token is a usage error") {
  Plans p;
  RunResult r = run_shell(fmt::format("env -u XSERV_PIPELINE_TOKEN {} run {} {} --coordinator "
                                      "127.0.0.1:0 --world 2 2>&1",
                                      XSERV_BINARY, p.pp2, kPrompt));
  CHECK(r.code == 2);
  CHECK(r.out.find("neither --pipeline-token nor XSERV_PIPELINE_TOKEN is set") !=
        std::string::npos);
}

TEST_CASE("pipelined plan: a frozen rank 0 ends the workers' runs, naming rank 0") {
  Plans p;
  const fs::path log = p.tmp.path / "frozen.log";
  // Rank 0 stops itself (SIGSTOP, every thread) at step 1; its spawned worker shares the log.
  const std::string cmd = fmt::format(
      "XSERV_PIPELINE_FAULT=0:stop@1 XSERV_PIPELINE_TIMEOUT=2 exec {} run {} {} > {} 2>&1",
      XSERV_BINARY, p.pp2, kPrompt, log.string());
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const std::string want = "rank 1: rank 0 (127.0.0.1:";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string text;
  while (std::chrono::steady_clock::now() < deadline &&
         (text = read_file(log)).find(want) == std::string::npos)
    std::this_thread::sleep_for(std::chrono::milliseconds(50)); // waits for the worker's exit
  ::kill(pid, SIGKILL); // rank 0 is stopped: nothing else would end it
  ::waitpid(pid, nullptr, 0);
  CHECK(text.find(want) != std::string::npos);
  CHECK(text.find("stopped: 127.0.0.1:") != std::string::npos);
  CHECK(text.find("sent nothing for 2 s") != std::string::npos);
}

TEST_CASE("pipelined plan: a result of the wrong shape or outside the vocabulary is refused") {
  Plans p;
  // Greedy steps bring ids back; --logits-out steps every logit.
  RunResult ids =
      run_with_env("XSERV_PIPELINE_FAULT=1:narrow@0", "run " + p.pp2 + kPrompt, p.tmp.path);
  CHECK(ids.code == 1);
  CHECK(ids.err.find("pipeline rank 1 sent a malformed result: id 1073741824 is outside the "
                     "vocabulary of 201088") != std::string::npos);
  RunResult rows = run_with_env(
      "XSERV_PIPELINE_FAULT=1:narrow@0",
      "run " + p.pp2 + kPrompt + " --logits-out " + (p.tmp.path / "l.f32").string(), p.tmp.path);
  CHECK(rows.code == 1);
  CHECK(rows.err.find("pipeline rank 1 sent a malformed result: expected one float logits "
                      "tensor of [1 or ") != std::string::npos); // tokens of the micro-batch
  CHECK(rows.err.find(", 201088]") != std::string::npos);
}

TEST_CASE("pipelined plan: --pipeline-token takes precedence over XSERV_PIPELINE_TOKEN") {
  Plans p;
  // Rank 0's environment holds one secret, its flag another: the flag's is the one asked for.
  Rank0 r0(p.pp2, p.tmp.path / "rank0.log", "env-secret", "--pipeline-token flag-secret");
  const std::string address = fmt::format("127.0.0.1:{}", r0.port());
  RunResult env_only =
      run_shell(fmt::format("XSERV_PIPELINE_TOKEN=env-secret {} worker {} --rank 1 "
                            "--world 2 --coordinator {} 2>&1",
                            XSERV_BINARY, p.pp2, address));
  CHECK(env_only.code == 1);
  CHECK(env_only.out.find("refused by rank 0: authentication failed") != std::string::npos);
  // The worker's flag wins over its own (wrong) environment too.
  RunResult flag = run_shell(fmt::format("XSERV_PIPELINE_TOKEN=env-secret {} worker {} --rank 1 "
                                         "--world 2 --coordinator {} --pipeline-token flag-secret "
                                         "2>&1",
                                         XSERV_BINARY, p.pp2, address));
  CHECK(flag.code == 0);
  CHECK(r0.wait() == 0);
  // Without the variable the flag alone is enough, and an empty one is a usage error.
  RunResult empty = run_shell(fmt::format("env -u XSERV_PIPELINE_TOKEN {} run {} {} --coordinator "
                                          "127.0.0.1:0 --world 2 --pipeline-token '' 2>&1",
                                          XSERV_BINARY, p.pp2, kPrompt));
  CHECK(empty.code == 2);
  CHECK(empty.out.find("--pipeline-token is empty") != std::string::npos);
  for (const char* cmd : {"run", "chat", "bench", "eval", "serve", "worker"}) {
    RunResult help = run_xserv(std::string(cmd) + " --help", "", true);
    INFO(cmd);
    CHECK(help.out.find("--pipeline-token TOKEN") != std::string::npos);
  }
}

namespace {

/// The test in rank 0's place for a real `xserv worker` (rank 1 of 2, CPU backend): the
/// handshake done with the token, the worker's stage loaded; send() forges what rank 0 sends.
struct FakeRank0 {
  xserv::runtime::Listener listener{"127.0.0.1", 0};
  pid_t pid = -1;
  xserv::runtime::Connection c;
  FakeRank0(const std::string& plan, const fs::path& log) {
    namespace wire = xserv::engine::pipeline::wire;
    const std::string cmd =
        fmt::format("exec {} worker {} --rank 1 --world 2 --coordinator 127.0.0.1:{} "
                    "--pipeline-token forge-secret > {} 2>&1",
                    XSERV_BINARY, plan, listener.port(), log.string());
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    c = listener.accept(std::chrono::steady_clock::now() + std::chrono::seconds(60));
    c.send(wire::message(wire::kChallenge, {{"nonce", "c0ffee"}}));
    const xserv::runtime::Frame hello = c.receive(std::chrono::seconds(30));
    REQUIRE(hello.type == wire::kHello);
    const nlohmann::json h = wire::decode(hello.payload, nullptr);
    CHECK(h["proof"] == wire::hello_proof("forge-secret", "c0ffee", 1, 2, h["digest"], h["nonce"]));
    c.send(wire::message(wire::kWelcome,
                         {{"ok", true},
                          {"backend", "cpu"},
                          {"max_batch", 2},
                          {"max_seq", 64},
                          {"proof", wire::welcome_proof("forge-secret", h["nonce"], 1)}}));
    REQUIRE(next().type == wire::kReady);
  }
  /// The next frame that is not a heartbeat.
  xserv::runtime::Frame next() {
    for (;;) {
      xserv::runtime::Frame f = c.receive(std::chrono::seconds(60));
      if (f.type != xserv::engine::pipeline::wire::kAlive)
        return f;
    }
  }
  /// The worker's exit status.
  int wait() {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ~FakeRank0() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

/// A plan's stage program `s`, parsed.
xserv::ir::Graph stage_program(const std::string& plan, size_t s) {
  return xserv::ir::parse_file(fs::path(plan) / xserv::runtime::read_plan(plan).stages.at(s).graph,
                               "stage");
}

} // namespace

TEST_CASE("pipelined plan: a worker refuses forged activations of the wrong shape, by name") {
  namespace wire = xserv::engine::pipeline::wire;
  using xserv::ir::DType;
  using xserv::ir::Tensor;
  Plans p;
  // What stage 1 receives for a step of 3 tokens, from its program in the plan.
  const auto want = xserv::engine::pipeline::stage_receives(stage_program(p.pp2, 1), 3);
  REQUIRE(want.size() == 1);
  REQUIRE(want[0].shape.size() == 2);
  const std::string name = want[0].name;
  const int64_t width = want[0].shape[1];
  xserv::models::StepInput step;
  step.tokens = {{5, 6, 7}};
  step.ctx_lens = {0};
  step.block_tables = {{0}};
  step.window_tables = {{0}};
  const std::string carries = fmt::format("the plan's stage boundary carries f32[3, {}]", width);
  struct Forgery {
    const char* what;
    xserv::models::StepInput in;
    xserv::engine::pipeline::Named tensors;
    std::string message; ///< what the worker answers, in its kFail frame and on stderr
  };
  xserv::models::StepInput bad_row = step;
  bad_row.block_tables = {{99999999}};
  const std::vector<Forgery> forgeries = {
      {"one token's activation in a step of 3",
       step,
       {{name, Tensor::zeros(DType::F32, {1, width})}},
       fmt::format("pipeline rank 0 sent activation '{}' as f32[1, {}]; {}", name, width, carries)},
      {"a wider row",
       step,
       {{name, Tensor::zeros(DType::F32, {3, width + 1})}},
       fmt::format("as f32[3, {}]; {}", width + 1, carries)},
      {"integers",
       step,
       {{name, Tensor::zeros(DType::I32, {3, width})}},
       fmt::format("as i32[3, {}]; {}", width, carries)},
      {"nothing", step, {}, fmt::format("pipeline rank 0 did not send activation '{}'", name)},
      {"a KV block outside the worker's pool",
       bad_row,
       {{name, Tensor::zeros(DType::F32, {3, width})}},
       "sequence 0: positions 0..15 need full-attention block 0, which is block 99999999 (the "
       "pool has"},
  };
  for (const Forgery& f : forgeries) {
    INFO(f.what);
    const fs::path log = p.tmp.path / "worker.log";
    FakeRank0 r0(p.pp2, log);
    r0.c.send(wire::message(wire::kStep, wire::step_header(f.in, 0, false), f.tensors));
    const xserv::runtime::Frame answer = r0.next();
    REQUIRE(answer.type == wire::kFail);
    CHECK(wire::decode(answer.payload, nullptr)["message"].get<std::string>().find(f.message) !=
          std::string::npos);
    CHECK(r0.wait() == 1);
    CHECK(read_file(log).find(f.message) != std::string::npos);
  }
}

TEST_CASE("pipelined plan: rank 0 refuses a forged intermediate activation before relaying it") {
  namespace wire = xserv::engine::pipeline::wire;
  using xserv::runtime::Connection;
  // Three stages need three layers: the tiny config with one more.
  xserv::testing::TempDir tmp("pipeline3");
  nlohmann::json cfg =
      nlohmann::json::parse(read_file(xserv::testing::source_dir() / "examples/tiny/config.json"));
  cfg["num_hidden_layers"] = 3;
  cfg["layer_types"].push_back("sliding_attention");
  { std::ofstream(tmp.path / "config.json") << cfg.dump(); }
  const std::string model = (tmp.path / "model").string(), plan = (tmp.path / "pp3").string();
  REQUIRE(run_xserv("synth --config " + (tmp.path / "config.json").string() + " -o " + model +
                    " --seed 3")
              .code == 0);
  REQUIRE(run_xserv(fmt::format("compile {} -o {} --pp 3 --max-batch 2 --max-seq 64 --no-cubins",
                                model, plan))
              .code == 0);
  const auto sends = xserv::engine::pipeline::stage_sends(stage_program(plan, 1), 5);
  REQUIRE(sends.size() == 1);
  const int64_t width = sends[0].shape.at(1);

  Rank0 r0(plan, tmp.path / "rank0.log", "three-secret", "", 3);
  const std::string address = fmt::format("127.0.0.1:{}", r0.port());
  const std::string digest = plan_digest(plan);
  // Joins as `rank` with the token and reports its stage loaded.
  auto join = [&](int rank) {
    Connection c =
        Connection::connect(address, std::chrono::steady_clock::now() + std::chrono::seconds(10));
    const xserv::runtime::Frame ch = c.receive(std::chrono::seconds(10));
    REQUIRE(ch.type == wire::kChallenge);
    const std::string challenge = wire::decode(ch.payload, nullptr)["nonce"];
    c.send(wire::message(wire::kHello, {{"rank", rank},
                                        {"world", 3},
                                        {"digest", digest},
                                        {"nonce", "0a"},
                                        {"proof", wire::hello_proof("three-secret", challenge, rank,
                                                                    3, digest, "0a")}}));
    REQUIRE(c.receive(std::chrono::seconds(10)).type == wire::kWelcome);
    c.send(wire::message(wire::kReady, {{"kv_blocks", 1 << 20}, {"window_blocks", 1 << 20}}));
    return c;
  };
  Connection one = join(1);
  Connection two = join(2);
  xserv::runtime::Frame f;
  do
    f = one.receive(std::chrono::seconds(60));
  while (f.type == wire::kAlive || f.type == wire::kReset); // the engine resets at its start
  REQUIRE(f.type == wire::kStep);
  CHECK(wire::step_from_header(wire::decode(f.payload, nullptr)).tokens.at(0).size() == 5);
  // Rank 1 answers the 5-token step with one token's activation: rank 0 must not pass it on.
  one.send(wire::message(
      wire::kResult, nlohmann::json::object(),
      {{sends[0].name, xserv::ir::Tensor::zeros(xserv::ir::DType::F32, {1, width})}}));
  CHECK(r0.wait() == 1);
  const std::string log = read_file(r0.log);
  CHECK(log.find(fmt::format("pipeline rank 1 sent activation '{}' as f32[1, {}]; the plan's "
                             "stage boundary carries f32[5, {}] for this step",
                             sends[0].name, width, width)) != std::string::npos);
}

namespace {

/// Writes a frame header of `type` announcing `bytes` of payload on `c`, and no payload.
void send_lying_header(xserv::runtime::Connection& c, uint8_t type, uint64_t bytes) {
  char head[13];
  const uint32_t magic = 0x46505358; // "XSPF"
  std::memcpy(head, &magic, 4);
  head[4] = static_cast<char>(type);
  std::memcpy(head + 5, &bytes, 8);
  REQUIRE(::write(c.fd_for_tests(), head, sizeof(head)) == ssize_t(sizeof(head)));
}

} // namespace

TEST_CASE("pipelined plan: a frame larger than the plan allows is refused, token or not") {
  namespace wire = xserv::engine::pipeline::wire;
  using xserv::runtime::Connection;
  Plans p;
  const uint64_t gib = uint64_t{1} << 30;
  { // rank 0 -> worker: a step frame of 1 GiB against a worker of 2 rows x 64 positions
    const fs::path log = p.tmp.path / "worker.log";
    FakeRank0 r0(p.pp2, log);
    send_lying_header(r0.c, wire::kStep, gib);
    CHECK(r0.wait() == 1);
    const std::string text = read_file(log);
    CHECK(text.find("refused a frame from rank 0") != std::string::npos);
    CHECK(text.find("announced a frame of 1073741824 bytes (type 3), more than the ") !=
          std::string::npos);
  }
  // What a step frame may carry: the step's header (token ids, context lengths, both block
  // tables and block copies) and the stage's receives for 2 x 64 tokens.
  const auto recv = xserv::engine::pipeline::stage_receives(stage_program(p.pp2, 1), 128);
  const auto bound = wire::worker_frame_bound(stage_program(p.pp2, 1), 2, 64);
  CHECK(bound(wire::kStep) ==
        wire::header_bound(3 * 128 + 9 * 2, recv) + xserv::engine::pipeline::boundary_bytes(recv));
  CHECK(bound(wire::kStep) < (1 << 20));
  CHECK(bound(wire::kAlive) == wire::kMaxControlBytes);
  CHECK(bound(wire::kFail) == wire::kMaxFailBytes);

  // worker -> rank 0: a result of 1 GiB for a greedy step of one sequence (the last rank sends
  // one id back), from a peer that proved the token.
  Rank0 r0(p.pp2, p.tmp.path / "rank0.log", "lying-secret");
  const std::string address = fmt::format("127.0.0.1:{}", r0.port());
  const std::string digest = plan_digest(p.pp2);
  Connection c =
      Connection::connect(address, std::chrono::steady_clock::now() + std::chrono::seconds(10));
  const xserv::runtime::Frame ch = c.receive(std::chrono::seconds(10));
  REQUIRE(ch.type == wire::kChallenge);
  const std::string challenge = wire::decode(ch.payload, nullptr)["nonce"];
  c.send(wire::message(
      wire::kHello, {{"rank", 1},
                     {"world", 2},
                     {"digest", digest},
                     {"nonce", "0b"},
                     {"proof", wire::hello_proof("lying-secret", challenge, 1, 2, digest, "0b")}}));
  REQUIRE(c.receive(std::chrono::seconds(10)).type == wire::kWelcome);
  c.send(wire::message(wire::kReady, {{"kv_blocks", 1 << 20}, {"window_blocks", 1 << 20}}));
  xserv::runtime::Frame f;
  do
    f = c.receive(std::chrono::seconds(60));
  while (f.type == wire::kAlive || f.type == wire::kReset);
  REQUIRE(f.type == wire::kStep);
  send_lying_header(c, wire::kResult, gib);
  CHECK(r0.wait() == 1);
  const std::string log = read_file(r0.log);
  CHECK(log.find("refused a frame from pipeline rank 1: ") != std::string::npos);
  CHECK(log.find("announced a frame of 1073741824 bytes (type 4), more than the ") !=
        std::string::npos);
  xserv::models::StepInput one;
  one.tokens = {{5, 6, 7, 8, 9}};
  one.ctx_lens = {0};
  one.block_tables = {{0}};
  CHECK(wire::result_frame_bytes(one, {}, true, true, 201088) == wire::header_bound(1, {}));
  CHECK(wire::result_frame_bytes(one, {}, true, false, 201088) ==
        wire::header_bound(0, {{"out.0", xserv::ir::DType::F32, {5, 201088}}}) + 5 * 201088 * 4);
}
