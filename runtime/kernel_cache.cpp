// Cubin cache: NAME.cubin holds NVRTC's bytes as is; NAME.key records what they were built from.
//
// NAME.key is text, one "field value" per line: key (the request's SHA-256), cubin (SHA-256 of
// NAME.cubin, to catch a truncated or edited file), then arch, nvrtc and source for the notice
// that says why an entry is stale.
#include "runtime/kernel_cache.h"

#include "base/error.h"
#include "runtime/sha256.h"

#include <atomic>
#include <cctype>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <unistd.h>

namespace xserv::runtime {
namespace {

namespace fs = std::filesystem;

bool plain_file_name(const std::string& name) {
  if (name.empty() || name == "." || name == "..")
    return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-'))
      return false;
  return true;
}

std::optional<std::string> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad())
    return std::nullopt;
  return ss.str();
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename, so a
/// reader sees the old file or the new one, never a part.
void write_atomically(const fs::path& path, std::string_view bytes) {
  static std::atomic<unsigned> counter{0};
  fs::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw Error("cannot write the kernel cache file " + tmp.string());
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw Error("cannot move " + tmp.string() + " to " + path.string() + ": " + ec.message());
  }
}

std::map<std::string, std::string> parse_key_file(const std::string& text) {
  std::map<std::string, std::string> fields;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    auto space = line.find(' ');
    if (space != std::string::npos)
      fields[line.substr(0, space)] = line.substr(space + 1);
  }
  return fields;
}

/// Why the recorded entry does not serve the request, in a few words.
std::string stale_reason(const std::map<std::string, std::string>& old, const std::string& arch,
                         const std::string& source_digest) {
  auto get = [&](const std::string& k) {
    auto it = old.find(k);
    return it == old.end() ? std::string("?") : it->second;
  };
  if (get("arch") != arch)
    return "it was built for " + get("arch") + ", this needs " + arch;
  if (get("nvrtc") != nvrtc_version())
    return "it was built by NVRTC " + get("nvrtc") + ", this is NVRTC " + nvrtc_version();
  if (get("source") != source_digest)
    return "its source changed";
  return "its compile options or headers changed";
}

} // namespace

std::string kernel_cache_key(const std::string& source, const std::string& name,
                             const CompileOptions& opts) {
  CompileOptions keyed = opts;
  keyed.cuda_headers = false; // the path is machine-specific; its content is NVRTC-versioned
  Sha256 h;
  h.update_field("xserv kernel cache v1");
  h.update_field(name);
  h.update_field(source);
  h.update_field("nvrtc " + nvrtc_version());
  h.update_field(opts.cuda_headers ? "cuda headers" : "no cuda headers");
  for (const auto& flag : keyed.flags())
    h.update_field(flag);
  for (const auto& [include_name, text] : opts.headers) {
    h.update_field(include_name);
    h.update_field(text);
  }
  return h.hex_digest();
}

CachedCubin get_or_compile(const std::string& source, const std::string& name,
                           const CompileOptions& opts, const fs::path& cache_dir,
                           const CacheNotice& notice) {
  if (!plain_file_name(name))
    throw Error("kernel name '" + name +
                "' cannot name a cache file: use letters, digits, '_', '.' and '-'");
  CachedCubin result;
  result.key = kernel_cache_key(source, name, opts);
  if (cache_dir.empty()) { // no cache: compile every time
    CompileResult compiled = compile_cuda(source, name, opts);
    result.cubin = std::move(compiled.cubin);
    result.compiled = true;
    result.compile_ms = compiled.compile_ms;
    return result;
  }
  result.path = cache_dir / (name + ".cubin");
  const fs::path key_path = cache_dir / (name + ".key");
  const std::string source_digest = sha256_hex(source);

  // 1. A recorded entry with the same key and an intact cubin is returned as is.
  std::string why;
  if (auto key_text = read_file(key_path)) {
    auto old = parse_key_file(*key_text);
    if (old["key"] != result.key) {
      why = stale_reason(old, opts.arch, source_digest);
    } else if (auto cubin = read_file(result.path); !cubin) {
      why = "its cubin is missing";
    } else if (sha256_hex(*cubin) != old["cubin"]) {
      why = "its cubin is damaged";
    } else {
      result.cubin.assign(cubin->begin(), cubin->end());
      return result;
    }
  }
  if (!why.empty()) {
    std::string line = "xserv: recompiling kernel " + name + " (" + why + ")";
    if (notice)
      notice(line);
    else
      std::cerr << line << "\n";
  }

  // 2. Otherwise compile, then store the cubin before the key that vouches for it.
  CompileResult compiled = compile_cuda(source, name, opts);
  std::error_code ec;
  fs::create_directories(cache_dir, ec);
  if (ec)
    throw Error("cannot create the kernel cache directory " + cache_dir.string() + ": " +
                ec.message());
  std::string_view bytes(compiled.cubin.data(), compiled.cubin.size());
  write_atomically(result.path, bytes);
  write_atomically(key_path, "key " + result.key + "\ncubin " + sha256_hex(bytes) + "\narch " +
                                 opts.arch + "\nnvrtc " + nvrtc_version() + "\nsource " +
                                 source_digest + "\n");
  result.cubin = std::move(compiled.cubin);
  result.compiled = true;
  result.compile_ms = compiled.compile_ms;
  return result;
}

std::vector<CachedCubin> get_or_compile_all(const std::vector<KernelCode>& kernels,
                                            const CompileOptions& opts, const fs::path& cache_dir) {
  std::vector<std::future<CachedCubin>> jobs;
  for (const KernelCode& k : kernels)
    jobs.push_back(std::async(std::launch::async, [&k, &opts, &cache_dir] {
      return get_or_compile(k.source, k.name, opts, cache_dir);
    }));
  std::vector<CachedCubin> out;
  for (auto& j : jobs)
    j.wait(); // no job may outlive what it refers to, even when one throws
  for (auto& j : jobs)
    out.push_back(j.get());
  return out;
}

} // namespace xserv::runtime
