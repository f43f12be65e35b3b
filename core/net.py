"""Where a caller or a listener is: loopback or not (the sandbox's open doors)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str | None) -> bool:
    """127.0.0.0/8, ::1 or `localhost`; a name or nothing is not."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
