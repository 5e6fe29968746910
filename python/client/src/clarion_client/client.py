"""Publish clients for the Clarion HTTP API: :class:`Client` (blocking) and :class:`AsyncClient`.

Both keep one ``httpx`` connection pool, so consecutive publishes reuse keep-alive connections
(the API serves one thread per connection; few long-lived connections are what it expects).
``str`` data is published as a text message, ``bytes`` as a binary one.
"""

import asyncio
import base64
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union
from urllib.parse import quote

import httpx

from .errors import (
    APIError,
    BatchPartlyRefused,
    ClarionError,
    ConnectionFailed,
    Timeout,
    TransportError,
    error_for,
)

#: The publish API's default address (``api_listen``).
DEFAULT_BASE_URL = "http://127.0.0.1:8081"
#: Seconds allowed for each of connecting, sending and waiting for an answer.
DEFAULT_TIMEOUT = 10.0
#: Seconds, in all, for which a publish answered ``503`` with ``Retry-After`` is sent again: an
#: upgrade's freeze lasts well under a second, a Redis failover a few seconds.
DEFAULT_RETRY_FOR = 10.0

Data = Union[str, bytes]
TimeoutTypes = Union[float, httpx.Timeout, None]
TokenSource = Union[str, Callable[[], str]]


@dataclass(frozen=True)
class Receipt:
    """What the server answered for one published message.

    Attributes:
        topic: the topic it was published to.
        id: its id (``EPOCH-SEQ``); subscribers can resume after it with ``since=ID``.
        subscribers: how many subscribers it was handed to at publish time.
        repeat: the publish repeated an ``Idempotency-Key`` the server had seen within its
            ``idempotency_window``: nothing was delivered, and ``id`` is the first publish's.
        stream: for a fragment of an appendable message (a batch item with ``"stream":
            "open"`` or ``"append_to"``), the stream's id, which later fragments append to;
            ``None`` for a message.
        seq: for a fragment, its place in its stream (1 for the opening one).
        done: for a fragment, whether it closed its stream.
    """

    topic: str
    id: str
    subscribers: int
    repeat: bool = False
    stream: Optional[str] = None
    seq: Optional[int] = None
    done: Optional[bool] = None


@dataclass(frozen=True)
class Message:
    """One message of a batch (:meth:`Client.publish_batch`)."""

    topic: str
    data: Data
    event: Optional[str] = None


BatchItem = Union[Message, Tuple[str, Data], Tuple[str, Data, Optional[str]], Mapping[str, Any]]


def _receipt(value: Any) -> Receipt:
    try:
        stream = value.get("stream")
        return Receipt(
            topic=str(value["topic"]),
            id=str(value["id"]),
            subscribers=int(value["subscribers"]),
            repeat=value.get("repeat") is True,
            stream=None if stream is None else str(stream),
            seq=None if stream is None else int(value["seq"]),
            done=None if stream is None else value.get("done") is True,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ClarionError(f"unexpected answer from the server: {value!r}") from e


def _message(item: BatchItem) -> Dict[str, Any]:
    """One batch item as the server reads it. A dict is sent with all its fields (``key``,
    ``tags``, ``conflation_key``, and a fragment's ``stream``, ``append_to`` and ``done`` too):
    the server answers a field it does not know with an error in the item's place."""
    if isinstance(item, Message):
        fields: Dict[str, Any] = {"topic": item.topic, "data": item.data, "event": item.event}
    elif isinstance(item, tuple):
        topic, payload, *event = item
        fields = {"topic": topic, "data": payload, "event": event[0] if event else None}
    elif isinstance(item, Mapping):
        fields = dict(item)
    else:
        kind = type(item).__name__
        raise TypeError(f"a batch item is a Message, a (topic, data[, event]) tuple or a dict, not {kind}")
    if fields.get("event", 0) is None:
        del fields["event"]
    data = fields.get("data")
    if isinstance(data, bytes):
        fields["data"] = base64.b64encode(data).decode("ascii")
        fields["encoding"] = "base64"
    elif not isinstance(data, str):
        raise TypeError(f"message data is str or bytes, not {type(data).__name__}")
    return fields


def _batch_body(messages: Iterable[BatchItem]) -> Tuple[bytes, int]:
    out = [_message(item) for item in messages]
    return json.dumps({"messages": out}).encode(), len(out)


def _single(
    topic: str, data: Data, event: Optional[str], idempotency_key: Optional[str]
) -> Tuple[str, Dict[str, str], bytes, Dict[str, str]]:
    if isinstance(data, bytes):
        content_type, body = "application/octet-stream", data
    elif isinstance(data, str):
        content_type, body = "text/plain; charset=utf-8", data.encode()
    else:
        raise TypeError(f"message data is str or bytes, not {type(data).__name__}")
    # Topic characters the server accepts need no escaping; anything else is escaped so that the
    # server sees (and refuses with 400) the name as given rather than a different path.
    path = "/publish/" + quote(topic, safe="_.:@/-")
    params = {"event": event} if event is not None else {}
    # A key on every publish, the same on each retry: a retry of a publish the server took but
    # could not answer (a 503 after the broker took it, a node lost) is not delivered twice.
    key = idempotency_key if idempotency_key is not None else uuid.uuid4().hex
    return path, params, body, {"Content-Type": content_type, "Idempotency-Key": key}


def _retry_wait(response: httpx.Response, deadline: float, now: float) -> Optional[float]:
    """Seconds to wait before sending a publish again: a ``503`` with ``Retry-After`` (whole
    seconds, as Clarion sends) published nothing; ``None`` for any other answer, or when the
    wait would pass ``deadline``."""
    if response.status_code != 503:
        return None
    value = response.headers.get("retry-after", "").strip()
    if not value.isdigit() or len(value) > 6:
        return None
    wait = float(value)
    return wait if now + wait <= deadline else None


def _check(response: httpx.Response) -> httpx.Response:
    if response.status_code == 200:
        return response
    body = response.content
    message = body.decode("utf-8", "replace").strip()
    try:
        parsed = json.loads(body)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
            message = parsed["error"]
    except ValueError:
        pass
    raise error_for(response.status_code, message or response.reason_phrase, body)


def _json(response: httpx.Response) -> Any:
    try:
        value = response.json()
    except ValueError as e:
        raise ClarionError(f"the server's answer is not JSON: {response.text[:200]!r}") from e
    if not isinstance(value, dict):
        raise ClarionError(f"unexpected answer from the server: {value!r}")
    return value


def _receipts(answer: Dict[str, Any]) -> List[Receipt]:
    results = answer.get("results")
    if not isinstance(results, list):
        raise ClarionError(f"unexpected answer from the server: {answer!r}")
    out: List[Union[Receipt, Dict[str, Any]]] = [
        r if isinstance(r, dict) and "error" in r else _receipt(r) for r in results
    ]
    receipts = [r for r in out if isinstance(r, Receipt)]
    if len(receipts) < len(out):
        raise BatchPartlyRefused(out)
    return receipts


def _transport_error(e: httpx.TransportError) -> TransportError:
    if isinstance(e, httpx.TimeoutException):
        return Timeout(f"timed out: {e}")
    return ConnectionFailed(f"cannot reach the Clarion API: {e}")


def _fragment(
    topic: str, text: str, params: Dict[str, str], idempotency_key: Optional[str]
) -> Tuple[str, Dict[str, str], bytes, Dict[str, str]]:
    """The request of one fragment of an appendable message (text only)."""
    if not isinstance(text, str):
        raise TypeError(f"a stream's fragments are str, not {type(text).__name__}")
    path, _, body, headers = _single(topic, text, None, idempotency_key)
    return path, params, body, headers


def _stream_params(stream_id: str, done: bool) -> Dict[str, str]:
    return {"append_to": stream_id, "done": "1"} if done else {"append_to": stream_id}


class _Writing:
    """What both stream writers know of their stream."""

    def __init__(self, opened: Receipt) -> None:
        self.topic = opened.topic
        self.id = opened.stream or opened.id
        self.seq = opened.seq or 1
        self.done = False

    def _took(self, r: Receipt) -> Receipt:
        self.seq, self.done = r.seq or self.seq, bool(r.done)
        return r


class StreamWriter(_Writing):
    """An appendable message being written (:meth:`Client.open_stream`): an AI answer sent
    token by token. Subscribers get each fragment live as an ``append``, and one that
    reconnects gets the text so far as one message, then the rest.

    Attributes:
        topic: its topic.
        id: the stream's id (the opening fragment's), which subscribers see as ``stream``.
        seq: fragments written so far.
        done: whether it was closed.

    Use it as a context manager to close it however the block ends::

        with client.open_stream("chat.42") as answer:
            for token in tokens:
                answer.append(token)
    """

    def __init__(self, client: "Client", opened: Receipt) -> None:
        super().__init__(opened)
        self._client = client

    def append(self, text: str, *, done: bool = False, idempotency_key: Optional[str] = None) -> Receipt:
        """Appends ``text`` (``done=True``: and closes the stream); returns its receipt. Each
        call carries an ``Idempotency-Key`` (random unless given) that the client's own retries
        reuse, so a retried append is never added twice."""
        request = _fragment(self.topic, text, _stream_params(self.id, done), idempotency_key)
        return self._took(_receipt(_json(self._client._post(*request))))

    def close(self, text: str = "") -> Receipt:
        """Closes the stream, with ``text`` as its last fragment (may be empty)."""
        return self.append(text, done=True)

    def __enter__(self) -> "StreamWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.done:
            self.close()


class AsyncStreamWriter(_Writing):
    """:class:`StreamWriter` for :class:`AsyncClient` (``await``, ``async with``)."""

    def __init__(self, client: "AsyncClient", opened: Receipt) -> None:
        super().__init__(opened)
        self._client = client

    async def append(self, text: str, *, done: bool = False, idempotency_key: Optional[str] = None) -> Receipt:
        """Appends ``text``; see :meth:`StreamWriter.append`."""
        request = _fragment(self.topic, text, _stream_params(self.id, done), idempotency_key)
        return self._took(_receipt(_json(await self._client._post(*request))))

    async def close(self, text: str = "") -> Receipt:
        """Closes the stream; see :meth:`StreamWriter.close`."""
        return await self.append(text, done=True)

    async def __aenter__(self) -> "AsyncStreamWriter":
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.done:
            await self.close()


class _Settings:
    """What both clients share: the base URL, credentials, timeout and retry budget."""

    def __init__(
        self,
        base_url: str,
        api_key: Optional[str],
        token: Optional[TokenSource],
        timeout: TimeoutTypes,
        retry_for: float = DEFAULT_RETRY_FOR,
    ):
        if api_key is not None and token is not None:
            raise ValueError("give either api_key or token, not both")
        self.retry_for = retry_for
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.token = token
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)

    def auth_headers(self) -> Dict[str, str]:
        bearer = self.api_key if self.api_key is not None else self.token
        if callable(bearer):
            bearer = bearer()
        return {"Authorization": f"Bearer {bearer}"} if bearer is not None else {}


class Client:
    """A blocking publish client.

    Args:
        base_url: the API listener, ``http://HOST:PORT`` (``https://`` with ``tls_api``).
        api_key: the server's ``api_key``, sent as ``Authorization: Bearer KEY``.
        token: a bearer token instead (a JWT, for example), or a function returning a fresh one
            for each request (for tokens that expire).
        timeout: seconds for each of connect, write and read (or an ``httpx.Timeout``);
            ``None`` waits forever.
        http_client: an ``httpx.Client`` to use instead of the client's own (for proxies, custom
            CA files, ...); ``timeout`` still applies to each request, and it is not closed by
            :meth:`close`.
        retry_for: seconds, in all, for which a publish answered ``503`` with ``Retry-After``
            (an upgrade in progress, a broker away: nothing was published) is sent again after
            the wait the header asks; ``0`` never retries.

    Use it as a context manager, or call :meth:`close`, to release its connections::

        with clarion.Client(api_key="secret") as c:
            receipt = c.publish("news", "hello")
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        api_key: Optional[str] = None,
        token: Optional[TokenSource] = None,
        timeout: TimeoutTypes = DEFAULT_TIMEOUT,
        http_client: Optional[httpx.Client] = None,
        retry_for: float = DEFAULT_RETRY_FOR,
    ) -> None:
        self._settings = _Settings(base_url, api_key, token, timeout, retry_for)
        self._owned = http_client is None
        self._http = http_client or httpx.Client(timeout=self._settings.timeout)

    def publish(
        self, topic: str, data: Data, event: Optional[str] = None, idempotency_key: Optional[str] = None
    ) -> Receipt:
        """Publishes one message and returns its receipt.

        Args:
            topic: the topic (1 to 128 characters of ``A-Z a-z 0-9 _ . : @ / -``).
            data: ``str`` for a text message, ``bytes`` for a binary one.
            event: the Server-Sent Events event name subscribers over ``/sse`` see.
            idempotency_key: sent as ``Idempotency-Key`` (1 to 128 characters ``!`` to ``~``):
                a publish with a key the topic saw within the server's ``idempotency_window``
                is not delivered again and answers the first id (``Receipt.repeat``). Give your
                own to make your retries (to another node, after a crash) safe; by default each
                call gets a random one, which the client's own ``503`` retries reuse.

        Raises:
            APIError: a subclass per status (:class:`BadRequest`, :class:`Unauthorized`, ...).
            TransportError: :class:`Timeout` or :class:`ConnectionFailed`.
        """
        path, params, body, headers = _single(topic, data, event, idempotency_key)
        return _receipt(_json(self._post(path, params, body, headers)))

    def publish_batch(self, messages: Iterable[BatchItem]) -> List[Receipt]:
        """Publishes several messages in one request, in order and atomically with respect to
        other publishes. The server answers each message: when it refuses some (invalid, or a
        topic the token does not allow), it still publishes the other topics' messages (a
        topic's messages go all or none), and this raises :class:`BatchPartlyRefused` with every
        result; :class:`BadRequest` when the body was not a batch.

        Items are :class:`Message`\\ s, ``(topic, data)`` or ``(topic, data, event)`` tuples, or
        dicts with ``topic``, ``data`` and any other field of the server's batch items
        (``event``, ``key``, ``tags``, ``conflation_key``; for a fragment of an appendable
        message ``"stream": "open"``, or ``"append_to": STREAM`` and ``"done": True``). Returns
        one receipt per item (a fragment's has its ``stream``, ``seq`` and ``done``).
        """
        body, _ = _batch_body(messages)
        answer = _json(self._post("/publish", {}, body, {"Content-Type": "application/json"}))
        return _receipts(answer)

    def open_stream(self, topic: str, text: str = "", *, idempotency_key: Optional[str] = None) -> StreamWriter:
        """Opens an appendable message on ``topic`` with ``text`` as its first fragment (may be
        empty) and returns its writer (:class:`StreamWriter`): ``append`` the rest, then
        ``close``. See docs/protocol.md, "Appendable messages", for limits and refusals."""
        request = _fragment(topic, text, {"stream": "open"}, idempotency_key)
        return StreamWriter(self, _receipt(_json(self._post(*request))))

    def healthy(self) -> bool:
        """Whether ``GET /healthz`` answers ``200`` (``False`` while the server is stopping).

        Raises:
            TransportError: the server cannot be reached.
        """
        try:
            r = self._http.get(self._settings.base_url + "/healthz", timeout=self._settings.timeout)
        except httpx.TransportError as e:
            raise _transport_error(e) from e
        return r.status_code == 200

    def close(self) -> None:
        """Closes the client's connections (not those of an ``http_client`` given to it)."""
        if self._owned:
            self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _post(self, path: str, params: Dict[str, str], body: bytes, headers: Dict[str, str]) -> httpx.Response:
        deadline = time.monotonic() + self._settings.retry_for
        while True:
            headers.update(self._settings.auth_headers())
            try:
                response = self._http.post(
                    self._settings.base_url + path,
                    params=params,
                    content=body,
                    headers=headers,
                    timeout=self._settings.timeout,
                )
            except httpx.TransportError as e:
                raise _transport_error(e) from e
            wait = _retry_wait(response, deadline, time.monotonic())
            if wait is None:
                return _check(response)
            time.sleep(wait)


class AsyncClient:
    """The same client for ``asyncio`` (and trio, through ``httpx``): every method is awaited.

    Takes the same arguments as :class:`Client` (``http_client`` is an ``httpx.AsyncClient``)::

        async with clarion.AsyncClient() as c:
            receipt = await c.publish("news", "hello")
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        api_key: Optional[str] = None,
        token: Optional[TokenSource] = None,
        timeout: TimeoutTypes = DEFAULT_TIMEOUT,
        http_client: Optional[httpx.AsyncClient] = None,
        retry_for: float = DEFAULT_RETRY_FOR,
    ) -> None:
        self._settings = _Settings(base_url, api_key, token, timeout, retry_for)
        self._owned = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=self._settings.timeout)

    async def publish(
        self, topic: str, data: Data, event: Optional[str] = None, idempotency_key: Optional[str] = None
    ) -> Receipt:
        """Publishes one message; see :meth:`Client.publish`."""
        path, params, body, headers = _single(topic, data, event, idempotency_key)
        return _receipt(_json(await self._post(path, params, body, headers)))

    async def publish_batch(self, messages: Iterable[BatchItem]) -> List[Receipt]:
        """Publishes several messages in one request; see :meth:`Client.publish_batch`."""
        body, _ = _batch_body(messages)
        answer = _json(await self._post("/publish", {}, body, {"Content-Type": "application/json"}))
        return _receipts(answer)

    async def open_stream(
        self, topic: str, text: str = "", *, idempotency_key: Optional[str] = None
    ) -> AsyncStreamWriter:
        """Opens an appendable message; see :meth:`Client.open_stream`."""
        request = _fragment(topic, text, {"stream": "open"}, idempotency_key)
        return AsyncStreamWriter(self, _receipt(_json(await self._post(*request))))

    async def healthy(self) -> bool:
        """Whether ``GET /healthz`` answers ``200``; see :meth:`Client.healthy`."""
        try:
            r = await self._http.get(self._settings.base_url + "/healthz", timeout=self._settings.timeout)
        except httpx.TransportError as e:
            raise _transport_error(e) from e
        return r.status_code == 200

    async def aclose(self) -> None:
        """Closes the client's connections (not those of an ``http_client`` given to it)."""
        if self._owned:
            await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _post(self, path: str, params: Dict[str, str], body: bytes, headers: Dict[str, str]) -> httpx.Response:
        deadline = time.monotonic() + self._settings.retry_for
        while True:
            headers.update(self._settings.auth_headers())
            try:
                response = await self._http.post(
                    self._settings.base_url + path,
                    params=params,
                    content=body,
                    headers=headers,
                    timeout=self._settings.timeout,
                )
            except httpx.TransportError as e:
                raise _transport_error(e) from e
            wait = _retry_wait(response, deadline, time.monotonic())
            if wait is None:
                return _check(response)
            await asyncio.sleep(wait)


__all__ = ["APIError", "AsyncClient", "AsyncStreamWriter", "Client", "Message", "Receipt", "StreamWriter"]
