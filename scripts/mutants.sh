#!/usr/bin/env bash
# Mutation testing on demand (not in CI): applies each small semantic mutation of the list below
# to a scratch copy of the source tree, one at a time, rebuilds incrementally in its own build
# directory, runs the CPU suite without the golden change-detectors, and reports whether the
# suite noticed (killed) or not (survived). docs/TESTING.md keeps the list and the last results.
#
#   scripts/mutants.sh                 # every mutant
#   scripts/mutants.sh yarn_ rms_      # only mutants whose id starts with one of these
#   XSERV_MUTANTS_DIR=/tmp/m XSERV_JOBS=8 scripts/mutants.sh
#   XSERV_MUTANTS_TESTS='hf fixture|^compiler/' scripts/mutants.sh yarn_   # a narrower suite
#   XSERV_MUTANTS_REFRESH=0 scripts/mutants.sh   # reuse the last copy of the tree as it is
#   XSERV_MUTANTS_TARGETS='xserv cli_tests' XSERV_MUTANTS_TESTS='^cli/hf ' scripts/mutants.sh
#                                      # the HF fixtures alone: which mutants they kill by themselves
#
# Steps:
#   1. Copy the working tree (tracked and untracked files, not build outputs) to
#      $XSERV_MUTANTS_DIR/src (default /tmp/xserv-mutants) and configure $XSERV_MUTANTS_DIR/build.
#   2. Build the unmutated copy and run the suite once: it must pass, or nothing can be judged.
#   3. For each mutant: replace its OLD text (exactly one occurrence, else the mutant is
#      reported stale) with NEW, rebuild, run ctest -L cpu -E golden --stop-on-failure, put the
#      file back. A mutant that does not compile counts as killed by the compiler.
#   4. Print one line per mutant and a summary; exit 1 when any mutant survived.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${XSERV_MUTANTS_DIR:-/tmp/xserv-mutants}"
JOBS="${XSERV_JOBS:-$(nproc)}"
SRC="$WORK/src"
BUILD="$WORK/build"
LOG="$WORK/logs"
# The copy has no ../shared beside it: point the tests at the real data (they skip without it).
if [ -z "${XSERV_DATA:-}" ] && [ -d "$ROOT/../shared/data" ]; then
  export XSERV_DATA="$(cd "$ROOT/../shared/data" && pwd)"
fi

# id ~ file ~ OLD ~ NEW ~ MODEL.md section (or the component)   ("\n" in OLD/NEW is a newline)
MUTANTS=$(cat <<'EOF'
config_layer_types~models/config.cpp~if (t == "sliding_attention") {\n      c.sliding.push_back(true);~if (t == "sliding_attention") {\n      c.sliding.push_back(false);~Config: layer_types
config_swiglu_alpha~models/config.h~double swiglu_alpha = 1.702;~double swiglu_alpha = 1.7;~Config: alpha 1.702
config_eps~models/gpt_oss.cpp~const double eps = c_.rms_norm_eps;~const double eps = c_.rms_norm_eps * 10;~Config: rms_norm_eps
tensors_post_norm_weight~models/gpt_oss.cpp~w(p + "post_attention_layernorm.weight", bf16({d}))~w(p + "input_layernorm.weight", bf16({d}))~Tensors: post_attention_layernorm
tensors_o_proj_bias~models/gpt_oss.cpp~w(p + "self_attn.o_proj.bias", bf16({d}))});~});~Tensors: o_proj bias
mxfp4_nibbles~models/mxfp4.cpp~out[2 * j] = lut[block[j] & 0x0F];\n    out[2 * j + 1] = lut[block[j] >> 4];~out[2 * j] = lut[block[j] >> 4];\n    out[2 * j + 1] = lut[block[j] & 0x0F];~MXFP4: nibble order
mxfp4_scale_bias~models/mxfp4.cpp~static_cast<int>(scale) - kMxfp4ScaleBias;~static_cast<int>(scale) - kMxfp4ScaleBias + 1;~MXFP4: 2^(scale - 127)
fwd_residual_attn~models/gpt_oss.cpp~h = b_.add_node(Op::Add, {h, o});~h = o;~Forward pass: attention residual
fwd_kv_write_key~models/gpt_oss.cpp~b_.add_node(Op::KvWrite, {kc, kr, in.positions~b_.add_node(Op::KvWrite, {kc, vh, in.positions~Forward pass: keys cached
rms_mean~ir/reference.cpp~ss / static_cast<double>(d) + eps~ss / static_cast<double>(d - 1) + eps~Forward pass: rms_norm mean
yarn_truncate~models/gpt_oss.cpp~c_.rope_scaling.truncate ? 1 : 0~c_.rope_scaling.truncate ? 0 : 1~YaRN: truncate false
yarn_attention_factor~ir/reference.cpp~0.1 * std::log(y.factor) + 1.0~0.1 * std::log2(y.factor) + 1.0~YaRN: attention_factor
yarn_rotate_sign~ir/reference.cpp~static_cast<float>(x1 * c - x2 * s)~static_cast<float>(x1 * c + x2 * s)~YaRN: rotate-half
yarn_ramp~ir/reference.cpp~f / y.factor * ramp + f * (1 - ramp)~f * ramp + f / y.factor * (1 - ramp)~YaRN: ramp direction
yarn_beta~ir/reference.cpp~(beta * 2 * pi)~(beta * pi)~YaRN: correction range
attn_scale~models/gpt_oss.cpp~{{"scale", 1.0 / std::sqrt(static_cast<double>(hd))}~{{"scale", 1.0 / static_cast<double>(hd)}~Attention: scale 1/sqrt(64)
attn_window~ir/reference.cpp~std::max<int64_t>(0, p - window + 1)~std::max<int64_t>(0, p - window)~Attention: j > i-128
attn_sink_mass~ir/reference.cpp~double denom = std::exp(sink - m);~double denom = 0.0;~Attention: sinks
attn_gqa~ir/reference.cpp~const int64_t g = h / group;~const int64_t g = h % g_count;~Attention: head h reads kv head h/8
attn_causal~ir/reference.cpp~for (int64_t j = lo; j <= p; ++j) {\n        const float* kv~for (int64_t j = lo; j < p; ++j) {\n        const float* kv~Attention: j <= i
kv_ring_slot~ir/reference.cpp~cache.f.begin() + (s.row * slots + p % slots) * g * d~cache.f.begin() + (s.row * slots + (p + 1) % slots) * g * d~Attention: ring cache
moe_gate_clamp~ir/reference.cpp~std::min(gu[0], limit)~std::min(gu[0], 2 * limit)~MoE: gate = min(gate, 7)
moe_up_clamp~ir/reference.cpp~std::clamp(gu[1], -limit, limit)~std::clamp(gu[1], -2 * limit, 2 * limit)~MoE: up = clamp(up, -7, 7)
moe_up_plus_one~ir/reference.cpp~act[idx(i)] = (up + 1.0) * glu;~act[idx(i)] = up * glu;~MoE: (up + 1)
moe_interleave~ir/reference.cpp~const int64_t row = 2 * i + half;~const int64_t row = half * inter + i;~MoE: gate/up interleaved
moe_softmax_over_topk~ir/reference.cpp~for (int64_t j = 0; j < k; ++j)\n      sum += std::exp~for (int64_t j = 0; j < e; ++j)\n      sum += std::exp~MoE: softmax over the top 4 only
moe_topk_order~ir/reference.cpp~[&](int32_t a, int32_t b) { return r[a] > r[b]; }~[&](int32_t a, int32_t b) { return r[a] < r[b]; }~MoE: top-k
harmony_reasoning~models/harmony.cpp~"Reasoning: " + std::string~"Reasoning:" + std::string~Chat format: system message
harmony_cutoff~models/harmony.cpp~add_line("Knowledge cutoff: " + sys.knowledge_cutoff);~add_line("Knowledge cutoff " + sys.knowledge_cutoff);~Chat format: system message
harmony_header_cut~models/harmony_parser.cpp~} else if (state_ == State::Header && !header_.empty()) {~} else if (false) {~Chat format: parser, header cut
tokenizer_special_return~models/tokenizer_load.cpp~{200002, "<|return|>"}~{200001, "<|return|>"}~Tokenizer: specials
pass_rmsnorm_linear_eps~compiler/fuse_rmsnorm_linear.cpp~{{"eps", *norm.find_attr("eps")}}~{{"eps", ir::Attr{1e-6}}}~passes: fuse_rmsnorm_linear
pass_qkv_eps~compiler/fuse_qkv.cpp~attrs.emplace_back("eps", *norm.find_attr("eps"));~attrs.emplace_back("eps", ir::Attr{1e-6});~passes: fuse_qkv
pass_dce_kv_write~compiler/dce.cpp~if (ir::has_trait(g.nodes[i].op, ir::kWritesState))~if (false)~passes: dce keeps kv_write
sampler_temperature~runtime/sampler.cpp~const double t = opts_.temperature, inv_t = 1.0 / t;~const double t = opts_.temperature, inv_t = t;~sampler: temperature
sampler_min_p~runtime/sampler.cpp~double(top) + t * std::log(double(opts_.min_p))~double(top) + std::log(double(opts_.min_p))~sampler: min_p
sampler_top_p~runtime/sampler.cpp~const double want = double(opts_.top_p) * sum;~const double want = double(opts_.top_p) * sum * 0.9;~sampler: top_p
answers_marker~models/answers.cpp~return nums.front().value;~return nums.back().value;~eval: answer extraction
moe_gate_unclamped~ir/reference.cpp~const double gate = std::min(gu[0], limit);~const double gate = gu[0];~MoE: gate clamped above (fixtures hit it)
moe_up_no_floor~ir/reference.cpp~const double up = std::clamp(gu[1], -limit, limit);~const double up = std::min(gu[1], limit);~MoE: up clamped below -7
moe_up_no_ceiling~ir/reference.cpp~const double up = std::clamp(gu[1], -limit, limit);~const double up = std::max(gu[1], -limit);~MoE: up clamped above +7
kv_ring_read~ir/reference.cpp~(s.row * slots + j % slots) * g_count~(s.row * slots + (j - lo) % slots) * g_count~Attention: ring read once it wraps
yarn_position_wrap~ir/reference.cpp~const double p = positions.i[idx(i)];~const double p = positions.i[idx(i)] % 4096;~YaRN: positions past 4096
batch_cache_row~ir/reference.cpp~const int64_t row = batch.cache_rows.i[idx(b)];~const int64_t row = b;~batch: cache row of a sequence
batch_positions~models/step.cpp~pos.push_back(step.ctx_lens[b] + static_cast<int32_t>(i));~pos.push_back(step.ctx_lens[0] + static_cast<int32_t>(i));~batch: positions per sequence
batch_logit_rows~models/step.cpp~last.push_back(static_cast<int32_t>(ids.size()) - 1);~last.push_back(static_cast<int32_t>(step.tokens[b].size()) - 1);~batch: each sequence's last row
engine_chunk_ctx~engine/engine.cpp~in.ctx_lens.push_back(static_cast<int32_t>(s.cached));\n    in.cache_rows.push_back(s.row);\n    seqs.push_back(&s);~in.ctx_lens.push_back(0);\n    in.cache_rows.push_back(s.row);\n    seqs.push_back(&s);~engine: a prompt chunk continues the cache
EOF
)

want() { # is mutant $1 selected by the prefixes given on the command line?
  [ $# -le 1 ] && return 0
  local id="$1"; shift
  for p in "$@"; do [[ "$id" == "$p"* ]] && return 0; done
  return 1
}

mkdir -p "$WORK" "$LOG"
if [ "${XSERV_MUTANTS_REFRESH:-1}" = 1 ] || [ ! -d "$SRC" ]; then
  # tar keeps the files' times, so the next build recompiles only what changed since last time.
  echo "[mutants] copying the tree to $SRC"
  mkdir -p "$SRC"
  (cd "$ROOT" && git ls-files -co --exclude-standard -z |
    tar --null --ignore-failed-read -cf - -T - 2>/dev/null) | tar -xf - -C "$SRC"
fi
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCUDAToolkit_ROOT="${CUDAToolkit_ROOT:-/usr/local/cuda}" > "$LOG/configure.log"
fi

# XSERV_MUTANTS_TARGETS narrows what is rebuilt to the binaries a narrowed suite runs.
TARGETS="${XSERV_MUTANTS_TARGETS:-xserv ir_tests models_tests compiler_tests cli_tests engine_tests runtime_tests codegen_tests}"
build() { cmake --build "$BUILD" --target $TARGETS -j "$JOBS" < /dev/null > "$1" 2>&1; }
suite() {
  # XSERV_MUTANTS_TESTS (a ctest -R regex) narrows the suite for a quick look; a mutant has
  # survived only if it survives the whole suite.
  local only=()
  [ -n "${XSERV_MUTANTS_TESTS:-}" ] && only=(-R "$XSERV_MUTANTS_TESTS")
  (cd "$BUILD" && ctest -L cpu -E golden -j "$JOBS" --stop-on-failure --timeout 600 "${only[@]}") \
    < /dev/null > "$1" 2>&1
}

echo "[mutants] baseline build and suite"
build "$LOG/baseline_build.log" || { echo "baseline does not build: $LOG/baseline_build.log"; exit 2; }
suite "$LOG/baseline_suite.log" || { echo "baseline suite fails: $LOG/baseline_suite.log"; exit 2; }

killed=0; survived=0; stale=0; results=()
while IFS='~' read -r id file old new section; do
  [ -z "$id" ] && continue
  want "$id" "$@" || continue
  path="$SRC/$file"
  cp "$path" "$path.orig"
  if ! python3 - "$path" "$old" "$new" <<'PY'; then
import sys
path, old, new = sys.argv[1], sys.argv[2].replace("\\n", "\n"), sys.argv[3].replace("\\n", "\n")
text = open(path).read()
if text.count(old) != 1:
    sys.exit(1)
open(path, "w").write(text.replace(old, new))
PY
    verdict="STALE (text not found once in $file)"; stale=$((stale + 1))
  elif ! build "$LOG/$id.build.log"; then
    verdict="killed (does not compile)"; killed=$((killed + 1))
  elif suite "$LOG/$id.suite.log"; then
    verdict="SURVIVED"; survived=$((survived + 1))
  else
    by=$(grep -m1 -E '^\s*[0-9]+ - ' "$LOG/$id.suite.log" | sed -E 's/^\s*[0-9]+ - //' || true)
    verdict="killed by: ${by:-see $LOG/$id.suite.log}"; killed=$((killed + 1))
  fi
  mv "$path.orig" "$path"
  touch "$path" # the next build recompiles the restored file
  line=$(printf '%-26s %-34s %s' "$id" "[$section]" "$verdict")
  echo "$line"
  results+=("$line")
done <<< "$MUTANTS"

build "$LOG/restore_build.log" || true
echo
echo "[mutants] killed $killed, survived $survived, stale $stale (logs in $LOG)"
[ "$survived" -eq 0 ] && [ "$stale" -eq 0 ]
