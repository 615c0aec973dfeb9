"""Class "pipeline": strays, forged and malformed frames and frozen peers spoken to a real rank 0
and a real worker over 127.0.0.1 (the peers are in pipeline_peers.py)."""
import json
import os
import socket
import struct
import time

from .common import C, now
from .pipeline_peers import (ALIVE, FAIL, HELLO, MAGIC, QUIT, READY, RESULT, STEP, WELCOME,
                             fake_rank0_case, fake_worker_case, frame, hmac_hex,
                             learn_digest, payload, recv_frame, stray_case)


def pipeline_cases():
    C.digest = learn_digest()

    def send_and_idle(b, idle=0.3):
        def a(s):
            s.sendall(b)
            time.sleep(idle)
            s.close()
        return a

    stray_case("garbage bytes", send_and_idle(os.urandom(300)))
    stray_case("HTTP request", send_and_idle(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
    stray_case("closed at once", lambda s: s.close())
    stray_case("idle 6 s then close", lambda s: (time.sleep(6), s.close()))
    stray_case("half a frame header", send_and_idle(struct.pack("<IB", MAGIC, HELLO)))
    stray_case("frame header announcing 2^63 bytes", send_and_idle(
        struct.pack("<IBQ", MAGIC, HELLO, 2 ** 63)))
    stray_case("frame header announcing 2 GiB, no data", send_and_idle(
        struct.pack("<IBQ", MAGIC, HELLO, 2 ** 31), 1))
    stray_case("hello announcing 60 KiB (within the handshake bound), 10 bytes sent, idle",
               send_and_idle(struct.pack("<IBQ", MAGIC, HELLO, 60000) + b"x" * 10, 1))
    stray_case("a result frame announcing 1 GiB before any hello", send_and_idle(
        struct.pack("<IBQ", MAGIC, RESULT, 2 ** 30), 1))
    stray_case("hello with a wrong proof", lambda s: (recv_frame(s), s.sendall(frame(
        HELLO, payload({"rank": 1, "world": 2, "digest": C.digest, "nonce": "00",
                        "proof": "0" * 64}))), time.sleep(0.3), s.close()))
    stray_case("hello with wrong types", lambda s: (recv_frame(s), s.sendall(frame(
        HELLO, payload({"rank": "1", "world": [], "digest": 5, "nonce": None, "proof": {}}))),
        time.sleep(0.3), s.close()))
    stray_case("hello with rank -1 and world 2^40", lambda s: (recv_frame(s), s.sendall(frame(
        HELLO, payload({"rank": -1, "world": 2 ** 40, "digest": "x", "nonce": "y",
                        "proof": "z"}))), time.sleep(0.3), s.close()))
    stray_case("hello whose payload header length overruns", lambda s: (recv_frame(s), s.sendall(
        frame(HELLO, struct.pack("<Q", 2 ** 40) + b"{}")), time.sleep(0.3), s.close()))
    stray_case("hello payload not JSON", lambda s: (recv_frame(s), s.sendall(
        frame(HELLO, struct.pack("<Q", 5) + b"{{{{{")), time.sleep(0.3), s.close()))
    stray_case("a step frame before any hello", send_and_idle(frame(STEP, payload({"step": 0}))))
    stray_case("a result frame with [2^32,2^32] before the hello", lambda s: (recv_frame(s),
               s.sendall(frame(RESULT, payload({}, [("logits", "f32", [2 ** 32, 2 ** 32],
                                                     b"")]))), time.sleep(0.3), s.close()))

    def flood(s):
        s.settimeout(5)
        try:
            for _ in range(2000):
                s.sendall(os.urandom(4096))
        except OSError:
            pass
        s.close()
    stray_case("flood of 8 MB of random bytes", flood)

    def many(s):
        socks = [s]
        for _ in range(50):
            try:
                socks.append(socket.create_connection(("127.0.0.1", s.getpeername()[1]), 5))
            except OSError:
                break
        time.sleep(1)
        for x in socks:
            x.close()
    stray_case("50 connections that idle 1 s", many)

    # authenticated peers that misbehave
    def ready_then(frames, idle=0.0):
        def a(s):
            s.sendall(frame(READY, payload({})))
            t, step, _ = recv_frame(s)
            while t == ALIVE:
                t, step, _ = recv_frame(s)
            C.last_step = step
            for f in frames(step):
                s.sendall(f)
            time.sleep(idle)
        return a

    V = 201088

    def logits(shape, data=None, dtype="f32", name="logits"):
        n = 1
        for x in shape:
            n *= x
        return frame(RESULT, payload({}, [(name, dtype, shape,
                                           data if data is not None else b"\0" * (4 * n))]))

    fake_worker_case("result [2^32, 2^32] with no data", ready_then(
        lambda st: [logits([2 ** 32, 2 ** 32], b"")]))
    fake_worker_case("result [1, 10] logits (too narrow)", ready_then(
        lambda st: [logits([1, 10])]))
    fake_worker_case("result [3, V] as int32", ready_then(
        lambda st: [logits([3, V], dtype="i32")]))
    fake_worker_case("result two tensors", ready_then(
        lambda st: [frame(RESULT, payload({}, [("a", "f32", [1, V], b"\0" * 4 * V),
                                               ("b", "f32", [1, V], b"\0" * 4 * V)]))]))
    fake_worker_case("result with NaN logits", ready_then(
        lambda st: [logits([1, V], struct.pack("<f", float("nan")) * V)]),
        expect_names=("rank 1", "finite", "NaN", "step"))
    fake_worker_case("result with ids outside the vocabulary", ready_then(
        lambda st: [frame(RESULT, payload({"ids": [10 ** 9]}))]))
    fake_worker_case("result with ids of wrong count", ready_then(
        lambda st: [frame(RESULT, payload({"ids": [1, 2, 3, 4]}))]))
    fake_worker_case("result with ids as strings", ready_then(
        lambda st: [frame(RESULT, payload({"ids": ["1"]}))]))
    fake_worker_case("result header 'tensors' not a list", ready_then(
        lambda st: [frame(RESULT, struct.pack("<Q", 14) + b'{"tensors": 5}')]))
    fake_worker_case("result with a dtype 'q4'", ready_then(
        lambda st: [logits([1, V], dtype="q4")]))
    fake_worker_case("result with negative shape", ready_then(
        lambda st: [logits([-1, V], b"")]))
    fake_worker_case("result truncated data", ready_then(
        lambda st: [frame(RESULT, payload({}, [("logits", "f32", [1, V], b"\0" * 100)]))]))
    fake_worker_case("only heartbeats, never a result", ready_then(
        lambda st: [frame(ALIVE, payload({}))] * 1, idle=0), ("rank 1", "progress", "step"))

    def beats_forever(s):
        s.sendall(frame(READY, payload({})))
        t0 = now()
        while now() - t0 < 25:
            try:
                s.sendall(frame(ALIVE, payload({})))
            except OSError:
                return
            time.sleep(0.5)
    fake_worker_case("heartbeats every 0.5 s for 25 s, no result", beats_forever,
                     ("rank 1", "progress", "step", "s"))
    fake_worker_case("never ready, silent", lambda s: time.sleep(8))
    fake_worker_case("kFail with a non-string message", ready_then(
        lambda st: [frame(FAIL, payload({"message": {"x": [1]}}))]))
    fake_worker_case("closes after ready", ready_then(lambda st: [], idle=0.1))
    fake_worker_case("frame of unknown type 200", ready_then(
        lambda st: [frame(200, payload({}))]))
    fake_worker_case("announces a 4 GiB result in a 13-byte header (peak RSS measured)",
                     ready_then(lambda st: [struct.pack("<IBQ", MAGIC, RESULT, 2 ** 32)], idle=1),
                     rss_limit_mib=1024)
    # Lying sizes from a peer that holds the token: every frame type is bounded by the plan.
    for n, d in [(2 ** 20, "1 MiB (a greedy result is a few ids)"),
                 (2 ** 34 - 1, "just under the 16 GiB cap"), (2 ** 64 - 1, "2^64 - 1")]:
        fake_worker_case(f"announces a result of {d}, sends nothing (peak RSS measured)",
                         ready_then(lambda st, n=n: [struct.pack("<IBQ", MAGIC, RESULT, n)],
                                    idle=1), ("rank 1", "announced"), rss_limit_mib=256)
    fake_worker_case("announces a 1 GiB heartbeat", ready_then(
        lambda st: [struct.pack("<IBQ", MAGIC, ALIVE, 2 ** 30)], idle=1), ("rank 1", "announced"))
    fake_worker_case("announces a 1 GiB failure frame", ready_then(
        lambda st: [struct.pack("<IBQ", MAGIC, FAIL, 2 ** 30)], idle=1), ("rank 1", "announced"))
    fake_worker_case("announces a 3 KiB result, sends 100 bytes and closes", ready_then(
        lambda st: [struct.pack("<IBQ", MAGIC, RESULT, 3000) + b"x" * 100], idle=0.2),
        ("rank 1", "closed"))

    # a fake rank 0 towards a real worker
    def welcome_then(steps, welcome_extra=None, welcome_proof_ok=True):
        def a(s, hello):
            proof = hmac_hex(f"xserv-pipeline welcome\n{hello['nonce']}\n1")
            if not welcome_proof_ok:
                proof = "0" * 64
            wel = {"ok": True, "backend": "cpu", "max_batch": 2, "max_seq": 64, "proof": proof}
            wel.update(welcome_extra or {})
            s.sendall(frame(WELCOME, payload(wel)))
            while True:
                t, _, _ = recv_frame(s)
                if t == READY:
                    break
                if t == FAIL:
                    return
            for f in steps:
                s.sendall(f)
            s.settimeout(15)
            try:
                while True:
                    t, h, _ = recv_frame(s)
                    if t in (RESULT, FAIL):
                        C.worker_reply = (t, h)
                        if t == FAIL:
                            break
                        s.sendall(frame(QUIT, payload({})))
                        break
            except (OSError, ConnectionError):
                pass
        return a

    # The activation stage 1 receives, as the pp 2 plan names it.
    boundary = json.load(open(os.path.join(C.pp_plan, "plan.json")))["pipeline"]["stages"][1][
        "recvs"][0]["name"]

    def act(T, shape=None, dtype="f32", name=None, data=None):
        name = name or boundary
        shape = shape or [T, 64]
        n = 1
        for x in shape:
            n *= x
        return (name, dtype, shape, data if data is not None else
                struct.pack("<f", 0.01) * max(n, 0))

    def step(tokens, ctx, rows, tensors, **extra):
        """A step of the paged engine: sequence b on fixed row rows[b] of the worker's pools (2
        rows x 64 positions of the tiny model: 4 blocks of 16 a row after the null block, and a
        ring of 2 window blocks a row), its tables as long as its positions need."""
        full, window = [], []
        for b, r in enumerate(rows):
            n = (ctx[b] if b < len(ctx) and isinstance(ctx[b], int) else 0) + (
                len(tokens[b]) if isinstance(tokens, list) and b < len(tokens) else 1)
            blocks = max(1, -(-max(n, 1) // 16))
            full.append([1 + r * 4 + i for i in range(blocks)])
            window.append([1 + r * 2 + i % 2 for i in range(blocks)])
        h = {"step": 0, "tokens": tokens, "ctx_lens": ctx, "block_tables": full,
             "window_tables": window, "copies": [], "greedy": True}
        h.update(extra)
        return frame(STEP, payload(h, tensors))

    fake_rank0_case("welcome with a wrong proof", welcome_then([], welcome_proof_ok=False))
    fake_rank0_case("welcome max_seq 2^40", welcome_then([step([[1, 2, 3]], [3], [0],
                                                               [act(3)])],
                                                         {"max_seq": 2 ** 40}), "either")
    fake_rank0_case("welcome backend 'quantum'", welcome_then([], {"backend": "quantum"}))
    fake_rank0_case("welcome max_batch string", welcome_then([], {"max_batch": "2"}))
    fake_rank0_case("step with 3 tokens but a [1,64] activation", welcome_then(
        [step([[1, 2, 3]], [3], [0], [act(1)])]))
    fake_rank0_case("step with activation [2^32, 2^32] and no data", welcome_then(
        [step([[1, 2, 3]], [3], [0], [act(3, [2 ** 32, 2 ** 32], data=b"")])]))
    fake_rank0_case("step with activation of wrong name", welcome_then(
        [step([[1, 2, 3]], [3], [0], [act(3, name="act.1")])]))
    fake_rank0_case("step with activation as int32", welcome_then(
        [step([[1, 2, 3]], [3], [0], [act(3, dtype="i32")])]))
    fake_rank0_case("step with no activation", welcome_then([step([[1, 2, 3]], [3], [0], [])]))
    fake_rank0_case("step with block ids past the pools (row 99)", welcome_then(
        [step([[1, 2, 3]], [3], [99], [act(3)])]))
    fake_rank0_case("step with ctx_lens 1000 > max_seq", welcome_then(
        [step([[1, 2, 3]], [1000], [0], [act(3)])]))
    fake_rank0_case("step with ctx_lens negative", welcome_then(
        [step([[1, 2, 3]], [-5], [0], [act(3)])]))
    fake_rank0_case("step with token ids beyond vocab", welcome_then(
        [step([[10 ** 9]], [1], [0], [act(1)])]))
    fake_rank0_case("step with 3 sequences > max_batch 2", welcome_then(
        [step([[1], [2], [3]], [1, 1, 1], [0, 1, 0], [act(3)])]))
    fake_rank0_case("step with tokens not a list", welcome_then(
        [step("abc", [3], [0], [act(3)])]))
    fake_rank0_case("step header missing ctx_lens", welcome_then(
        [frame(STEP, payload({"step": 0, "tokens": [[1]], "block_tables": [[1]],
                              "window_tables": [[1]], "copies": []}, [act(1)]))]))
    fake_rank0_case("step with NaN activations", welcome_then(
        [step([[1, 2, 3]], [3], [0], [act(3, data=struct.pack("<f", float("nan")) * 192)])]),
        "either")
    fake_rank0_case("step frame truncated (announces more than sent, then closes)",
                    welcome_then([frame(STEP, payload({"step": 0}))[:-3]]))
    fake_rank0_case("garbage instead of a step", welcome_then([os.urandom(64)]))
    fake_rank0_case("unknown frame type 77", welcome_then([frame(77, payload({}))]))
    fake_rank0_case("silent rank 0 after ready (frozen)", welcome_then([]))
    fake_rank0_case("a valid step, then quit (control)", welcome_then(
        [step([[1, 2, 3]], [3], [0], [act(3)])]), "ok")
    # Lying sizes towards a worker of 2 rows x 64 positions (a step frame of at most ~39 KB).
    for n, d in [(2 ** 30, "1 GiB"), (2 ** 34, "16 GiB"), (2 ** 63, "2^63"),
                 (200000, "200 KB (4x the largest step)")]:
        fake_rank0_case(f"step frame announcing {d}, no data", welcome_then(
            [struct.pack("<IBQ", MAGIC, STEP, n)]))
    fake_rank0_case("step frame announcing 30 KB (within the bound), 100 bytes sent, closed",
                    welcome_then([struct.pack("<IBQ", MAGIC, STEP, 30000) + b"x" * 100]))
    fake_rank0_case("heartbeat announcing 1 MiB", welcome_then(
        [struct.pack("<IBQ", MAGIC, ALIVE, 2 ** 20)]))
    fake_rank0_case("a valid 64-token step, then quit (control: the bound admits it)",
                    welcome_then([step([list(range(1, 65))], [0], [0], [act(64)])]), "ok")
