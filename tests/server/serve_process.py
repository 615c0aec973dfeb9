"""`xserv serve` in a child process for the Python tests: the tiny example checkpoint
synthesized into a temporary directory, the server on a free port over the CPU engine, its port
read from its log, and a SIGTERM at the end that must exit 0."""
import contextlib
import os
import re
import signal
import subprocess
import time


@contextlib.contextmanager
def tiny_server(binary, source, tokenizer, tmp, args, name="tiny"):
    """Yields the server's base URL (http://127.0.0.1:PORT); `args` are serve's extra flags."""
    model = os.path.join(tmp, "tiny")
    subprocess.run([binary, "synth", "--config", os.path.join(source, "examples/tiny/config.json"),
                    "-o", model, "--seed", "1"], check=True, capture_output=True)
    log_path = os.path.join(tmp, "serve.log")
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [binary, "serve", model, "--port", "0", "--backend", "cpu", "--tokenizer", tokenizer,
             "--served-model-name", name] + list(args), stderr=log)
        try:
            port = None
            deadline = time.time() + 300
            while port is None and time.time() < deadline and server.poll() is None:
                m = re.search(rf"\[serve\] ready: model '{name}' at http://127\.0\.0\.1:(\d+)",
                              open(log_path).read())
                port = int(m.group(1)) if m else None
                time.sleep(0.05)
            assert port is not None, "server did not start:\n" + open(log_path).read()
            yield f"http://127.0.0.1:{port}"
        finally:
            server.send_signal(signal.SIGTERM)
            code = server.wait(timeout=120)
    assert code == 0, f"xserv serve exited {code}:\n" + open(log_path).read()
