"""Clarion for Python: the server binary, a publish client and a test helper.

- The ``clarion`` command (and ``python -m clarion``) runs the server binary shipped in this
  wheel; :func:`find_clarion_bin` gives its path.
- The clients are those of the ``clarion-client`` wheel (``clarion_client``), which this one
  depends on; ``clarion.Client is clarion_client.Client``:
- :class:`Client` and :class:`AsyncClient` publish through the server's HTTP API
  (``POST /publish/{topic}``, ``POST /publish``), mapping every error status to a typed
  exception (:mod:`clarion.errors`).
- :class:`Subscriber` (asyncio) and :class:`SyncSubscriber` follow topics over one WebSocket,
  reconnecting with backoff and resuming every topic exactly, and keep presence topics' members
  (:mod:`clarion.subscriber`).
- :mod:`clarion.testing` starts a server on free loopback ports for a test suite and stops it;
  the ``clarion_server`` pytest fixture is registered automatically.
"""

from typing import TYPE_CHECKING, Any

from ._find import BINARY_PATH_VARIABLE, find_clarion_bin
from .errors import (
    APIError,
    BadRequest,
    BatchPartlyRefused,
    ClarionError,
    ConnectionFailed,
    Forbidden,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    RequestHeadTooLarge,
    ServerError,
    Timeout,
    TransportError,
    Unauthorized,
    Unavailable,
)

if TYPE_CHECKING:
    from .client import AsyncClient, AsyncStreamWriter, Client, Message, Receipt, StreamWriter
    from .subscriber import (
        Delivery,
        Gap,
        Join,
        Leave,
        Member,
        Presence,
        PresenceError,
        Subscriber,
        SubscriptionRefused,
        SyncSubscriber,
    )

    __version__: str

# The clients (and httpx under them) are imported on first use, so that `python -m clarion`
# starts the server without paying for them (about 130 ms).
_LAZY = {"AsyncClient", "AsyncStreamWriter", "Client", "Message", "Receipt", "StreamWriter"}
# The subscriber (and websockets under it), likewise.
_LAZY_SUBSCRIBER = {
    "Delivery",
    "Gap",
    "Join",
    "Leave",
    "Member",
    "Presence",
    "PresenceError",
    "Subscriber",
    "SubscriptionRefused",
    "SyncSubscriber",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import client

        return getattr(client, name)
    if name in _LAZY_SUBSCRIBER:
        from . import subscriber

        return getattr(subscriber, name)
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("clarion")
        except PackageNotFoundError:  # imported from a source tree, not installed
            return "0.0.0"
    raise AttributeError(f"module 'clarion' has no attribute {name!r}")

__all__ = [
    "APIError",
    "AsyncClient",
    "AsyncStreamWriter",
    "BINARY_PATH_VARIABLE",
    "BadRequest",
    "BatchPartlyRefused",
    "ClarionError",
    "Client",
    "ConnectionFailed",
    "Delivery",
    "Forbidden",
    "Gap",
    "Join",
    "Leave",
    "Member",
    "Message",
    "MethodNotAllowed",
    "NotFound",
    "PayloadTooLarge",
    "Presence",
    "PresenceError",
    "Receipt",
    "RequestHeadTooLarge",
    "ServerError",
    "StreamWriter",
    "Subscriber",
    "SubscriptionRefused",
    "SyncSubscriber",
    "Timeout",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "__version__",
    "find_clarion_bin",
]
