"""The `clarion-client` wheel installed on its own (packaging/test.sh runs this in a fresh
virtualenv holding that wheel only): no server command and no `clarion` package come with it,
and its Subscriber receives what its Client publishes to a real server. The server is the binary
the other packages ship, named by CLARION_TEST_SERVER (it is not part of this install)."""

import asyncio
import importlib.util
import os
import shutil
import signal
import subprocess

import pytest

import clarion_client
from clarion_client import Client, Delivery, NotFound, Subscriber, SyncSubscriber


@pytest.fixture
def server():
    binary = os.environ["CLARION_TEST_SERVER"]
    proc = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        line = proc.stdout.readline().decode()
        assert line.startswith("clarion ready"), line
        fields = dict(part.split("=", 1) for part in line.split()[2:] if "=" in part)
        yield fields["clients"], fields["api"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def test_the_client_wheel_brings_no_server():
    assert shutil.which("clarion") is None
    assert importlib.util.find_spec("clarion") is None
    assert clarion_client.__version__ == os.environ["CLARION_EXPECTED_VERSION"]


def test_the_subscriber_receives_what_the_client_publishes(server):
    clients, api = server

    async def main():
        with Client(f"http://{api}") as pub:
            # Following from the first message's id makes the order of subscribe and publish moot.
            mark = pub.publish("orders", "before")
            async with Subscriber(f"ws://{clients}/ws") as sub:
                items = sub.subscribe("orders", since=mark.id)
                pub.publish("orders", "after")
                return await asyncio.wait_for(items.__anext__(), 10)

    item = asyncio.run(main())
    assert isinstance(item, Delivery) and item.topic == "orders" and item.data == "after"


def test_the_sync_subscriber_and_the_typed_errors(server):
    clients, api = server
    with SyncSubscriber(f"ws://{clients}/ws") as sub, Client(f"http://{api}") as pub:
        mark = pub.publish("news", "before")
        items = sub.subscribe("news", since=mark.id, timeout=10)
        pub.publish("news", b"\x00\x01")
        item = next(iter(items))
        assert isinstance(item, Delivery) and item.data == b"\x00\x01"
    # The client listener is not the API: the answer says so, as its own exception.
    with Client(f"http://{clients}") as wrong, pytest.raises(NotFound):
        wrong.publish("news", "x")
