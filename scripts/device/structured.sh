#!/usr/bin/env bash
# Structured output on the GPU in one call (nvidia-h200, ~6 min), the synthetic 20b's default
# plan (max-seq 8192, max-batch 64):
#   1. the masked pick's GPU tests (kernel against a brute force, device picks against the
#      host's over the same rows) when .device/bin holds the GPU test binaries, and the masks'
#      host cost on the GPU machine's CPU (grammar_bench, one thread and every core);
#   2. B64 decode with every sequence constrained against none, in process: `xserv bench
#      --requests 256 --concurrency 64 --input-len 64 --output-len 256` free, then with
#      --regex '[a-z ]+' and with a JSON schema of an unbounded array of objects (the masks'
#      host cost is the schema's); with an old binary (.device/old/xserv), its free run beside
#      the new one's (the engine's step path changed under every request);
#   3. the 500 schemas x greedy and temperature 1 (tests/server/structured_schemas_test.py)
#      against `xserv serve` on the 20b, validated by jsonschema.
#   PARTS="..." a subset of: tests bench schemas (default all)
# Needs .device/bin/xserv (+ engine_gpu_tests, codegen_gpu_tests, grammar_bench for the tests),
# .device/data/{gpt-oss-20b.json,o200k_base.tiktoken}; the schemas need jsonschema, carried as
# wheels for the device's Python 3.12 (docs: the device README): once, here,
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl jsonschema==4.23.0 attrs==24.2.0 referencing==0.35.1 \
#     jsonschema-specifications==2024.10.1 rpds-py==0.22.3 typing_extensions==4.12.2
# carry [".device/bin", ".device/data", ".whl"] (and ".device/old" for the baseline).
source "$(dirname "$0")/common.sh"
gpu_info
PARTS=${PARTS:-"tests bench schemas"}
want() { [[ " $PARTS " == *" $1 "* ]]; }

if want tests && [ -x $B/engine_gpu_tests ]; then
  echo "== GPU tests ($(at))"
  run_tests codegen_gpu_tests -tc="*masked argmax*,*argmax kernel*"
  run_tests engine_gpu_tests -tc="*masked greedy picks*"
fi

if want tests && [ -x $B/grammar_bench ]; then # the masks' host cost on this machine's CPU
  echo "== grammar_bench, one thread ($(at))"
  THREADS=1 timeout 120 $B/grammar_bench $D/o200k_base.tiktoken 2>&1 | tail -6
  echo "== grammar_bench, every core (the compile's thread pool; masks per sequence alike)"
  timeout 120 $B/grammar_bench $D/o200k_base.tiktoken 2>&1 | tail -6
fi

synth20b
$X compile /tmp/g20 -o /tmp/p_new --max-seq 8192 --max-batch 64 2>&1 | tail -1
if have_old; then
  $OLD compile /tmp/g20 -o /tmp/p_old --max-seq 8192 --max-batch 64 2>&1 | tail -1
fi
cat > /tmp/objects.json << 'EOF'
{"type": "array", "items": {"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"},
  "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4}},
  "required": ["name", "n"]}}
EOF

if want bench; then
  W="--requests 256 --concurrency 64 --input-len 64 --output-len 256"
  T="--tokenizer $D/o200k_base.tiktoken"
  serve_row() { # LABEL BINARY PLAN [constraint flags]
    local label=$1 bin=$2 plan=$3
    shift 3
    echo "== $label ($(at))"
    # shellcheck disable=SC2086
    timeout 240 "$bin" bench "$plan" --backend cuda $W "$@" > "/tmp/$label.md" 2> "$OUT/$label.err"
    serving_lines "/tmp/$label.md"
    grep -E "structured output|model time per step|engine steps" "/tmp/$label.md" | tr -s ' ' |
      tr '\n' ';'
    echo
  }
  serve_row free "$X" /tmp/p_new
  serve_row regex "$X" /tmp/p_new $T --regex '[a-z ]+'
  serve_row schema "$X" /tmp/p_new $T --json-schema /tmp/objects.json
  if have_old; then # an old binary's bench takes no constraint flags
    serve_row old_free "$OLD" /tmp/p_old
  fi
fi

if want schemas; then
  echo "== 500 schemas on the 20b ($(at))"
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  fi
  PORT=8323
  $X serve /tmp/p_new --port $PORT --tokenizer $D/o200k_base.tiktoken > "$OUT/serve.log" 2>&1 &
  pid=$!
  if wait_health $PORT $pid 150; then
    XSERV_SCHEMAS_ENDPOINT=http://127.0.0.1:$PORT timeout 400 python3 \
      tests/server/structured_schemas_test.py "$X" . $D 500 2>&1 | tail -12
    curl -s localhost:$PORT/metrics | grep -E "^xserv:(generation_tokens_total|request_success)" |
      tr '\n' ' '
    echo
    stop_server $pid
  else
    tail -5 "$OUT/serve.log"
  fi
fi
echo "done ($(at))"
