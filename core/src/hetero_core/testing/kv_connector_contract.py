"""KVConnectorContract: the tests every KV connector passes, as a mixin a connector's author subclasses.

    from hetero_core.testing import KVConnectorContract

    class TestMyConnector(KVConnectorContract):
        def make_connector(self):
            return MyConnector(...)          # a fresh one; the kit makes a publisher and a fetcher

        def silent_address(self):            # optional: an address that accepts and never answers
            return None                      # (None skips the timeout rule)

The rules (docs/disaggregation.md, "The connector contract"); a broken one raises ``ContractFailure``
naming the rule:

- a round trip keeps every byte, dtype, shape, the block size, block dim and token ids;
- a transfer is fetched once: a second fetch, or one after ``discard``, fails with KVTransferError;
- an unknown transfer id fails with KVTransferError (a message that says so), not a hang;
- a publisher that closed fails the fetch with KVTransferError within the timeout;
- a peer that never answers fails the fetch with KVTransferError within the timeout;
- one failed transfer leaves the others intact; transfers fetched from several threads at once
  each arrive whole.

Imports neither torch nor pytest.
"""

from __future__ import annotations

import random
import threading
import time

from hetero_core.engine.kv.kv_transfer import KVBlocks, KVTensor, KVTransferError
from hetero_core.testing.contract_failure import ContractFailure

__all__ = ["KVConnectorContract", "sample_blocks"]
SLACK_S = 5.0  # how far past its timeout a failing fetch may return


def sample_blocks(
    seed: int = 0, num_layers: int = 3, num_blocks: int = 3, block_size: int = 4, row_bytes: int = 96
) -> KVBlocks:
    """KV blocks of random bytes: per layer a K and a V (``float32`` and ``bfloat16`` alternating)."""
    rng = random.Random(seed)
    layers = []
    for i in range(num_layers):
        dtype, width = ("float32", 4) if i % 2 == 0 else ("bfloat16", 2)
        shape = (num_blocks, 2, block_size, row_bytes // (2 * width))
        size = num_blocks * block_size * row_bytes
        layers.append(tuple(KVTensor(dtype, shape, rng.randbytes(size)) for _ in range(2)))
    token_ids = tuple(rng.randrange(50_000) for _ in range(num_blocks * block_size - 1))
    return KVBlocks(block_size, 0, tuple(layers), token_ids)


class KVConnectorContract:
    """Mix into a test class and define ``make_connector()`` (and, optionally, ``silent_address()``)."""

    timeout_s: float = 2.0

    def make_connector(self):
        raise NotImplementedError("subclass KVConnectorContract and implement make_connector()")

    def silent_address(self) -> str | None:
        return None

    # -- helpers ----------------------------------------------------------------------------------
    def _pair(self):
        publisher, fetcher = self.make_connector(), self.make_connector()
        self._opened = [publisher, fetcher]
        return publisher, fetcher

    def teardown_method(self, method=None) -> None:
        for connector in getattr(self, "_opened", []):
            connector.close()

    def _expect_failure(self, rule: str, fetch) -> KVTransferError:
        started = time.monotonic()
        try:
            got = fetch()
        except KVTransferError as exc:
            if time.monotonic() - started > self.timeout_s + SLACK_S:
                raise ContractFailure(
                    rule, f"failed only after {time.monotonic() - started:.1f}s (timeout {self.timeout_s}s)"
                ) from None
            if not str(exc):
                raise ContractFailure(rule, "KVTransferError without a message") from None
            return exc
        except Exception as exc:
            raise ContractFailure(
                rule, f"raised {type(exc).__name__}: {exc} instead of KVTransferError"
            ) from None
        raise ContractFailure(rule, f"the fetch returned {type(got).__name__} instead of failing")

    @staticmethod
    def _check_same(rule: str, got, sent: KVBlocks) -> None:
        if not isinstance(got, KVBlocks):
            raise ContractFailure(rule, f"fetch returned {type(got).__name__}, not KVBlocks")
        for name in ("block_size", "block_dim", "token_ids"):
            a, b = getattr(sent, name), getattr(got, name)
            if name == "token_ids":
                a, b = tuple(a), tuple(b)
            if a != b:
                raise ContractFailure(rule, f"{name} changed: sent {a!r:.80}, got {b!r:.80}")
        if len(got.layers) != len(sent.layers):
            raise ContractFailure(rule, f"sent {len(sent.layers)} layers, got {len(got.layers)}")
        for i, (a, b) in enumerate(zip(sent.layers, got.layers)):
            if len(a) != len(b):
                raise ContractFailure(rule, f"layer {i}: sent {len(a)} tensors, got {len(b)}")
            for j, (x, y) in enumerate(zip(a, b)):
                if (x.dtype, tuple(x.shape)) != (y.dtype, tuple(y.shape)):
                    raise ContractFailure(
                        rule, f"layer {i} tensor {j}: sent {x.dtype} {x.shape}, got {y.dtype} {y.shape}"
                    )
                if bytes(x.data) != bytes(y.data):
                    raise ContractFailure(rule, f"layer {i} tensor {j}: the bytes changed")

    # -- the rules --------------------------------------------------------------------------------
    def test_round_trip_keeps_bytes_dtype_and_layout(self):
        publisher, fetcher = self._pair()
        for seed, blocks in enumerate(
            [
                sample_blocks(1),
                sample_blocks(2, num_layers=1, num_blocks=1),
                sample_blocks(3, num_layers=2, num_blocks=64, row_bytes=4096),
            ]
        ):
            address = publisher.publish(f"t{seed}", blocks)
            self._check_same(
                "a round trip keeps every byte, dtype, shape and token id",
                fetcher.fetch(address, f"t{seed}", self.timeout_s),
                blocks,
            )

    def test_a_transfer_is_fetched_once_and_discard_drops_it(self):
        publisher, fetcher = self._pair()
        address = publisher.publish("once", sample_blocks())
        fetcher.fetch(address, "once", self.timeout_s)
        self._expect_failure(
            "a second fetch of a transfer fails with KVTransferError",
            lambda: fetcher.fetch(address, "once", self.timeout_s),
        )
        address = publisher.publish("dropped", sample_blocks())
        publisher.discard("dropped")
        publisher.discard("never-published")  # no error
        self._expect_failure(
            "a fetch after discard fails with KVTransferError",
            lambda: fetcher.fetch(address, "dropped", self.timeout_s),
        )

    def test_an_unknown_transfer_fails_clearly(self):
        publisher, fetcher = self._pair()
        address = publisher.publish("known", sample_blocks())
        self._expect_failure(
            "an unknown transfer id fails with KVTransferError",
            lambda: fetcher.fetch(address, "unknown", self.timeout_s),
        )

    def test_a_closed_publisher_fails_the_fetch(self):
        publisher, fetcher = self._pair()
        address = publisher.publish("orphan", sample_blocks())
        publisher.close()
        self._expect_failure(
            "a fetch from a publisher that closed fails with KVTransferError",
            lambda: fetcher.fetch(address, "orphan", self.timeout_s),
        )

    def test_a_silent_peer_times_out(self):
        address = self.silent_address()
        if address is None:
            return
        _, fetcher = self._pair()
        self._expect_failure(
            "a fetch from a peer that never answers fails with KVTransferError in time",
            lambda: fetcher.fetch(address, "anything", self.timeout_s),
        )

    def test_one_failed_transfer_leaves_the_others_intact(self):
        publisher, fetcher = self._pair()
        sent = {f"c{i}": sample_blocks(10 + i, num_blocks=8, row_bytes=1024) for i in range(6)}
        address = ""
        for tid, blocks in sent.items():
            address = publisher.publish(tid, blocks)
        self._expect_failure(
            "an unknown transfer id fails with KVTransferError",
            lambda: fetcher.fetch(address, "c-missing", self.timeout_s),
        )
        results, errors = {}, []

        def fetch(tid):
            try:
                results[tid] = fetcher.fetch(address, tid, self.timeout_s)
            except Exception as exc:  # reported below
                errors.append(f"{tid}: {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=fetch, args=(tid,)) for tid in sent]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.timeout_s + SLACK_S)
        if errors or len(results) != len(sent):
            raise ContractFailure(
                "transfers fetched from several threads at once each arrive whole",
                "; ".join(errors) or f"{len(results)} of {len(sent)} arrived",
            )
        for tid, blocks in sent.items():
            self._check_same(
                "transfers fetched from several threads at once each arrive whole", results[tid], blocks
            )
