"""Shared by every case class: the run context C, RESULTS, subprocess and port helpers, the
classification of one run and the synthesised checkpoint and plans the cases start from."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time


TIMEOUT = 30
# The shared data as the tests find it: $XSERV_DATA, else ../shared/data beside the repository.
REAL_TIKTOKEN = os.path.join(
    os.environ.get("XSERV_DATA") or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "..", "..", "..", "shared", "data"),
    "o200k_base.tiktoken")

LIB_PATTERNS = [r"\[json\.exception", r"\bstou?l+\b", r"\bsto[ifd]\b", r"basic_string",
                r"std::", r"bad_alloc", r"vector::", r"map::at", r"_M_", r"out_of_range",
                r"invalid_argument", r"max_size\(\)"]
CRASH_PATTERNS = ["terminate called", "Assertion", "AddressSanitizer", "UndefinedBehavior",
                  "runtime error:", "Segmentation fault", "core dumped", "Aborted"]


class Ctx:
    pass


C = Ctx()
RESULTS = []


def now():
    return time.monotonic()


def run_cmd(argv, timeout=TIMEOUT, env=None, cwd=None, stdin_data=None):
    """Runs argv under nice; returns (rc, stdout, stderr, wall, timed_out)."""
    t0 = now()
    e = dict(os.environ)
    e.pop("XSERV_PIPELINE_TOKEN", None)
    if env:
        e.update(env)
    p = subprocess.Popen(["nice", "-n", "10"] + argv, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.PIPE if stdin_data else
                         subprocess.DEVNULL, env=e, cwd=cwd, start_new_session=True)
    try:
        out, err = p.communicate(stdin_data, timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        timed_out = True
    return p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), \
        now() - t0, timed_out


def first_line(err):
    for ln in err.splitlines():
        if ln.strip():
            return ln.strip()[:300]
    return ""


def message_line(err):
    """The error message: the last line that starts with 'xserv', else the last non-empty one."""
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("xserv"):
            return ln[:400]
    return lines[-1][:400] if lines else ""


def classify(rc, err, timed_out, expect, names, leftover=False):
    if timed_out:
        return "hang"
    if rc is not None and (rc < 0 or rc in (134, 136, 139)):
        return "crash"
    if any(p in err for p in CRASH_PATTERNS):
        return "crash"
    if leftover:
        return "leftover"
    if rc == 0:
        return "silent_wrong" if expect == "fail" else "clean"
    if expect == "ok":
        return "refused_ok"
    msg = message_line(err)
    if any(re.search(p, msg) for p in LIB_PATTERNS):
        return "misleading"
    if names and not any(n.lower() in err.lower() for n in names):
        return "misleading"
    return "clean"


def record(cls, desc, rc, err, wall, outcome, note="", cmd=None, status=None):
    r = {"class": cls, "description": desc, "exit": rc, "http_status": status,
         "stderr_first": first_line(err), "message": message_line(err), "wall_s": round(wall, 3),
         "outcome": outcome, "note": note, "cmd": cmd}
    RESULTS.append(r)
    mark = "" if outcome == "clean" else "  <-- " + outcome.upper()
    print(f"[{len(RESULTS):4d}] {cls:10s} {outcome:12s} {wall:6.2f}s rc={rc} {desc[:70]}{mark}",
          flush=True)
    if C.limit and len(RESULTS) >= C.limit:
        raise StopIteration


def scratch(name):
    d = os.path.join(C.work, name)
    if os.path.lexists(d):
        shutil.rmtree(d, ignore_errors=True)
    return d


def copy_model(dst, copy_shard=False):
    """A fresh model dir: config + index copied, the shard hard-linked (copied if damaged)."""
    os.makedirs(dst)
    for f in os.listdir(C.model):
        s, d = os.path.join(C.model, f), os.path.join(dst, f)
        if f.endswith(".safetensors") and not copy_shard:
            os.link(s, d)
        else:
            shutil.copy(s, d)
    return dst


def copy_plan(src, dst):
    shutil.copytree(src, dst)
    return dst


def X(*args):
    return [C.xserv] + [str(a) for a in args]


RUN_ARGS = ["--backend", "cpu", "--prompt-ids", "1,2,3", "--max-tokens", "2"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Proc:
    def __init__(self, argv, env=None):
        e = dict(os.environ)
        e.update(env or {})
        self.t0 = now()
        self.p = subprocess.Popen(["nice", "-n", "10"] + argv, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=e, start_new_session=True)
        self.argv = argv

    def wait(self, timeout):
        try:
            out, err = self.p.communicate(timeout=timeout)
            return self.p.returncode, out.decode("utf-8", "replace"), \
                err.decode("utf-8", "replace"), now() - self.t0, False
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            out, err = self.p.communicate()
            return self.p.returncode, out.decode("utf-8", "replace"), \
                err.decode("utf-8", "replace"), now() - self.t0, True


def prepare(xserv, out, config, limit):
    """Fills C and synthesises DIR/model (and a seed-2 twin), compiles DIR/plan, DIR/plan_s512
    and DIR/plan_pp2; exits when any of that fails."""
    C.xserv = os.path.abspath(xserv)
    C.limit = limit
    C.out = os.path.abspath(out)
    C.config = os.path.abspath(config)
    os.makedirs(C.out, exist_ok=True)
    C.work = os.path.join(C.out, "work")
    shutil.rmtree(C.work, ignore_errors=True)
    os.makedirs(C.work)
    C.model = os.path.join(C.out, "model")
    C.plan = os.path.join(C.out, "plan")
    C.pp_plan = os.path.join(C.out, "plan_pp2")
    C.plan_long = os.path.join(C.out, "plan_s512")
    other = os.path.join(C.out, "model_seed2")
    for d in (C.model, C.plan, C.pp_plan, C.plan_long, other):
        shutil.rmtree(d, ignore_errors=True)
    for argv in [X("synth", "--config", C.config, "-o", C.model, "--seed", 1),
                 X("synth", "--config", C.config, "-o", other, "--seed", 2),
                 X("compile", C.model, "-o", C.plan, "--max-batch", 2, "--max-seq", 64,
                   "--no-cubins"),
                 X("compile", C.model, "-o", C.plan_long, "--max-batch", 2, "--max-seq", 512,
                   "--no-cubins"),
                 X("compile", C.model, "-o", C.pp_plan, "--max-batch", 2, "--max-seq", 64,
                   "--no-cubins", "--pp", 2)]:
        rc, o, err, wall, to = run_cmd(argv, timeout=120)
        if rc != 0:
            sys.exit(f"set-up failed: {' '.join(argv)}\n{err}")
    C.shard_name = [f for f in os.listdir(C.model) if f.endswith(".safetensors")][0]
    C.shard = os.path.join(C.model, C.shard_name)
    C.other_shard = os.path.join(other, C.shard_name)
