"""One host-overhead measurement: a run to the end on the ``null`` executor, in a fresh process.

``measure`` runs in the calling process; ``measure_in(core_dir, ...)`` runs it in a new Python with
``core_dir`` (a checkout's ``core/``, e.g. an older version of Hetero to compare with) first on the
path, and this bench and mock plugin after it, so both sides of a comparison run the same workload,
the same executor and the same timing code. Run as ``python -m hetero_bench.host_overhead_run JSON``
(the keyword arguments of ``measure``); it prints the row as JSON on its last line.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

PHASES = ("schedule", "build_batch", "postprocess", "outputs")


def measure(
    num_seqs: int, output_tokens: int, seed: int, step_time: float = 0.0, async_scheduling: bool | None = None
) -> dict:
    """The engine's time and its phases, per step, over one run to the end. Wall times, and the
    engine thread's CPU time (``cpu_ms_per_step``: what a machine shared with other processes
    inflates least)."""
    from hetero_core import LLM, SamplingParams

    settings = dict(
        max_batch_size=num_seqs,
        max_num_seqs=num_seqs,
        max_num_blocks=32 * num_seqs,
        max_total_tokens=256 * num_seqs,
        enable_prefix_caching=False,
    )
    if async_scheduling is not None:
        settings["async_scheduling"] = async_scheduling
    llm = LLM(executor={"name": "null", "null": {"step_time": step_time}}, **settings)
    engine = llm.engine
    rng = random.Random(seed)
    params = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
    for _ in range(num_seqs):
        prompt = [rng.randint(32, 126) for _ in range(rng.randint(100, 400))]
        try:
            engine.add_request(prompt, params, stream=False)
        except TypeError:  # an engine without stream= (older): every output every step
            engine.add_request(prompt, params)
    timed = _TimedExecutor(engine.executor)
    engine.executor = timed
    before = _phases(engine)
    wall = cpu = seq_steps = num_steps = 0
    try:
        while engine.has_unfinished_requests():
            started, started_cpu = time.perf_counter(), time.thread_time()
            engine.step()
            wall += time.perf_counter() - started
            cpu += time.thread_time() - started_cpu
            num_seqs_run = engine.stats().last_step_num_seqs
            if num_seqs_run:
                num_steps += 1
                seq_steps += num_seqs_run
    finally:
        llm.shutdown()
    phases = _phases(engine)
    waited = phases["execute"] - before["execute"] if phases else timed.seconds
    engine_s = wall - waited
    row = {
        "num_seqs": num_seqs,
        "steps": num_steps,
        "wall_ms_per_step": wall / num_steps * 1e3,
        "engine_ms_per_step": engine_s / num_steps * 1e3,
        "us_per_seq_step": engine_s / seq_steps * 1e6,
        "ceiling_tok_s": num_seqs * output_tokens / engine_s,
        "cpu_ms_per_step": (cpu - timed.cpu_seconds) / num_steps * 1e3,
    }
    for phase in PHASES:
        row[f"{phase}_ms"] = (phases[phase] - before[phase]) / num_steps * 1e3 if phases else None
    return row


def measure_in(core_dir: str | None, **kwargs) -> dict:
    """``measure(**kwargs)`` in a fresh Python process; ``core_dir``: the ``core/`` to import
    ``hetero_core`` from (None: the one this process imports)."""
    import hetero_core
    from hetero_core import HeteroError

    own_core = str(Path(hetero_core.__file__).resolve().parents[1])
    mock = importlib.util.find_spec("hetero_plugins_mock")  # the null executor's plugin (not imported here)
    if mock is None or mock.origin is None:
        raise HeteroError(
            "host-overhead needs the null executor of hetero-plugins-mock: pip install ./hetero_plugins_mock"
        )
    paths = [
        core_dir or own_core,
        str(Path(mock.origin).resolve().parents[1]),
        str(Path(__file__).resolve().parents[1]),
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-m", "hetero_bench.host_overhead_run", json.dumps(kwargs)],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise HeteroError(f"the measurement with core {paths[0]} failed: " + " | ".join(tail))
    return json.loads(done.stdout.strip().splitlines()[-1])


def _phases(engine) -> dict[str, float]:
    timings = getattr(engine, "timings", None)  # an older engine has none
    if timings is None:
        return {}
    return {p: getattr(timings, f"{p}_s") for p in (*PHASES, "execute")}


class _TimedExecutor:
    """The executor with the seconds spent in ``execute`` counted (wall: for engines without timings;
    CPU: the engine thread's CPU time less the executor's)."""

    def __init__(self, inner) -> None:
        self.inner, self.seconds, self.cpu_seconds = inner, 0.0, 0.0

    def execute(self, batch):
        started, started_cpu = time.perf_counter(), time.thread_time()
        try:
            return self.inner.execute(batch)
        finally:
            self.seconds += time.perf_counter() - started
            if threading.current_thread() is threading.main_thread():  # async: the executor's own thread
                self.cpu_seconds += time.thread_time() - started_cpu

    def __getattr__(self, name):
        return getattr(self.inner, name)


if __name__ == "__main__":
    print(json.dumps(measure(**json.loads(sys.argv[1]))))
