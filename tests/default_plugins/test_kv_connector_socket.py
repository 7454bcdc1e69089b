"""The built-in ``socket`` KV connector passes the connector contract kit; the kit catches a broken one."""

from __future__ import annotations

import socket
import threading

import pytest

from hetero_core.default_plugins.socket_connector import SocketConnector
from hetero_core.kv_transfer import KVTransferError
from hetero_core.testing import ContractFailure, KVConnectorContract


class TestSocketConnector(KVConnectorContract):
    timeout_s = 1.0

    def make_connector(self):
        return SocketConnector()

    def silent_address(self):
        listener = socket.create_server(("127.0.0.1", 0))
        accepted = []
        threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
        self._silent = listener  # accepts, never answers; closed with the test
        return f"127.0.0.1:{listener.getsockname()[1]}"

    def teardown_method(self, method=None):
        super().teardown_method(method)
        if getattr(self, "_silent", None) is not None:
            self._silent.close()


class TestTheKitCatchesAConnectorThatNeverForgets:
    def test_second_fetch_rule(self):
        class Broken(KVConnectorContract):
            def make_connector(self):
                connector = SocketConnector()
                fetch = connector.fetch
                seen = {}

                def fetch_twice(address, transfer_id, timeout):  # answers from memory the second time
                    if transfer_id in seen:
                        return seen[transfer_id]
                    seen[transfer_id] = fetch(address, transfer_id, timeout)
                    return seen[transfer_id]

                connector.fetch = fetch_twice
                return connector

        kit = Broken()
        with pytest.raises(ContractFailure, match="a second fetch of a transfer fails"):
            try:
                kit.test_a_transfer_is_fetched_once_and_discard_drops_it()
            finally:
                kit.teardown_method()


def test_a_peer_that_is_not_there_is_named():
    with SocketConnectorClosing() as connector:
        with pytest.raises(
            KVTransferError, match="cannot reach the KV connector at 127.0.0.1:1.*prefill engine running"
        ):
            connector.fetch("127.0.0.1:1", "x", 1.0)


class SocketConnectorClosing(SocketConnector):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
