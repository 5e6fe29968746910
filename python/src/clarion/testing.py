"""Run a real Clarion server in a test suite: :class:`ClarionServer`.

The server listens on free loopback ports (port 0, chosen by the kernel, so parallel test runs
never collide) and is ready when :meth:`ClarionServer.start` returns: the binary prints
``clarion ready clients=ADDR api=ADDR`` once both listeners are bound. ::

    from clarion.testing import ClarionServer

    with ClarionServer() as server:
        server.client().publish("news", "hello")

With pytest the ``clarion_server`` fixture (:mod:`clarion.pytest_plugin`, registered on install)
gives one server per test session.
"""

import os
import selectors
import signal
import subprocess
import tempfile
import threading
import time
from typing import Dict, List, Mapping, Optional, Sequence
from urllib.parse import urlencode

from ._find import find_clarion_bin
from .client import AsyncClient, Client

#: Seconds :meth:`ClarionServer.start` waits for the ready line.
START_TIMEOUT = 20.0
#: Seconds :meth:`ClarionServer.stop` waits after SIGTERM before killing the process.
STOP_TIMEOUT = 10.0


class ServerStartError(RuntimeError):
    """The server exited, or printed no ready line in time; the message holds its stderr."""


class ClarionServer:
    """A ``clarion serve`` process on loopback ports, for tests.

    Args:
        args: more ``clarion serve`` flags, e.g. ``["--api-key", "secret"]``.
        env: environment variables for the server. ``CLARION_*`` variables of the test
            process are *not* passed on (they would silently change the server under test);
            give them here instead.
        binary: the ``clarion`` binary (default: :func:`clarion.find_clarion_bin`).
        start_timeout: seconds to wait for the server to be ready.

    Attributes (after :meth:`start`):
        clients: ``HOST:PORT`` of the client listener (WebSocket, SSE, streaming, long-poll).
        api: ``HOST:PORT`` of the publish API.
        api_url: ``http://`` URL of the publish API.
        api_key: the ``--api-key`` given in ``args``, if any (used by :meth:`client`).
    """

    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        env: Optional[Mapping[str, str]] = None,
        binary: Optional[str] = None,
        start_timeout: float = START_TIMEOUT,
    ) -> None:
        self.args: List[str] = list(args)
        self.env: Dict[str, str] = dict(env or {})
        self.binary = binary
        self.start_timeout = start_timeout
        self.clients = ""
        self.api = ""
        self.api_key: Optional[str] = _flag_value(self.args, "--api-key") or self.env.get("CLARION_API_KEY")
        self._proc: Optional["subprocess.Popen[bytes]"] = None
        self._stderr = tempfile.TemporaryFile()
        self._drain: Optional[threading.Thread] = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> "ClarionServer":
        """Starts the server and waits until both listeners accept connections."""
        if self._proc is not None:
            raise RuntimeError("the server is already started")
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
        env.update(self.env)
        binary = self.binary or find_clarion_bin()
        cmd = [binary, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0", *self.args]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr, env=env)
        line = self._ready_line()
        fields = dict(part.split("=", 1) for part in line.split()[2:] if "=" in part)
        self.clients, self.api = fields["clients"], fields["api"]
        # Keep reading stdout so that a chatty server never blocks on a full pipe.
        self._drain = threading.Thread(target=self._discard_stdout, daemon=True)
        self._drain.start()
        return self

    def stop(self) -> Optional[int]:
        """Stops the server (SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT`); returns its exit
        status. Calling it twice is harmless."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        return proc.returncode

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def stderr(self) -> str:
        """Everything the server wrote to stderr so far (its log)."""
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")

    def __enter__(self) -> "ClarionServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._stderr.close()

    # -- addresses and clients -------------------------------------------------------------

    @property
    def api_url(self) -> str:
        return f"http://{self.api}"

    def url(self, path: str, *topics: str, scheme: str = "http", **query: str) -> str:
        """A client-listener URL: ``url("/sse", "news")`` is ``http://HOST:PORT/sse?topic=news``."""
        params = [("topic", t) for t in topics] + list(query.items())
        return f"{scheme}://{self.clients}{path}" + (f"?{urlencode(params)}" if params else "")

    def ws_url(self, *topics: str, **query: str) -> str:
        """``ws://HOST:PORT/ws?topic=...`` for the given topics."""
        return self.url("/ws", *topics, scheme="ws", **query)

    def client(self, **kwargs: object) -> Client:
        """A :class:`clarion.Client` for this server (with its ``--api-key``, if any)."""
        kwargs.setdefault("api_key", self.api_key)
        return Client(self.api_url, **kwargs)  # type: ignore[arg-type]

    def async_client(self, **kwargs: object) -> AsyncClient:
        """An :class:`clarion.AsyncClient` for this server (with its ``--api-key``, if any)."""
        kwargs.setdefault("api_key", self.api_key)
        return AsyncClient(self.api_url, **kwargs)  # type: ignore[arg-type]

    # -- internals -------------------------------------------------------------------------

    def _ready_line(self) -> str:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        deadline = time.monotonic() + self.start_timeout
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    self.stop()
                    raise ServerStartError(f"no ready line after {self.start_timeout} s:\n{self.stderr()}")
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    status = proc.wait()
                    self._proc = None
                    raise ServerStartError(f"clarion serve exited with status {status}:\n{self.stderr()}")
                buf += chunk
        line = buf.split(b"\n", 1)[0].decode("utf-8", "replace")
        if not line.startswith("clarion ready"):
            self.stop()
            raise ServerStartError(f"unexpected first line {line!r}:\n{self.stderr()}")
        return line

    def _discard_stdout(self) -> None:
        proc = self._proc
        if proc is None or proc.stdout is None:
            return
        try:
            while proc.stdout.read(65536):
                pass
        except (OSError, ValueError):
            pass


def _flag_value(args: Sequence[str], flag: str) -> Optional[str]:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


__all__ = ["ClarionServer", "ServerStartError", "START_TIMEOUT", "STOP_TIMEOUT"]
