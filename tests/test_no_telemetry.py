"""Nothing leaves the machine, and no child of ours runs our signal handlers.

A command that opens OpenVINO and ONNX Runtime (``layerscope engines`` starts both) runs with ``HOME`` pointed at
an empty folder and the CI variables that OpenVINO's telemetry stands down for removed: nothing may appear under
that home (OpenVINO's telemetry writes a client id under ``~/intel``, ONNX Runtime's a device id and an event
store under ``~/.cache/Microsoft``), and Python's audit hooks (installed before layerscope is imported) must see
no socket opened, no host looked up, no URL requested and no process forked (OpenVINO's telemetry sends from a
forked helper).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hang_guard import HANG_S

pytest.importorskip("openvino")

SWITCHES = ("ORT_DISABLE_TELEMETRY", "HF_HUB_DISABLE_TELEMETRY", "RAY_USAGE_STATS_ENABLED")
WATCHED = ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "urllib.Request", "os.fork")

RUN = """
import json, sys
seen = []
def hook(event, args):
    if event in {watched!r}:
        seen.append(event + " " + repr(args)[:120])
sys.addaudithook(hook)
from layerscope.cli import main
try:
    main(["engines"])
except SystemExit:
    pass
import openvino  # the engines probe compiled a graph on it
import time
time.sleep(0.5)  # a send starts in a background thread: give it the time to begin
json.dump(seen, open(sys.argv[1], "w"))
"""


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TF_BUILD", "JENKINS_URL", "XDG_CACHE_HOME",
                                                             "XDG_CONFIG_HOME", *SWITCHES)}
    env.update(HOME=str(home), LAYERSCOPE_HOME=str(home.parent / "layerscope-home"))
    return env


def test_a_command_that_opens_openvino_writes_nothing_home_and_reaches_no_network(tmp_path):
    """Catches: OpenVINO's import event sent from an ordinary run (a forked helper making an HTTPS request to
    an analytics service) and its client id left under ~/intel."""
    home = tmp_path / "home"
    home.mkdir()
    seen = tmp_path / "seen.json"
    proc = subprocess.run([sys.executable, "-c", RUN.format(watched=WATCHED), str(seen)], env=_clean_env(home),
                          capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "OpenVINO 20" in proc.stdout and "onnxruntime" in proc.stdout  # the probe reached both
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []
    assert json.loads(seen.read_text()) == []


def test_children_inherit_the_switches(tmp_path):
    """The variables ONNX Runtime, the Hub and Ray read are set for the processes layerscope starts, and a user's
    own choice is kept."""
    show = "import os; print(*(os.environ.get(k) for k in %r))" % (SWITCHES,)
    code = ("import layerscope, subprocess, sys; "
            f"print(subprocess.run([sys.executable, '-c', {show!r}], capture_output=True, text=True).stdout)")
    env = _clean_env(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert out.stdout.split() == ["1", "1", "0"]
    env["RAY_USAGE_STATS_ENABLED"] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert out.stdout.split() == ["1", "1", "1"]


def _report_sigterm(queue) -> None:
    queue.put(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
    time.sleep(60)


def _forked_child_of_a_cli_run(result_file: str) -> None:
    """In a fresh process (the CLI's handler is installed in its main thread): a child forked during the run, as
    a library's helper process is, then stopped with SIGTERM the way such a library stops it."""
    from layerscope import cli

    def run_with_a_fork():
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_report_sigterm, args=(queue,))
        child.start()
        default = queue.get(timeout=60)
        child.terminate()
        child.join(60)
        Path(result_file).write_text(json.dumps({"default": default, "exitcode": child.exitcode}))

    cli._main = lambda argv: run_with_a_fork()
    cli.main([])


def test_a_child_forked_during_a_cli_run_does_not_run_its_sigterm_handler(tmp_path):
    """Catches: SIGTERM to a forked helper (OpenVINO's telemetry sender, stopped after 3 s) turned into a
    KeyboardInterrupt traceback in the user's output by the CLI's handler the child inherited."""
    result = tmp_path / "result.json"
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_no_telemetry as t; "
            f"t._forked_child_of_a_cli_run({str(result)!r})")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(result.read_text()) == {"default": True, "exitcode": -signal.SIGTERM}
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr


def test_the_tokenizer_pool_workers_leave_ctrl_c_to_the_parent():
    """A terminal's Ctrl-C reaches every process of the group: a pool worker ignores it (the parent stops the pool),
    instead of each worker printing its own KeyboardInterrupt traceback; SIGTERM still stops it."""
    from layerscope.model.tokenize_pool import TokenizerPool

    with TokenizerPool(_Upper(), 1) as pool:
        assert list(pool.map([(["a"], 0, [1])])) == ["A"]
        worker = pool._pool._pool[0]
        os.kill(worker.pid, signal.SIGINT)
        time.sleep(0.5)
        assert worker.is_alive()
        assert list(pool.map([(["b"], 1, [1])])) == ["B"]
    worker.join(30)
    assert worker.exitcode == -signal.SIGTERM


class _Upper:
    """An encoder stand-in the pool's workers call: upper-cases its one text."""

    def __call__(self, texts, index, lengths):
        return texts[0].upper()
