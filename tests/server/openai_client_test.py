#!/usr/bin/env python3
"""`xserv serve` through the official `openai` Python client: chat, streaming with usage,
completions, responses (plain, streamed, a function call round trip), a tool call round trip,
and the client's error types for 400 / 401 / 404.

usage: openai_client_test.py XSERV_BINARY SOURCE_DIR DATA_DIR
Exits 77 (ctest SKIP_RETURN_CODE) when the openai package or the shared data is missing.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_process import tiny_server  # noqa: E402

SKIP = 77


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    binary, source, data = sys.argv[1:]
    try:
        import openai
    except ImportError:
        print("skipped: the openai package is not installed (pip install openai)")
        return SKIP
    tokenizer = os.path.join(os.environ.get("XSERV_DATA", data), "o200k_base.tiktoken")
    if not os.path.exists(tokenizer):
        print(f"skipped: {tokenizer} not found (set XSERV_DATA)")
        return SKIP

    with tempfile.TemporaryDirectory(prefix="xserv_openai_") as tmp:
        with tiny_server(binary, source, tokenizer, tmp,
                         ["--max-seq", "192", "--max-batch", "2", "--api-key", "test-key"]) as url:
            run_checks(openai, url + "/v1")
    print("ok: chat, stream with usage, completions, responses, tool round trips, 400/401/404")
    return 0


def run_checks(openai, base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="test-key", max_retries=0)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]

    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8,
                                          temperature=0, reasoning_effort="low")
    choice = chat.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length", "tool_calls"), choice.finish_reason
    assert chat.usage.completion_tokens == 8, chat.usage
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + 8

    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].choices == []
    assert chunks[-2].choices[0].finish_reason == "length"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == (choice.message.content or ""), (streamed, choice.message.content)

    comp = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=5,
                                     temperature=0)
    assert comp.choices[0].finish_reason == "length"
    assert comp.usage.completion_tokens == 5
    ids = client.completions.create(model="tiny", prompt=[1000, 2000, 3000], max_tokens=3)
    assert ids.usage.prompt_tokens == 3
    # A loglikelihood request as lm-evaluation-harness's local-completions sends it.
    scored = client.completions.create(model="tiny", prompt=[1000, 2000, 3000, 4000],
                                       max_tokens=1, temperature=0, logprobs=1, echo=True)
    lp = scored.choices[0].logprobs
    assert len(lp.tokens) == 5 and lp.token_logprobs[0] is None, lp
    assert all(x <= 0 for x in lp.token_logprobs[1:]), lp.token_logprobs
    assert lp.top_logprobs[0] is None and all(len(t) == 1 for t in lp.top_logprobs[1:])

    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    history = messages + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_abc", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": '{"temp_c": 21}'}]
    tool_reply = client.chat.completions.create(model="tiny", messages=history, tools=tools,
                                                max_tokens=6, temperature=0)
    msg = tool_reply.choices[0].message
    assert msg.role == "assistant"
    assert msg.content is not None or msg.tool_calls

    ask = dict(model="tiny", input="What is 2 + 2?", instructions="Answer briefly.",
               reasoning={"effort": "low"}, max_output_tokens=8, temperature=0)
    resp = client.responses.create(**ask)
    assert resp.object == "response" and resp.status == "incomplete", resp.status
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.output_tokens == 8, resp.usage
    assert resp.usage.total_tokens == resp.usage.input_tokens + 8
    assert resp.output and resp.output[-1].type == "message", resp.output
    events = list(client.responses.create(**ask, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == resp.output_text, (streamed, resp.output_text)
    assert events[-1].response.output_text == resp.output_text
    fn_tools = [{"type": "function", "name": "get_weather",
                 "description": "Current weather in a city",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"]}}]
    after_call = client.responses.create(model="tiny", tools=fn_tools, max_output_tokens=6,
                                         temperature=0, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_abc", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_abc", "output": '{"temp_c": 21}'}])
    assert after_call.output and after_call.tools[0].name == "get_weather"

    def expect(error_type, call, param=None):
        try:
            call()
        except error_type as e:
            body = e.body if isinstance(e.body, dict) else {}
            if param is not None:
                assert body.get("param") == param, body
            return
        raise AssertionError(f"expected {error_type.__name__}")

    expect(openai.BadRequestError, lambda: client.chat.completions.create(
        model="tiny", messages=messages, temperature=5), "temperature")
    expect(openai.BadRequestError, lambda: client.chat.completions.create(
        model="tiny", messages=messages, extra_body={"frobnicate": 1}), "frobnicate")
    expect(openai.NotFoundError, lambda: client.chat.completions.create(
        model="gpt-5", messages=messages))
    expect(openai.BadRequestError, lambda: client.responses.create(
        model="tiny", input="x", previous_response_id="resp_1"), "previous_response_id")
    expect(openai.BadRequestError, lambda: client.responses.create(
        model="tiny", input="x", max_output_tokens=0), "max_output_tokens")
    bad_key = openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0)
    expect(openai.AuthenticationError, lambda: bad_key.chat.completions.create(
        model="tiny", messages=messages))
    assert [m.id for m in client.models.list()] == ["tiny"]


if __name__ == "__main__":
    sys.exit(main())
