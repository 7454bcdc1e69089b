"""One engine started in a process of its own and measured from outside: ``hetero bench memory``'s unit.

The worker (``hetero_worker.py`` for Hetero, ``peers/vllm_worker.py`` under vLLM's Python) speaks
one JSON object a line: ``ready`` after its first token, then ``decode_latency``, then ``quit``.
``measure`` starts it in a new process group (inside a ``MemoryLimit`` cgroup when given), samples
the group's summed RSS from the start (``PeakSampler``), and records:

- time to first token: from just before the process is spawned to its ``ready`` line (interpreter
  start, imports, loading the weights, the prefill, the first token);
- steady decode tokens/s at batch 1 (the worker's ``decode_latency``);
- peak RSS: the sampled peak, and the group's ``VmHWM``, each process's and their sum, read just
  before it quits (with tensor parallelism, each rank's own peak);
- whether it was OOM-killed (the cgroup's count; without a cgroup, a death by SIGKILL).

A worker that dies or does not answer within ``timeout_s`` is a result with an ``error`` (the last
error line of its log), never an exception: the next engine still runs.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hetero_bench.memory import PeakSampler, group_hwm_each_mb
from hetero_bench.memory_limit import MemoryLimit


@dataclass
class Measurement:
    first_token_s: float | None = None
    decode_tokens_per_s: float | None = None
    peak_rss_mb: float | None = None  # the group's summed RSS, sampled
    hwm_sum_mb: float | None = None  # the sum of its processes' VmHWM, just before quitting
    hwm_each_mb: list[float] | None = None  # each process's VmHWM then, largest first (the TP ranks)
    cgroup_peak_mb: float | None = None  # the cgroup's peak charge (RSS and page cache), when limited
    oom_killed: bool = False
    version: str | None = None
    error: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


class _Lines:
    """The worker's stdout, read on a thread so a read can time out."""

    def __init__(self, stream) -> None:
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def next(self, timeout_s: float) -> dict | None:
        """The next message; None when the worker closed its stdout; TimeoutError past ``timeout_s``."""
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError from None
        return None if line is None else json.loads(line)


def measure(
    command: list[str],
    env: dict[str, str],
    decode_prompt: list[int],
    num_tokens: int,
    timeout_s: float,
    limit: MemoryLimit | None = None,
) -> Measurement:
    result = Measurement()
    log = tempfile.NamedTemporaryFile(prefix="hetero-bench-memory-", suffix=".log", delete=False)
    start = time.perf_counter()
    process = subprocess.Popen(
        limit.wrap(command) if limit else command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
        start_new_session=True,
    )
    sampler = PeakSampler(process.pid).start()
    lines = _Lines(process.stdout)
    try:
        ready = lines.next(timeout_s)
        if ready is not None:
            result.first_token_s = time.perf_counter() - start
            result.version = ready.get("version")
            process.stdin.write(
                json.dumps({"cmd": "decode_latency", "prompt": decode_prompt, "n": num_tokens})
            )
            process.stdin.write("\n")
            process.stdin.flush()
            reply = lines.next(timeout_s)
            if reply is not None:
                if reply["s_per_token"] > 0:
                    result.decode_tokens_per_s = 1.0 / reply["s_per_token"]
                else:  # n tokens took no longer than 1: too few to time
                    result.error = f"decode timing not positive ({reply['s_per_token']:.2g} s/token)"
                result.hwm_each_mb = group_hwm_each_mb(process.pid) or None
                result.hwm_sum_mb = sum(result.hwm_each_mb) if result.hwm_each_mb else None
                process.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                process.stdin.flush()
                process.wait(timeout=120)
    except TimeoutError:
        result.error = f"no answer within {timeout_s:.0f} s"
    except (BrokenPipeError, subprocess.TimeoutExpired):
        pass
    finally:
        killed_here = process.poll() is None
        if killed_here:
            _kill_group(process.pid)
        process.wait()
        _kill_group(process.pid)  # any of its group left behind (vLLM's engine core)
        result.peak_rss_mb = sampler.stop()
        if limit is not None:
            result.oom_killed = limit.oom_kills() > 0
            result.cgroup_peak_mb = limit.peak_mb()
        elif process.returncode == -signal.SIGKILL and not killed_here:
            result.oom_killed = True  # no cgroup to ask: a SIGKILL nobody here sent is the OOM killer's
        log.close()
    if result.decode_tokens_per_s is None and result.error is None:
        result.error = _last_error(Path(log.name), process.returncode, result.oom_killed)
    if result.error is None:
        os.unlink(log.name)
    else:
        result.error += f" (its log: {log.name})"
    return result


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _last_error(log: Path, code: int | None, oom_killed: bool) -> str:
    if oom_killed:
        return f"OOM-killed (exit {code})"
    lines = log.read_text(errors="replace").strip().splitlines()
    errors = [line for line in lines if "Error" in line] or lines or ["(no output)"]
    return f"exited with code {code}: {errors[-1].strip()[-300:]}"
