"""Hypothesis settings for the fuzz tests: a short run in the default test run, a long run on demand.

    HETERO_FUZZ_EXAMPLES=5000 python -m pytest -q -s tests/engine/test_engine_state_machine.py \
        tests/server/test_async_llm_fuzz.py -k "not real_model" --hypothesis-show-statistics

The variable is read when the test modules are imported (the tests' own fixtures clear HETERO_*
variables later) and sets every fuzz test's ``max_examples``. The default run is derandomized (the
same examples every time); a long run is random, so each finds new cases (``--hypothesis-seed N``
repeats one). ``TALLY`` counts what the runs did; with ``-s`` each fuzz module prints it at the end.
"""

from __future__ import annotations

import os
from collections import Counter

from hypothesis import HealthCheck, settings

FUZZ_EXAMPLES_VARIABLE = "HETERO_FUZZ_EXAMPLES"
TALLY: Counter = Counter()


def fuzz_settings(default_examples: int, **kwargs) -> settings:
    """``default_examples`` unless HETERO_FUZZ_EXAMPLES says otherwise; no deadline (CPU speed varies)."""
    examples = int(os.environ.get(FUZZ_EXAMPLES_VARIABLE) or default_examples)
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=FUZZ_EXAMPLES_VARIABLE not in os.environ,
        suppress_health_check=[HealthCheck.too_slow],
        **kwargs,
    )


def print_tally(title: str) -> None:
    print(f"\n{title}: " + ", ".join(f"{key} {n:,}" for key, n in sorted(TALLY.items())))
    TALLY.clear()
