"""Benchmark peer: µWebSockets (through socketify, its Python binding) doing what Clarion does
in bench/idle_memory.py: accept WebSockets on /ws, subscribe each to topic `bench`, and
broadcast a 30-byte text message to the topic on every request to /publish/bench.

    bench/.venv/bin/python bench/peers/socketify_server.py PORT [CERT KEY]

With CERT and KEY, it serves TLS (µWebSockets' SSLApp over OpenSSL).
"""

import sys

from socketify import App, AppOptions, OpCode

TOPIC = "bench"
PAYLOAD = "x" * 30

if len(sys.argv) > 3:
    app = App(AppOptions(cert_file_name=sys.argv[2], key_file_name=sys.argv[3]))
else:
    app = App()


def on_open(ws):
    ws.subscribe(TOPIC)


def on_message(ws, message, opcode):
    pass


def publish(res, req):
    app.publish(TOPIC, PAYLOAD, OpCode.TEXT)
    res.end(str(app.num_subscribers(TOPIC)))


app.ws("/ws", {"open": on_open, "message": on_message, "idle_timeout": 120})
app.any("/publish/bench", publish)
port = int(sys.argv[1])
app.listen(port, lambda config: print(f"ready {port}", flush=True))
app.run()
