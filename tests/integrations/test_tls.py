"""One TLS context per process (integrations/tls.py): made once, configured as httpx's
default (`verify=True`), one per `trust_env`."""

from __future__ import annotations

import ssl

from autoclusters.integrations.tls import default_verify


def test_the_context_is_made_once_and_verifies_as_httpx_default() -> None:
    ctx = default_verify()
    assert default_verify() is ctx
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.cert_store_stats()["x509_ca"] > 0  # a CA bundle is loaded


def test_a_client_that_ignores_the_environment_gets_its_own() -> None:
    assert default_verify(False) is default_verify(False)
    assert default_verify(False) is not default_verify(True)
