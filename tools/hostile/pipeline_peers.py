"""The pipeline protocol's wire format and the three shapes of a pipeline case: a stray peer
towards a real rank 0, a fake worker that holds the token, a fake rank 0 towards a real
worker."""
import hashlib
import hmac
import json
import socket
import struct
import threading
import time

from .common import C, TIMEOUT, Proc, X, classify, free_port, message_line, now, record


MAGIC = 0x46505358
CHALLENGE, HELLO, WELCOME, STEP, RESULT, ALIVE, RESET, QUIT, FAIL, READY = \
    10, 1, 2, 3, 4, 5, 6, 7, 8, 9
TOKEN = "probe-token-" + "ab" * 8


def payload(head, tensors=()):
    h = dict(head)
    h["tensors"] = [{"name": n, "dtype": dt, "shape": sh} for n, dt, sh, _ in tensors]
    text = json.dumps(h).encode()
    return struct.pack("<Q", len(text)) + text + b"".join(d for *_, d in tensors)


def frame(ftype, pl):
    return struct.pack("<IBQ", MAGIC, ftype, len(pl)) + pl


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise ConnectionError("closed")
        b += c
    return b


def recv_frame(s):
    h = recv_exact(s, 13)
    magic, t, n = struct.unpack("<IBQ", h)
    pl = recv_exact(s, n)
    ln = struct.unpack("<Q", pl[:8])[0]
    return t, json.loads(pl[8:8 + ln]), pl[8 + ln:]


def hmac_hex(msg):
    return hmac.new(TOKEN.encode(), msg.encode(), hashlib.sha256).hexdigest()


PENV = {"XSERV_PIPELINE_TOKEN": TOKEN, "XSERV_PIPELINE_TIMEOUT": "3",
        "XSERV_PIPELINE_STEP_TIMEOUT": "6"}


def start_rank0(port):
    return Proc(X("run", C.pp_plan, "--backend", "cpu", "--prompt-ids", "1,2,3", "--max-tokens",
                  "3", "--coordinator", f"127.0.0.1:{port}", "--world", "2"), PENV)


def start_worker(port, env=None):
    e = dict(PENV)
    e.update(env or {})
    return Proc(X("worker", C.pp_plan, "--rank", "1", "--world", "2", "--coordinator",
                  f"127.0.0.1:{port}"), e)


def connect(port, wait=10):
    t = now()
    while now() - t < wait:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError:
            time.sleep(0.1)
    raise ConnectionError(f"nothing listens on {port}")


def learn_digest():
    """Plays rank 0 once towards a real worker to learn the hello's plan digest."""
    port = free_port()
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(4)
    w = start_worker(port)
    ls.settimeout(20)
    s, _ = ls.accept()
    s.settimeout(20)
    s.sendall(frame(CHALLENGE, payload({"nonce": "00" * 32})))
    t, h, _ = recv_frame(s)
    s.sendall(frame(QUIT, payload({})))
    s.close()
    ls.close()
    w.wait(10)
    return h["digest"]


def stray_case(desc, action):
    """A stray, unauthenticated or malformed connection to a real rank 0; then a real worker
    joins. Rank 0 must drop the stray and finish (exit 0)."""
    port = free_port()
    r0 = start_rank0(port)
    note = ""
    try:
        s = connect(port)
        action(s)
    except Exception as e:  # noqa: BLE001
        note = f"peer side: {type(e).__name__}: {e}"
    w = start_worker(port)
    rc, o, err, wall, to = r0.wait(TIMEOUT)
    w.wait(10)
    oc = classify(rc, err, to, "ok", None)
    record("pipeline", "rank 0 <- " + desc, rc, err, wall, oc, note=note + " " +
           (message_line(err)[:120] if rc else ""), cmd=" ".join(r0.argv))


def peak_rss_mib(pid):
    try:
        for ln in open(f"/proc/{pid}/status"):
            if ln.startswith("VmHWM"):
                return int(ln.split()[1]) // 1024
    except OSError:
        pass
    return 0


def fake_worker_case(desc, after_ready, expect_names=("rank 1",), rss_limit_mib=0):
    """An authenticated fake worker (it holds the token) that misbehaves after the handshake:
    rank 0 must end the run with a message naming the rank, within its timeouts."""
    port = free_port()
    r0 = start_rank0(port)
    note = ""
    try:
        s = connect(port)
        t, ch, _ = recv_frame(s)
        nonce = "11" * 32
        proof = hmac_hex(f"xserv-pipeline hello\n{ch['nonce']}\n1\n2\n{C.digest}\n{nonce}")
        s.sendall(frame(HELLO, payload({"rank": 1, "world": 2, "digest": C.digest,
                                        "nonce": nonce, "proof": proof})))
        t, wel, _ = recv_frame(s)
        C.peak = 0
        if rss_limit_mib:
            def watch():
                while r0.p.poll() is None:
                    C.peak = max(C.peak, peak_rss_mib(r0.p.pid))
                    time.sleep(0.1)
            threading.Thread(target=watch, daemon=True).start()
        after_ready(s)
    except Exception as e:  # noqa: BLE001
        note = f"peer side: {type(e).__name__}: {e}"
    rc, o, err, wall, to = r0.wait(TIMEOUT)
    if rss_limit_mib:
        note += f" rank 0 peak RSS {C.peak} MiB"
    try:
        s.close()
    except Exception:  # noqa: BLE001
        pass
    oc = classify(rc, err, to, "fail", list(expect_names))
    if rss_limit_mib and C.peak > rss_limit_mib and oc == "clean":
        oc = "resource"
    record("pipeline", "rank 0 <- authenticated peer: " + desc, rc, err, wall, oc,
           note=note + (" stdout: " + o.strip()[:60] if rc == 0 else ""), cmd=" ".join(r0.argv))


def fake_rank0_case(desc, after_ready, expect="fail"):
    """A fake rank 0 (holding the token) towards a real worker, sending hostile step frames:
    the worker must exit non-zero with a clean message, or refuse with kFail."""
    port = free_port()
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(4)
    w = start_worker(port)
    note = ""
    try:
        ls.settimeout(20)
        s, _ = ls.accept()
        s.settimeout(20)
        s.sendall(frame(CHALLENGE, payload({"nonce": "22" * 32})))
        t, h, _ = recv_frame(s)
        after_ready(s, h)
    except Exception as e:  # noqa: BLE001
        note = f"peer side: {type(e).__name__}: {e}"
    rc, o, err, wall, to = w.wait(TIMEOUT)
    ls.close()
    oc = classify(rc, err, to, expect, ["rank 0", "pipeline", "step", "welcome", "127.0.0.1",
                                        "sequence", "token id", "cache row"])
    record("pipeline", "worker <- " + desc, rc, err, wall, oc, note=note, cmd=" ".join(w.argv))
