"""The Clarion subscriber: ``async for item in client.subscribe("topic")``, resumed exactly.

One ``clarion.v1`` WebSocket (the ``websockets`` library) carries every subscription of a
:class:`Subscriber`. The client keeps the last id of every topic and resubscribes with it after
each reconnect, on whichever node answers; the iterator yields :class:`Delivery` items and, when
the server cannot replay everything, :class:`Gap` items that say what was lost. Reconnects wait
an exponential backoff with full jitter; tokens come from ``get_token`` before every connection
and on the server's ``expiring`` warning. Nothing the server sends and nothing a callback raises
escapes into the app except a subscription refused for good (:class:`SubscriptionRefused`).
:class:`SyncSubscriber` is the same for code without an event loop. With ``presence=True``
a subscription also keeps the topic's members (:attr:`Subscription.members`) and yields
:class:`Presence` lists and :class:`Join` / :class:`Leave` items; :meth:`Subscriber.presence`
asks for one page of members. docs/clients.md has the states, what the client does after each
server answer, and presence across reconnects.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random as _random
import threading
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Awaitable, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import ClarionError
from .fossil import DeltaError, apply as apply_delta
from .streams import MISSING, StreamFold, StreamText

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
    #: The publication's filter tags (docs/filters.md), empty when it has none.
    tags: Optional[Dict[str, str]] = None


@dataclass(frozen=True)
class Gap:
    """Messages of ``topic`` after ``since`` that will never arrive: ``trimmed`` (history no
    longer holds them), ``epoch`` (``since`` is from another server run), ``unpositioned``
    (nothing had arrived before the connection dropped, so there was no id to resume from)."""

    topic: str
    since: Optional[str]
    reason: str


@dataclass(frozen=True)
class Member:
    """A member of a presence topic: one per identity (the token's ``sub``), however many
    connections it has; ``info`` is the token's ``clarion.info`` object when it has one."""

    sub: str
    info: Optional[Dict[str, Any]] = field(default=None, hash=False)


@dataclass(frozen=True)
class Presence:
    """A member list of ``topic``, sorted by ``sub``.

    Yielded by a presence subscription when a complete list arrived (after subscribing, and
    again after every reconnect; every page already assembled, so ``more`` is ``False``), and
    returned by :meth:`Subscriber.presence` as one page: ``more`` says that members follow after
    ``next``. ``count`` is the members (identities), ``connections`` every connection on the
    topic, anonymous ones included (counted, never listed)."""

    topic: str
    count: int
    connections: int
    members: Tuple[Member, ...]
    more: bool = False
    next: Optional[str] = None


@dataclass(frozen=True)
class Join:
    """``member`` joined ``topic`` (live, or found in a fresh list after a reconnect)."""

    topic: str
    member: Member


@dataclass(frozen=True)
class Leave:
    """``member`` left ``topic`` (live, or missing from a fresh list after a reconnect)."""

    topic: str
    member: Member


Item = Union[Delivery, Gap, Presence, Join, Leave]


class PresenceError(ClarionError):
    """A member query failed. ``kind``: ``"server"`` (the server's error reply: not a presence
    topic, the token does not grant it, ``presence_max_topics``, presence not configured) or
    ``"disconnected"`` (no connection, or it ended before the answer)."""

    def __init__(self, kind: str, topic: str, reason: str) -> None:
        super().__init__(f"{topic}: {reason}")
        self.kind = kind
        self.topic = topic
        self.reason = reason


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


def _member(value: Any) -> Optional[Member]:
    if not isinstance(value, dict) or not isinstance(value.get("sub"), str):
        return None
    info = value.get("info")
    return Member(value["sub"], info if isinstance(info, dict) else None)


def _page(m: Dict[str, Any]) -> Presence:
    members = tuple(x for x in map(_member, m.get("members") or ()) if x is not None)
    nxt = m.get("next")
    return Presence(
        str(m.get("topic", "")),
        int(m.get("count") or 0),
        int(m.get("connections") or 0),
        members,
        bool(m.get("more")),
        nxt if isinstance(nxt, str) else None,
    )


class Subscription:
    """One followed topic: an async iterator of :class:`Delivery` and :class:`Gap` items, and
    with ``presence=True`` of :class:`Presence`, :class:`Join` and :class:`Leave` items."""

    def __init__(
        self,
        client: "Subscriber",
        topic: str,
        since: Optional[str],
        presence: bool = False,
        filter: Any = None,
        delta: bool = False,
    ) -> None:
        self.client = client
        self.topic = topic
        #: Only messages whose tags pass it (docs/filters.md): text, or the JSON form as a dict.
        self.filter = filter
        self.last_id = since
        # A ``conflated`` notice came: the next message replaced older ones of its key and may
        # be newer than messages still to come, so it does not move last_id (docs/conflation.md).
        self._conflated = False
        self.state = "pending"
        self.presence = presence
        #: Messages come as deltas of the previous one where the server can (docs/delta.md).
        self.delta = delta
        #: Deltas that did not apply (each answered by a resubscription from ``last_id``).
        self.delta_failures = 0
        # The last message's bytes (what the next delta applies to), and whether a
        # resubscription after a delta that did not apply is under way.
        self._base: Optional[bytes] = None
        self._resyncing = False
        # Appendable messages' text so far (yielded as StreamText items).
        self._streams = StreamFold()
        #: ``count`` and ``connections`` of the last complete list (join/leave do not move them).
        self.count = 0
        self.connections = 0
        self._members: Dict[str, Optional[Dict[str, Any]]] = {}
        self._pages: Optional[Dict[str, Optional[Dict[str, Any]]]] = None
        self._listed = False
        self._queue: "asyncio.Queue[Any]" = asyncio.Queue()
        self._ever = False

    @property
    def members(self) -> Mapping[str, Optional[Dict[str, Any]]]:
        """The current members, ``sub`` -> ``info`` (read-only, live): replaced by every complete
        list, changed by every join and leave. Empty until the first list. It is up to date
        with the items the client has received, which may be ahead of the items the app has
        taken from the iterator."""
        return MappingProxyType(self._members)

    def _list(self, m: Dict[str, Any]) -> Optional[str]:
        """Takes a list (or one page of it); returns the ``after`` of the page still to ask."""
        page = _page(m)
        members = self._pages if self._pages is not None else {}
        for x in page.members:
            members[x.sub] = x.info
        self.count, self.connections = page.count, page.connections
        if page.more and page.next is not None:
            self._pages = members
            return page.next
        self._pages = None
        old, again = self._members, self._listed
        self._members, self._listed = members, True
        if again:
            # A fresh list (after a reconnect) is the truth: say what changed meanwhile.
            for sub, info in old.items():
                if sub not in members:
                    self._queue.put_nowait(Leave(self.topic, Member(sub, info)))
            for sub, info in members.items():
                if sub not in old:
                    self._queue.put_nowait(Join(self.topic, Member(sub, info)))
        listed = tuple(Member(sub, info) for sub, info in sorted(members.items()))
        self._queue.put_nowait(Presence(self.topic, self.count, self.connections, listed))
        return None

    def _change(self, kind: str, value: Any) -> None:
        member = _member(value)
        if member is None:
            return
        target = self._pages if self._pages is not None else self._members
        if kind == "join":
            target[member.sub] = member.info
        else:
            target.pop(member.sub, None)
        # While pages are assembled the change is part of the list the app will get.
        if self._pages is None:
            self._queue.put_nowait((Join if kind == "join" else Leave)(self.topic, member))

    def __aiter__(self) -> "Subscription":
        return self

    async def __anext__(self) -> Item:
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
        restart_delay: the first wait after a close saying the server is going away or busy
            (1001, 1013), which every client of that server gets at once: a random wait in
            ``[0, restart_delay)`` spreads their reconnections over the other nodes.
        reload_delay: the first wait after 1012 (the server is restarting: an upgrade or a
            reload whose new process is already listening and holds the history). A random
            wait in ``[0, reload_delay)``: the resume must land while the server's history
            still holds what was published meanwhile (the default 100 messages per topic last
            5 s at 20 messages a second), so it is short.
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
        reload_delay: float = 1.0,
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
        self.reload_delay = reload_delay
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
        # Per topic, the answers the current connection still owes, in the order the requests
        # went out (the server answers in that order): "S" (subscribed or an error), "P" (a
        # list for the subscription) and the futures of presence() queries.
        self._expect: Dict[str, List[Any]] = {}

    async def __aenter__(self) -> "Subscriber":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def subscribe(
        self,
        topic: str,
        since: Optional[str] = None,
        *,
        presence: bool = False,
        filter: Any = None,
        delta: bool = False,
    ) -> Subscription:
        """Follows ``topic`` (after ``since`` when given); starts the connection if needed.

        With ``filter`` (text such as ``'sym in ["A", "B"]'``, or the JSON form as a dict), only
        messages whose tags pass it arrive, resumes included (docs/filters.md); a filter the
        server refuses ends the subscription with :class:`SubscriptionRefused`.

        With ``presence``, the subscription keeps the topic's members (a ``presence_topics``
        topic; another one is refused with :class:`SubscriptionRefused`). Asking for presence on
        a topic already followed adds it.

        With ``delta``, the server sends each message as a delta of the one before where it can
        (a ``delta_topics`` topic; another one is refused with :class:`SubscriptionRefused`);
        the client applies it and yields the whole message. A delta that does not apply (for
        another message, or a checksum mismatch) is never yielded: the client resubscribes
        from the last message it yielded and gets full messages from there."""
        if self._closed:
            raise ClarionError("subscriber is closed")
        sub = self.subs.get(topic)
        if sub is None:
            sub = self.subs[topic] = Subscription(self, topic, since, presence, filter, delta)
            if self._ready:
                asyncio.ensure_future(self._send_subscribe(sub))
        elif presence and not sub.presence:
            sub.presence = True
            if self._ready:
                asyncio.ensure_future(self._send_subscribe(sub))
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        return sub

    async def presence(self, topic: str, after: Optional[str] = None) -> Presence:
        """One page of ``topic``'s members (any topic the token may subscribe to, followed or
        not), sorted by ``sub``; ``after`` is the previous page's ``next``. Raises
        :class:`PresenceError`."""
        if self._ws is None or not self._ready:
            raise PresenceError("disconnected", topic, "not connected")
        future: "asyncio.Future[Presence]" = asyncio.get_running_loop().create_future()
        await self._ask(topic, after, future)
        return await future

    async def _ask(self, topic: str, after: Optional[str], what: Any) -> None:
        self._expect.setdefault(topic, []).append(what)
        msg = {"type": "presence", "topic": topic}
        if after is not None:
            msg["after"] = str(after)
        try:
            await self._ws.send(json.dumps(msg))
        except Exception:
            pass  # the connection is going away: _unanswered() settles what it owed

    def _shift(self, topic: Any, test: Callable[[Any], bool]) -> Any:
        queue = self._expect.get(topic) if isinstance(topic, str) else None
        if not queue or not test(queue[0]):
            return None
        if len(queue) == 1:
            del self._expect[topic]
        return queue.pop(0)

    def _unanswered(self) -> None:
        """Fails the presence() queries the ended connection will never answer."""
        expect, self._expect = self._expect, {}
        for topic, queue in expect.items():
            for what in queue:
                if isinstance(what, asyncio.Future) and not what.done():
                    what.set_exception(PresenceError("disconnected", topic, "the connection ended before the answer"))

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
                self._unanswered()
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
            if code == _RESTART and self._attempt == 0:
                delay = self.random() * self.reload_delay
            elif code in (_AWAY, _TRY_AGAIN) and self._attempt == 0:
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
        msg: Dict[str, Any] = {"type": "subscribe", "topic": sub.topic}
        sub._pages = None
        self._expect.setdefault(sub.topic, []).append("S")
        if sub.presence:
            msg["presence"] = True
            self._expect[sub.topic].append("P")
        if sub.filter is not None:
            msg["filter"] = sub.filter
        if sub.delta:
            msg["delta"] = True
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
        # A type not handled below is a protocol error.
        if kind in ("append", "message") and "stream" in m:
            sub = self.subs.get(m.get("topic", ""))
            if sub is None or not isinstance(m.get("id"), str):
                return
            item = sub._streams.take(m)
            if item == MISSING:
                await self._resync(sub, "fragments of an appendable message are missing", "stream")
                return
            sub.last_id = m["id"]
            if isinstance(item, StreamText):
                sub._queue.put_nowait(item)
        elif kind == "message":
            sub = self.subs.get(m.get("topic", ""))
            mid = m.get("id")
            if sub is None or not isinstance(mid, str):
                return
            if sub.last_id and _not_after(mid, sub.last_id):
                return  # a repeat (never expected): delivered once already
            binary = m.get("encoding") == "base64"
            raw = m.get("data", "")
            try:
                wire = base64.b64decode(raw) if binary else str(raw).encode()
                if "delta" in m:
                    if sub._resyncing:
                        return  # the resubscription's full message is on its way
                    if not sub.delta or sub._base is None or m["delta"] != sub.last_id:
                        raise DeltaError(f"a delta of {m['delta']!r}, the last message is {sub.last_id!r}")
                    body = apply_delta(sub._base, wire, self.max_frame_bytes * 4)
                    data: Union[str, bytes] = body if binary else body.decode()
                else:
                    body, data = wire, (wire if binary else str(raw))
            except (DeltaError, ValueError) as e:
                # Never a corrupted message to the app: full messages again from the last one.
                await self._resync(sub, str(e))
                return
            if sub._conflated:
                sub._conflated = False
            else:
                sub.last_id = mid
            sub._resyncing = False
            if sub.delta:
                sub._base = body
            sub._queue.put_nowait(Delivery(sub.topic, mid, data, m.get("event"), m.get("tags")))
        elif kind == "gap":
            sub = self.subs.get(m.get("topic", ""))
            if sub is not None:
                sub._queue.put_nowait(Gap(sub.topic, m.get("since"), str(m.get("reason"))))
        elif kind == "conflated":
            # The next message replaced older ones of its key: nothing to reload.
            sub = self.subs.get(m.get("topic", ""))
            if sub is not None:
                sub._conflated = True
        elif kind == "presence":
            head = self._shift(m.get("topic"), lambda x: x != "S")
            if isinstance(head, asyncio.Future):
                if not head.done():
                    head.set_result(_page(m))
                return
            sub = self.subs.get(m.get("topic", ""))
            if sub is not None and sub.presence:
                after = sub._list(m)
                if after is not None:
                    # Truncated at presence_max_members: ask for the rest before yielding.
                    await self._ask(sub.topic, after, "P")
        elif kind in ("join", "leave"):
            sub = self.subs.get(m.get("topic", ""))
            if sub is not None and sub.presence:
                sub._change(kind, m.get("member"))
        elif kind == "subscribed":
            self._shift(m.get("topic"), lambda x: x == "S")
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

    async def _resync(self, sub: Subscription, why: str, kind: str = "delta") -> None:
        """A delta did not apply (`kind` "delta"), or fragments of an appendable message are
        missing ("stream"): subscribe again from the last good message (the server then sends
        the rest in full first, a stream's text so far as one message)."""
        if kind == "delta":
            sub.delta_failures += 1
        sub._resyncing = True
        self._emit("error", kind=kind, message=why, topic=sub.topic)
        ws = self._ws
        if ws is None or not self._ready:
            return  # the next connection subscribes from last_id anyway
        try:
            await ws.send(json.dumps({"type": "unsubscribe", "topic": sub.topic}))
        except Exception:
            return
        await self._send_subscribe(sub)

    async def _refresh(self, ws: Any) -> None:
        try:
            token = await self._token()
            if ws is self._ws:
                await ws.send(json.dumps({"type": "refresh", "token": token}))
        except Exception as e:
            self._emit("error", kind="token", message=f"refresh failed: {e}")

    async def _on_error(self, m: Dict[str, Any]) -> None:
        text = str(m.get("error", ""))
        head = self._shift(m.get("topic"), lambda x: True)
        if isinstance(head, asyncio.Future):
            if not head.done():
                head.set_exception(PresenceError("server", str(m.get("topic")), text))
            return
        if head == "S":  # a refused subscribe: no member list follows it
            self._shift(m.get("topic"), lambda x: x == "P")
        sub = self.subs.get(m.get("topic") or "")
        if sub is None:
            if not self._ready or "token" in text:
                raise _Drop("unauthorized", text)
            self._emit("error", kind="server", message=text)
            return
        refusals = ("grant", "token", "invalid topic", "invalid filter", "max_subscriptions", "more than", "presence", "delta")
        if any(k in text for k in refusals):
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

    def subscribe(
        self,
        topic: str,
        since: Optional[str] = None,
        timeout: Optional[float] = None,
        *,
        presence: bool = False,
        filter: Any = None,
        delta: bool = False,
    ) -> Iterator[Item]:
        """Yields the topic's items; with ``timeout``, raises ``TimeoutError`` when none comes.
        ``presence``, ``filter`` and ``delta``: as :meth:`Subscriber.subscribe`
        (``client.subs[topic].members`` is the member map)."""

        async def make() -> Subscription:
            return self.client.subscribe(topic, since, presence=presence, filter=filter, delta=delta)

        sub = asyncio.run_coroutine_threadsafe(make(), self._loop).result()

        def items() -> Iterator[Item]:
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

    def presence(self, topic: str, after: Optional[str] = None, timeout: Optional[float] = 10.0) -> Presence:
        """:meth:`Subscriber.presence`, waiting at most ``timeout`` seconds."""
        future = asyncio.run_coroutine_threadsafe(self.client.presence(topic, after), self._loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    def close(self) -> None:
        if not self._loop.is_running():
            return
        asyncio.run_coroutine_threadsafe(self.client.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


__all__ = [
    "Delivery",
    "Gap",
    "Item",
    "Join",
    "Leave",
    "Member",
    "Presence",
    "PresenceError",
    "Subscriber",
    "Subscription",
    "SubscriptionRefused",
    "SyncSubscriber",
]
