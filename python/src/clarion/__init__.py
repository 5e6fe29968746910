"""Clarion for Python: the server binary, a publish client and a test helper.

- The ``clarion`` command (and ``python -m clarion``) runs the server binary shipped in this
  wheel; :func:`find_clarion_bin` gives its path.
- :class:`Client` and :class:`AsyncClient` publish through the server's HTTP API
  (``POST /publish/{topic}``, ``POST /publish``), mapping every error status to a typed
  exception (:mod:`clarion.errors`).
- :mod:`clarion.testing` starts a server on free loopback ports for a test suite and stops it;
  the ``clarion_server`` pytest fixture is registered automatically.
"""

from importlib.metadata import PackageNotFoundError, version

from ._find import BINARY_PATH_VARIABLE, find_clarion_bin
from .client import AsyncClient, Client, Message, Receipt
from .errors import (
    APIError,
    BadRequest,
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

try:
    __version__ = version("clarion")
except PackageNotFoundError:  # imported from a source tree, not installed
    __version__ = "0.0.0"

__all__ = [
    "APIError",
    "AsyncClient",
    "BINARY_PATH_VARIABLE",
    "BadRequest",
    "ClarionError",
    "Client",
    "ConnectionFailed",
    "Forbidden",
    "Message",
    "MethodNotAllowed",
    "NotFound",
    "PayloadTooLarge",
    "Receipt",
    "RequestHeadTooLarge",
    "ServerError",
    "Timeout",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "__version__",
    "find_clarion_bin",
]
