// Safetensors parsing with the reference implementation's checks, and mmap/pread file access.
//
// The checks follow huggingface/safetensors (Rust) read_metadata + Metadata::validate:
//   1. the file has at least 8 bytes; the little-endian u64 N is <= 100 MB and 8 + N fits;
//   2. the header is UTF-8 JSON (no NUL), an object starting with '{'; "__metadata__"
//      (optional) maps strings to strings;
//   3. every other entry has a known dtype, a shape of non-negative ints, data_offsets [b, e];
//   4. sorted by offsets, each tensor starts where the previous ended (the first at 0), and
//      e - b == product(shape) * dtype bits / 8 (overflow-checked, whole bytes);
//   5. the last tensor ends exactly at the end of the file.
#include "models/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/utf8.h"

namespace xserv::models {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& source, const std::string& problem) {
  throw Error(fmt::format("{}: invalid safetensors file: {}", source, problem));
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

TensorInfo parse_entry(const std::string& name, const json& v, const std::string& source) {
  auto where = [&](const std::string& what) { return fmt::format("tensor '{}': {}", name, what); };
  if (!v.is_object())
    fail(source, where(fmt::format("entry must be an object, found {}", v.type_name())));
  TensorInfo t;
  t.name = name;
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string())
    fail(source, where("missing string field 'dtype'"));
  t.dtype = dt->get<std::string>();
  if (safetensors_dtype_bits(t.dtype) == 0)
    fail(source, where(fmt::format("unknown dtype '{}'", t.dtype)));
  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array())
    fail(source, where("missing list field 'shape'"));
  for (const json& d : *sh) {
    if (!d.is_number_unsigned())
      fail(source, where(fmt::format("shape {} must hold non-negative integers", sh->dump())));
    uint64_t x = d.get<uint64_t>();
    if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(source, where(fmt::format("dimension {} is too large", x)));
    t.shape.push_back(static_cast<int64_t>(x));
  }
  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    fail(source, where("'data_offsets' must be a list of two non-negative integers [begin, end]"));
  uint64_t b = (*off)[0].get<uint64_t>(), e = (*off)[1].get<uint64_t>();
  t.offset = b; // relative until validation makes it absolute
  t.size = e >= b ? e - b : 0;
  if (e < b)
    fail(source, where(fmt::format("data_offsets [{}, {}] end before they begin", b, e)));
  return t;
}

/// Bytes of a tensor of `shape` and `dtype`, with the reference's overflow and alignment checks.
uint64_t expected_bytes(const TensorInfo& t, const std::string& source) {
  uint64_t n = 1;
  for (int64_t d : t.shape)
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n))
      fail(source, fmt::format("tensor '{}': shape {} overflows", t.name, shape_str(t.shape)));
  uint64_t bits;
  if (__builtin_mul_overflow(n, static_cast<uint64_t>(safetensors_dtype_bits(t.dtype)), &bits))
    fail(source, fmt::format("tensor '{}': shape {} overflows", t.name, shape_str(t.shape)));
  if (bits % 8 != 0)
    fail(source,
         fmt::format("tensor '{}': {} elements of {} do not fill whole bytes", t.name, n, t.dtype));
  return bits / 8;
}

} // namespace

int safetensors_dtype_bits(std::string_view dtype) {
  static const std::pair<std::string_view, int> kBits[] = {
      {"BOOL", 8},    {"U8", 8},   {"I8", 8},   {"F8_E4M3", 8}, {"F8_E5M2", 8},
      {"F8_E8M0", 8}, {"I16", 16}, {"U16", 16}, {"F16", 16},    {"BF16", 16},
      {"I32", 32},    {"U32", 32}, {"F32", 32}, {"F64", 64},    {"I64", 64},
      {"U64", 64},    {"C64", 64}, {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6}};
  for (const auto& [name, bits] : kBits)
    if (name == dtype)
      return bits;
  return 0;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

uint64_t parse_safetensors_header_length(std::span<const uint8_t> first8, uint64_t file_size,
                                         const std::string& source) {
  if (file_size < 8 || first8.size() < 8)
    fail(source, fmt::format("file has {} bytes, fewer than the 8-byte header length", file_size));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | first8[static_cast<size_t>(i)];
  if (n > kMaxSafetensorsHeader)
    fail(source,
         fmt::format("header length {} exceeds the limit of {} bytes", n, kMaxSafetensorsHeader));
  if (n > file_size - 8)
    fail(source, fmt::format("header length {} runs past the end of the file ({} bytes): the "
                             "file is truncated",
                             n, file_size));
  return n;
}

SafetensorsHeader parse_safetensors_json(std::string_view text, uint64_t data_start,
                                         uint64_t file_size, const std::string& source) {
  if (!valid_utf8(text))
    fail(source, "header is not valid UTF-8");
  // nlohmann stops at a NUL byte, so NUL padding would pass; the reference (serde) rejects it.
  if (text.find('\0') != std::string_view::npos)
    fail(source, "header is not valid JSON (it contains a NUL byte)");
  // JSON lets a later key replace an earlier one; a tensor named twice would lose its first
  // entry's bytes to what looks like a gap, so duplicates are named instead.
  std::set<std::string> keys;
  std::string duplicate;
  json doc = json::parse(
      text.begin(), text.end(),
      [&](int depth, json::parse_event_t event, json& parsed) {
        if (event == json::parse_event_t::key && depth == 1 && duplicate.empty() &&
            !keys.insert(parsed.get<std::string>()).second)
          duplicate = parsed.get<std::string>();
        return true;
      },
      /*allow_exceptions=*/false);
  if (doc.is_discarded())
    fail(source, "header is not valid JSON");
  if (!duplicate.empty())
    fail(source, fmt::format("header names '{}' twice (a duplicate key)", duplicate));
  if (!doc.is_object())
    fail(source, fmt::format("header must be a JSON object, found {}", doc.type_name()));
  if (text.front() != '{')
    fail(source, "header must start with '{' (no leading whitespace)");
  SafetensorsHeader h;
  h.data_start = data_start;
  h.file_size = file_size;
  for (const auto& [key, value] : doc.items()) {
    if (key == "__metadata__") {
      if (value.is_null())
        continue;
      if (!value.is_object())
        fail(source, "'__metadata__' must be an object of strings");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          fail(source, fmt::format("'__metadata__.{}' must be a string, found {}", mk, mv.dump()));
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_entry(key, value, source));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::pair(a.offset, a.offset + a.size) < std::pair(b.offset, b.offset + b.size);
  });
  uint64_t data_size = file_size - data_start, end = 0;
  const TensorInfo* prev = nullptr;
  for (TensorInfo& t : h.tensors) {
    uint64_t b = t.offset, e = t.offset + t.size;
    if (b < end)
      fail(source, fmt::format("tensor '{}' data_offsets [{}, {}] overlap tensor '{}' ending at {}",
                               t.name, b, e, prev->name, end));
    if (b > end)
      fail(source, prev ? fmt::format("gap in the data: tensor '{}' starts at {} but tensor '{}' "
                                      "ends at {}",
                                      t.name, b, prev->name, end)
                        : fmt::format("gap in the data: the first tensor '{}' starts at {}, not 0",
                                      t.name, b));
    uint64_t want = expected_bytes(t, source);
    if (want != t.size)
      fail(source,
           fmt::format("tensor '{}': {} {} needs {} bytes but data_offsets [{}, {}] hold {}",
                       t.name, t.dtype, shape_str(t.shape), want, b, e, t.size));
    if (e > data_size)
      fail(source, fmt::format("tensor '{}' data_offsets [{}, {}] run past the end of the data "
                               "({} bytes): the file is truncated",
                               t.name, b, e, data_size));
    t.offset = data_start + b;
    end = e;
    prev = &t;
  }
  if (end != data_size)
    fail(source, fmt::format("the tensors end at data offset {} but the data section holds {} "
                             "bytes ({} trailing)",
                             end, data_size, data_size - end));
  return h;
}

SafetensorsHeader parse_safetensors(std::span<const uint8_t> file, const std::string& source) {
  uint64_t n = parse_safetensors_header_length(file, file.size(), source);
  std::string_view text(reinterpret_cast<const char*>(file.data()) + 8, n);
  return parse_safetensors_json(text, 8 + n, file.size(), source);
}

std::string make_safetensors_header(std::span<const TensorSpec> tensors,
                                    const std::map<std::string, std::string>& metadata) {
  json doc = json::object();
  if (!metadata.empty())
    doc["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorSpec& t : tensors) {
    TensorInfo info{t.name, t.dtype, t.shape, 0, 0};
    XSERV_CHECK(safetensors_dtype_bits(t.dtype) != 0, "unknown dtype " + t.dtype);
    uint64_t size = expected_bytes(info, "<header>");
    doc[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  std::string text = doc.dump();
  text.append((8 - text.size() % 8) % 8, ' '); // keeps tensor data 8-byte aligned
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xFF);
  return out + text;
}

namespace {

/// Closes a file descriptor on every path out of open().
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0)
      ::close(fd);
  }
};

std::string sys_error(const std::filesystem::path& path, const char* what) {
  return fmt::format("{}: cannot {}: {}", path.string(), what, std::strerror(errno));
}

void pread_all(int fd, uint8_t* out, size_t n, uint64_t offset, const std::filesystem::path& p) {
  while (n > 0) {
    ssize_t got = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      throw Error(sys_error(p, "read"));
    if (got == 0)
      throw Error(fmt::format("{}: file shrank while being read", p.string()));
    out += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

} // namespace

SafetensorsFile SafetensorsFile::read_header_only(const std::filesystem::path& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.headers_only_ = true;
  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0)
    throw Error(sys_error(path, "open safetensors file"));
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0)
    throw Error(sys_error(path, "stat"));
  if (!S_ISREG(st.st_mode))
    throw Error(fmt::format("{}: not a regular file", path.string()));
  auto size = static_cast<uint64_t>(st.st_size);
  uint8_t first8[8] = {};
  if (size >= 8)
    pread_all(fd.fd, first8, 8, 0, path);
  uint64_t n = parse_safetensors_header_length(first8, size, path.string());
  std::string text(n, '\0');
  pread_all(fd.fd, reinterpret_cast<uint8_t*>(text.data()), n, 8, path);
  f.header_ = parse_safetensors_json(text, 8 + n, size, path.string());
  for (size_t i = 0; i < f.header_.tensors.size(); ++i)
    f.index_.emplace(f.header_.tensors[i].name, i);
  return f;
}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile f = read_header_only(path);
  f.headers_only_ = false;
  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0)
    throw Error(sys_error(path, "open safetensors file"));
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0)
    throw Error(sys_error(path, "stat"));
  if (static_cast<uint64_t>(st.st_size) != f.header_.file_size)
    throw Error(fmt::format("{}: file changed size while being opened", path.string()));
  f.map_size_ = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, f.map_size_, PROT_READ, MAP_SHARED, fd.fd, 0);
  if (p == MAP_FAILED)
    throw Error(sys_error(path, "mmap"));
  f.map_ = static_cast<const uint8_t*>(p);
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)), header_(std::move(o.header_)), index_(std::move(o.index_)),
      map_(std::exchange(o.map_, nullptr)), map_size_(std::exchange(o.map_size_, 0)),
      headers_only_(o.headers_only_) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    header_ = std::move(o.header_);
    index_ = std::move(o.index_);
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    headers_only_ = o.headers_only_;
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  release();
}

void SafetensorsFile::release() noexcept {
  if (map_)
    ::munmap(const_cast<uint8_t*>(map_), map_size_);
  map_ = nullptr;
  map_size_ = 0;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

std::span<const uint8_t> SafetensorsFile::bytes(const TensorInfo& t) const {
  if (headers_only_)
    throw Error(fmt::format("{}: opened headers-only; tensor '{}' bytes are not available",
                            path_.string(), t.name));
  XSERV_CHECK(t.offset + t.size <= map_size_, "tensor outside its file: " + t.name);
  return {map_ + t.offset, static_cast<size_t>(t.size)};
}

} // namespace xserv::models
