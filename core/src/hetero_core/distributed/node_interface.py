"""Which network interface gloo binds on a node: the one holding the node's address.

Left to itself, gloo binds the address this machine's hostname resolves to, which on many machines
is a loopback address (``127.0.1.1 host`` in ``/etc/hosts``): fine for ranks on one machine, a dead
end for ranks on several. So a rank that runs on a cluster sets ``GLOO_SOCKET_IFNAME`` to the
interface of its node's address, unless it is set already (the operator's choice wins). Linux only
(``SIOCGIFADDR``), as the rest of Hetero's process handling.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct

SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address
GLOO_INTERFACE_VARIABLE = "GLOO_SOCKET_IFNAME"


def interface_of(address: str) -> str | None:
    """The name of the interface whose IPv4 address is ``address``, or None."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                answer = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
        if socket.inet_ntoa(answer[20:24]) == address:
            return name
    return None


def pin_gloo_interface(address: str) -> str | None:
    """Make gloo bind the interface of ``address`` (unless ``GLOO_SOCKET_IFNAME`` is set); returns
    the interface gloo will use (None: gloo's own choice)."""
    if os.environ.get(GLOO_INTERFACE_VARIABLE):
        return os.environ[GLOO_INTERFACE_VARIABLE]
    name = interface_of(address)
    if name is not None:
        os.environ[GLOO_INTERFACE_VARIABLE] = name
    return name
