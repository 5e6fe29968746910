"""Exceptions raised by :class:`Client`, :class:`AsyncClient` and :class:`Subscriber`.

Every answer of the publish API other than ``200`` becomes an :class:`APIError` subclass chosen
by its status (docs/protocol.md lists them); the server's ``{"error": "..."}`` text is the
exception's message. Failures to reach the server at all are :class:`TransportError`\\ s.
Catch :class:`ClarionError` for everything.
"""

from typing import Any, Dict, List, Optional, Type


class ClarionError(Exception):
    """Base class of every exception this package raises."""


class TransportError(ClarionError):
    """The request did not get an answer: connection refused or reset, TLS failure, ..."""


class ConnectionFailed(TransportError):
    """The API listener could not be reached (refused, reset, unknown host, TLS handshake)."""


class Timeout(TransportError):
    """Connecting, sending or waiting for the answer took longer than the client's timeout."""


class APIError(ClarionError):
    """The server answered with an error status.

    Attributes:
        status: the HTTP status code.
        message: the server's explanation (the ``error`` field of its JSON answer, or the body).
        body: the raw answer body.
    """

    def __init__(self, status: int, message: str, body: bytes = b"") -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.body = body


class BadRequest(APIError):
    """400: invalid topic or event name, text that is not UTF-8, malformed batch or query."""


class Unauthorized(APIError):
    """401: the server has an API key and the request's bearer key or token is missing or wrong."""


class Forbidden(APIError):
    """403: the credentials are valid but do not allow publishing to this topic."""


class NotFound(APIError):
    """404: no such API path (the base URL probably points at the wrong listener)."""


class MethodNotAllowed(APIError):
    """405: wrong method for the path (publishing is POST, health and metrics GET)."""


class PayloadTooLarge(APIError):
    """413: the body is larger than the server's ``max_publish_size``."""


class RequestHeadTooLarge(APIError):
    """414 or 431: the request line or headers exceed the server's head limits."""


class ServerError(APIError):
    """500 (or another 5xx not listed here): the server failed to handle the request."""


class Unavailable(APIError):
    """503: the server is stopping, or already holds its maximum of API connections.

    Retrying later, or with fewer concurrent publishers, can succeed.
    """


_BY_STATUS: Dict[int, Type[APIError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    413: PayloadTooLarge,
    414: RequestHeadTooLarge,
    431: RequestHeadTooLarge,
    503: Unavailable,
}


def error_for(status: int, message: str, body: bytes = b"") -> APIError:
    """The exception for an error answer: a subclass by status, else ``ServerError`` for 5xx and
    plain ``APIError`` for anything else."""
    cls: Optional[Type[APIError]] = _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else APIError
    return cls(status, message, body)


class BatchPartlyRefused(BadRequest):
    """A batch (:meth:`Client.publish_batch`) in which the server refused some messages while
    it published the others (a :class:`BadRequest`, as a bad batch was before servers answered
    per message). ``status`` and ``message`` are the first refused message's; ``results`` has
    one entry per message, in order: a :class:`Receipt` for each published one, a dict
    ``{"error": ..., "status": ...}`` for each refused one (``424``: held back because another
    message of its topic was refused; a topic's messages are published all or none)."""

    def __init__(self, results: List[Any]) -> None:
        refused = [(i, r) for i, r in enumerate(results) if isinstance(r, dict)]
        first, why = refused[0]
        super().__init__(
            int(why.get("status", 400)),
            f"{len(refused)} of {len(results)} messages not published; "
            f"messages[{first}]: {why.get('error')}",
        )
        self.results = results


__all__ = [
    "APIError",
    "BadRequest",
    "BatchPartlyRefused",
    "ClarionError",
    "ConnectionFailed",
    "Forbidden",
    "MethodNotAllowed",
    "NotFound",
    "PayloadTooLarge",
    "RequestHeadTooLarge",
    "ServerError",
    "Timeout",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "error_for",
]

