#!/usr/bin/env bash
# xserv next to llama.cpp on the same synthetic gpt-oss-20b, one call (nvidia-h200, ~8-10 min,
# the llama.cpp build ~5-7 of them; re-entrant, see below):
# - serving through one harness: `xserv serve` and `llama-server -np 64` each driven by
#   `xserv bench --endpoint` (256 requests of 512 prompt + 256 output tokens at concurrency 64,
#   then 8 at concurrency 1) and `xserv eval --endpoint` (GSM8K, 64 problems, 256 tokens at
#   most: on random weights this checks the chat path end to end; the accuracy is noise);
# - the llama-bench rows of docs/TARGETS.md: llama-bench -p 512,2048 -n 128 -d 0,4096,
#   llama-batched-bench at 8 and 64 sequences, and xserv bench's same rows in the same call.
# llama.cpp is built here from the sources scripts/device/llama_src.sh packed (CUDA, sm_90), the
# checkpoint converted to GGUF with its convert_hf_to_gguf.py (MXFP4 experts stay MXFP4, the
# rest BF16, the gpt-oss chat template inside).
# Needs .device/bin/xserv, .device/data/{gpt-oss-20b.json,
# o200k_base.tiktoken, gsm8k_test.jsonl (the evals are skipped without it)}, .device/llama;
# carry [".device/bin", ".device/data", ".device/llama"].
# Knobs: BUDGET seconds for the whole call (default 570; a phase that would not fit is skipped),
# OVERLAP=1 (default) runs xserv's serving benchmark while llama.cpp still builds and the
# checkpoint converts (both at nice 19: a pessimistic setting for xserv, never for llama-server,
# which runs alone); OVERLAP=0 waits for both first. LLAMA_SERVER_FLAGS / XSERV_SERVE_FLAGS add
# flags. Re-entrant: the build and the conversion run in their own sessions (setsid), which
# outlive a call, and every step leaves a done-file in /tmp/lsr. A call that runs out of BUDGET
# leaves them running; the same command again on the still-warm machine (within its 30 s) goes
# on from there and skips what is done (results too). FRESH=1 starts over. REUSE_G20=1 keeps
# the /tmp/g20 and /tmp/p64 an earlier script made on this machine (synth20b, compile
# --max-seq 8192 --max-batch 64). PREP=1 only starts the build and the conversion (and makes
# /tmp/g20, /tmp/p64) and returns in about a minute: a next call that times nothing (the GPU
# test suite) can run while they go on, then this script without PREP.
source "$(dirname "$0")/common.sh"
BUDGET=${BUDGET:-570}
LS=/tmp/llama.cpp LB=/tmp/llama.cpp/build R=/tmp/lsr
LPORT=8322 XPORT=8321
[ "${FRESH:-0}" = 1 ] && rm -rf $R
mkdir -p $R
phase() { echo "== [$((SECONDS - start)) s] $*"; }
left() { echo $((BUDGET - (SECONDS - start))); }
server_pid=""
# On exit: the server of this call goes; a build or conversion still running is left to a next
# call (KEEP=0 ends them too).
cleanup() {
  [ -n "$server_pid" ] && stop_ours
  if [ "${KEEP:-1}" = 0 ]; then
    for f in $R/build.pid $R/convert.pid; do [ -f $f ] && kill -- -"$(cat $f)" 2> /dev/null; done
  fi
  summary
}
# done_ok NAME: NAME's done-file says rc=0.
done_ok() { [ -f $R/$1.done ] && grep -q '^rc=0 ' $R/$1.done; }
# running NAME: NAME's background session is alive.
running() { [ -f $R/$1.pid ] && kill -0 "$(cat $R/$1.pid)" 2> /dev/null; }
trap cleanup EXIT

# bench_endpoint NAME PORT: warm-up, concurrency 64, concurrency 1, GSM8K, each into $R/NAME_*.
bench_endpoint() {
  local n=$1 url=http://127.0.0.1:$2
  local W="--input-len 512 --output-len 256 -o json"
  phase "$n: warm-up (8 requests of 16 tokens)"
  timeout 60 $X bench --endpoint $url --requests 8 --concurrency 8 --input-len 512 \
    --output-len 16 > /dev/null 2>&1
  phase "$n: 256 requests, concurrency 64"
  timeout 240 $X bench --endpoint $url --requests 256 --concurrency 64 $W > $R/${n}_c64.json \
    2> $R/${n}_c64.err
  grep -E '"(completed|failed|output_throughput|median_ttft_ms|median_tpot_ms|first_error)"' \
    $R/${n}_c64.json | tr -d '\n '; echo
  if [ "$(left)" -gt 60 ]; then
    phase "$n: 8 requests, concurrency 1"
    timeout 60 $X bench --endpoint $url --requests 8 --concurrency 1 $W > $R/${n}_c1.json \
      2> $R/${n}_c1.err
  fi
  if [ -f $D/gsm8k_test.jsonl ] && [ "$(left)" -gt 60 ]; then
    phase "$n: GSM8K, 64 problems, 256 tokens at most, reasoning low"
    timeout 90 $X eval --endpoint $url --task gsm8k --data $D/gsm8k_test.jsonl --limit 64 \
      --batch 64 --max-tokens 256 --reasoning low --out $R/${n}_gsm8k.jsonl \
      > $R/${n}_gsm8k.txt 2> $R/${n}_gsm8k.err
    echo "rc=$? $(tr '\n' ' ' < $R/${n}_gsm8k.txt)"
    grep -m3 "failed\|HTTP" $R/${n}_gsm8k.err
  fi
}

# stop_ours: this call's server (common.sh's stop_server), forgotten.
stop_ours() {
  stop_server "$server_pid"
  server_pid=""
}

summary() {
  trap - EXIT
  phase "summary"
  tail -c 100000 $R/llama_server.log > "$OUT/llama_server.log" 2> /dev/null
  tail -c 100000 $R/xserv_serve.log > "$OUT/xserv_serve.log" 2> /dev/null
  tail -c 60000 $R/build.log > "$OUT/llama_build.log" 2> /dev/null
  grep -E '^(INFO|WARNING|ERROR|Traceback|  File|[A-Za-z.]*(Error|Exception))' $R/convert.log 2> /dev/null |
    grep -v 'Setting chat_template' | tail -c 30000 > "$OUT/convert.log"
  python3 - "$R" "$OUT" << 'EOF' | tee "$OUT/summary.md"
import glob, json, os, sys
r, out = sys.argv[1], sys.argv[2]
res = {}
for f in sorted(glob.glob(f"{r}/*.json")):
    try:
        res[os.path.basename(f)[:-5]] = json.load(open(f))
    except Exception as e:
        res[os.path.basename(f)[:-5]] = {"unreadable": str(e)}
for f in sorted(glob.glob(f"{r}/*.txt")):
    res[os.path.basename(f)[:-4]] = open(f).read()
json.dump(res, open(f"{out}/results.json", "w"), indent=1)
rows = [("completed / failed", lambda j: f"{j['completed']} / {j['failed']}"),
        ("output tok/s", lambda j: f"{j['output_throughput']:,.0f}"),
        ("total tok/s", lambda j: f"{j['total_token_throughput']:,.0f}"),
        ("request/s", lambda j: f"{j['request_throughput']:.2f}"),
        ("TTFT median / p99 ms", lambda j: f"{j['median_ttft_ms']:.0f} / {j['p99_ttft_ms']:.0f}"),
        ("TPOT median / p99 ms", lambda j: f"{j['median_tpot_ms']:.2f} / {j['p99_tpot_ms']:.2f}"),
        ("ITL median / p99 ms", lambda j: f"{j['median_itl_ms']:.2f} / {j['p99_itl_ms']:.2f}"),
        ("E2E median / p99 s", lambda j: f"{j['median_e2e_ms']/1e3:.2f} / {j['p99_e2e_ms']/1e3:.2f}")]
for c in ("c64", "c1"):
    x, l = res.get(f"xserv_{c}"), res.get(f"llama_{c}")
    if not x and not l:
        continue
    print(f"\n| {c}: 512 in / 256 out | xserv serve | llama-server | xserv / llama |")
    print("|---|---|---|---|")
    for name, fn in rows:
        def cell(j):
            try: return fn(j)
            except Exception: return "-"
        ratio = "-"
        if name in ("output tok/s", "total tok/s", "request/s"):
            key = {"output tok/s": "output_throughput", "total tok/s": "total_token_throughput",
                   "request/s": "request_throughput"}[name]
            try: ratio = f"{x[key] / l[key]:.2f}"
            except Exception: pass
        print(f"| {name} | {cell(x)} | {cell(l)} | {ratio} |")
    for n, j in (("xserv", x), ("llama", l)):
        if j and j.get("first_error"):
            print(f"{n} first error: {j['first_error'][:300]}")
for n in ("xserv", "llama"):
    if f"{n}_gsm8k" in res:
        print(f"\nGSM8K via {n}: " + res[f"{n}_gsm8k"].strip().replace("\n", " | "))
lb = res.get("llama_bench")
if isinstance(lb, list):
    def name(t):
        n = f"pp{t['n_prompt']}" if t.get("n_gen", 0) == 0 else f"tg{t['n_gen']}"
        return n + (f" @ d{t['n_depth']}" if t.get("n_depth") else "")
    print("\nllama-bench: " + ", ".join(f"{name(t)} {t['avg_ts']:,.1f} tok/s" for t in lb))
if res.get("llama_batched"):
    print("llama-batched-bench (S_TG t/s is the batched decode figure):\n" + res["llama_batched"])
for f in ("xserv_bench", "xserv_bench_batch"):
    xb = res.get(f)
    if isinstance(xb, dict) and isinstance(xb.get("results"), list):
        print("xserv bench: " + ", ".join(f"{t['test']} {t['avg_ts']:,.1f} tok/s" for t in xb["results"]))
EOF
  grep -h "^phase" $R/times.txt 2> /dev/null
  echo "== done at $((SECONDS - start)) s"
}

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "llama.cpp $(cat .device/llama/COMMIT); earlier calls' steps done: $(cd $R && ls *.done 2> /dev/null | tr '\n' ' ')"
export PATH=/usr/local/cuda/bin:$PATH
if done_ok build || running build; then
  phase "llama.cpp build: $(cat $R/build.done 2> /dev/null || echo 'still running from an earlier call')"
else
  phase "unpack llama.cpp, build llama-server, llama-bench, llama-batched-bench in the background (ninja -j16, nice 19)"
  rm -rf $LS $R/build.done && tar -xJf .device/llama/llama-src.tar.xz -C /tmp || exit 1
  setsid bash -c "t0=\$SECONDS
    cmake -S $LS -B $LB -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
      -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_COMPRESSION_MODE=none -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
      > $R/build.log 2>&1 && echo \"phase llama.cpp cmake configure: \$((SECONDS - t0)) s\" >> $R/times.txt &&
    nice -n 19 ninja -C $LB -j16 llama-server llama-bench >> $R/build.log 2>&1
    rc=\$?
    [ \$rc = 0 ] && { nice -n 19 ninja -C $LB -j16 llama-batched-bench >> $R/build.log 2>&1 ||
      echo 'no llama-batched-bench target' >> $R/build.log; }
    echo \"phase llama.cpp build: \$((SECONDS - t0)) s, rc=\$rc\" >> $R/times.txt
    echo \"rc=\$rc \$((SECONDS - t0)) s\" > $R/build.done" < /dev/null > /dev/null 2>&1 &
  echo $! > $R/build.pid
fi

if done_ok convert || running convert; then
  phase "GGUF: $(cat $R/convert.done 2> /dev/null || echo 'conversion still running from an earlier call')"
else
  if ! done_ok synth && [ "${REUSE_G20:-0}" = 1 ] && [ -d /tmp/g20 ]; then
    phase "an earlier script's /tmp/g20 and /tmp/p64 kept (REUSE_G20=1)"
    echo "rc=0 0 s (kept)" > $R/synth.done
    [ -f /tmp/p64/plan.json ] && echo "rc=0 0 s (kept)" > $R/plan.done
  fi
  if ! done_ok synth; then
    phase "synth the 20b"
    t0=$SECONDS
    synth20b && echo "rc=0 $((SECONDS - t0)) s" > $R/synth.done
    echo "phase synth: $((SECONDS - t0)) s" >> $R/times.txt
  fi
  # The conversion reads the tokenizer and the chat template from the checkpoint's directory:
  # a second directory of links keeps /tmp/g20 as every other script has it.
  rm -rf /tmp/g20hf && mkdir /tmp/g20hf && ln -s /tmp/g20/* /tmp/g20hf/
  xz -dc .device/llama/tokenizer.json.xz > /tmp/g20hf/tokenizer.json
  cp .device/llama/tokenizer_config.json /tmp/g20hf/
  cp $LS/models/templates/openai-gpt-oss-120b.jinja /tmp/g20hf/chat_template.jinja
  phase "convert to GGUF in the background (nice 19)"
  setsid bash -c "t0=\$SECONDS
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 nice -n 19 python3 $LS/convert_hf_to_gguf.py \
      /tmp/g20hf --outfile /tmp/g20.gguf --outtype bf16 > $R/convert.log 2>&1
    rc=\$?
    echo \"phase convert: \$((SECONDS - t0)) s, rc=\$rc\" >> $R/times.txt
    echo \"rc=\$rc \$((SECONDS - t0)) s\" > $R/convert.done" < /dev/null > /dev/null 2>&1 &
  echo $! > $R/convert.pid
fi

if [ ! -f /tmp/p64/plan.json ] || ! done_ok plan; then
  phase "compile the xserv plan"
  t0=$SECONDS
  $X compile /tmp/g20 -o /tmp/p64 --max-seq 8192 --max-batch 64 2>&1 | tail -1
  [ "${PIPESTATUS[0]}" = 0 ] && echo "rc=0 $((SECONDS - t0)) s" > $R/plan.done
  echo "phase xserv compile: $((SECONDS - t0)) s" >> $R/times.txt
fi

if [ "${PREP:-0}" = 1 ]; then
  phase "PREP=1: the build and the conversion go on in the background; run this again (PREP unset) in a later call on this machine"
  exit 0
fi

# wait_done NAME SECONDS: NAME's done-file, or time up.
wait_done() {
  local t0=$SECONDS
  while [ ! -f $R/$1.done ] && [ $((SECONDS - t0)) -lt "$2" ]; do sleep 1; done
  [ -f $R/$1.done ]
}

xserv_part() {
  grep -q '"completed": [1-9]' $R/xserv_c64.json 2> /dev/null && return 0 # an earlier call's
  phase "xserv serve (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  t0=$SECONDS
  $X serve /tmp/p64 --port $XPORT --tokenizer $D/o200k_base.tiktoken --max-running 64 \
    ${XSERV_SERVE_FLAGS:-} > $R/xserv_serve.log 2>&1 &
  server_pid=$!
  if wait_health $XPORT $server_pid 120; then
    echo "phase xserv serve ready: $((SECONDS - t0)) s" >> $R/times.txt
    bench_endpoint xserv $XPORT
  fi
  stop_ours
  echo "phase xserv part: $((SECONDS - t0)) s" >> $R/times.txt
}

[ "${OVERLAP:-1}" = 1 ] && xserv_part
phase "wait for the GGUF conversion"
wait_done convert $(($(left) - 110)) || { echo "conversion not done: run again"; exit 1; }
cat $R/convert.done; grep -E "Error|error:" $R/convert.log | head -5
done_ok convert || exit 1
phase "wait for the llama.cpp build"
wait_done build $(($(left) - 100)) ||
  { echo "build not done: run again"; tail -2 $R/build.log; exit 1; }
cat $R/build.done; grep -E "FAILED|error:" $R/build.log | head -10
[ -x $LB/bin/llama-server ] || exit 1
[ "${OVERLAP:-1}" = 1 ] || xserv_part

if ! grep -q '"completed": [1-9]' $R/llama_c64.json 2> /dev/null; then
  phase "llama-server"
  t0=$SECONDS
  # 64 slots of 1024 positions (a slot stops one short of its context); llama-server ignores
  # a request's reasoning_effort other than "none", so the template gets the eval's effort here.
  $LB/bin/llama-server -m /tmp/g20.gguf --host 127.0.0.1 --port $LPORT -ngl 999 -fa on -np 64 \
    -c 65536 --no-webui --chat-template-kwargs '{"reasoning_effort": "low"}' \
    ${LLAMA_SERVER_FLAGS:-} > $R/llama_server.log 2>&1 &
  server_pid=$!
  if wait_health $LPORT $server_pid 150; then
    echo "phase llama-server ready: $((SECONDS - t0)) s" >> $R/times.txt
    grep -m3 -E "n_ctx_slot|model loaded|chat template" $R/llama_server.log
    bench_endpoint llama $LPORT
  fi
  stop_ours
  echo "phase llama part: $((SECONDS - t0)) s" >> $R/times.txt
fi

if [ "$(left)" -gt 100 ] && [ ! -s $R/llama_bench.json ]; then
  phase "llama-bench pp512, pp2048, tg128 at depth 0 and 4096"
  timeout 150 $LB/bin/llama-bench -m /tmp/g20.gguf -ngl 999 -fa 1 -p 512,2048 -n 128 -d 0,4096 \
    -r 3 -o json > $R/llama_bench.json 2> $R/llama_bench.err || tail -3 $R/llama_bench.err
fi
if [ "$(left)" -gt 70 ] && [ -x $LB/bin/llama-batched-bench ] && [ ! -s $R/llama_batched.txt ]; then
  phase "llama-batched-bench: 128 tokens at 8 and 64 sequences"
  timeout 90 $LB/bin/llama-batched-bench -m /tmp/g20.gguf -ngl 999 -fa on -c 16384 -npp 1 \
    -ntg 128 -npl 8,64 > $R/llama_batched.log 2>&1 || tail -3 $R/llama_batched.log
  grep -E '^\|' $R/llama_batched.log > $R/llama_batched.txt
fi
if [ "$(left)" -gt 40 ] && [ ! -s $R/xserv_bench.json ]; then
  phase "xserv bench, the same rows (same call)"
  timeout 100 $X bench /tmp/p64 --backend cuda -p 512,2048 -n 128 -b 1 -d 0,4096 -r 2 -o json \
    > $R/xserv_bench.json 2> /dev/null
  timeout 60 $X bench /tmp/p64 --backend cuda -p 0 -n 128 -b 8,64 -r 2 -o json \
    > $R/xserv_bench_batch.json 2> /dev/null
fi
