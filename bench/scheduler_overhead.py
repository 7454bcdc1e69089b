"""Scheduler + allocator time per running sequence per step (goal: <= 5 us), on the mock executor.

Workload: N requests (prompts of 32-256 tokens, 128 output tokens, greedy) queued at once with room
for all of them to run together; every ``schedule()`` call is timed (policy snapshot and decision,
prefix-cache bookkeeping, block growth, batch building) and divided by the sequences it scheduled.
Only decode-only steps are counted in the "decode" row, where the per-sequence cost matters most.

    .venv/bin/python bench/scheduler_overhead.py [--num-requests 64 256] [--policy fcfs]
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

from hetero_core.builder import build_engine
from hetero_core.engine.params import SamplingParams
from hetero_core.plugins import load_plugins
from hetero_core.settings import load_settings


def measure(num_requests: int, policy: str, caching: bool) -> tuple[float, float]:
    import hetero_plugins_mock

    settings = load_settings(executor="mock", scheduler_policy=policy, enable_prefix_caching=caching,
                             max_num_blocks=num_requests * 30, max_batch_size=num_requests,
                             max_num_seqs=num_requests, max_total_tokens=8192)
    engine = build_engine(settings, load_plugins(entry_points=[], extra_plugins=[("mock", hetero_plugins_mock)]))
    rng = random.Random(0)
    params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    for _ in range(num_requests):
        engine.add_request([rng.randint(32, 126) for _ in range(rng.randint(32, 256))], params)
    all_steps, decode_steps = [], []
    schedule = engine.scheduler.schedule

    def timed():
        start = time.perf_counter()
        step = schedule()
        elapsed = time.perf_counter() - start
        if step is not None:
            per_seq = elapsed / len(step.seqs)
            all_steps.append(per_seq)
            if not any(step.batch.is_prefill):
                decode_steps.append(per_seq)
        return step

    engine.scheduler.schedule = timed
    while engine.has_unfinished_requests():
        engine.step()
    return statistics.median(all_steps) * 1e6, statistics.median(decode_steps) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-requests", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--policy", default="fcfs")
    args = parser.parse_args()
    print(f"machine: {platform.machine()} {platform.processor() or ''}, python {platform.python_version()}")
    print(f"{'requests':>9}{'prefix cache':>14}{'all steps us/seq':>18}{'decode steps us/seq':>21}")
    for n in args.num_requests:
        for caching in (False, True):
            every, decode = measure(n, args.policy, caching)
            print(f"{n:>9}{'on' if caching else 'off':>14}{every:>18.2f}{decode:>21.2f}")


if __name__ == "__main__":
    main()
