"""llama.cpp as the peer of ``hetero bench gguf``: its own tools on the same GGUF file, same shapes.

Not an ``offline`` peer (no ``PEERS``): llama.cpp's tools take a file and shapes, not our requests.
``llama-bench`` times batch-1 decode after a prompt (``-p 0 -n N -d P``: N decode steps after a
P-token context, the prompt not timed), ``llama-batched-bench`` B sequences in parallel (``-npp P
-ntg T -npl B``: a P-token prefill of each, then T steps of B tokens; the prefill's logits give
each sequence's first token, so T + 1 output tokens a sequence, all of the wall time counted),
``llama-perplexity`` the perplexity (``-f TEXT -c N``; ``chunked_perplexity.py`` is its method).
The tools are found in ``--llama-cpp DIR`` (a build folder: ``bin/`` under it is searched too) or
on PATH; a tool that is missing is a ``PeerUnavailable`` naming it and the fix.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from hetero_bench.peers import PeerUnavailable

TOOLS = ("llama-bench", "llama-batched-bench", "llama-perplexity")
BUILD_HINT = "build llama.cpp (docs/benchmarks.md, 'GGUF beside llama.cpp') and pass --llama-cpp DIR"
_PPL_RE = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
_CHUNKS_RE = re.compile(r"calculating perplexity over (\d+) chunks")
_TOKENS_RE = re.compile(r"tokenizes to only (\d+) tokens")


def find_tool(name: str, directory: str | None) -> str:
    """The path of llama.cpp tool ``name``: in ``directory`` (or its ``bin/``), else on PATH."""
    if directory:
        for folder in (Path(directory), Path(directory) / "bin"):
            candidate = folder / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
        raise PeerUnavailable(f"no {name} in {directory} (nor in its bin/); {BUILD_HINT}")
    found = shutil.which(name)
    if found is None:
        raise PeerUnavailable(f"{name} is not on PATH; {BUILD_HINT}")
    return found


class LlamaCpp:
    """llama.cpp's tools on one GGUF file, with ``threads`` CPU threads."""

    name, label = "llama.cpp", "llama.cpp"

    def __init__(self, gguf_path: str, directory: str | None, threads: int) -> None:
        self.tools = {name: find_tool(name, directory) for name in TOOLS}
        self.gguf_path, self.threads = gguf_path, threads
        self.version = self._version()

    def decode_tokens_per_s(self, prompt_tokens: int, output_tokens: int, repetitions: int) -> dict:
        """Batch-1 decode tok/s over ``output_tokens`` steps after a ``prompt_tokens`` context."""
        argv = [
            self.tools["llama-bench"], "-m", self.gguf_path, "-t", str(self.threads),
            "-p", "0", "-n", str(output_tokens), "-d", str(prompt_tokens),
            "-r", str(repetitions), "-o", "json",
        ]  # fmt: skip
        results = json.loads(_run(argv).stdout)
        if not results:
            raise PeerUnavailable(f"llama-bench printed no result for {self.gguf_path}")
        result = results[0]
        return {"tok_s": result["avg_ts"], "stddev": result["stddev_ts"], "samples": result["samples_ts"]}

    def parallel_tokens_per_s(self, parallel: int, prompt_tokens: int, output_tokens: int) -> dict:
        """Output tok/s of ``parallel`` sequences of ``prompt_tokens`` + ``output_tokens``, the
        prefill counted: ``parallel * output_tokens / (t_pp + t_tg)``."""
        steps = output_tokens - 1  # the prefill's logits give each sequence's first token
        context = parallel * (prompt_tokens + output_tokens)
        argv = [
            self.tools["llama-batched-bench"], "-m", self.gguf_path, "-t", str(self.threads),
            "-tb", str(self.threads), "-c", str(context), "-b", "2048", "-ub", "512",
            "-npp", str(prompt_tokens), "-ntg", str(steps), "-npl", str(parallel),
            "--output-format", "jsonl",
        ]  # fmt: skip
        lines = [line for line in _run(argv).stdout.splitlines() if line.startswith("{")]
        if not lines:
            raise PeerUnavailable(f"llama-batched-bench printed no result for {self.gguf_path}")
        result = json.loads(lines[-1])
        elapsed = result["t_pp"] + result["t_tg"]
        return {
            "tok_s": parallel * output_tokens / elapsed,
            "decode_tok_s": result["speed_tg"],
            "t_pp": result["t_pp"],
            "t_tg": result["t_tg"],
        }

    def perplexity(self, text_path: str, n_ctx: int) -> dict:
        """``llama-perplexity -f TEXT -c n_ctx``'s final estimate, its ``+/-`` and chunk count."""
        argv = [
            self.tools["llama-perplexity"], "-m", self.gguf_path, "-f", text_path,
            "-c", str(n_ctx), "-b", str(n_ctx), "-t", str(self.threads),
        ]  # fmt: skip
        done = _run(argv, check=False)
        log = done.stdout + done.stderr
        match = _PPL_RE.search(log)
        if match is None:
            short = _TOKENS_RE.search(log)
            why = f"the text is only {short.group(1)} tokens" if short else f"exit {done.returncode}"
            raise PeerUnavailable(f"llama-perplexity gave no estimate ({why}): {log.strip()[-300:]}")
        chunks = _CHUNKS_RE.search(log)
        return {
            "perplexity": float(match.group(1)),
            "perplexity_error": float(match.group(2)),
            "chunks": int(chunks.group(1)) if chunks else None,
        }

    def _version(self) -> str:
        done = _run([self.tools["llama-bench"], "--version"], check=False)
        lines = (done.stdout + done.stderr).strip().splitlines()
        return lines[0] if lines else "unknown"


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-300:]
        raise PeerUnavailable(f"{Path(argv[0]).name} failed (exit {done.returncode}): {tail}")
    return done
