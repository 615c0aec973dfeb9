// The compile -> run contract: plain structs that the compiler side fills and the runtime reads.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace xserv::runtime {

/// A run of bytes in a file on disk that holds (part of) one tensor, e.g. a safetensors tensor.
struct WeightSource {
  std::string name;           ///< the tensor's name in its file, for messages
  std::string file;           ///< path of the file
  uint64_t offset = 0;        ///< absolute byte offset of the data in the file
  uint64_t bytes = 0;         ///< byte length of the data
  std::string dtype;          ///< safetensors dtype name: "BF16", "U8", ...
  std::vector<int64_t> shape; ///< the stored shape
};

/// One logical weight tensor the runtime places on the GPU, and how to make it from the files.
struct WeightSpec {
  /// How the stored bytes become the device tensor.
  enum class Transform {
    /// The bytes of `data` are copied as they are; the device tensor has `data.dtype`.
    Copy,
    /// `data` holds MXFP4 blocks U8 [..., G, 16] and `scales` the E8M0 scales U8 [..., G]
    /// (MODEL.md "MXFP4"); the device tensor is BF16 [..., G * 32].
    Mxfp4ToBf16,
    /// The same pair kept as MXFP4 on the device (4.25 bits per weight, decoded in registers
    /// by the kernels): one tensor holding the blocks [..., G, 16] unchanged, then the scales
    /// [..., G] unchanged (mxfp4_scales_offset() bytes from its start).
    Mxfp4,
  };

  std::string name; ///< the logical tensor, e.g. "model.layers.0.mlp.experts.gate_up_proj"
  Transform transform = Transform::Copy;
  WeightSource data;                  ///< the bytes (Copy), or the blocks (Mxfp4ToBf16, Mxfp4)
  std::optional<WeightSource> scales; ///< the scales, for Mxfp4ToBf16 and Mxfp4 only
  std::vector<int64_t> shape;         ///< logical shape on the GPU, e.g. [E, rows, cols]
};

/// Where the scales start in an Mxfp4 device tensor of logical shape [..., cols]: after the
/// blocks, numel / 2 bytes (16 bytes per 32 values).
inline uint64_t mxfp4_scales_offset(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape)
    n *= static_cast<uint64_t>(d);
  return n / 2;
}

/// How a plan keeps the MoE expert matrices on the GPU (compile --expert-format).
enum class ExpertFormat {
  Bf16,  ///< dequantised to BF16 at load (2 bytes per weight)
  Mxfp4, ///< as the checkpoint stores them, decoded in the kernels' registers
  /// Both copies: steps of few tokens (decode) read the MXFP4 one, the gemms of longer steps
  /// the BF16 one; 2.53 bytes per weight.
  Both,
};

/// The device tensor name of the MXFP4 copy of expert weight `name` under ExpertFormat::Both
/// (a character no checkpoint name holds).
inline std::string mxfp4_copy_name(const std::string& name) {
  return name + "#mxfp4";
}

/// "bf16" / "mxfp4" / "both".
inline const char* expert_format_name(ExpertFormat f) {
  return f == ExpertFormat::Mxfp4 ? "mxfp4" : f == ExpertFormat::Both ? "both" : "bf16";
}

/// The format `name` names (expert_format_name's inverse); false when it names none.
inline bool parse_expert_format(const std::string& name, ExpertFormat& f) {
  for (ExpertFormat e : {ExpertFormat::Bf16, ExpertFormat::Mxfp4, ExpertFormat::Both})
    if (name == expert_format_name(e)) {
      f = e;
      return true;
    }
  return false;
}

/// The key count attention's split count is chosen for when a token sees at most `keys` keys:
/// `keys` rounded up to a power of two, at least 64 and at most 2048 (where the split count
/// saturates). Launches of decode steps (tokens == seqs, the ones CUDA graphs capture) depend on
/// a step only through (tokens, seqs, this bucket of max_pos + 1), so a graph captured for one
/// replays correctly for any step with the same three; attention_decode leaves the surplus
/// splits of a smaller context empty. Other steps' launches also follow StepShape::decodes
/// (PlanLaunch::part): a graph of such steps would have to key on it too.
inline int attention_key_bucket(int keys) {
  int b = 64;
  while (b < keys && b < 2048)
    b *= 2;
  return b;
}

/// The batch a decode step of `seqs` sequences runs at, padded so that a few captured CUDA
/// graphs serve every batch: exact up to 16 (a small batch's padding would route its dummy
/// tokens to experts no real token needs), then multiples of 8 to 64, of 16 to 128, of 32 to
/// 256, of 64 beyond; never above `most` (the stage's max batch and step capacity), which is a
/// size of its own.
inline int decode_batch_bucket(int seqs, int most) {
  int b = seqs;
  if (seqs > 16) {
    const int step = seqs <= 64 ? 8 : seqs <= 128 ? 16 : seqs <= 256 ? 32 : 64;
    b = (seqs + step - 1) / step * step;
  }
  return std::min(b, most);
}

/// Every batch decode_batch_bucket gives for 1..most, ascending.
inline std::vector<int> decode_batch_sizes(int most) {
  std::vector<int> out;
  for (int s = 1; s <= most; ++s)
    if (decode_batch_bucket(s, most) == s)
      out.push_back(s);
  return out;
}

/// Key splits of attention_decode for at most `max_keys` keys: one per 64 keys, 1 to 32 (the
/// same rule as codegen::attention_splits, which sizes the kernels' buffers).
inline int attention_splits(int max_keys) {
  return std::clamp((max_keys + 63) / 64, 1, 32);
}

/// Blocks of attention_decode a step's key splits aim for: about what the GPU holds at once
/// (H200: 132 SMs x 2 blocks of 256 threads). Splitting further only adds partial states and a
/// combine: at 64 sequences of 640 keys one split takes 63 us, 16 splits 175 us
/// (kernels_bench "attention decode under key splits").
inline constexpr int kAttnSplitBlocks = 256;

/// Key splits of attention_decode and attention_combine in a step of `tokens` tokens whose keys
/// fall in attention_key_bucket `bucket`: attention_splits(min(bucket, window)) (window 0:
/// none), cut so that tokens x heads x splits stays within kAttnSplitBlocks when `heads` (the
/// kv heads, attention_decode's blocks per token and split) is given; heads 0 keeps the split
/// count of the keys alone. A function of (tokens, bucket) only, as a CUDA graph needs.
inline int attention_step_splits(int bucket, int window, int tokens, int heads) {
  const int splits = attention_splits(window > 0 ? std::min(bucket, window) : bucket);
  if (heads <= 0)
    return splits;
  const int64_t per_split = std::max<int64_t>(1, int64_t(tokens) * heads);
  return static_cast<int>(std::clamp<int64_t>(kAttnSplitBlocks / per_split, 1, splits));
}

/// Keys per chunk of the canonical attention order (codegen/kernels/attention_mma.cuh) in the
/// plans that compile it: the unit a decode step's key splits take, and where the prompt kernel
/// folds its running state.
inline constexpr int kAttnChunkKeys = 128;

/// Partial states attention_decode_mma may leave a step, over its tokens and key chunks: the
/// scratch buffers hold this many (token, chunk) states of every head (32 MiB of outputs for
/// the 20b).
inline constexpr int kAttnChunkPartials = 2048;

/// Key splits of attention_decode_mma and attention_combine_chunks (plans in the canonical
/// attention order, chunks of `chunk` keys at multiples of `chunk`) in a step of `tokens`
/// tokens whose keys fall in attention_key_bucket `bucket`: one block a chunk (as many as a
/// token's keys can span: every chunk below the bucket, or those a window of `window` keys
/// crosses) while tokens x heads alone would leave most of the GPU idle and the partial states
/// fit kAttnChunkPartials; else 1, each block running all its token's chunks. Either way a
/// token's chunks are folded in key order, so the choice changes no bit. A function of
/// (tokens, bucket) only, as a CUDA graph needs.
inline int attention_chunk_splits(int bucket, int window, int tokens, int heads, int chunk) {
  const int all = (std::max(bucket, 1) + chunk - 1) / chunk;
  const int spans = window > 0 ? std::min(all, (window - 1) / chunk + 2) : all;
  const int64_t blocks = int64_t(tokens) * std::max(heads, 1);
  if (spans <= 1 || blocks >= kAttnSplitBlocks || int64_t(tokens) * spans > kAttnChunkPartials)
    return 1;
  return spans;
}

/// The sizes of one (sub-)step that launches depend on.
struct StepShape {
  int tokens = 0;  ///< T: tokens in the step
  int seqs = 0;    ///< B: sequences in the step
  int max_pos = 0; ///< the largest position of any token (decides attention key splits)
  /// The step's leading tokens that are each their sequence's only token (the scheduler puts
  /// decodes first): PlanLaunch::part 1's rows; 0 when unknown (part 2 then takes every row).
  int decodes = 0;
};

/// A generated kernel of the launch table and its launch rule (codegen::LaunchRule's fields):
/// grid and shared memory follow from the launch's rows and key splits.
struct PlanKernel {
  std::string name;            ///< the kernel's extern "C" name (and its cubin's)
  int block = 256;             ///< threads per block (blockDim.x)
  int blocks_x = 1;            ///< grid.x
  int y_per_token = 0;         ///< grid.y = rows * y_per_token; 1 when 0
  bool z_splits = false;       ///< grid.z = key splits
  int blocks_z = 1;            ///< grid.z when not z_splits
  int y_tile = 0, y_extra = 0; ///< when y_tile > 0: grid.y = ceil(rows * max(1, y_per_token) /
                               ///< y_tile) + y_extra
  uint64_t smem_per_row = 0, smem_fixed = 0; ///< dynamic shared memory: fixed + per row

  std::array<unsigned, 3> grid(int rows, int splits) const {
    int gy = y_per_token ? rows * y_per_token : 1;
    if (y_tile > 0)
      gy = (rows * std::max(1, y_per_token) + y_tile - 1) / y_tile + y_extra;
    return {static_cast<unsigned>(blocks_x), static_cast<unsigned>(gy),
            static_cast<unsigned>(z_splits ? splits : blocks_z)};
  }
  size_t smem(int rows) const { return smem_fixed + smem_per_row * static_cast<size_t>(rows); }

  bool operator==(const PlanKernel&) const = default;
};

/// One kernel argument of a launch: a device pointer into a bound region (8 bytes) or an int
/// (4 bytes).
struct LaunchArg {
  enum class Kind {
    Null,       ///< a null pointer
    Activation, ///< arena base + offset
    Weight,     ///< the weight tensor `name` (+ offset)
    Cache,      ///< KV cache number `index` (the graph's cache nodes in order) + offset
    Param,      ///< the step input `name` (token_ids, positions, ...) + offset
    Scratch,    ///< scratch buffer number `index` of the table + offset
    Rows,       ///< int: the launch's rows (the chunk's rows when chunked)
    Splits,     ///< int: the launch's key splits
    Int,        ///< int: `value`
  };
  Kind kind = Kind::Null;
  std::string name;        ///< Weight, Param
  int index = 0;           ///< Cache, Scratch
  uint64_t offset = 0;     ///< pointer kinds: bytes from the region's start
  uint64_t row_stride = 0; ///< pointer kinds of chunked launches: bytes per row of chunk start
  int value = 0;           ///< Int

  bool operator==(const LaunchArg&) const = default;
};

/// A library routine a launch calls instead of a generated kernel (the runtime binds it to the
/// library on its stream). GemmBf16: y[rows, n] = x[rows, k] w[n, k]^T (+ y when accumulate), x
/// and w bf16 row-major, y fp32, fp32 accumulation (cuBLAS's cublasGemmEx); its args are x, w,
/// y. The compile picks it where kernels_bench measured the library faster than gemm_wg.
struct PlanLibraryCall {
  enum class Op { GemmBf16 };
  Op op = Op::GemmBf16;
  int n = 0, k = 0;
  bool accumulate = false;
  /// > 0: one algorithm at every row count, the one the library picks for this many rows
  /// without split K (Blas's fixed order: plans in the natural K order); 0: its own pick each
  /// call.
  int fixed_rows = 0;

  bool operator==(const PlanLibraryCall&) const = default;
};

/// One entry of the launch table: launches kernel `kernel` (or calls library routine
/// `library`) when the step's rows (tokens or sequences) lie in [min_rows, max_rows] and its key
/// splits are at least min_splits.
struct PlanLaunch {
  int kernel = -1;       ///< index into LaunchTable::kernels; -1 with `library`
  int library = -1;      ///< index into LaunchTable::library, or -1
  std::string label;     ///< the IR op the launch serves ("argmax" for the epilogue), for profiles
  bool seq_rows = false; ///< rows are the step's sequences (B) rather than its tokens (T)
  int min_rows = 0;      ///< launch only for at least this many rows
  int max_rows = -1;     ///< ... and at most this many; -1: unbounded
  /// > 0: one launch per chunk of at most `chunk` rows, pointer args advanced by chunk start *
  /// row_stride, Rows args the chunk's rows.
  int chunk = 0;
  /// Key splits: < 0 none (1); >= 0 attention's, attention_splits(min(attention_key_bucket(
  /// max_pos + 1), window)) with window 0 meaning no window.
  int splits_window = -1;
  int min_splits = 1; ///< launch only with at least this many splits (attention_combine: 2)
  /// > 0: the kv heads attention_decode runs per token, which cut its splits for steps of
  /// many tokens (attention_step_splits); the same on its attention_combine launch.
  int splits_heads = 0;
  /// > 0: keys per chunk of the canonical attention order (attention_decode_mma and
  /// attention_combine_chunks): the splits are attention_chunk_splits' instead.
  int split_chunk = 0;
  /// 1: only steps with one token per sequence (tokens == seqs: decode); -1: only the other
  /// steps; 0: any (rope_yarn_qk_kv writes the KV caches itself in decode steps).
  int one_per_seq = 0;
  /// Which of the step's rows (tokens) the launch serves, once min_rows, max_rows and
  /// one_per_seq have chosen the step: 0 all of them; 1 its leading decodes (StepShape::decodes,
  /// not launched when there are none); 2 the rows after them, pointer args advanced by
  /// decodes * row_stride (not launched when there are none). Attention of a step mixing
  /// decodes and prompt chunks: the decode kernel over the decodes, the prompt kernel over the
  /// chunks (the same bits: the canonical order, docs/DESIGN.md).
  int part = 0;
  std::vector<LaunchArg> args;

  bool operator==(const PlanLaunch&) const = default;
};

/// A device buffer the launches use besides the arena: key-split partials, gemm partials, the
/// YaRN inv_freq tables (constant f64 contents uploaded once). Lives as long as the executor.
struct ScratchBuffer {
  uint64_t bytes = 0;
  std::vector<double> f64; ///< constant contents (f64.size() * 8 == bytes), or empty

  bool operator==(const ScratchBuffer&) const = default;
};

/// What argmax_of_keys returns for a row holding a NaN or an infinity (engine::kNonFinite).
inline constexpr int32_t kArgmaxNonFinite = -1;

/// The greedy id the sampling epilogue's keys for one row pick (`chunks` uint64 keys, one per
/// 8192-logit chunk: the logit's bits in unsigned order above the complement of its id, so ties
/// go to the lower id; all ones for a chunk holding a NaN or an infinity): the largest key's
/// id, kArgmaxNonFinite when a logit of the row was not finite, 0 for a row of no logits.
inline int32_t argmax_of_keys(const uint64_t* keys, int chunks) {
  const uint64_t best = *std::max_element(keys, keys + chunks);
  if (best == ~uint64_t{0})
    return kArgmaxNonFinite;
  return best == 0 ? 0 : static_cast<int32_t>(~static_cast<uint32_t>(best & 0xffffffffu));
}

/// Every launch of a step, in order, as data: what `compile` writes into plan.json and the
/// executor (runtime/executor.h) replays. Launches depend on the step only through its
/// StepShape: tokens, seqs, attention_key_bucket(max_pos + 1) and, outside decode steps,
/// decodes.
struct LaunchTable {
  std::vector<PlanKernel> kernels;
  std::vector<PlanLibraryCall> library; ///< library routines the launches call
  std::vector<PlanLaunch> launches;
  std::vector<ScratchBuffer> scratch;
  /// The sampling epilogue: scratch buffer of argmax_chunks uint64 greedy keys per sequence
  /// (argmax_of_keys), written every step when the graph's first output is per-sequence
  /// logits; -1 when none.
  int argmax_scratch = -1;
  int argmax_chunks = 0;
  /// Structured output's masked greedy pick (empty in a plan without one): launches that no
  /// step makes, run by Executor::run_masked after a step for the rows a grammar constrains
  /// (their rows are those rows). It reads scratch mask_scratch (mask_words uint32 per masked
  /// row: bit t % 32 of word t / 32 allows id t) and mask_rows_scratch (int32 per masked row:
  /// its logits row), and rewrites those rows' keys in argmax_scratch.
  std::vector<PlanLaunch> masked_pick;
  int mask_scratch = -1;
  int mask_rows_scratch = -1;
  int mask_words = 0;

  bool operator==(const LaunchTable&) const = default;
};

/// Where a stage's values live and what it owns, so that the CUDA model runs a compiled plan
/// without its graph: with the launch table, everything the model binds and allocates. Written
/// by compile into plan.json ("codegen"."layout"); a run whose max batch, max sequence, step
/// capacity or gemm precision differ cannot use it.
struct StageLayout {
  int64_t max_batch = 0; ///< sequences per step
  int64_t max_seq = 0;   ///< positions of the longest sequence
  int64_t tokens = 0;    ///< step capacity (T) the arena and the launch table are for
  bool gemm_split = true;
  /// The expert matrices' device format: the weight upload and the MoE kernels both follow it.
  ExpertFormat expert_format = ExpertFormat::Bf16;
  /// PlanOptions::mxfp4_max_scale, which the upload holds the MXFP4 scales to (-1: any).
  int mxfp4_max_scale = -1;
  uint64_t arena_bytes = 0;
  /// The graph's first output: logits (one row per sequence, or per token with --all-logits),
  /// or the activation a pipeline stage sends on.
  struct Output {
    uint64_t offset = 0;    ///< in the arena
    uint64_t row_bytes = 0; ///< one row (fp32)
    bool per_token = false; ///< rows are the step's tokens, not its sequences
    bool sends = false;     ///< a pipeline send: the rows go to the next stage
    int64_t vocab = 0;      ///< values per row
    bool operator==(const Output&) const = default;
  } output;
  /// A pipeline stage's received value: its buffer in the arena, one row per token.
  struct Recv {
    std::string name;
    uint64_t offset = 0, row_bytes = 0;
    bool operator==(const Recv&) const = default;
  };
  std::vector<Recv> recvs;
  /// The paging of the KV caches: positions per block, entries of a sequence's block table (the
  /// longest sequence in blocks), and the sliding layers' window (0: none). How many blocks the
  /// pools hold is decided when a model loads, not at compile.
  int64_t kv_block = 16;
  int64_t table_blocks = 0;
  int64_t window = 0;
  /// A KV cache, in the graph's order (the launch table's Cache index): one block's shape
  /// [kv_block, kv heads, head dim], its element size, and which pool it pages from (the
  /// sliding layers' window pool through window_table, else the full pool through block_table).
  struct Cache {
    std::vector<int64_t> block_shape;
    int elem_bytes = 4;
    bool window = false;
    uint64_t block_bytes() const {
      uint64_t n = static_cast<uint64_t>(elem_bytes);
      for (int64_t d : block_shape)
        n *= static_cast<uint64_t>(d);
      return n;
    }
    bool operator==(const Cache&) const = default;
  };
  std::vector<Cache> caches;
  /// A weight the launches read, by its logical name and shape (BF16 on the device; the
  /// experts in expert_format).
  struct Weight {
    std::string name;
    std::vector<int64_t> shape;
    bool operator==(const Weight&) const = default;
  };
  std::vector<Weight> weights;

  bool operator==(const StageLayout&) const = default;
};

} // namespace xserv::runtime
