"""Clarion's Python clients, without the server: publish and subscribe from a worker.

- :class:`Client` and :class:`AsyncClient` publish through the server's HTTP API
  (``POST /publish/{topic}``, ``POST /publish``), mapping every error status to a typed
  exception (:mod:`clarion_client.errors`).
- :class:`Subscriber` (asyncio) and :class:`SyncSubscriber` follow topics over one WebSocket,
  reconnecting with backoff and resuming every topic exactly, and keep presence topics' members
  (:mod:`clarion_client.subscriber`).

The ``clarion`` wheel (the server binary and a test helper) depends on this package and
re-exports every name here, so ``clarion.Client is clarion_client.Client``.
"""

from typing import TYPE_CHECKING, Any

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
    from .streams import StreamText

    __version__: str

# A publisher does not pay for websockets, nor a subscriber for httpx: each module is imported
# on first use of one of its names.
CLIENT_NAMES = frozenset({"AsyncClient", "AsyncStreamWriter", "Client", "Message", "Receipt", "StreamWriter"})
SUBSCRIBER_NAMES = frozenset(
    {
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
        "StreamText",
    }
)


def __getattr__(name: str) -> Any:
    if name in CLIENT_NAMES:
        from . import client

        return getattr(client, name)
    if name in SUBSCRIBER_NAMES:
        from . import subscriber

        return getattr(subscriber, name)
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("clarion-client")
        except PackageNotFoundError:  # imported from a source tree, not installed
            return "0.0.0"
    raise AttributeError(f"module 'clarion_client' has no attribute {name!r}")


__all__ = [
    "APIError",
    "AsyncClient",
    "AsyncStreamWriter",
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
    "StreamText",
    "StreamWriter",
    "Subscriber",
    "SubscriptionRefused",
    "SyncSubscriber",
    "Timeout",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "__version__",
]
