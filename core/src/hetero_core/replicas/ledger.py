"""The router's arithmetic, without Ray: which replica holds the fewest queued tokens.

Each replica reports its engine's queued tokens (``EngineStats.num_queued_tokens``: prompt + remaining
output tokens of its unfinished requests) with the wall-clock time of the report; Ray Serve's controller
collects the reports every ``request_routing_stats_period_s`` and hands them to every router. Between
reports a router corrects them with what it knows: each request it routed after the replica's latest
report counts at an estimate of its tokens until it finishes, and one that finishes after a report
counted it is taken off that report. So a burst of requests spreads out at once instead of piling
onto whichever replica looked idle at the last report, and a replica that finished work gets more.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

QUEUED_TOKENS_KEY = "num_queued_tokens"
REPORT_TIME_KEY = "reported_at"
CHARS_PER_TOKEN = 4  # a prompt sent as text is estimated at this many characters per token
# A request sent this shortly before a report may not be in it yet (the replica adds it to its engine
# between steps, and the stats it reports are from the last step): it keeps counting on its own.
REPORT_LAG_S = 0.1


def estimate_request_tokens(prompt, max_tokens: int | None) -> int:
    """What a request adds to a replica's queue before the replica has tokenized it: prompt tokens
    (exact for token ids, ``CHARS_PER_TOKEN`` characters each for text or chat messages) + ``max_tokens``."""
    if isinstance(prompt, str):
        num_prompt = -(-len(prompt) // CHARS_PER_TOKEN)
    elif prompt and all(isinstance(m, dict) for m in prompt):
        num_prompt = -(-sum(len(str(m.get("content") or "")) for m in prompt) // CHARS_PER_TOKEN)
    else:
        num_prompt = len(prompt or ())
    return max(1, num_prompt) + (max_tokens or 0)


@dataclass
class _Sent:
    replica: object
    sent_at: float
    num_tokens: int
    in_report: bool = False  # counted in the replica's latest report


@dataclass
class QueuedTokensLedger:
    """The latest report of each replica and the requests sent to it. Replicas are any hashable ids."""

    reports: dict = field(default_factory=dict)  # replica -> [queued tokens, reported_at]
    sent: dict = field(
        default_factory=dict
    )  # request id -> _Sent (one replica per request), until it finishes

    def report(self, replica, stats: dict | None) -> None:
        """Take a replica's routing stats if newer than the last; requests sent to it at least
        ``REPORT_LAG_S`` before the report are counted in it."""
        if not stats or QUEUED_TOKENS_KEY not in stats:
            return
        reported_at = float(stats.get(REPORT_TIME_KEY, 0.0))
        if replica in self.reports and reported_at <= self.reports[replica][1]:
            return  # the same report again (or an older one)
        self.reports[replica] = [int(stats[QUEUED_TOKENS_KEY]), reported_at]
        for s in self.sent.values():
            if s.replica == replica and s.sent_at <= reported_at - REPORT_LAG_S:
                s.in_report = True

    def record_sent(self, replica, request_id, num_tokens: int, now: float) -> None:
        """The request goes to ``replica`` (moving it there if an earlier choice was refused)."""
        self.sent[request_id] = _Sent(replica, now, num_tokens)

    def record_finished(self, replica, request_id) -> None:
        """The request is done: it stops counting, also in the report that counted it (its estimate is
        taken off, not below zero), so a replica that just finished work looks free at once."""
        s = self.sent.get(request_id)
        if s is None or s.replica != replica:
            return
        del self.sent[request_id]
        if s.in_report and replica in self.reports:
            self.reports[replica][0] = max(0, self.reports[replica][0] - s.num_tokens)

    def forget(self, replica) -> None:
        """The replica is gone (died or removed)."""
        self.reports.pop(replica, None)
        for request_id in [r for r, s in self.sent.items() if s.replica == replica]:
            del self.sent[request_id]

    def queued_tokens(self, replica) -> int:
        reported = self.reports.get(replica, (0, 0.0))[0]
        return reported + sum(
            s.num_tokens for s in self.sent.values() if s.replica == replica and not s.in_report
        )

    def rank(self, replicas: list, rng: random.Random | None = None) -> list:
        """``replicas`` from fewest to most queued tokens; ties in random order, so equal replicas
        share the work instead of the first one taking it all."""
        rng = rng or random
        keyed = [(self.queued_tokens(r), rng.random(), i) for i, r in enumerate(replicas)]
        return [replicas[i] for _, _, i in sorted(keyed)]
