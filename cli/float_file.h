// A file of raw float32 values (`xserv run --logits-out`, `xserv trace`) that is written whole or
// not at all: no partial file is left that looks like a result.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "base/error.h"

namespace xserv::cli {

/// Opens `path` for writing (Error "PREFIXcannot write PATH: REASON"); write() appends floats,
/// commit() closes it. Destroyed without a successful commit() (an error on the way), the file
/// is removed.
class FloatFile {
public:
  FloatFile(std::string path, std::string prefix)
      : path_(std::move(path)), prefix_(std::move(prefix)), f_(std::fopen(path_.c_str(), "wb")) {
    if (!f_)
      throw Error(fmt::format("{}cannot write {}: {}", prefix_, path_, std::strerror(errno)));
  }
  FloatFile(const FloatFile&) = delete;
  FloatFile& operator=(const FloatFile&) = delete;
  ~FloatFile() {
    if (f_) {
      std::fclose(f_);
      std::remove(path_.c_str());
    }
  }

  void write(const float* values, size_t n) {
    if (std::fwrite(values, sizeof(float), n, f_) != n)
      throw Error(fmt::format("{}writing {} failed", prefix_, path_));
  }

  void commit() {
    std::FILE* f = f_;
    f_ = nullptr;
    if (std::fclose(f) != 0) {
      std::remove(path_.c_str());
      throw Error(fmt::format("{}writing {} failed", prefix_, path_));
    }
  }

  /// Removes the committed file too (a result whose companion could not be written).
  void discard() const { std::remove(path_.c_str()); }

private:
  std::string path_, prefix_;
  std::FILE* f_;
};

} // namespace xserv::cli
