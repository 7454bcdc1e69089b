"""Hypothesis settings for the fuzz tests: a short run in the default test run, a long run on demand.

    HETERO_FUZZ_EXAMPLES=5000 python -m pytest -q tests/test_engine_state_machine.py \
        tests/server/test_async_llm_fuzz.py --hypothesis-show-statistics

The variable is read when the test modules are imported (the tests' own fixtures clear HETERO_*
variables later), and sets every fuzz test's ``max_examples`` (docs/testing.md).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

FUZZ_EXAMPLES_VARIABLE = "HETERO_FUZZ_EXAMPLES"


def fuzz_settings(default_examples: int, **kwargs) -> settings:
    """``default_examples`` unless HETERO_FUZZ_EXAMPLES says otherwise; no deadline (CPU speed varies)."""
    examples = int(os.environ.get(FUZZ_EXAMPLES_VARIABLE) or default_examples)
    return settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow], **kwargs)
