"""GRIP proxy mode over HTTP/2: a client on an h2c connection is forwarded to an ordinary
HTTP/1.1 backend like any other, and the backend's answers come back as streams: a plain answer,
a held stream (`Grip-Hold: stream`) that gets what is published to its channel, and a held
response (`Grip-Hold: response`) answered by a publish.
"""

import http.server
import json
import threading
import time

from h2client import in_background


class Backend(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/held-stream"):
            self._answer(b"start\n", {"Grip-Hold": "stream", "Grip-Channel": "h2grip"})
        elif self.path.startswith("/held-response"):
            self._answer(b"timeout\n", {"Grip-Hold": "response", "Grip-Channel": "h2grip"})
        else:
            self._answer(b"plain backend answer\n", {})

    def _answer(self, body, headers):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def curl_h2(url, seconds):
    """`curl --http2-prior-knowledge` in the background; a function giving (stdout, stderr)."""
    done = in_background(["curl", "-sSN", "-v", "--http2-prior-knowledge", "--max-time", str(seconds), url])

    def result():
        p = done()
        return p.stdout, p.stderr

    return result


def test_grip_over_http2(start_server, tmp_path):
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    try:
        routes = tmp_path / "routes"
        routes.write_text(f"* 127.0.0.1:{backend.server_address[1]}\n")
        server = start_server("--grip-routes", routes)
        base = f"http://{server.clients}"
        out, err = curl_h2(f"{base}/plain", 5)()
        assert "< HTTP/2 200" in err and out == "plain backend answer\n", err
        stream = curl_h2(f"{base}/held-stream", 4)
        held = curl_h2(f"{base}/held-response", 4)
        deadline = time.time() + 5
        while server.metrics().get("clarion_grip_held", 0) < 2:
            assert time.time() < deadline, "both requests to be held"
            time.sleep(0.05)
        item = {
            "channel": "h2grip",
            "formats": {
                "http-stream": {"content": "pushed\n"},
                "http-response": {"body": "held answer\n"},
            },
        }
        status, _, body = server.request(
            "POST", "/publish/", json.dumps({"items": [item]}).encode(),
            {"Content-Type": "application/json"},
        )
        assert status == 200, body
        out, err = held()
        assert "< HTTP/2 200" in err and out == "held answer\n", err
        out, err = stream()
        assert "< HTTP/2 200" in err
        assert out == "start\npushed\n", out
        assert server.metrics()["clarion_h2_streams_total"] >= 3
    finally:
        backend.shutdown()
