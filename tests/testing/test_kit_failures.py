"""The contract kits say what broke: a deliberately broken executor or policy run through a kit, the
way a plugin's own test suite runs it (pytest's ``pytester``), fails with the rule and the offending
value in pytest's report, although the kits are installed modules whose asserts pytest never
rewrites. And the kits import without the packages they do not need."""

from __future__ import annotations

import re
import subprocess
import sys

pytest_plugins = ["pytester"]


def run_kit(pytester, source: str, *args: str):
    pytester.makepyfile(test_plugin=source)
    # a plugin's suite as its author runs it; no shrinking: the first failing example is enough here
    pytester.makeconftest(
        "from hypothesis import Phase, settings\n"
        "settings.register_profile('kit', phases=[Phase.explicit, Phase.generate])\n"
        "settings.load_profile('kit')\n"
    )
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:logging", "-q", *args)


EXECUTOR = """
from array import array

from hetero_core.executor import ExecutorOutput
from hetero_core.testing import ExecutorContract
from hetero_plugins_mock.executor import MockExecutor


class OutOfVocabulary(MockExecutor):
    def execute(self, batch):
        super().execute(batch)
        return ExecutorOutput(token_ids=[999] * len(batch.sample_indices))


class IgnoresBlockTables(MockExecutor):  # reads blocks as if contiguous from the first one
    def _check(self, batch):
        pass

    def _read_context(self, block_table, num_tokens):
        first = block_table[0]
        return super()._read_context([first + i for i in range(len(block_table))], num_tokens)


class NoOpCopies(MockExecutor):  # declares block_copy (as the mock does) but copies nothing
    def copy_blocks(self, pairs):
        pass


class UndeclaredSwapIn(MockExecutor):  # declares block_swap without a swap_in
    swap_in = None


class TestNoOpCopies(ExecutorContract):
    vocab_size = 258

    def make_executor(self, ctx):
        executor = NoOpCopies(ctx)
        executor.slots = array("q", [0]) * len(executor.slots)  # stale slots read as 0, not as an error
        return executor


class TestUndeclaredSwapIn(ExecutorContract):
    vocab_size = 258

    def make_executor(self, ctx):
        return UndeclaredSwapIn(ctx)


class TestOutOfVocabulary(ExecutorContract):
    vocab_size = 258

    def make_executor(self, ctx):
        return OutOfVocabulary(ctx)


class TestIgnoresBlockTables(ExecutorContract):
    vocab_size = 258

    def make_executor(self, ctx):
        executor = IgnoresBlockTables(ctx)
        executor.slots = array("q", [0]) * len(executor.slots)  # stale slots read as 0, not as an error
        return executor
"""


def test_the_executor_kit_checks_what_the_capabilities_declare(pytester):
    result = run_kit(
        pytester, EXECUTOR, "-k", "NoOpCopies and block_copies or UndeclaredSwapIn and capabilities"
    )
    result.assert_outcomes(failed=2)
    report = result.stdout.str()
    assert (
        "ContractFailure: an executor declares its capabilities (hetero_core.executor."
        "ExecutorCapabilities): UndeclaredSwapIn: it declares block_swap=True but has no callable "
        "swap_in"
    ) in report
    assert re.search(
        r"ContractFailure: copy_blocks copies whole blocks \(block_copy\): a sequence "
        r"reading the copies: token at 37 is \d+, expected \d+\n",
        report,
    )


def test_an_executor_kit_failure_names_the_rule_and_the_value(pytester):
    result = run_kit(
        pytester, EXECUTOR, "-k", "OutOfVocabulary and one_row or IgnoresBlockTables and block_tables"
    )
    result.assert_outcomes(failed=2)
    report = result.stdout.str()
    assert "ContractFailure: token ids are ints in [0, vocab_size = 258): row 0 is 999\n" in report
    assert re.search(
        r"ContractFailure: block tables are honoured: shuffled, non-contiguous block tables: "
        r"token at \(0, 37\) is \d+, expected \d+\n",
        report,
    )


POLICY = """
from hetero_core.policy import SchedulingDecision, SortKeyPolicy
from hetero_core.testing import SchedulerPolicyContract


class InventsARequest:  # a decision the engine would replace with arrival order
    name = "invents"

    def decide(self, snapshot):
        return SchedulingDecision(order=tuple(r.request_id for r in snapshot.requests) + ("ghost",))


class HoldsEverythingBack(SortKeyPolicy):  # the engine's override would rescue it after 64 steps
    name = "holds"

    def key(self, request):
        return request.arrival_order

    def decide(self, snapshot):
        held = frozenset(r.request_id for r in snapshot.waiting + snapshot.swapped)
        return SchedulingDecision(order=super().decide(snapshot).order, hold_back=held)


class TestInventsARequest(SchedulerPolicyContract):
    def make_policy(self):
        return InventsARequest()


class TestHoldsEverythingBack(SchedulerPolicyContract):
    def make_policy(self):
        return HoldsEverythingBack()
"""


def test_a_policy_the_engine_would_forgive_fails_the_kit_naming_the_decision(pytester):
    result = run_kit(pytester, POLICY, "-k", "budgets or decisions_are_valid")
    result.assert_outcomes(failed=3, passed=1)  # a policy that only holds back makes valid decisions
    report = result.stdout.str()
    valid = (
        "ContractFailure: every decision is valid "
        "(the engine ignores an invalid one and serves in arrival order): "
    )
    # driving the engine (which alone would fall back to arrival order and pass)
    assert re.search(
        re.escape(valid) + r"step \d+: order names unknown requests \['ghost'\] "
        r"\(the decision: SchedulingDecision\(order=\(.*'ghost'\)",
        report,
    )
    # deciding on generated snapshots
    assert re.search(
        re.escape(valid) + r"order names unknown requests \['ghost'\] for a snapshot with "
        r"\{'waiting': \[.*\]\}",
        report,
    )
    # holding everything back (which the engine's override alone would rescue after 64 steps)
    assert re.search(
        r"ContractFailure: a policy may delay requests, never stall the engine: nothing ran and it "
        r"held back every request \(\['\d+'.*\]\) for 64 steps in a row, so the engine overrode "
        r"its hold-backs\n",
        report,
    )


def run_python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


BLOCK = "import sys; sys.modules.update(dict.fromkeys({names}))\n"  # a None entry makes `import name` fail


def test_the_executor_kit_needs_neither_hypothesis_nor_pytest_nor_torch():
    code = BLOCK.format(names=["hypothesis", "pytest", "torch", "hetero_plugins_mock"]) + (
        "from hetero_core.testing import ExecutorContract, ContractFailure, build_batch\n"
        "import hetero_core.testing as kits\n"
        "print(sorted(m for m in ('hetero_core.testing.policy_contract', 'pydantic_settings') "
        "if m in sys.modules))"
    )
    assert run_python(code) == "[]"


def test_the_policy_kit_without_hypothesis_names_the_extra_to_install():
    code = BLOCK.format(names=["hypothesis"]) + (
        "try:\n"
        "    from hetero_core.testing import SchedulerPolicyContract\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert run_python(code) == (
        "SchedulerPolicyContract generates workloads with hypothesis, which is not "
        "installed: pip install 'hetero-core[testing]'"
    )


def test_the_policy_kit_runs_an_engine_without_the_mock_package():
    code = BLOCK.format(names=["hetero_plugins_mock"]) + (
        "from hetero_core.default_plugins.policies import FcfsPolicy\n"
        "from hetero_core.testing.policy_workload import Arrival, run_workload\n"
        "result = run_workload(FcfsPolicy, "
        "[Arrival(0, 9, 4, 0, None, None), Arrival(1, 3, 2, 0, 'a', None)])\n"
        "print([len(o.output_token_ids) for o in result.outputs.values()], len(result.batches) > 1)"
    )
    assert run_python(code) == "[4, 2] True"
