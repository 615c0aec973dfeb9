// The command table: names, usage, options and handlers of every xserv subcommand.
#include "cli/commands.h"

#include <initializer_list>

namespace xserv::cli {

namespace {

// Option groups several commands declare with the same meaning and help.

const OptSpec kWeights{"--weights", "DIR",
                       "checkpoint directory (default: the one the plan was built from)"};
const OptSpec kVerifyWeights{
    "--verify-weights", "",
    "plan: hash every checkpoint file whole (SHA-256) against the digests compile recorded, "
    "before loading (about 1 GB/s a file on a CPU with SHA extensions)"};

/// Where the model runs and where its weights come from; the KV pools and the engine's use of
/// them.
const std::vector<OptSpec>& load_options() {
  static const std::vector<OptSpec> opts = {
      {"--backend", "auto|cpu|cuda", "where to run (default auto: cuda when a GPU is usable)"},
      kWeights,
      kVerifyWeights,
      {"--gpu-memory-utilization", "F",
       "share of the GPU's memory the process may hold; the KV pools get what the weights and "
       "buffers leave of it (default 0.9)"},
      {"--kv-memory", "GIB", "KV pools of this many GiB instead"},
      {"--no-prefix-cache", "", "compute every prompt whole (no reuse of cached KV blocks)"},
      {"--prefill-budget", "N",
       "prompt tokens a step takes beside running decodes (default 0: the step budget)"},
      {"--backlog-steps", "N",
       "a deeper backlog raises that budget to the waiting prompt tokens over N steps (default "
       "8; 0: the fixed budget only)"},
      {"--itl-target", "MS",
       "beside running decodes, prompt tokens stop where the step's expected time (learned "
       "from the steps so far) reaches MS milliseconds (default 0: off)"},
      {"--itl-factor", "F",
       "the same with the target F times the expected time alone of the batch the step heads "
       "for, its running and queued sequences (default 3 for serve, else 0: off)"},
      {"--itl-tail", "Q",
       "with a target or factor: a step takes its prompts without that bound while the decodes "
       "of recent steps past it, its own included, stay within the share Q of all recent "
       "decodes (0 to 0.5; default 0: every step bounded)"}};
  return opts;
}

const OptSpec kTokenizer{"--tokenizer", "PATH", "tokenizer.json or o200k_base.tiktoken"};

/// Sampling beyond the seed (whose default each command states).
const std::vector<OptSpec>& sampling_options_spec() {
  static const std::vector<OptSpec> opts = {
      {"--temperature", "T", "0 for greedy (default)"},
      {"--top-p", "P", "nucleus sampling threshold (default 1)"},
      {"--top-k", "K", "sample among the K most likely (default: all)"},
      {"--min-p", "P", "drop tokens below P x the most likely one's probability (default 0)"}};
  return opts;
}

/// The logit adjustments (run, chat).
const std::vector<OptSpec>& logit_adjust_options_spec() {
  static const std::vector<OptSpec> opts = {
      {"--logit-bias", "ID:B,...", "add B (-100..100) to token ID's logit"},
      {"--presence-penalty", "P", "subtract P (-2..2) from tokens already generated"},
      {"--frequency-penalty", "F", "subtract F (-2..2) times how often a token was generated"},
      {"--repetition-penalty", "R",
       "divide (multiply, if negative) the logits of prompt and output tokens by R"}};
  return opts;
}

/// The harmony chat format's system-side settings.
const std::vector<OptSpec>& chat_format_options() {
  static const std::vector<OptSpec> opts = {
      {"--system", "TEXT", "developer instructions for the chat"},
      {"--reasoning", "low|medium|high", "reasoning effort (default medium)"},
      {"--date", "YYYY-MM-DD", "current date for the system message"}};
  return opts;
}

const OptSpec kShowReasoning{"--show-reasoning", "", "also stream the analysis channel"};

const OptSpec kPipelineToken{
    "--pipeline-token", "TOKEN",
    "pipelined plan: the secret every rank proves it holds (default: $XSERV_PIPELINE_TOKEN; "
    "visible to other users in ps, prefer the variable on shared hosts)"};

/// How rank 0 of a pipelined plan finds its stages, then the token.
const std::vector<OptSpec>& pipeline_options() {
  static const std::vector<OptSpec> opts = {
      {"--coordinator", "HOST:PORT",
       "pipelined plan: listen here for ranks started with `xserv worker` (default: start "
       "them on this host)"},
      {"--world", "N", "pipelined plan: ranks in all (must equal the plan's stages)"},
      {"--pp-local", "", "pipelined plan: run every stage in this process instead"},
      kPipelineToken};
  return opts;
}

/// The options of a command: its own and the groups, in order.
std::vector<OptSpec> options(std::initializer_list<std::vector<OptSpec>> parts) {
  std::vector<OptSpec> all;
  for (const std::vector<OptSpec>& p : parts)
    all.insert(all.end(), p.begin(), p.end());
  return all;
}

} // namespace

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {{"bench",
        "PLAN_OR_MODEL [-p 512,2048] [-n 128] [-d 0,4096] [-b 1,8,32,64] [--mixed 128] [-r 5] "
        "[-o md|json|csv]\n"
        "       xserv bench [PLAN_OR_MODEL | --endpoint URL] --requests N [--concurrency C] "
        "[--rate R] [--input-len I] [--output-len O]",
        "measure prefill and decode tokens/s on random token ids, as llama-bench does; with "
        "--requests, serving throughput and latency, as vllm bench serve does",
        options(
            {{{"-p", "N,N", "prompt sizes for prefill tests ppN (default 512; 0 skips)"},
              {"-n", "N,N", "tokens for decode tests tgN (default 128; 0 skips)"},
              {"-d", "D,D", "context depth filled before each test, untimed (default 0)"},
              {"-b", "B,B", "sequences decoded together in tg tests (default 1)"},
              {"--mixed", "M,M",
               "also each tg test with a prompt chunk of M tokens in every step (tgN x B + pM: "
               "decode tokens/s and step times while a prompt is prefilled)"},
              {"-r", "R", "timed repeats after one warm-up (default 5)"},
              {"-o", "md|json|csv", "output format (default md)"},
              {"--seed", "S", "seed of the random token ids (default 1)"}},
             load_options(),
             {{"--max-seq", "S", "cache length (default: what the tests need, or the plan's)"},
              {"--max-batch", "B",
               "most sequences a step holds (default: what the tests need, or the plan's)"},
              {"--pp-local", "", "pipelined plan: run every stage in this process (one GPU)"},
              kPipelineToken,
              {"--requests", "N", "serving benchmark: N random requests through the engine"},
              {"--concurrency", "C", "serving: requests in flight at most (default 64)"},
              {"--rate", "R", "serving: Poisson arrivals per second (default 0: all at once)"},
              {"--input-len", "I", "serving: prompt tokens per request (default 512)"},
              {"--output-len", "O", "serving: generated tokens per request (default 256)"},
              {"--len-range", "F", "serving: lengths uniform in len x [1-F, 1+F] (default 0)"},
              {"--shared-prefix", "N", "serving: every prompt starts with the same N tokens"},
              {"--turns", "N",
               "serving: conversations of N turns, each turn's prompt the last one's with its "
               "reply and input-len new tokens (default 1)"},
              {"--max-running", "N",
               "serving: sequences the engine runs at once (default: max batch)"},
              {"--max-tokens-per-step", "N", "serving: the engine's token budget (default 8192)"},
              {"--admit-batch", "N", "serving: waiting requests join N at a time (default 1)"},
              {"--json-schema", "FILE",
               "serving: every request's whole output follows the JSON schema in FILE "
               "(structured output's cost; it may end at an eos id)"},
              {"--json", "", "serving: every output is a JSON object"},
              {"--regex", "RE", "serving: every output matches the regular expression RE"},
              {"--grammar", "FILE", "serving: every output follows the EBNF grammar in FILE"},
              kTokenizer,
              {"--endpoint", "URL", "serving: an OpenAI-compatible server instead of a plan"},
              {"--model", "NAME", "serving with --endpoint: the model name to send"},
              {"--api-key", "KEY", "serving with --endpoint: the bearer token"},
              {"--vocab", "V", "serving with --endpoint: prompt ids below V (default 199998)"},
              {"--disconnect", "F",
               "serving with --endpoint: this fraction of clients hang up "
               "mid-stream (default 0)"}}}),
        0, 1},
       &cmd_bench},
      {{"chat", "PLAN_OR_MODEL [options]",
        "talk with a model: one line per turn on stdin, /help for the commands",
        options(
            {chat_format_options(),
             {kShowReasoning, {"--max-tokens", "N", "most tokens per reply (default 1024)"}},
             sampling_options_spec(),
             logit_adjust_options_spec(),
             {{"--seed", "S", "sampling seed (default 0; turn N uses S+N)"}},
             load_options(),
             {kTokenizer,
              {"--max-seq", "S", "longest conversation in tokens (default: the plan's, else 4096)"},
              kPipelineToken}}),
        1, 1},
       &cmd_chat},
      {{"compile",
        "MODEL_DIR (-o PLAN_DIR | --emit ir) [options]",
        "compile a gpt-oss checkpoint (or a directory holding only config.json) into a plan",
        {{"-o", "PLAN_DIR", "write the plan directory here", "--output"},
         {"--emit", "ir|plan", "stop and print the IR (ir) or write the plan (plan, default)"},
         {"--passes", "P1,P2", "passes to run, in order (default: cse, the fusions, dce)"},
         {"--dump-after", "P1,P2", "print the IR after these passes ('all' for every pass)"},
         {"--verify-after-all", "", "verify the IR after every pass"},
         {"--stop-after", "N", "run only the first N passes"},
         {"--dump-dir", "DIR", "write NN_pass.ir files for each step here"},
         {"--all-logits", "", "return logits for every token, not only each sequence's last"},
         {"--max-batch", "B",
          "most sequences a step holds: decode graph buckets and step buffers (default 256)"},
         {"--kv-block", "N", "positions per KV-cache block, a power of two (default 16)"},
         {"--max-seq", "S", "longest sequence, prompt plus output (default 8192)"},
         {"--kv-dtype", "f32|bf16", "KV cache element type (default f32: exact keys/values)"},
         {"--prefill-chunk", "T", "most prompt tokens per step (default min(2048, max-seq))"},
         {"--pp", "N", "pipeline stages (default 1)"},
         {"--arch", "sm_XX", "GPU architecture of the kernels (default sm_90)"},
         {"--expert-format", "bf16|mxfp4|both",
          "MoE expert weights on the GPU: kept as mxfp4 (default, decoded in the kernels), "
          "dequantised to bf16, or both (mxfp4 for decode steps, bf16 for prompt gemms)"},
         {"--gemm-precision", "split|bf16",
          "gemm activations as plain bf16 (default, fastest) or bf16 hi + lo pairs (split: "
          "about fp32, batch-invariant)"},
         {"--dense-gemm", "wg|cublas",
          "dense projections of prompt steps on cuBLAS (default with bf16 gemms on sm_90) or "
          "our warpgroup gemm"},
         {"--gemm-order", "fast|canonical|natural",
          "every step's sums in the prompt gemms' order (canonical: a token's logits are the "
          "same bits alone, batched or chunked; projections on our warpgroup gemm: prompts "
          "7-11%, decode 13-15% slower; natural: the same guarantee with the projections in "
          "cuBLAS's K order, on cuBLAS: prompts 0-2% and 64 sequences 4% slower, decode of 1-8 "
          "sequences 25-30%) or the fastest "
          "kernels (default)"},
         {"--no-cubins", "", "write kernel sources only, skip NVRTC"},
         {"--timeline", "",
          "a diagnostic plan: every kernel stamps the GPU clock as it starts, and the run "
          "prints "
          "each kernel's share of the step (docs/DESIGN.md)"}},
        1,
        1},
       &cmd_compile},
      {{"eval", "(PLAN_OR_MODEL | --endpoint URL) --task gsm8k|aime25 --data FILE.jsonl [options]",
        "score a model on GSM8K or AIME 2025: accuracy, pass@k, per-sample JSONL",
        options(
            {{{"--task", "gsm8k|aime25", "which benchmark the data file holds"},
              {"--data", "FILE", "JSONL problems (gsm8k_test.jsonl, aime2025.jsonl)"},
              {"--limit", "N", "only the first N problems"},
              {"--samples", "K", "samples per problem (default 1; sample k uses seed S+k)"},
              {"--batch", "B", "sequences generated together (default: the plan's, else 8)"},
              {"--reasoning", "low|medium|high", "reasoning effort (default medium)"},
              {"--max-tokens", "N", "most tokens per sample (default 2048)"},
              {"--out", "FILE", "write one JSON line per sample here"}},
             sampling_options_spec(),
             {{"--seed", "S", "sampling seed (default 0)"}},
             load_options(),
             {kTokenizer,
              {"--max-seq", "S",
               "longest sequence (default: the plan's, else prompt + max tokens)"},
              {"--endpoint", "URL",
               "instead of a plan: an OpenAI-compatible server (http://HOST:PORT[/v1]); --batch "
               "requests at a time"},
              {"--model", "NAME", "with --endpoint: the model to ask for (default: its first)"},
              {"--api-key", "KEY", "with --endpoint: sent as Authorization: Bearer KEY"},
              kPipelineToken}}),
        0, 1},
       &cmd_eval},
      {{"inspect",
        "PLAN_DIR [--json]",
        "show a plan: stages, weights, KV cache, activation memory, ops, roofline floors",
        {{"--json", "", "machine-readable output"}},
        1,
        1},
       &cmd_inspect},
      {{"run", "PLAN_OR_MODEL (--prompt-ids 1,2,3 | --prompt TEXT) [options]",
        "generate from a plan or checkpoint: token ids, or text in the harmony chat format",
        options(
            {{{"--prompt-ids", "IDS", "comma-separated prompt token ids"},
              {"--prompt", "TEXT", "a user message, rendered in the harmony chat format"}},
             chat_format_options(),
             {{"--raw", "", "send --prompt as plain text, without the chat format"},
              kShowReasoning,
              {"--max-tokens", "N", "tokens to generate (default 128)"},
              {"--json-schema", "FILE",
               "the answer follows the JSON schema in FILE (chat: the final channel; --raw: "
               "the whole output)"},
              {"--json", "", "the answer is a JSON object"},
              {"--regex", "RE", "the answer matches the regular expression RE"},
              {"--grammar", "FILE", "the answer follows the EBNF grammar in FILE (rule root)"}},
             sampling_options_spec(),
             logit_adjust_options_spec(),
             {{"--seed", "S", "sampling seed (default 0)"},
              {"--stop-at-eos", "", "with --prompt-ids: stop at the config's eos ids"},
              {"--logits-out", "FILE",
               "with --prompt-ids: write each step's logits (vocab float32 values per generated "
               "token, little-endian) to FILE"}},
             load_options(),
             {kTokenizer,
              {"--max-seq", "S", "longest sequence (default: the plan's, else 4096)"},
              {"--max-batch", "B", "most sequences a step holds (default: the plan's)"}},
             pipeline_options()}),
        1, 1},
       &cmd_run},
      {{"serve", "PLAN_OR_MODEL [--host 127.0.0.1] [--port 8000] [options]",
        "serve a model over OpenAI-compatible HTTP (/v1/chat/completions, /v1/responses, ...)",
        options(
            {{{"--host", "ADDR", "address to listen on (default 127.0.0.1)"},
              {"--port", "N", "port to listen on (default 8000; 0: any free port)"},
              {"--api-key", "KEY",
               "require Authorization: Bearer KEY on every route but /health (default: "
               "$XSERV_API_KEY)"},
              {"--metrics-public", "", "serve /metrics without the API key"},
              {"--served-model-name", "NAME", "the model name clients use (default gpt-oss)"},
              {"--max-running", "N",
               "sequences running at once, n choices counting n (default: the plan's max "
               "batch; the KV pools decide how many fit)"},
              {"--max-queue", "N", "requests waiting to run; more get 429 (default 4096)"},
              {"--max-tokens-per-step", "N", "decode plus prompt tokens per step (default 8192)"},
              {"--max-body", "SIZE", "largest request body; larger get 413 (default 16MiB)"},
              {"--max-json-depth", "N",
               "deepest nesting of a request body's arrays and objects; deeper get 400 "
               "(default 64)"},
              {"--max-connections", "N", "connections open at once; more get 503 (default 8192)"},
              {"--max-connections-per-client", "N",
               "connections open at once from one address; more get 503 (default 512; 0: no cap)"},
              {"--header-timeout", "SECONDS",
               "a request's whole header, from its first byte; slower clients are cut off "
               "(default 10)"},
              {"--body-timeout", "SECONDS", "a request's whole body (default 60)"},
              {"--keep-alive-timeout", "SECONDS",
               "an idle kept-alive connection waits this long for its next request (default 30)"},
              {"--write-timeout", "SECONDS",
               "a client that reads nothing this long is cut off, its request aborted (default "
               "60)"},
              {"--http-threads", "N", "threads serving the connections (default 2)"},
              {"--grace", "SECONDS", "on SIGTERM/SIGINT, time running requests get (default 30)"}},
             load_options(),
             {kTokenizer,
              {"--max-seq", "S", "longest sequence (default: the plan's, else 4096)"},
              {"--max-batch", "B", "most sequences a step holds (default: the plan's)"}},
             pipeline_options()}),
        1, 1},
       &cmd_serve},
      {{"worker",
        "PLAN_DIR --rank R --world N --coordinator HOST:PORT [--device D] [--weights DIR] "
        "[--pipeline-token TOKEN]",
        "run pipeline stage R of a plan compiled with --pp N for the rank 0 at HOST:PORT",
        {{"--rank", "R", "this process's stage, 1..N-1 (rank 0 is `xserv run`)"},
         {"--world", "N", "ranks in all"},
         {"--coordinator", "HOST:PORT", "where rank 0 listens"},
         {"--device", "D", "with the CUDA backend: run on this host's visible GPU D (default 0)"},
         kWeights,
         kVerifyWeights,
         kPipelineToken},
        1,
        1},
       &cmd_worker},
      {{"synth",
        "--config CONFIG.json -o DIR [options]",
        "write a random-weight checkpoint of any gpt-oss config in the Hugging Face layout",
        {{"--config", "FILE", "a gpt-oss config.json"},
         {"-o", "DIR", "output checkpoint directory", "--output"},
         {"--seed", "N", "random seed (same seed, same bytes)"},
         {"--shard-size", "SIZE", "bytes per shard, e.g. 5GB (default)"},
         {"--matrix-std", "S", "std of BF16 matrices (default 0.02)"},
         {"--bias-std", "S", "std of biases (default 0.02)"},
         {"--norm-std", "S", "norm weights are 1 + N(0, S) (default 0.1)"},
         {"--sink-std", "S", "std of attention sinks (default 1)"},
         {"--router-std", "S", "std of router weights (default 0.2)"},
         {"--expert-scale-range", "LO,HI", "MXFP4 scale bytes in [LO, HI) (default 116,119)"},
         {"--threads", "N", "writer threads (default: all cores)"}},
        0,
        0},
       &cmd_synth},
      {{"tokenize",
        "MODEL_DIR_OR_TOKENIZER TEXT [--allow-special] | --decode IDS",
        "print the o200k_harmony token ids of TEXT",
        {{"--allow-special", "", "recognise special tokens such as <|start|> in TEXT"},
         {"--decode", "IDS", "decode comma-separated ids to text instead"}},
        1,
        2},
       &cmd_tokenize},
      {{"trace",
        "PLAN_DIR --prompt-ids IDS -o FILE [--backend cpu|cuda]",
        "write the residual stream of a teacher-forced prompt, layer by layer (for "
        "tools/hf_layer_compare.py)",
        {{"--prompt-ids", "IDS", "comma-separated prompt token ids"},
         {"-o", "FILE", "float32 [embedding + layers, tokens, hidden]; FILE.json describes it"},
         {"--backend", "cpu|cuda|auto", "the interpreter (default), the GPU engine, or auto"},
         {"--weights", "DIR", "checkpoint directory (default: the one the plan was built from)"}},
        1,
        1},
       &cmd_trace},
  };
  return table;
}

} // namespace xserv::cli
