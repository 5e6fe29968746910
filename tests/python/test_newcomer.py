"""The first hour with Clarion (issue 23): every mistake a new user makes on the command line,
in the environment or against the API gets an answer that says what was wrong and what to do,
and what the README and docs point at exists."""

import json
import os
import random
import re
import socket
import subprocess
import urllib.request

from conftest import ROOT, _binary

ENV = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}


def run(*args, env=None, stdin=None, timeout=60):
    full = dict(ENV)
    full.update(env or {})
    return subprocess.run([_binary(), *map(str, args)], input=stdin, capture_output=True,
                          env=full, timeout=timeout)


def published(server):
    return server.metrics().get("clarion_messages_published_total", 0)


def free_port():
    """A port free on every interface, below the ephemeral range: a load generator on this
    machine may hold any ephemeral port on some loopback address, which 0.0.0.0 would clash with.
    The probe sets SO_REUSEADDR as the server's listeners do, so the TIME-WAIT sockets a load
    run leaves behind (the bench binds source ports from 10,000 up) do not count as taken."""
    for _ in range(100):
        port = random.randrange(10000, 30000)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port")


def test_publish_checks_the_topic_with_the_servers_rules(server):
    for topic, why in [("news?event=evil", "may only contain A-Z a-z 0-9 _ . : @ / -"),
                       ("bad topic", "may only contain A-Z a-z 0-9 _ . : @ / -"),
                       ("", "topic name is empty"),
                       ("x" * 129, "longer than 128 bytes")]:
        p = run("publish", "--api", server.api, topic, "hi")
        assert p.returncode == 1
        assert f"invalid topic {json.dumps(topic)}: topic name {why}".encode() in p.stderr \
            or why.encode() in p.stderr, p.stderr
        assert b"malformed request" not in p.stderr and b"invalid JSON" not in p.stderr
    assert published(server) == 0
    # A topic with every allowed punctuation goes through unchanged.
    p = run("publish", "--api", server.api, "t:a/b@c.d-e_f", "hi")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["topic"] == "t:a/b@c.d-e_f"


def test_a_message_piped_from_echo_is_published_without_its_newline(start_server):
    server = start_server()
    assert run("publish", "--api", server.api, "news", stdin=b"hi\n").returncode == 0
    assert run("publish", "--api", server.api, "news", "-", "--binary", stdin=b"raw\n").returncode == 0
    _, _, body = server.request("GET", "/topics/news")
    # Newest first; a binary message is shown in base64.
    newest, older = json.loads(body)["history"]
    assert (older["data"], older["encoding"]) == ("hi", "text"), body
    assert (newest["data"], newest["encoding"]) == ("cmF3Cg==", "base64"), body  # "raw\n"


def test_publish_shows_the_413_the_server_answered(start_server):
    server = start_server()
    # 2 MB: the server answers 413 from the head and closes; the client must show that answer.
    p = run("publish", "--api", server.api, "news", stdin=b"x" * 2_000_000)
    assert p.returncode == 1
    assert b"reset by peer" not in p.stderr, p.stderr
    answer = json.loads(p.stdout)
    assert answer["error"] == \
        "message of 2000000 bytes larger than max_publish_size (1048576 bytes)"
    assert b"HTTP 413" in p.stderr and b"max_publish_size" in p.stderr
    # Under the size that is announced with Expect: 100-continue, the body is sent at once and
    # the server closes on it: the answer is still read.
    small = start_server("--max-publish-size", 1000)
    for size in (5000, 60_000):
        p = run("publish", "--api", small.api, "news", stdin=b"y" * size)
        assert p.returncode == 1, p.stderr
        assert json.loads(p.stdout)["error"].endswith("larger than max_publish_size (1000 bytes)")
    assert published(server) == 0 and published(small) == 0
    # A large message within the limit goes through the 100 Continue.
    p = run("publish", "--api", server.api, "news", stdin=b"z" * 500_000)
    assert p.returncode == 0, p.stderr
    assert published(server) == 1


def test_publish_sends_a_publish_refused_during_an_upgrade_again_after_retry_after():
    """A 503 with Retry-After (a server in a hand-over's freeze) published nothing:
    `clarion publish` says so, waits, and sends it again, for at most --retry-for seconds."""
    import http.server
    import threading
    import time

    requests = []
    keys = []

    class Upgrading(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            requests.append(time.monotonic())
            keys.append(self.headers.get("Idempotency-Key"))
            if len(requests) % 3 != 0:
                body = b'{"error":"message not published: an upgrade is in progress"}'
                self.send_response(503)
                self.send_header("Retry-After", "1")
            else:
                body = b'{"topic":"news","id":"e-1","subscribers":0}'
                self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    api = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upgrading)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    addr = f"127.0.0.1:{api.server_address[1]}"
    try:
        p = run("publish", "--api", addr, "news", "hi")
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["id"] == "e-1"
        assert p.stderr.decode().count("upgrade is in progress; publishing again in 1 s") == 2, p.stderr
        assert len(requests) == 3 and requests[2] - requests[0] >= 1.9
        # Every attempt of one run carries the run's Idempotency-Key.
        assert keys[0] and keys.count(keys[0]) == 3, keys
        # Bounded: --retry-for 2 allows one wait of 1 s (a second would end past 2 s), then the
        # 503 is the answer.
        p = run("publish", "--api", addr, "--retry-for", "2", "news", "hi")
        assert p.returncode == 1 and b"HTTP 503" in p.stderr, p.stderr
        assert len(requests) == 5
        assert keys[3] == keys[4] != keys[0], keys
    finally:
        api.shutdown()
        api.server_close()


def test_publish_with_the_same_idempotency_key_is_delivered_once(server):
    first = run("publish", "--api", server.api, "--idempotency-key", "job-9", "news", "hi")
    again = run("publish", "--api", server.api, "--idempotency-key", "job-9", "news", "hi")
    assert first.returncode == 0 and again.returncode == 0, again.stderr
    a, b = json.loads(first.stdout), json.loads(again.stdout)
    assert b["id"] == a["id"] and b["repeat"] is True and "repeat" not in a, (a, b)
    assert published(server) == 1
    bad = run("publish", "--api", server.api, "--idempotency-key", "two words", "news", "hi")
    assert bad.returncode != 0 and b"--idempotency-key" in bad.stderr, bad.stderr


def test_publish_takes_host_port_and_urls(server):
    host, port = server.api.rsplit(":", 1)
    for api in (server.api, f"http://{server.api}", f"http://{server.api}/", f"localhost:{port}"):
        p = run("publish", "--api", api, "news", "hi")
        assert p.returncode == 0, (api, p.stderr)
    p = run("publish", "--api", f"https://{server.api}", "news", "hi")
    # https:// is spoken (issue 36); to a plain API it says to use http://.
    assert p.returncode == 1 and b"answered in plain HTTP, not TLS: give it as http://" in p.stderr, p.stderr
    assert published(server) == 4


def test_failed_publishes_hint_at_the_fix(start_server):
    p = run("publish", "--api", f"127.0.0.1:{free_port()}", "news", "hi")
    assert p.returncode == 1
    assert b"Connection refused" in p.stderr and b"--api or CLARION_API" in p.stderr, p.stderr
    keyed = start_server(env={"CLARION_API_KEY": "sekrit"})
    p = run("publish", "--api", keyed.api, "news", "hi")
    assert p.returncode == 1 and b"--api-key or CLARION_API_KEY" in p.stderr, p.stderr
    p = run("publish", "--api", keyed.api, "news", "hi", env={"CLARION_API_KEY": "sekrit"})
    assert p.returncode == 0, p.stderr
    # The client listener is not the API: say so.
    p = run("publish", "--api", keyed.clients, "news", "hi")
    assert p.returncode == 1 and b"not its client listener" in p.stderr, p.stderr


def test_api_errors_say_what_was_expected(start_server):
    server = start_server("--max-publish-size", 1000)
    status, _, body = server.request("POST", "/publish", b'[{"topic": "a", "data": "x"}]',
                                     {"Content-Type": "application/json"})
    assert status == 400
    assert json.loads(body)["error"] == ('invalid batch: expected an object {"messages": '
                                         '[{"topic": "...", "data": "..."}, ...]}, not an array')
    status, _, body = server.request("POST", "/publish/", b"hello")
    assert status == 400 and json.loads(body)["error"].startswith("missing topic: publish to "
                                                                  "/publish/{topic}")
    status, _, body = server.request("POST", "/publish/news", b"z" * 5000)
    assert status == 413
    assert json.loads(body)["error"] == \
        "message of 5000 bytes larger than max_publish_size (1000 bytes)"
    # A chunked body over the limit: the size is not known in advance, the limit still is.
    with socket.create_connection(tuple(server.api.rsplit(":", 1)), timeout=10) as s:
        s.sendall(b"POST /publish/news HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"7d0\r\n" + b"z" * 2000 + b"\r\n0\r\n\r\n")
        answer = b""
        while b"}" not in answer:
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
    assert b" 413 " in answer and b"larger than max_publish_size (1000 bytes)" in answer, answer
    assert published(server) == 0


def test_a_config_file_error_is_printed_once():
    p = run("serve", "--config", "/nonexistent/clarion.toml")
    assert p.returncode == 1
    assert p.stderr.count(b"No such file") == 1, p.stderr
    assert b"cannot read the config file /nonexistent/clarion.toml" in p.stderr


def test_a_bad_variable_is_named_not_the_flag():
    p = run("serve", env={"CLARION_MAX_BACKLOG": "lots"})
    assert p.returncode == 2
    assert b"invalid value 'lots' for CLARION_MAX_BACKLOG (the variable of --max-backlog)" \
        in p.stderr, p.stderr
    # The flag typed on the command line is still blamed as such.
    p = run("serve", "--max-backlog", "lots")
    assert p.returncode == 2 and b"'--max-backlog <MAX_BACKLOG>'" in p.stderr


def test_unknown_variables_and_log_levels_are_warned_about(start_server):
    server = start_server(env={"CLARION_HISTROY_SIZE": "5", "CLARION_LOG": "dbug",
                               "CLARION_WORKERS": "1"})
    _, stderr = server.stop()
    assert "CLARION_HISTROY_SIZE is not a Clarion variable and is ignored: did you mean " \
        "CLARION_HISTORY_SIZE?" in stderr, stderr
    assert 'CLARION_LOG="dbug" is not a level: use warn, info or debug (did you mean debug?)' \
        in stderr, stderr
    assert "CLARION_WORKERS" not in stderr
    # Known variables and levels say nothing.
    quiet = start_server(env={"CLARION_LOG": "info", "CLARION_SSE_RETRY": "100"})
    _, stderr = quiet.stop()
    assert "WARN" not in stderr, stderr


def test_listen_takes_a_bare_port_and_host_names(tmp_path):
    clients, api = free_port(), free_port()
    proc = subprocess.Popen([_binary(), "serve", "--listen", f":{clients}",
                             "--api-listen", f"localhost:{api}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"clarion ready clients=0.0.0.0:{clients} api="), \
            (line, proc.stderr.read() if proc.poll() is not None else "")
        api_addr = line.split("api=")[1].split()[0]
        assert api_addr.endswith(f":{api}") and ("127.0.0.1" in api_addr or "::1" in api_addr)
        with urllib.request.urlopen(f"http://localhost:{api}/healthz", timeout=10) as r:
            assert r.read() == b"ok\n"
        socket.create_connection(("127.0.0.1", clients), timeout=10).close()
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    # The same forms in a config file.
    config = tmp_path / "clarion.toml"
    config.write_text(f'listen = ":{clients}"\napi_listen = "localhost:{api}"\n')
    p = subprocess.Popen([_binary(), "serve", "--config", str(config)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=ENV, text=True)
    try:
        assert p.stdout.readline().startswith(f"clarion ready clients=0.0.0.0:{clients} ")
    finally:
        p.terminate()
        p.wait(timeout=15)
    bad = run("serve", "--listen", "18080")
    assert bad.returncode == 2 and b"give ip:port, host:port or :port" in bad.stderr


def test_help_describes_every_transport_and_scenario():
    top = run("--help").stdout.decode()
    for word in ("WebSocket", "Server-Sent Events", "long-polling", "HTTP streaming", "TLS"):
        assert word in top, top
    bench = run("bench", "--help").stdout.decode()
    summary = bench.split("Possible values")[0]
    for scenario in ("idle", "burst", "ticker", "topics", "churn", "streams"):
        assert scenario in summary, summary


def bench(server, *args):
    p = run("bench", "--target", server.clients, "--server-pid", server.proc.pid, *args,
            timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.decode()


def test_bench_takes_both_api_forms_and_says_when_a_figure_cannot_be_trusted(server, tmp_path):
    out = bench(server, "--api", f"http://{server.api}/", "-n", 300, "-m", 2)
    assert "300/300 open" in out, out
    # A second run on the same server reuses the memory the first freed: the figure is
    # near zero, and the report says not to trust it.
    report = tmp_path / "short.html"
    out = bench(server, "--api", server.api, "-n", 300, "-m", 2, "--report", report)
    memory = float(re.search(r"server memory +(-?[\d.]+) B", out).group(1))
    if memory < 32:
        assert "restart the server before measuring memory" in out, out
    assert "kernel memory per connection: measured machine-wide over only 300" in out, out
    # The run lasted well under a second, and its plots still show the connections and the
    # deliveries rising from zero (not flat lines at zero).
    page = report.read_text()
    charts = dict(re.findall(r"<h2>([^<]+)</h2><svg[^>]*><polyline[^>]*points=\"([^\"]*)\"",
                             page))
    for title in ("Connections open", "Deliveries per second"):
        ys = [float(p.split(",")[1]) for p in charts[title].split()]
        assert min(ys) < max(ys), (title, charts[title])


def test_readme_and_docs_link_only_to_files_in_the_repository():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        text = page.read_text()
        assert "../shared" not in text and "shared/PERF" not in text, page
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            assert path.exists(), f"{page.name} links to {target}, which does not exist"


def test_the_dev_certificate_directory_is_ignored_by_git():
    ignored = subprocess.run(["git", "check-ignore", "-q", "clarion-dev-tls/key.pem"], cwd=ROOT)
    assert ignored.returncode == 0


# The second hour (issue 36).


def test_serve_help_shows_defaults_and_variables_and_h_is_a_short_summary():
    long = run("serve", "--help").stdout.decode()
    # Every setting with its default, and its variable without a trailing `=` (clap's
    # `[env: CLARION_X=]` read as "set to empty").
    assert "=]" not in long, [l for l in long.splitlines() if "=]" in l][:3]
    assert "[default: 0.0.0.0:8080] [env: CLARION_LISTEN]" in long
    assert "[default: 127.0.0.1:8081] [env: CLARION_API_LISTEN]" in long
    assert "--max-backlog" in long and "[env: CLARION_MAX_BACKLOG]" in long
    assert long.count("[default: ") >= 60
    short = run("serve", "-h").stdout.decode()
    assert len(short.splitlines()) < 40, short
    for flag in ("--listen", "--api-listen", "--tls-listen", "--tls-cert", "--api-key", "--broker",
                 "--processes", "--config"):
        assert flag in short, (flag, short)
    assert "--max-backlog" not in short
    assert "docs/configuration.md" in short and "serve --help" in short
    assert "--listen :PORT --api-listen 127.0.0.1:PORT" in short and "CLARION_API" in short


def test_port_flags_point_at_listen():
    for flag in ("--port", "-p"):
        p = run("serve", flag, "9000")
        assert p.returncode == 2
        assert b"--listen :PORT" in p.stderr and b"--api-listen 127.0.0.1:PORT" in p.stderr, p.stderr


def test_a_typo_in_the_config_file_suggests_the_setting(tmp_path):
    config = tmp_path / "clarion.toml"
    config.write_text('listen = ":0"\nmax_conections_per_address = 5\n')
    p = run("serve", "--config", config)
    assert p.returncode == 1
    err = p.stderr.decode()
    assert f"invalid config file {config}: unknown setting `max_conections_per_address` (line 2): " \
        "did you mean `max_connections_per_address`?" in err, err
    # Not serde's list of every key there is.
    assert "expected one of" not in err and "grip_routes" not in err, err


def test_the_startup_line_says_what_is_on(start_server):
    s = start_server("--workers", 1, "--auth-secret", "s3cret", "--auth-public-topics", "news,chat.*",
                     "--auth-anonymous=false", "--node-name", "alpha")
    _, stderr = s.stop()
    line = next(l for l in stderr.splitlines() if "serving:" in l)
    assert f"clients on {s.clients}, API on {s.api} (1 worker, " in line, line
    assert "broker: none (node alpha)" in line, line
    assert "auth: HS256 tokens, public topics: news, chat.*, anonymous connections: refused" in line
    # Tokens on and no key: the line says the publish API now takes tokens only, and how to
    # make one (issue 54: turning auth on for presence silently closed the API).
    assert "(publish API: tokens only (no api_key; `clarion token --admin`" in line, line
    assert "hooks: none" in line and "1 process" in line and "s3cret" not in line, line
    plain = start_server("--workers", 2, "--webhook-url", "http://127.0.0.1:9/hooks/events")
    _, stderr = plain.stop()
    line = next(l for l in stderr.splitlines() if "serving:" in l)
    assert "(2 workers, " in line and "auth: off (publish API: open (no api_key))" in line, line
    assert "hooks: webhook;" in line, line
    keyed = start_server("--auth-secret", "s3cret", "--api-key", "k3y",
                         "--hook-connect-url", "http://127.0.0.1:9/hooks/connect")
    _, stderr = keyed.stop()
    line = next(l for l in stderr.splitlines() if "serving:" in l)
    assert "(publish API: api_key, or a token that grants the topic)" in line, line
    assert "hooks: connect;" in line and "k3y" not in line, line


def test_an_auth_policy_without_a_key_is_refused():
    for args in (["--auth-public-topics", "news"], ["--auth-anonymous=false"]):
        p = run("serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0", *args)
        assert p.returncode == 1, p.stderr
        err = p.stderr.decode()
        assert "authentication is off" in err and "auth_secret, auth_public_key or auth_jwks" in err, err


def test_cert_dev_twice_keeps_the_files_and_succeeds(tmp_path):
    assert run("cert", "--dev", "--dir", tmp_path).returncode == 0
    before = (tmp_path / "key.pem").read_bytes()
    again = run("cert", "--dev", "--dir", tmp_path)
    assert again.returncode == 0, again.stderr
    assert b"already exist and are kept (--force makes new ones)" in again.stdout, again.stdout
    assert (tmp_path / "key.pem").read_bytes() == before
    assert run("cert", "--dev", "--dir", tmp_path, "--force").returncode == 0
    assert (tmp_path / "key.pem").read_bytes() != before


# The third hour (issue 54).


def slug(heading):
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_first_screen_names_the_two_commands_and_what_each_role_installs():
    readme = (ROOT / "README.md").read_text()
    first = readme[: readme.index("\n## The test suite")]
    # The two commands, exactly as CI and a new user run them.
    assert "cargo run --release -- serve     # clients on :8080" in first
    assert "bash .ci/run                     # the whole test suite" in first
    assert (ROOT / ".ci" / "run").exists()
    table = first[first.index("## What to install"):]
    rows = [r for r in table.splitlines() if r.startswith("| a ") or r.startswith("| the ")]
    for role in ("a browser page", "a Node service", "a Python worker", "a backend that publishes"):
        assert any(r.startswith(f"| {role}") for r in rows), role
    # Every package the table installs is one this repository builds (packaging/build.sh).
    built = {
        "pip": {re.search(r'^name = "([^"]+)"', (ROOT / p).read_text(), re.M).group(1)
                for p in ("python/pyproject.toml", "python/client/pyproject.toml")},
        "npm": {json.loads((ROOT / p).read_text())["name"]
                for p in ("node/clarion/package.json", "node/client/package.json")},
    }
    named = re.findall(r"`(pip|npm) install ([@\w/.-]+)", "\n".join(rows))
    assert len(named) >= 6
    for tool, package in named:
        assert package in built[tool] or (tool == "npm" and package == "ws"), (tool, package)
    # The browser row's import is what the server serves.
    assert "/client.js'" in table and "ClarionClient" in table


def test_the_readmes_anchors_lead_to_headings():
    readme = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)\s]*#[^)\s]+)\)", readme):
        page, anchor = target.split("#", 1)
        text = (ROOT / page).read_text() if page else readme
        headings = {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
        assert anchor in headings, f"README links to {target}: no such heading"
