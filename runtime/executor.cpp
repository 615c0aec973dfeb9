// Executor: binds a launch table's symbolic arguments to device memory and replays it.
#include "runtime/executor.h"

#include <cstring>

#include <fmt/format.h>

#include "base/error.h"
#include "runtime/blas.h"

namespace xserv::runtime {

namespace {

/// The most arguments a generated kernel takes (attention_decode: 13).
constexpr size_t kMaxArgs = 24;

const void* find(const std::map<std::string, const void*>& m, const std::string& name,
                 const char* what, const PlanLaunch& l) {
  auto it = m.find(name);
  if (it == m.end())
    throw Error(fmt::format("launch table: {} '{}' (used by a {} launch) is not bound", what, name,
                            l.label));
  return it->second;
}

const void* at(const std::vector<const void*>& v, int i, const char* what, const PlanLaunch& l) {
  if (i < 0 || static_cast<size_t>(i) >= v.size())
    throw Error(fmt::format("launch table: {} {} (used by a {} launch) is not bound; there are {}",
                            what, i, l.label, v.size()));
  return v[static_cast<size_t>(i)];
}

} // namespace

Bindings placeholder_bindings(const LaunchTable& t) {
  static char placeholder[64];
  Bindings b;
  b.arena = placeholder;
  for (const PlanLaunch& l : t.launches)
    for (const LaunchArg& a : l.args) {
      if (a.kind == LaunchArg::Kind::Weight)
        b.weights[a.name] = placeholder;
      if (a.kind == LaunchArg::Kind::Param)
        b.params[a.name] = placeholder;
      if (a.kind == LaunchArg::Kind::Cache && a.index >= static_cast<int>(b.caches.size()))
        b.caches.resize(static_cast<size_t>(a.index) + 1, placeholder);
    }
  b.scratch.assign(t.scratch.size(), placeholder);
  return b;
}

Executor::Executor(LaunchTable table, const Bindings& b, std::vector<LoadedKernel> kernels)
    : table_(std::move(table)), kernels_(std::move(kernels)) {
  if (!kernels_.empty() && kernels_.size() != table_.kernels.size())
    throw Error(fmt::format("launch table has {} kernels, but {} were loaded",
                            table_.kernels.size(), kernels_.size()));
  for (size_t i = 0; i < kernels_.size(); ++i)
    if (!kernels_[i].module || !kernels_[i].kernel ||
        kernels_[i].kernel->name != table_.kernels[i].name)
      throw Error(fmt::format("launch table kernel {} is '{}', but the loaded kernel is '{}'", i,
                              table_.kernels[i].name,
                              kernels_[i].kernel ? kernels_[i].kernel->name : "missing"));
  if (table_.argmax_scratch >= static_cast<int>(table_.scratch.size()))
    throw Error(fmt::format("launch table: argmax keys in scratch buffer {}, but there are {}",
                            table_.argmax_scratch, table_.scratch.size()));
  using K = LaunchArg::Kind;
  const auto bind = [&](const PlanLaunch& l) {
    if (l.library != -1) {
      if (l.library < 0 || static_cast<size_t>(l.library) >= table_.library.size() ||
          l.kernel != -1 || l.args.size() != 3 || l.chunk != 0)
        throw Error(fmt::format("launch table: a {} launch calls library routine {} (kernel {}, "
                                "{} arguments, chunk {}); there are {} routines, and a call "
                                "takes kernel -1, 3 arguments and no chunks",
                                l.label, l.library, l.kernel, l.args.size(), l.chunk,
                                table_.library.size()));
      for (const LaunchArg& a : l.args)
        if (a.kind == K::Null || a.kind == K::Rows || a.kind == K::Splits || a.kind == K::Int)
          throw Error(fmt::format("launch table: a {} library call takes pointers only", l.label));
    } else if (l.kernel < 0 || static_cast<size_t>(l.kernel) >= table_.kernels.size()) {
      throw Error(fmt::format("launch table: a {} launch uses kernel {}, but there are {}", l.label,
                              l.kernel, table_.kernels.size()));
    }
    if (l.splits_heads < 0 || l.splits_heads > (1 << 16))
      throw Error(fmt::format("launch table: a {} launch splits over {} heads, outside 0..65536",
                              l.label, l.splits_heads));
    if (l.split_chunk < 0 || l.split_chunk % 64 != 0 || l.split_chunk > (1 << 20) ||
        (l.split_chunk > 0 && l.splits_window < 0))
      throw Error(fmt::format("launch table: a {} launch has key chunks of {}: not a multiple of "
                              "64 in 64..1048576 on a split launch",
                              l.label, l.split_chunk));
    if (l.part < 0 || l.part > 2 || (l.part != 0 && (l.library != -1 || l.seq_rows)))
      throw Error(fmt::format("launch table: a {} launch serves part {} of the step's rows: parts "
                              "are 0 (all), 1 (the decodes) and 2 (the rest), of kernels over "
                              "tokens only",
                              l.label, l.part));
    if (l.args.size() > kMaxArgs)
      throw Error(fmt::format("launch table: kernel '{}' takes {} arguments, at most {} supported",
                              table_.kernels[size_t(l.kernel)].name, l.args.size(), kMaxArgs));
    std::vector<Arg> args;
    for (const LaunchArg& a : l.args) {
      Arg r{a.kind, 0, a.row_stride, a.value};
      const void* p = nullptr;
      switch (a.kind) {
      case K::Activation:
        p = b.arena;
        break;
      case K::Weight:
        p = find(b.weights, a.name, "weight", l);
        break;
      case K::Cache:
        p = at(b.caches, a.index, "cache", l);
        break;
      case K::Param:
        p = find(b.params, a.name, "step input", l);
        break;
      case K::Scratch:
        p = at(b.scratch, a.index, "scratch buffer", l);
        break;
      default:
        break;
      }
      r.base = reinterpret_cast<uint64_t>(p) + (p || a.kind == K::Activation ? a.offset : 0);
      args.push_back(r);
    }
    return args;
  };
  for (const PlanLaunch& l : table_.launches)
    args_.push_back(bind(l));
  if (!table_.masked_pick.empty())
    for (const auto& [index, field] : {std::pair{table_.mask_scratch, "mask_scratch"},
                                       std::pair{table_.mask_rows_scratch, "mask_rows_scratch"}})
      if (index < 0 || index >= static_cast<int>(table_.scratch.size()))
        throw Error(fmt::format("launch table: {} is {}, but there are {} scratch buffers", field,
                                index, table_.scratch.size()));
  for (const PlanLaunch& l : table_.masked_pick) {
    if (l.library != -1)
      throw Error("launch table: the masked pick calls a library routine; it launches kernels");
    masked_args_.push_back(bind(l));
  }
}

template <typename F, typename L>
size_t Executor::for_each(bool masked, const StepShape& s, size_t begin, size_t end, F&& f,
                          L&& lib) const {
  using K = LaunchArg::Kind;
  const std::vector<PlanLaunch>& launches = masked ? table_.masked_pick : table_.launches;
  size_t launched = 0;
  end = std::min(end, launches.size());
  for (size_t e = begin; e < end; ++e) {
    const PlanLaunch& l = launches[e];
    int rows = l.seq_rows ? s.seqs : s.tokens;
    if (rows < l.min_rows || (l.max_rows >= 0 && rows > l.max_rows))
      continue;
    if (l.one_per_seq != 0 && (s.tokens == s.seqs) != (l.one_per_seq > 0))
      continue;
    // A part of the rows: the leading decodes, or the rows after them (from row `first`).
    int first = 0;
    if (l.part != 0) {
      XSERV_CHECK(s.decodes >= 0 && s.decodes <= s.tokens && s.decodes <= s.seqs,
                  "a step's decodes within its tokens and sequences");
      first = l.part == 2 ? s.decodes : 0;
      rows = l.part == 1 ? s.decodes : rows - s.decodes;
      if (rows <= 0)
        continue;
    }
    int splits = 1;
    if (l.splits_window >= 0) {
      // Splits from the bucketed key count, so that they stay fixed over a range of positions
      // (and one CUDA graph serves them all); a split past a token's keys stays empty.
      const int bucket = attention_key_bucket(s.max_pos + 1);
      splits =
          l.split_chunk > 0
              ? attention_chunk_splits(bucket, l.splits_window, rows, l.splits_heads, l.split_chunk)
              : attention_step_splits(bucket, l.splits_window, rows, l.splits_heads);
    }
    if (splits < l.min_splits)
      continue;
    const std::vector<Arg>& args = (masked ? masked_args_ : args_)[e];
    if (l.library >= 0) { // x, w, y: pointers, checked at construction
      std::array<uint64_t, 3> ptrs{};
      for (size_t i = 0; i < 3; ++i)
        ptrs[i] = args[i].base;
      lib(l.library, rows, ptrs.data(), size_t(3));
      ++launched;
      continue;
    }
    const PlanKernel& k = table_.kernels[size_t(l.kernel)];
    const int times =
        !repeat_.empty() && k.name.find(repeat_) != std::string::npos ? repeat_times_ : 1;
    const int chunk = l.chunk > 0 ? l.chunk : std::max(rows, 1);
    for (int r0 = 0; r0 < rows; r0 += chunk) {
      const int n = std::min(chunk, rows - r0);
      std::array<uint64_t, kMaxArgs> bytes{};
      std::array<void*, kMaxArgs> ptrs{};
      std::array<size_t, kMaxArgs> sizes{};
      for (size_t i = 0; i < args.size(); ++i) {
        const Arg& a = args[i];
        ptrs[i] = &bytes[i];
        sizes[i] = 8;
        switch (a.kind) {
        case K::Rows:
        case K::Splits:
        case K::Int: {
          const int32_t v = a.kind == K::Rows ? n : a.kind == K::Splits ? splits : a.value;
          std::memcpy(&bytes[i], &v, 4);
          sizes[i] = 4;
          break;
        }
        case K::Null:
          break;
        default:
          bytes[i] = a.base + a.row_stride * uint64_t(first + r0);
        }
      }
      for (int i = 0; i < times; ++i) {
        f(l.kernel, k.grid(n, splits), k.block, k.smem(n), ptrs.data(), sizes.data(), args.size());
        ++launched;
      }
    }
  }
  return launched;
}

size_t Executor::launch(bool masked, const StepShape& shape, cudaStream_t stream, size_t begin,
                        size_t end) const {
  if (kernels_.empty())
    throw Error("this executor has no loaded kernels: it can only record");
  if (!table_.library.empty() && !blas_)
    throw Error("launch table: it calls library gemms, but no cuBLAS handle is bound");
  return for_each(
      masked, shape, begin, end,
      [&](int k, std::array<unsigned, 3> g, int block, size_t smem, void** args,
          const size_t* sizes, size_t count) {
        const LoadedKernel& lk = kernels_[size_t(k)];
        // The masked pick follows memcpys, not a kernel: no programmatic dependent launch.
        lk.module->launch_raw(*lk.kernel, dim3(g[0], g[1], g[2]), dim3(block), smem, stream, args,
                              sizes, count, dependent_ && !masked);
      },
      [&](int lib, int rows, const uint64_t* ptrs, size_t) {
        const PlanLibraryCall& c = table_.library[size_t(lib)];
        blas_->gemm_bf16(
            stream, c.n, c.k, rows, c.accumulate, reinterpret_cast<const void*>(ptrs[0]),
            reinterpret_cast<const void*>(ptrs[1]), reinterpret_cast<void*>(ptrs[2]), c.fixed_rows);
      });
}

std::array<void*, 3> Executor::library_operands(int lib) const {
  for (size_t e = 0; e < table_.launches.size(); ++e)
    if (table_.launches[e].library == lib)
      return {reinterpret_cast<void*>(args_[e][0].base), reinterpret_cast<void*>(args_[e][1].base),
              reinterpret_cast<void*>(args_[e][2].base)};
  return {};
}

size_t Executor::run(const StepShape& shape, cudaStream_t stream, size_t begin, size_t end) const {
  return launch(false, shape, stream, begin, end);
}

size_t Executor::run_masked(int rows, cudaStream_t stream) const {
  XSERV_CHECK(rows > 0, "a masked pick of no rows");
  return launch(true, StepShape{rows, rows, 0}, stream, 0, SIZE_MAX);
}

std::vector<LaunchRecord> Executor::record_launches(bool masked, const StepShape& shape,
                                                    size_t begin, size_t end) const {
  std::vector<LaunchRecord> out;
  for_each(
      masked, shape, begin, end,
      [&](int k, std::array<unsigned, 3> g, int block, size_t smem, void** args,
          const size_t* sizes, size_t count) {
        LaunchRecord r{k, -1, g, unsigned(block), smem, {}};
        for (size_t i = 0; i < count; ++i)
          r.args.emplace_back(static_cast<const char*>(args[i]), sizes[i]);
        out.push_back(std::move(r));
      },
      [&](int lib, int rows, const uint64_t* ptrs, size_t count) {
        LaunchRecord r{-1, lib, {unsigned(rows), 0, 0}, 0, 0, {}}; // grid.x: the gemm's rows
        for (size_t i = 0; i < count; ++i)
          r.args.emplace_back(reinterpret_cast<const char*>(&ptrs[i]), 8);
        out.push_back(std::move(r));
      });
  return out;
}

std::vector<LaunchRecord> Executor::record(const StepShape& shape, size_t begin, size_t end) const {
  return record_launches(false, shape, begin, end);
}

std::vector<LaunchRecord> Executor::record_masked(int rows) const {
  return record_launches(true, StepShape{rows, rows, 0}, 0, SIZE_MAX);
}

std::vector<LoadedKernel> loaded_kernels(const std::vector<Module>& modules,
                                         const std::vector<Kernel>& kernels) {
  XSERV_CHECK(modules.size() == kernels.size(), "one module per kernel");
  std::vector<LoadedKernel> out;
  for (size_t i = 0; i < kernels.size(); ++i)
    out.push_back({&modules[i], &kernels[i]});
  return out;
}

} // namespace xserv::runtime
