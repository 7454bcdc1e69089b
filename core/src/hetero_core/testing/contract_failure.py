"""ContractFailure: what every contract kit raises when a plugin breaks one of its rules.

The kits are installed modules, so pytest does not rewrite their ``assert`` statements (a bare
``assert`` would fail with an empty ``AssertionError``). Each check raises this instead, with the rule
and the offending value in the message; it subclasses ``AssertionError``, so pytest reports it as a
test failure, not an error.
"""

from __future__ import annotations


class ContractFailure(AssertionError):
    """``rule``: the promise that was broken (one line); ``detail``: the offending value."""

    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(f"{rule}: {detail}")
        self.rule = rule
        self.detail = detail
