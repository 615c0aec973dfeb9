// The emitters' shared pieces: kernel parameters, float literals, identifier-safe attribute
// suffixes and the source assembly every generated kernel goes through.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "codegen/emit.h"

namespace xserv::codegen::detail {

/// A kernel parameter: its declaration and the expression the template call passes for it
/// (an empty declaration: a literal or nullptr argument with no kernel parameter).
struct Param {
  std::string decl;
  std::string arg;
};

inline constexpr const char* kBf16 = "const __nv_bfloat16*";

/// The parameter declaration of an expert (or any weight) matrix: bf16, or an MXFP4 device
/// tensor's bytes.
std::string expert_param(bool mxfp4, const char* name);

/// A float literal that reads back as exactly `v` rounded to fp32, e.g. "1e-05f".
std::string float_literal(double v);

/// Name suffix for an attribute that differs from gpt-oss's value: the fp32 bits in hex, so
/// names stay unique and valid C identifiers.
std::string attr_suffix(const char* tag, double v, double usual);

/// Where a kernel waits for the previous one (programmatic dependent launch): first thing in
/// the wrapper, or inside the call, which issues its first weight loads before it waits.
enum class DependencyWait { Wrapper, InCall };

/// The full kernel source: IR header, launch comment, include, extern "C" wrapper calling
/// `call` (with __launch_bounds__(block[, min_blocks_per_sm])).
KernelSource assemble(std::string name, const std::vector<std::string>& ir_lines,
                      const std::string& header, const std::string& call,
                      const std::vector<Param>& params, LaunchRule launch,
                      DependencyWait wait = DependencyWait::Wrapper);

/// The parameters of the fused qkv decode kernels: x, ln, eps (a literal), wq, bq, wk, bk, wv,
/// bv, yq, yk, yv, tokens; with head_dim > 0 also positions, token_seq, block_table, inv_freq,
/// the attention factor (a literal), k_cache, v_cache.
std::vector<Param> qkv_params(const QkvDims& d);

/// The parameters of the fused routing kernels: x, ln, eps (a literal), w, b (nullptr without
/// a bias), xn, weights, ids.
std::vector<Param> router_params(double eps, bool bias);

/// The operands both attention kernels take, in the IR's order (q, k, v, k_cache, v_cache,
/// sinks, positions, token_seq, ctx_lens, block_table), then the scale as a literal.
std::vector<Param> attention_params(const AttentionDims& d);

/// A decode kernel's name and template call with ROUND (LinearDims::round_act): "_a16" on the
/// name and `true` for the template's last parameter (every call passes all the others).
void round_act(bool round, std::string& name, std::string& call);

/// Throws xserv::Error unless every dimension is positive.
void check_positive(const char* what, std::initializer_list<int> dims);

/// Throws unless d.chunk (the canonical attention order's keys a chunk) is a positive multiple
/// of 64.
void check_chunk(const AttentionDims& d);

} // namespace xserv::codegen::detail
