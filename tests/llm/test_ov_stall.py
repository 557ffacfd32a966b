"""The engine watchdog: a generate call during which the process stays idle fails with EngineStalled instead
of waiting forever (GenAI once hung idle inside `generate`); busy or quick calls and their errors pass."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from searchteam.errors import EngineStalled, LLMError
from searchteam.llm.ov import watch_stall


def _burn(seconds: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))
    return "done"


def test_an_idle_call_is_reported_as_stalled():
    started = time.monotonic()
    with pytest.raises(EngineStalled, match="no progress for"):
        watch_stall(lambda: time.sleep(30), stall_seconds=0.5, idle_cpu=0.05)
    assert time.monotonic() - started < 10
    assert issubclass(EngineStalled, LLMError)  # the CLI prints it as one line; runs stop, not mark episodes


def test_a_busy_call_outlasting_the_window_is_not_a_stall():
    assert watch_stall(lambda: _burn(2.0), stall_seconds=0.5, idle_cpu=0.05) == "done"


def test_results_and_errors_come_back_to_the_caller():
    assert watch_stall(lambda: 7, stall_seconds=5) == 7
    with pytest.raises(ValueError, match="bad prompt"):
        watch_stall(lambda: (_ for _ in ()).throw(ValueError("bad prompt")), stall_seconds=5)


def test_a_process_with_a_stalled_call_still_exits():
    """The stalled thread is left blocked; the interpreter must not wait for it at exit."""
    script = textwrap.dedent(
        """
        import threading
        from searchteam.llm.ov import EngineStalled, watch_stall
        try:
            watch_stall(threading.Event().wait, stall_seconds=0.5, idle_cpu=0.05)
        except EngineStalled as exc:
            print("stalled:", exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "stalled: the OpenVINO engine made no progress" in done.stdout
    assert "rerun the command" in done.stdout


def test_the_watched_call_runs_in_another_thread():
    assert watch_stall(lambda: threading.current_thread().name, stall_seconds=5) == "ov-generate"
