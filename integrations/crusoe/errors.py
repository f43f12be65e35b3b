"""What can go wrong talking to the Crusoe API, and whether trying again can help.

    CloudError (autoclusters.integrations.cloud)
    └── CrusoeError                   non_retryable = False unless stated
        ├── CrusoeRequestError        the API refused the request (4xx): non_retryable
        │   └── CrusoeNotFound        404
        ├── CrusoeUnavailable         409/429/5xx, the network, or a 2xx that is no answer
        │                             (not JSON, not the resource), after retries; also a
        │                             core.unavailable.Unavailable (component "Crusoe API")
        ├── CrusoeOperationFailed     an async operation ended FAILED (its result.message)
        └── CrusoeTimeout             an operation or a replacement took longer than allowed

`non_retryable` tells the activity layer whether a Temporal retry is worth it: a 400 with
the same body fails the same way every time.
"""

from __future__ import annotations

from autoclusters.core.unavailable import Unavailable
from autoclusters.integrations.cloud import CloudError

__all__ = [
    "CRUSOE_API",
    "CrusoeError",
    "CrusoeNotFound",
    "CrusoeOperationFailed",
    "CrusoeRequestError",
    "CrusoeTimeout",
    "CrusoeUnavailable",
]


CRUSOE_API = "Crusoe API"


class CrusoeError(CloudError):
    non_retryable: bool = False


class CrusoeRequestError(CrusoeError):
    """A 4xx other than 409/429: the request itself is wrong; retrying cannot help."""

    non_retryable = True

    def __init__(self, status: int, message: str, *, method: str = "", path: str = "") -> None:
        where = f"{method} {path}: " if method else ""
        super().__init__(f"Crusoe API {where}{status} {message}")
        self.status = status
        self.message = message


class CrusoeNotFound(CrusoeRequestError):
    pass


class CrusoeUnavailable(CrusoeError, Unavailable):
    """Busy, throttled or failing (409/429/5xx, network errors, an answer that is not one)
    after every retry: the Crusoe API gave no answer to trust, so a reader raises this
    rather than "no VMs". Its ApplicationError type (`CrusoeUnavailable`) is an outage's."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        Unavailable.__init__(self, CRUSOE_API, message)
        self.status = status


class CrusoeOperationFailed(CrusoeError):
    def __init__(self, operation_id: str, message: str) -> None:
        super().__init__(f"Crusoe operation {operation_id} failed: {message}")
        self.operation_id = operation_id
        self.message = message


class CrusoeTimeout(CrusoeError):
    pass
