"""What can go wrong talking to the Crusoe API, and whether trying again can help.

    CloudError (autoclusters.integrations.cloud)
    └── CrusoeError                   non_retryable = False unless stated
        ├── CrusoeRequestError        the API refused the request (4xx): non_retryable
        │   └── CrusoeNotFound        404
        ├── CrusoeUnavailable         409/429/5xx or the network, still failing after retries
        ├── CrusoeOperationFailed     an async operation ended FAILED (its result.message)
        └── CrusoeTimeout             an operation or a replacement took longer than allowed

`non_retryable` tells the activity layer whether a Temporal retry is worth it: a 400 with
the same body fails the same way every time.
"""

from __future__ import annotations

from autoclusters.integrations.cloud import CloudError

__all__ = [
    "CrusoeError",
    "CrusoeNotFound",
    "CrusoeOperationFailed",
    "CrusoeRequestError",
    "CrusoeTimeout",
    "CrusoeUnavailable",
]


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


class CrusoeUnavailable(CrusoeError):
    """Busy, throttled or failing (409/429/5xx, network errors) after every retry."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class CrusoeOperationFailed(CrusoeError):
    def __init__(self, operation_id: str, message: str) -> None:
        super().__init__(f"Crusoe operation {operation_id} failed: {message}")
        self.operation_id = operation_id
        self.message = message


class CrusoeTimeout(CrusoeError):
    pass
