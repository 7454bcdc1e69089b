"""How many choices the server runs at once, reserved a whole request at a time before any engine work.

A request's choices are ``n`` per prompt, each one engine request. Reserving them all together means
a request that cannot run is refused before the first choice starts: 400 if it asks for more than the
server ever runs at once, 429 if it does not fit beside the choices already running. (The front end's
own limit, ``AsyncLLM``'s ``max_pending_requests``, still applies: it counts callers other than this app.)
"""

from __future__ import annotations

from hetero_core.server.errors import APIError


class ChoiceBudget:
    """Choices in flight in this app (one event loop: checking and reserving are one atomic step)."""

    def __init__(self, max_pending_choices: int) -> None:
        self.max_pending_choices = max_pending_choices
        self.num_pending = 0

    def reserve(self, num_prompts: int, n: int) -> Reservation:
        limit, num_choices = self.max_pending_choices, num_prompts * n
        asked = f"{num_choices} choices ({num_prompts} prompt{'s' if num_prompts > 1 else ''} x n={n})"
        if num_choices > limit:
            raise APIError(
                400,
                f"this request asks for {asked}; the server runs at most {limit} at once "
                "(max_pending_requests): send fewer prompts per request or a smaller n",
                param="n" if num_prompts == 1 else "prompt",
                code="too_many_choices",
            )
        if self.num_pending + num_choices > limit:
            raise APIError(
                429,
                f"{asked} do not fit beside the {self.num_pending} choices running (limit "
                f"{limit}, max_pending_requests); retry later",
                "rate_limit_error",
                code="too_many_pending_requests",
            )
        self.num_pending += num_choices
        return Reservation(self, num_choices)


class Reservation:
    """A request's choices; ``release()`` gives them back (once, however often it is called)."""

    def __init__(self, budget: ChoiceBudget, num_choices: int) -> None:
        self.budget, self.num_choices = budget, num_choices

    def release(self) -> None:
        self.budget.num_pending -= self.num_choices
        self.num_choices = 0
