"""The Clarion subscriber: ``async for item in client.subscribe("topic")``, resumed exactly.

One ``clarion.v1`` WebSocket (the ``websockets`` library) carries every subscription of a
:class:`Subscriber`. The client keeps the last id of every topic and resubscribes with it after
each reconnect, on whichever node answers; the iterator yields :class:`Delivery` items and, when
the server cannot replay everything, :class:`Gap` items that say what was lost. Reconnects wait
an exponential backoff with full jitter; tokens come from ``get_token`` before every connection
and on the server's ``expiring`` warning. Nothing the server sends and nothing a callback raises
escapes into the app except a subscription refused for good (:class:`SubscriptionRefused`).
:class:`SyncSubscriber` is the same for code without an event loop. docs/clients.md has the
states and what the client does after each server answer.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random as _random
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, Iterator, List, Optional, Sequence, Union

from .errors import ClarionError

# Close codes with a meaning for the client (docs/protocol.md, docs/auth.md).
_AWAY, _RESTART, _TRY_AGAIN, _EXPIRED, _AUTH_REQUIRED = 1001, 1012, 1013, 4001, 4002
_KNOWN_CLOSES = {1000, _AWAY, 1002, 1003, 1005, 1006, 1007, 1008, 1009, 1011, _RESTART, _TRY_AGAIN, _EXPIRED, _AUTH_REQUIRED}


@dataclass(frozen=True)
class Delivery:
    """A message of a followed topic; ``data`` is ``str`` for text, ``bytes`` for binary."""

    topic: str
    id: str
    data: Union[str, bytes]
    event: Optional[str] = None


@dataclass(frozen=True)
class Gap:
    """Messages of ``topic`` after ``since`` that will never arrive: ``trimmed`` (history no
    longer holds them), ``epoch`` (``since`` is from another server run), ``unpositioned``
    (nothing had arrived before the connection dropped, so there was no id to resume from)."""

    topic: str
    since: Optional[str]
    reason: str


class SubscriptionRefused(ClarionError):
    """The server refused a topic for good (the token does not grant it, an invalid name)."""

    def __init__(self, topic: str, reason: str) -> None:
        super().__init__(f"{topic}: {reason}")
        self.topic = topic
        self.reason = reason


class _Drop(Exception):
    """Ends the current connection; the client reports ``kind`` and reconnects."""

    def __init__(self, kind: str, message: str, quiet: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.quiet = quiet


_END = object()


def _not_after(b: str, a: str) -> bool:
    """True when id ``b`` is at or before ``a`` in the same epoch."""
    ea, _, sa = a.rpartition("-")
    eb, _, sb = b.rpartition("-")
    return ea == eb and sa.isdigit() and sb.isdigit() and int(sb) <= int(sa)


class Subscription:
    """One followed topic: an async iterator of :class:`Delivery` and :class:`Gap` items."""

    def __init__(self, client: "Subscriber", topic: str, since: Optional[str]) -> None:
        self.client = client
        self.topic = topic
        self.last_id = since
        self.state = "pending"
        self._queue: "asyncio.Queue[Any]" = asyncio.Queue()
        self._ever = False

    def __aiter__(self) -> "Subscription":
        return self

    async def __anext__(self) -> Union[Delivery, Gap]:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item  # type: ignore[no-any-return]

    async def unsubscribe(self) -> None:
        await self.client._unsubscribe(self)


class Subscriber:
    """Follows topics on a Clarion server (or one of several ``urls``) over one WebSocket.

    Args:
        url: ``ws://host:8080/ws`` or a list of them, tried in turn when one fails.
        get_token: returns a JWT (sync or async); called before each connection and on
            ``expiring``.
        initial_delay, max_delay, factor: the backoff, in seconds: a random wait in
            ``[0, min(max_delay, initial_delay * factor**attempt))``.
        restart_delay: the first wait after a close announcing a restart (1001, 1012, 1013),
            which every client of that server gets at once.
        connect_timeout: seconds a handshake may take.
        stable: a connection that lived this long resets the backoff.
        max_frame_bytes: larger frames are a protocol error.
        on_event: ``on_event(name, detail)`` for ``connecting``, ``connected``, ``disconnected``,
            ``reconnecting`` and ``error``; what it raises is dropped.
    """

    def __init__(
        self,
        url: Union[str, Sequence[str]],
        *,
        get_token: Optional[Callable[[], Union[str, Awaitable[str]]]] = None,
        initial_delay: float = 1.0,
        max_delay: float = 30.0,
        factor: float = 2.0,
        restart_delay: float = 10.0,
        connect_timeout: float = 10.0,
        stable: float = 5.0,
        max_frame_bytes: int = 2 * 1024 * 1024,
        on_event: Optional[Callable[[str, Dict[str, Any]], None]] = None,
        random: Callable[[], float] = _random.random,
    ) -> None:
        self.urls: List[str] = [url] if isinstance(url, str) else list(url)
        if not self.urls:
            raise ValueError("Subscriber needs at least one URL")
        self.get_token = get_token
        self.initial_delay, self.max_delay, self.factor = initial_delay, max_delay, factor
        self.restart_delay, self.connect_timeout, self.stable = restart_delay, connect_timeout, stable
        self.max_frame_bytes = max_frame_bytes
        self.on_event = on_event
        self.random = random
        self.state = "idle"
        self.subs: Dict[str, Subscription] = {}
        self._ws: Any = None
        self._ready = False
        self._task: Optional["asyncio.Task[None]"] = None
        self._attempt = 0
        self._url_index = 0
        self._closed = False

    async def __aenter__(self) -> "Subscriber":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def subscribe(self, topic: str, since: Optional[str] = None) -> Subscription:
        """Follows ``topic`` (after ``since`` when given); starts the connection if needed."""
        if self._closed:
            raise ClarionError("subscriber is closed")
        sub = self.subs.get(topic)
        if sub is None:
            sub = self.subs[topic] = Subscription(self, topic, since)
            if self._ready:
                asyncio.ensure_future(self._send_subscribe(sub))
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        return sub

    async def close(self) -> None:
        """Ends the connection and every iterator (they stop). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.state = "closed"
        for sub in self.subs.values():
            sub._queue.put_nowait(_END)
        task = self._task
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

    # ---- the connection loop

    def _emit(self, name: str, **detail: Any) -> None:
        if name in ("connecting", "connected", "disconnected", "reconnecting"):
            self.state = name
        if self.on_event is not None:
            try:
                self.on_event(name, detail)
            except Exception:  # an app callback must not break the client
                pass

    async def _token(self) -> Optional[str]:
        if self.get_token is None:
            return None
        value = self.get_token()
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = await value
        return str(value)

    async def _run(self) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed

        loop = asyncio.get_running_loop()
        while not self._closed:
            url = self.urls[self._url_index]
            self._emit("connecting", attempt=self._attempt, url=url)
            opened = 0.0
            was_up = False
            code = 0
            reason = "connect"
            try:
                token = await self._token()
                async with connect(
                    url,
                    subprotocols=["clarion.v1"],  # type: ignore[list-item]
                    open_timeout=self.connect_timeout,
                    max_size=self.max_frame_bytes,
                    close_timeout=2,
                ) as ws:
                    opened = loop.time()
                    self._ws = ws
                    if token is not None:
                        await ws.send(json.dumps({"type": "auth", "token": token}))
                    else:
                        await self._on_ready()
                    was_up = True
                    async for frame in ws:
                        if isinstance(frame, bytes):
                            raise _Drop("protocol", "the server sent a binary frame")
                        await self._on_frame(frame)
                    code = ws.close_code or 1006
                    reason = "closed"
            except asyncio.CancelledError:
                raise
            except _Drop as drop:
                reason = drop.kind
                if not drop.quiet:
                    self._emit("error", kind=drop.kind, message=str(drop))
            except ConnectionClosed as e:
                code = e.rcvd.code if e.rcvd is not None else 1006
                reason = "closed"
                if e.rcvd is None and e.sent is not None and e.sent.code == 1009:
                    self._emit("error", kind="protocol", message="frame over max_frame_bytes")
            except Exception as e:  # refused, reset, timeout, invalid handshake, getToken
                self._emit("error", kind="connect", message=f"{type(e).__name__}: {e}")
            finally:
                self._ws = None
                self._ready = False
            if self._closed:
                return
            if code and code not in _KNOWN_CLOSES:
                self._emit("error", kind="close", message=f"unexpected close code {code}")
            self._emit("disconnected", reason=reason, code=code)
            if opened and loop.time() - opened >= self.stable:
                self._attempt = 0
            if not (was_up and self._ready_seen):
                self._url_index = (self._url_index + 1) % len(self.urls)
            self._ready_seen = False
            if code in (_AWAY, _RESTART, _TRY_AGAIN) and self._attempt == 0:
                delay = self.random() * self.restart_delay
            else:
                delay = self.random() * min(self.max_delay, self.initial_delay * self.factor**self._attempt)
            self._attempt += 1
            self._emit("reconnecting", delay=delay, attempt=self._attempt)
            await asyncio.sleep(delay)

    _ready_seen = False

    async def _on_ready(self) -> None:
        self._ready = True
        self._ready_seen = True
        self._emit("connected", url=self.urls[self._url_index])
        for sub in list(self.subs.values()):
            await self._send_subscribe(sub)

    async def _send_subscribe(self, sub: Subscription) -> None:
        ws = self._ws
        if ws is None or not self._ready:
            return
        msg: Dict[str, str] = {"type": "subscribe", "topic": sub.topic}
        if sub.last_id:
            msg["since"] = sub.last_id
        elif sub._ever:
            sub._queue.put_nowait(Gap(sub.topic, None, "unpositioned"))
        sub._ever = True
        sub.state = "pending"
        try:
            await ws.send(json.dumps(msg))
        except Exception:
            pass  # the connection is going away; the next one subscribes again

    async def _unsubscribe(self, sub: Subscription) -> None:
        if self.subs.get(sub.topic) is not sub:
            return
        del self.subs[sub.topic]
        sub.state = "closed"
        sub._queue.put_nowait(_END)
        if self._ws is not None and self._ready:
            try:
                await self._ws.send(json.dumps({"type": "unsubscribe", "topic": sub.topic}))
            except Exception:
                pass

    async def _on_frame(self, text: str) -> None:
        try:
            m = json.loads(text)
        except ValueError:
            raise _Drop("protocol", "the server sent something that is not JSON") from None
        if not isinstance(m, dict) or not isinstance(m.get("type"), str):
            raise _Drop("protocol", "the server sent JSON without a type")
        kind = m["type"]
        # Presence (join/leave) and other new message types get their branch here; a type not
        # handled below is a protocol error.
        if kind == "message":
            sub = self.subs.get(m.get("topic", ""))
            mid = m.get("id")
            if sub is None or not isinstance(mid, str):
                return
            if sub.last_id and _not_after(mid, sub.last_id):
                return  # a repeat (never expected): delivered once already
            sub.last_id = mid
            data: Union[str, bytes] = m.get("data", "")
            if m.get("encoding") == "base64":
                data = base64.b64decode(data)
            sub._queue.put_nowait(Delivery(sub.topic, mid, data, m.get("event")))
        elif kind == "gap":
            sub = self.subs.get(m.get("topic", ""))
            if sub is not None:
                sub._queue.put_nowait(Gap(sub.topic, m.get("since"), str(m.get("reason"))))
        elif kind == "subscribed":
            sub = self.subs.get(m.get("topic", ""))
            if sub is not None:
                sub.state = "subscribed"
        elif kind == "unsubscribed":
            pass
        elif kind == "authenticated":
            if not self._ready:
                await self._on_ready()
        elif kind == "expiring":
            if self.get_token is not None:
                asyncio.ensure_future(self._refresh(self._ws))
        elif kind == "error":
            await self._on_error(m)
        else:
            raise _Drop("protocol", f"unknown message type {kind[:64]!r}")

    async def _refresh(self, ws: Any) -> None:
        try:
            token = await self._token()
            if ws is self._ws:
                await ws.send(json.dumps({"type": "refresh", "token": token}))
        except Exception as e:
            self._emit("error", kind="token", message=f"refresh failed: {e}")

    async def _on_error(self, m: Dict[str, Any]) -> None:
        text = str(m.get("error", ""))
        sub = self.subs.get(m.get("topic") or "")
        if sub is None:
            if not self._ready or "token" in text:
                raise _Drop("unauthorized", text)
            self._emit("error", kind="server", message=text)
            return
        if any(k in text for k in ("grant", "token", "invalid topic", "max_subscriptions", "more than")):
            # Refused for good (403 and friends): that subscription fails, the others go on.
            sub.state = "failed"
            del self.subs[sub.topic]
            sub._queue.put_nowait(SubscriptionRefused(sub.topic, text))
            self._emit("error", kind="subscription", message=text, topic=sub.topic)
        else:
            raise _Drop("server", text)


class SyncSubscriber:
    """:class:`Subscriber` for code without an event loop: ``for item in client.subscribe(t)``.

    The connection runs on an event loop in a daemon thread; :meth:`close` stops it."""

    def __init__(self, url: Union[str, Sequence[str]], **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="clarion-subscriber", daemon=True)
        self._thread.start()

        async def make() -> Subscriber:
            return Subscriber(url, **options)

        self.client: Subscriber = asyncio.run_coroutine_threadsafe(make(), self._loop).result()

    def __enter__(self) -> "SyncSubscriber":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def state(self) -> str:
        return self.client.state

    def subscribe(self, topic: str, since: Optional[str] = None, timeout: Optional[float] = None) -> Iterator[Union[Delivery, Gap]]:
        """Yields the topic's items; with ``timeout``, raises ``TimeoutError`` when none comes."""

        async def make() -> Subscription:
            return self.client.subscribe(topic, since)

        sub = asyncio.run_coroutine_threadsafe(make(), self._loop).result()

        def items() -> Iterator[Union[Delivery, Gap]]:
            while True:
                future = asyncio.run_coroutine_threadsafe(sub.__anext__(), self._loop)
                try:
                    yield future.result(timeout)
                except StopAsyncIteration:
                    return
                except BaseException:
                    future.cancel()
                    raise

        return items()

    def close(self) -> None:
        if not self._loop.is_running():
            return
        asyncio.run_coroutine_threadsafe(self.client.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


__all__ = ["Delivery", "Gap", "Subscriber", "Subscription", "SubscriptionRefused", "SyncSubscriber"]
