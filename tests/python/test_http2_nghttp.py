"""HTTP/2 against nghttp2's own client (`nghttp`, Debian's nghttp2-client): an SSE stream and a
long-poll over h2c (prior knowledge) and over TLS (ALPN h2), with the frames it reports.
"""

import shutil
import time

import pytest

from h2client import in_background

NGHTTP = shutil.which("nghttp")


def nghttp(url, seconds):
    """Runs `nghttp -v URL` in the background, its request cut after `seconds` (nghttp's own
    timeout, so it exits and flushes what it printed); returns a function giving its output."""
    done = in_background([NGHTTP, "-v", "-t", f"{seconds}s", url], timeout=seconds + 10)

    def result():
        p = done()
        return p.stdout if p else ""

    return result


@pytest.mark.parametrize("tls", [False, True], ids=["h2c", "tls"])
def test_nghttp_streams_an_event_stream_and_a_long_poll(start_server, cert, tls):
    assert NGHTTP, "nghttp missing: apt-get install nghttp2-client"
    server = start_server(
        "--tls-listen", "127.0.0.1:0", "--tls-cert", cert / "cert.pem", "--tls-key", cert / "key.pem"
    )
    base = f"https://localhost:{server.tls.rsplit(':', 1)[1]}" if tls else f"http://{server.clients}"
    sse = nghttp(f"{base}/sse?topic=ng", 4)
    poll = nghttp(f"{base}/poll?topic=ng&timeout=3", 4)
    deadline = time.time() + 5
    while server.metrics().get("clarion_subscriptions", 0) < 2:
        assert time.time() < deadline, "both streams to subscribe"
        time.sleep(0.05)
    assert server.publish("ng", "over nghttp")["subscribers"] == 2
    out = sse()
    assert ":status: 200" in out
    assert "content-type: text/event-stream" in out
    assert "data: over nghttp" in out
    out = poll()
    assert ":status: 200" in out
    assert '"data":"over nghttp"' in out
    # The long-poll's answer ends its stream.
    assert "END_STREAM" in out.split(":status: 200", 1)[1]
    if tls:
        assert "The negotiated protocol: h2" in out
