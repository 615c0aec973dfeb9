"""Class "http": `xserv serve` spoken to over raw sockets (malformed JSON, wrong types, auth,
huge bodies, Content-Length / Transfer-Encoding framing, slowloris, many connections)."""
import json
import re
import signal
import socket
import threading
import time

from .common import (C, CRASH_PATTERNS, LIB_PATTERNS, REAL_TIKTOKEN, Proc, X, free_port, now,
                     record)


API_KEY = "probe-key"


def http(port, method, path, body=None, headers=None, raw=None, timeout=20, source=None):
    """One exchange on a fresh connection, read to its end; the bytes stay in C.last_raw.
    `source`: another loopback address to connect from (another client, as the server counts)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                 source_address=(source, 0) if source else None)
    try:
        if raw is None:
            b = body if isinstance(body, (bytes, bytearray)) else (
                json.dumps(body).encode() if body is not None else b"")
            hs = {"Host": "x", "Content-Length": str(len(b)), "Connection": "close",
                  "Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
            for k, v in (headers or {}).items():
                if v is None:
                    hs.pop(k, None)
                else:
                    hs[k] = v
            raw = (f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in
                                                             hs.items()) + "\r\n").encode() + b
        s.sendall(raw)
        data = b""
        while True:
            c = s.recv(65536)
            if not c:
                break
            data += c
    finally:
        s.close()
    C.last_raw = data
    m = re.match(rb"HTTP/1\.[01] (\d{3})", data)
    status = int(m.group(1)) if m else None
    body = data.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in data else b""
    return status, body.decode("utf-8", "replace")


def http_case(desc, method, path, body=None, expect="4xx", names=None, headers=None, raw=None,
              timeout=20):
    t0 = now()
    status, text = None, ""
    to = False
    try:
        status, text = http(C.port, method, path, body, headers, raw, timeout)
    except socket.timeout:
        to = True
    except OSError as e:
        text = f"{type(e).__name__}: {e}"
    wall = now() - t0
    alive = C.server.p.poll() is None
    if not alive:
        oc = "crash"
    elif to:
        oc = "hang"
    elif status is None:
        oc = "misleading"  # no HTTP answer at all
    elif expect == "4xx":
        if 200 <= status < 300:
            oc = "silent_wrong"
        elif status >= 500:
            oc = "misleading"
        elif any(re.search(p, text) for p in LIB_PATTERNS):
            oc = "misleading"
        elif names and not any(n.lower() in text.lower() for n in names):
            oc = "misleading"
        else:
            oc = "clean"
    elif expect == "2xx":
        oc = "clean" if 200 <= status < 300 else "refused_ok"
    else:  # either
        oc = "clean" if status < 500 else "misleading"
    record("http", desc, None, text, wall, oc, status=status,
           note=f"status {status}: {text.strip()[:150]}", cmd=f"{method} {path}")
    if not alive:
        raise RuntimeError("server died")


def http_cases():
    port = free_port()
    C.port = port
    C.server = Proc(X("serve", C.plan, "--backend", "cpu", "--port", port, "--api-key", API_KEY,
                      "--tokenizer", REAL_TIKTOKEN, "--max-body", "1MiB", "--grace", "1"))
    t0 = now()
    while now() - t0 < 60:
        try:
            st, _ = http(port, "GET", "/health", timeout=5)
            if st == 200:
                break
        except OSError:
            pass
        time.sleep(0.3)
    CC, CP = "/v1/chat/completions", "/v1/completions"
    msg = [{"role": "user", "content": "Hi"}]
    try:
        http_case("control: chat completion", "POST", CC, {"messages": msg, "max_tokens": 2},
                  "2xx")
        http_case("control: completion with ids", "POST", CP, {"prompt": [1, 2, 3],
                                                              "max_tokens": 2}, "2xx")
        for raw, d in [(b"{", "truncated JSON"), (b"", "empty body"), (b"null", "null body"),
                       (b"[]", "list body"), (b"\xff\xfe", "binary body"),
                       (b'{"messages": [], "messages": []}', "duplicate keys, empty messages"),
                       (b"[" * 100000, "100k nested brackets"),
                       (b'{"a":' * 20000 + b"1" + b"}" * 20000, "20k nested objects")]:
            http_case(f"chat: {d}", "POST", CC, raw, "4xx", None)
        bad_fields = [
            ("messages a string", {"messages": "hi"}, ["messages"]),
            ("messages missing", {"max_tokens": 2}, ["messages"]),
            ("message role 7", {"messages": [{"role": 7, "content": "x"}]}, ["role"]),
            ("message role unknown", {"messages": [{"role": "wizard", "content": "x"}]}, ["role"]),
            ("message content a number", {"messages": [{"role": "user", "content": 5}]},
             ["content"]),
            ("max_tokens -1", {"messages": msg, "max_tokens": -1}, ["max_tokens"]),
            ("max_tokens 0", {"messages": msg, "max_tokens": 0}, ["max_tokens"]),
            ("max_tokens 2^63", {"messages": msg, "max_tokens": 2 ** 63}, ["max_tokens"]),
            ("max_tokens 1e99", {"messages": msg, "max_tokens": 1e99}, ["max_tokens"]),
            ("max_tokens '5'", {"messages": msg, "max_tokens": "5"}, ["max_tokens"]),
            ("max_tokens 2.5", {"messages": msg, "max_tokens": 2.5}, ["max_tokens"]),
            ("temperature -1", {"messages": msg, "temperature": -1, "max_tokens": 2},
             ["temperature"]),
            ("temperature 1e308", {"messages": msg, "temperature": 1e308, "max_tokens": 2},
             ["temperature"]),
            ("temperature string", {"messages": msg, "temperature": "hot"}, ["temperature"]),
            ("top_p 0", {"messages": msg, "top_p": 0, "max_tokens": 2}, ["top_p"]),
            ("top_p 1.5", {"messages": msg, "top_p": 1.5}, ["top_p"]),
            ("top_p -0.1", {"messages": msg, "top_p": -0.1}, ["top_p"]),
            ("top_k -5", {"messages": msg, "top_k": -5}, ["top_k"]),
            ("top_k 1.5", {"messages": msg, "top_k": 1.5}, ["top_k"]),
            ("min_p 2", {"messages": msg, "min_p": 2}, ["min_p"]),
            ("n 5", {"messages": msg, "n": 5, "max_tokens": 2}, ["n"]),
            ("seed string", {"messages": msg, "seed": "x"}, ["seed"]),
            ("stream 'yes'", {"messages": msg, "stream": "yes"}, ["stream"]),
            ("stop 5", {"messages": msg, "stop": 5}, ["stop"]),
            ("reasoning_effort extreme", {"messages": msg, "reasoning_effort": "extreme"},
             ["reasoning_effort"]),
            ("tools not a list", {"messages": msg, "tools": {"a": 1}}, ["tools"]),
            ("tools entry without function", {"messages": msg, "tools": [{"type": "function"}]},
             ["tools", "function"]),
            ("unknown field", {"messages": msg, "frobnicate": 1, "max_tokens": 2},
             ["frobnicate"]),
            ("logprobs true", {"messages": msg, "logprobs": True, "max_tokens": 2},
             ["logprobs"]),
            ("model wrong name", {"messages": msg, "model": "gpt-5", "max_tokens": 2},
             ["model"]),
            ("presence_penalty 99", {"messages": msg, "presence_penalty": 99, "max_tokens": 2},
             ["presence_penalty"]),
            ("a 20000-word message (> max-seq 64)",
             {"messages": [{"role": "user", "content": "word " * 20000}], "max_tokens": 2},
             ["max", "long", "context", "tokens", "64"]),
            ("stream_options without stream", {"messages": msg, "stream_options":
                                               {"include_usage": "x"}}, ["stream_options"]),
        ]
        for d, body, names in bad_fields:
            exp = "4xx"
            if d in ("model wrong name", "logprobs true", "presence_penalty 99"):
                exp = "either"
            http_case(f"chat: {d}", "POST", CC, body, exp, names)
        for d, body, names in [
                ("prompt ids beyond vocab", {"prompt": [10 ** 9], "max_tokens": 2}, ["prompt"]),
                ("prompt ids negative", {"prompt": [-1], "max_tokens": 2}, ["prompt"]),
                ("prompt ids floats", {"prompt": [1.5, 2.5], "max_tokens": 2}, ["prompt"]),
                ("prompt empty list", {"prompt": [], "max_tokens": 2}, ["prompt"]),
                ("prompt empty string", {"prompt": "", "max_tokens": 2}, ["prompt"]),
                ("prompt an object", {"prompt": {"a": 1}}, ["prompt"]),
                ("prompt list of lists (batch)", {"prompt": [[1, 2], [3]], "max_tokens": 2},
                 ["prompt"]),
                ("prompt 65 ids > max-seq", {"prompt": [5] * 65, "max_tokens": 2},
                 ["prompt", "max", "64", "long"]),
                ("prompt 60 ids + 100 max_tokens", {"prompt": [5] * 60, "max_tokens": 100},
                 ["max", "length"]),
                ("echo true", {"prompt": [1], "echo": True, "max_tokens": 2}, ["echo"]),
                ("best_of 3", {"prompt": [1], "best_of": 3, "max_tokens": 2}, ["best_of"])]:
            exp = "either" if d in ("prompt list of lists (batch)",
                                    "prompt 60 ids + 100 max_tokens") else "4xx"
            http_case(f"completions: {d}", "POST", CP, body, exp, names)
        for d, body in [("tokenize: wrong type", {"prompt": 5}),
                        ("tokenize: no field", {}),
                        ("detokenize: ids beyond vocab", {"tokens": [10 ** 9]}),
                        ("detokenize: ids strings", {"tokens": ["a"]})]:
            http_case(d, "POST", "/tokenize" if d.startswith("tokenize") else "/detokenize",
                      body, "4xx", None)
        # auth
        http_case("auth: no Authorization header", "POST", CC, {"messages": msg},
                  "4xx", None, headers={"Authorization": None})
        http_case("auth: wrong key", "POST", CC, {"messages": msg}, "4xx", None,
                  headers={"Authorization": "Bearer nope"})
        http_case("auth: key as Basic", "POST", CC, {"messages": msg}, "4xx", None,
                  headers={"Authorization": f"Basic {API_KEY}"})
        http_case("auth: key prefix only", "POST", CC, {"messages": msg}, "4xx", None,
                  headers={"Authorization": f"Bearer {API_KEY[:-1]}"})
        http_case("auth: /v1/models without key", "GET", "/v1/models", None, "4xx", None,
                  headers={"Authorization": None})
        # protocol
        http_case("body larger than --max-body 1MiB", "POST", CC, b"{" + b" " * (2 << 20) + b"}",
                  "4xx", None)
        http_case("Content-Length 2^63", "POST", CC, None, "4xx", None,
                  raw=b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                  b"9223372036854775807\r\nAuthorization: Bearer " + API_KEY.encode() +
                  b"\r\n\r\n{}")
        http_case("Content-Length -1", "POST", CC, None, "4xx", None,
                  raw=b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n"
                  b"Authorization: Bearer " + API_KEY.encode() + b"\r\n\r\n{}")
        http_case("Content-Length 'abc'", "POST", CC, None, "4xx", None,
                  raw=b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n"
                  b"Authorization: Bearer " + API_KEY.encode() + b"\r\n\r\n{}")
        http_case("chunked body with a bad chunk size", "POST", CC, None, "4xx", None,
                  raw=b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
                  b"chunked\r\nAuthorization: Bearer " + API_KEY.encode() +
                  b"\r\n\r\nZZZ\r\n{}\r\n0\r\n\r\n")
        framing_cases()
        http_case("request line garbage", "GET", "/", None, "4xx", None,
                  raw=b"\x00\x01\x02 garbage\r\n\r\n")
        http_case("header line 100 kB", "GET", "/health", None, "either", None,
                  raw=b"GET /health HTTP/1.1\r\nX-A: " + b"a" * 100000 + b"\r\n\r\n")
        http_case("10,000 headers", "GET", "/health", None, "either", None,
                  raw=b"GET /health HTTP/1.1\r\nConnection: close\r\n" + b"X-A: a\r\n" * 10000 +
                  b"\r\n")
        http_case("unknown path", "GET", "/v1/nothing", None, "4xx", None)
        http_case("wrong method on completions", "GET", CC, None, "4xx", None)
        http_case("path traversal", "GET", "/../../etc/passwd", None, "4xx", None)

        # slowloris and many connections: the server must still answer others promptly
        def still_answers(desc, hold):
            socks = []
            t0 = now()
            try:
                hold(socks)
                t1 = now()
                # From another client: the holder's own connections are capped per client.
                st, body = http(C.port, "GET", "/health", timeout=10, source="127.0.0.2")
                lat = now() - t1
                oc = "clean" if st == 200 and lat < 5 else "hang"
                note = f"/health {st} in {lat:.2f}s while holding {len(socks)} connections"
            except OSError as e:
                oc, note, st = "hang", f"{type(e).__name__}: {e}", None
            finally:
                for s in socks:
                    try:
                        s.close()
                    except OSError:
                        pass
            if C.server.p.poll() is not None:
                oc = "crash"
            record("http", desc, None, "", now() - t0, oc, status=st, note=note)

        def slowloris(socks):
            for _ in range(20):
                s = socket.create_connection(("127.0.0.1", C.port), timeout=5)
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000"
                          b"\r\n")
                socks.append(s)
            time.sleep(2)
        still_answers("slowloris: 20 connections with half a header, idle 2 s", slowloris)

        def slowbody(socks):
            for _ in range(10):
                s = socket.create_connection(("127.0.0.1", C.port), timeout=5)
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                          b"100000\r\n\r\n{\"messages\":")
                socks.append(s)
            time.sleep(2)
        still_answers("slow body: 10 connections that send 12 of 100000 bytes", slowbody)

        def many(socks):
            for _ in range(600):
                try:
                    socks.append(socket.create_connection(("127.0.0.1", C.port), timeout=5))
                except OSError:
                    break
            time.sleep(1)
        still_answers("600 idle connections", many)

        def parallel(socks):
            res = []

            def one():
                try:
                    res.append(http(C.port, "POST", CC, {"messages": msg, "max_tokens": 2},
                                    timeout=60)[0])
                except OSError as e:
                    res.append(str(e))
            th = [threading.Thread(target=one) for _ in range(16)]
            for t in th:
                t.start()
            for t in th:
                t.join()
            C.parallel = res
        still_answers("16 parallel chat requests, then /health", parallel)
        record("http", "16 parallel chat requests all answered 200", None, "", 0,
               "clean" if all(r == 200 for r in C.parallel) else "misleading",
               note=str(C.parallel))
        http_case("control: chat completion after the abuse", "POST", CC,
                  {"messages": msg, "max_tokens": 2}, "2xx")
    finally:
        C.server.p.send_signal(signal.SIGTERM)
        t_term = now()
        rc, o, err, wall, to = C.server.wait(15)
        wall = now() - t_term
        oc = "clean" if rc == 0 and not to else ("hang" if to else "crash" if rc and rc < 0
                                                 else "misleading")
        if any(p in err for p in CRASH_PATTERNS):
            oc = "crash"
        record("http", "server exits 0 on SIGTERM after the probe", rc, err, wall, oc)


def framing_cases():
    """Content-Length and Transfer-Encoding oddities, each followed on the same connection by a
    GET /health that must not be answered: after a request of unknown length nothing on the
    stream is a request (a second answer is request smuggling)."""
    auth = b"Authorization: Bearer " + API_KEY.encode() + b"\r\n"
    follow = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    body = b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}'
    cases = [
        ("Content-Length '+5'", b"Content-Length: +5\r\n", b"{}", ["Content-Length"]),
        ("Content-Length '5 5'", b"Content-Length: 5 5\r\n", b"{}", ["Content-Length"]),
        ("Content-Length '1,1'", b"Content-Length: 1,1\r\n", b"{}", ["Content-Length"]),
        ("Content-Length '0x10'", b"Content-Length: 0x10\r\n", b"{}", ["Content-Length"]),
        ("Content-Length ''", b"Content-Length: \r\n", b"{}", ["Content-Length"]),
        ("Content-Length 10^30", b"Content-Length: " + b"1" + b"0" * 30 + b"\r\n", b"{}",
         ["larger", "limit"]),
        ("Content-Length 2^64", b"Content-Length: 18446744073709551616\r\n", b"{}",
         ["larger", "limit"]),
        ("Content-Length 'abc' with a body", b"Content-Length: abc\r\n", body,
         ["Content-Length"]),
        ("Content-Length '-1' with a body", b"Content-Length: -1\r\n", body, ["Content-Length"]),
        ("two Content-Lengths that differ", b"Content-Length: 2\r\nContent-Length: " +
         str(len(body)).encode() + b"\r\n", body, ["Content-Length"]),
        ("Transfer-Encoding chunked and Content-Length", b"Content-Length: 2\r\n"
         b"Transfer-Encoding: chunked\r\n", b"{}", ["Transfer-Encoding"]),
        ("Transfer-Encoding gzip", b"Transfer-Encoding: gzip\r\n", b"{}", ["Transfer-Encoding"]),
        ("Transfer-Encoding 'chunked, chunked'", b"Transfer-Encoding: chunked, chunked\r\n",
         b"0\r\n\r\n", ["Transfer-Encoding"]),
        ("a chunked body past --max-body", b"Transfer-Encoding: chunked\r\n",
         (hex(1 << 20)[2:].encode() + b"\r\n" + b" " * (1 << 20) + b"\r\n") * 2 +
         b"0\r\n\r\n", ["larger", "limit"]),
        ("POST without Content-Length", b"", body, ["Content-Length"]),
        ("Content-Length with a space before the colon", b"Content-Length : 2\r\n", b"{}",
         ["Content-Length"]),
        ("wrong key with a body", b"Content-Length: 2\r\n", b"{}", ["key"]),
    ]
    for d, headers, b, names in cases:
        a = b"" if d == "wrong key with a body" else auth
        raw = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + a + headers + b"\r\n" + b
        http_case(f"framing: {d}", "POST", "/v1/chat/completions", None, "4xx", names,
                  raw=raw, timeout=15)
        t0 = now()
        try:
            st, text = http(C.port, "POST", "/v1/chat/completions", raw=raw + follow, timeout=15)
            two = len(re.findall(rb"HTTP/1\.[01] \d{3} ", C.last_raw)) >= 2
            oc = "silent_wrong" if two else ("clean" if st and 400 <= st < 500 else "misleading")
            note = f"status {st}; {'a second response: the body was read as a request' if two else 'one response'}"
        except socket.timeout:
            oc, note, st = "hang", "no end of the connection", None
        record("http", f"framing: {d}, then GET /health on the same connection", None, "",
               now() - t0, oc, status=st, note=note)
    # A well-formed chunked body is read under --max-body like any other: served.
    http_case("framing: a well-formed chunked body (control)", "POST", "/v1/chat/completions",
              None, "2xx", raw=b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth +
              b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n" +
              hex(len(body))[2:].encode() + b"\r\n" + body + b"\r\n0\r\n\r\n")
    # Duplicate Content-Lengths that agree are one length (RFC 9110): served.
    http_case("framing: two equal Content-Lengths (control)", "POST", "/v1/chat/completions",
              None, "2xx", raw=b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth +
              b"Connection: close\r\nContent-Length: " + str(len(body)).encode() +
              b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
