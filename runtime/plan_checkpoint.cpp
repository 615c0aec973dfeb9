// config_digest, sampled_file_digest, full_file_digests and the checks: a plan's ties to its
// checkpoint.
#include "runtime/plan_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "base/error.h"
#include "runtime/sha256.h"

namespace xserv::runtime {
namespace fs = std::filesystem;

std::string config_digest(const fs::path& config_file) {
  std::ifstream in(config_file, std::ios::binary);
  if (!in)
    throw Error(fmt::format("{}: cannot read", config_file.string()));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t h = 1469598103934665603ull; // FNV-1a: cheap, and enough to notice another config
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("fnv1a64:{:016x}", h);
}

std::string sampled_file_digest(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw Error(fmt::format("{}: cannot read", file.string()));
  std::error_code ec;
  const uint64_t size = fs::file_size(file, ec);
  Sha256 h;
  h.update_field(std::to_string(size));
  std::vector<char> buf(64 << 10);
  auto take = [&](uint64_t at, size_t n) {
    in.clear();
    in.seekg(static_cast<std::streamoff>(at));
    in.read(buf.data(), static_cast<std::streamsize>(n));
    h.update_field(std::string_view(buf.data(), static_cast<size_t>(in.gcount())));
  };
  take(0, buf.size());
  constexpr uint64_t kBlock = 4096, kBlocks = 64;
  if (size > buf.size() + kBlock)
    for (uint64_t i = 0; i < kBlocks; ++i)
      take(buf.size() + (size - buf.size() - kBlock) * i / (kBlocks - 1), kBlock);
  return h.hex_digest();
}

namespace {

/// SHA-256 of one whole file, read in 8 MiB pieces.
std::string file_sha256(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw Error(fmt::format("{}: cannot read ({})", file.string(), std::strerror(errno)));
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<char> buf(8 << 20);
  Sha256 h;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw Error(fmt::format("{}: read failed ({})", file.string(), why));
    }
    if (n == 0)
      break;
    h.update(buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return h.hex_digest();
}

} // namespace

std::vector<std::string> full_file_digests(const std::vector<fs::path>& files) {
  std::vector<std::string> out(files.size());
  std::vector<std::exception_ptr> errors(files.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < files.size();) {
      try {
        out[i] = file_sha256(files[i]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  const size_t threads =
      std::min<size_t>(files.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t)
    pool.emplace_back(work);
  work();
  for (std::thread& t : pool)
    t.join();
  for (const std::exception_ptr& e : errors)
    if (e)
      std::rethrow_exception(e);
  return out;
}

WeightsVerified verify_weights(const fs::path& plan_dir, const Plan& plan,
                               const fs::path& model_dir) {
  const std::string plan_file = (plan_dir / "plan.json").string();
  const auto start = std::chrono::steady_clock::now();
  std::vector<fs::path> files;
  WeightsVerified v;
  for (size_t i = 0; i < plan.weights.size(); ++i) {
    if (plan.weights[i].sha256.empty())
      throw Error(fmt::format("{}: field 'weights[{}].sha256': missing, so --verify-weights has "
                              "nothing to check {} against: recompile the plan",
                              plan_file, i, plan.weights[i].file));
    files.push_back(model_dir / plan.weights[i].file);
    v.bytes += plan.weights[i].bytes;
  }
  const std::vector<std::string> have = full_file_digests(files);
  for (size_t i = 0; i < files.size(); ++i)
    if (have[i] != plan.weights[i].sha256)
      throw Error(fmt::format("{}: {} holds other bytes than when the plan was compiled (its "
                              "SHA-256 is {}, compile recorded {}): the checkpoint changed, "
                              "recompile the plan",
                              plan_file, files[i].string(), have[i], plan.weights[i].sha256));
  v.files = files.size();
  v.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return v;
}

void check_plan_config(const fs::path& plan_dir, const Plan& plan, const fs::path& config_file,
                       const nlohmann::json& checkpoint_config) {
  auto shown = [](const nlohmann::json* v) {
    if (!v)
      return std::string("absent");
    const std::string s = v->dump();
    return s.size() > 60 ? s.substr(0, 57) + "..." : s;
  };
  auto refuse = [&](const std::string& key, const nlohmann::json* in_plan,
                    const nlohmann::json* in_checkpoint) {
    throw Error(fmt::format("{}: field 'config.{}' is {}, but {} gives {}: plan.json was edited "
                            "or belongs to another checkpoint, recompile the plan",
                            (plan_dir / "plan.json").string(), key, shown(in_plan),
                            config_file.string(), shown(in_checkpoint)));
  };
  for (auto it = plan.config.begin(); it != plan.config.end(); ++it) {
    const auto other = checkpoint_config.find(it.key());
    if (other == checkpoint_config.end())
      refuse(it.key(), &*it, nullptr);
    else if (*other != *it)
      refuse(it.key(), &*it, &*other);
  }
  for (auto it = checkpoint_config.begin(); it != checkpoint_config.end(); ++it)
    if (!plan.config.contains(it.key()))
      refuse(it.key(), nullptr, &*it);
}

void check_checkpoint(const fs::path& plan_dir, const Plan& plan, const fs::path& model_dir) {
  const std::string plan_file = (plan_dir / "plan.json").string();
  const fs::path config = model_dir / "config.json";
  const std::string have = config_digest(config);
  if (plan.model_digest != have)
    throw Error(fmt::format("{}: the plan was compiled for another config than {} (digest {} vs "
                            "{}): recompile the plan",
                            plan_file, config.string(), plan.model_digest, have));
  for (const PlanWeightFile& w : plan.weights) {
    const fs::path file = model_dir / w.file;
    std::error_code ec;
    const uint64_t size = fs::file_size(file, ec);
    if (ec)
      throw Error(fmt::format("{}: the plan was compiled with {}, which is gone: recompile the "
                              "plan or give --weights DIR",
                              plan_file, file.string()));
    if (size != w.bytes)
      throw Error(fmt::format("{}: {} is {} bytes, but {} when the plan was compiled: the "
                              "checkpoint changed, recompile the plan",
                              plan_file, file.string(), size, w.bytes));
    if (sampled_file_digest(file) != w.sample_sha256)
      throw Error(fmt::format("{}: {} holds other bytes than when the plan was compiled (sampled "
                              "sha256): the checkpoint changed, recompile the plan",
                              plan_file, file.string()));
  }
}

} // namespace xserv::runtime
