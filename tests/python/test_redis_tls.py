"""TLS to Redis (docs/cluster.md, "TLS to Redis"): nodes joined through a TLS-only
redis-server over `rediss://` deliver across nodes and resume; mutual TLS works with a client
certificate and is refused without one; a wrong CA, a name the certificate does not cover
and a plain port are each refused with a log line that says what failed, while the node keeps
running, answers /healthz (503) and retries without spinning. The certificates are made here,
with `cryptography`, for each test run."""

import datetime
import ipaddress
import ssl
import subprocess
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cluster_util import Redis, _RespReader, cluster, wait_until  # noqa: F401 (fixture)
from conftest import _binary
from test_cluster import recv_json, recv_messages, ws_sub

pytestmark = pytest.mark.timeout(120)


# --------------------------------------------------------------------------------------------
# Certificates


def _name(cn):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(path, key):
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


class Ca:
    """A CA that signs server and client certificates into `dir`."""

    def __init__(self, dir, cn):
        self.dir = dir
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(_name(cn))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True,
                    crl_sign=True, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )  # fmt: skip
        self.pem = dir / f"{cn.replace(' ', '_')}-ca.pem"
        self.pem.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, tag, names=(), ips=(), client=False, expired=False):
        """(cert path, key path) of a leaf for `names`/`ips` (a server) or a client; an
        `expired` one ended yesterday."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        sans = [x509.DNSName(n) for n in names] + [
            x509.IPAddress(ipaddress.ip_address(i)) for i in ips
        ]
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(tag))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=30))
            .not_valid_after(now + datetime.timedelta(days=-1 if expired else 30))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_path, key_path = self.dir / f"{tag}.pem", self.dir / f"{tag}-key.pem"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key_path, key)
        return cert_path, key_path


# --------------------------------------------------------------------------------------------
# A TLS-only redis-server


class TlsRedis(Redis):
    """redis-server with `--port 0 --tls-port P`: no plaintext port at all."""

    def __init__(
        self, workdir, ca, cert, key, auth_clients=False, client=None, name="127.0.0.1",
        verify=True,
    ):  # fmt: skip
        self.ca, self.cert, self.key, self.tls_name = ca, cert, key, name
        # Whether the fixture's own PING checks the certificate (not for an expired one).
        self.verify = verify
        self.auth_clients = auth_clients
        # What the fixture's own PING uses when the server wants a client certificate.
        self.client = client
        super().__init__(workdir)

    def command(self):
        return [
            *super().command(),
            "--port", "0",
            "--tls-port", str(self.port),
            "--tls-cert-file", str(self.cert),
            "--tls-key-file", str(self.key),
            "--tls-ca-cert-file", str(self.ca),
            "--tls-auth-clients", "yes" if self.auth_clients else "no",
        ]  # fmt: skip

    def _connect(self, timeout):
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.client:
            ctx.load_cert_chain(*map(str, self.client))
        sock = super()._connect(timeout)
        return ctx.wrap_socket(sock, server_hostname=self.tls_name)

    @property
    def url(self):
        return f"rediss://127.0.0.1:{self.port}"


@pytest.fixture
def pki(tmp_path):
    return make_pki(tmp_path)


def make_pki(tmp_path):
    """A CA, a Redis server certificate for 127.0.0.1 and localhost, a client certificate,
    a second CA nobody uses, and a server certificate for another name."""
    d = tmp_path / "pki"
    d.mkdir()
    ca = Ca(d, "Redis test CA")
    other = Ca(d, "Other CA")

    class Pki:
        pass

    p = Pki()
    p.ca = ca.pem
    p.other_ca = other.pem
    p.server = ca.issue("redis", names=["localhost"], ips=["127.0.0.1"])
    p.elsewhere = ca.issue("redis-internal", names=["redis.internal"])
    p.client = ca.issue("clarion", client=True)
    p.expired = ca.issue("redis-expired", names=["localhost"], ips=["127.0.0.1"], expired=True)
    return p


def tls_redis(cluster, pki, server=None, **kw):
    cert, key = server or pki.server
    r = TlsRedis(cluster.dir, pki.ca, cert, key, **kw)
    cluster.brokers.append(r)
    return r


def tls_nodes(cluster, n, redis, *extra):
    return cluster.start_nodes(
        n, "--broker", redis.url, "--node-name", "n{i}", "--workers", "2", *extra
    )


def refused(node, *words, timeout=10):
    """The node runs and stays up without its broker: the log says why (every word), /healthz
    answers 503, a publish answers 503, and retries are spaced out (backoff, no hot loop)."""
    wait_until(lambda: all(w in node.log_text() for w in words), timeout, f"log with {words}")
    status, body = node.healthz()
    assert status == 503 and "broker" in str(body), (status, body)
    status, _, _ = node.request("POST", "/publish/t", b"x")
    assert status == 503
    before = node.log_text().count("TLS with")
    time.sleep(2)
    assert node.running, node.log_text()[-2000:]
    assert node.log_text().count("TLS with") - before <= 6, "retries with backoff"
    # The appendable messages' timeout sweep waits for the broker instead of adding a connection
    # attempt and a log line every second to the outage.
    assert "stream timeouts not swept" not in node.log_text(), node.log_text()[-2000:]


# --------------------------------------------------------------------------------------------
# Tests


def test_two_nodes_over_rediss_deliver_across_nodes_and_resume(cluster, pki):
    redis = tls_redis(cluster, pki)
    a, b = tls_nodes(cluster, 2, redis, "--redis-tls-ca", pki.ca)
    ws = ws_sub(b, "feed")
    ids = [a.publish("feed", f"m{i}")["id"] for i in range(10)]
    got = recv_messages(ws, 4)
    assert [m["data"] for m in got] == ["m0", "m1", "m2", "m3"]
    assert [m["id"] for m in got] == ids[:4], "the same ids on every node"
    ws.close()
    # The client comes back on node a, resuming after the fourth message.
    ws = ws_sub(a, "feed", since=got[-1]["id"])
    again = recv_messages(ws, 6)
    assert [m["id"] for m in again] == ids[4:]
    b.publish("feed", "live")
    assert recv_json(ws)["data"] == "live"
    ws.close()
    assert a.wait_healthy() and b.wait_healthy()
    # Both nodes really are TLS clients of a TLS-only server (there is no plain port).
    clients = redis.command_reply("CLIENT", "LIST").decode()
    assert "name=clarion:n1" in clients and "name=clarion:n2" in clients


def test_mutual_tls_works_with_a_client_certificate_and_is_refused_without(cluster, pki):
    redis = tls_redis(cluster, pki, auth_clients=True, client=pki.client)
    cert, key = pki.client
    a = cluster.node(
        "--broker", redis.url, "--node-name", "mtls", "--redis-tls-ca", pki.ca,
        "--redis-tls-cert", cert, "--redis-tls-key", key, name="mtls",
    )  # fmt: skip
    ws = ws_sub(a, "room")
    ident = a.publish("room", "hello")["id"]
    assert recv_json(ws)["id"] == ident
    ws.close()
    bare = cluster.node(
        "--broker", redis.url, "--node-name", "bare", "--redis-tls-ca", pki.ca, name="bare"
    )
    refused(bare, "TLS with 127.0.0.1", "client certificate")


def test_a_wrong_ca_is_refused_with_a_clear_log_line_and_the_node_keeps_running(cluster, pki):
    redis = tls_redis(cluster, pki)
    node = cluster.node("--broker", redis.url, "--redis-tls-ca", pki.other_ca, name="wrongca")
    refused(node, "certificate verification failed for 127.0.0.1", "UnknownIssuer")


def test_a_certificate_for_another_name_is_refused_unless_that_name_is_asked_for(cluster, pki):
    redis = tls_redis(cluster, pki, server=pki.elsewhere, name="redis.internal")
    node = cluster.node("--broker", redis.url, "--redis-tls-ca", pki.ca, name="mismatch")
    refused(node, "certificate verification failed for 127.0.0.1", "redis.internal")
    named = cluster.node(
        "--broker", redis.url, "--redis-tls-ca", pki.ca,
        "--redis-tls-server-name", "redis.internal", name="named",
    )  # fmt: skip
    assert named.wait_healthy()
    assert named.publish("t", "x")["id"]


def test_an_expired_certificate_is_refused(cluster, pki):
    # redis-server itself serves an expired certificate (OpenSSL checks only its own key).
    redis = tls_redis(cluster, pki, server=pki.expired, verify=False)
    node = cluster.node("--broker", redis.url, "--redis-tls-ca", pki.ca, name="expired")
    refused(node, "certificate verification failed for 127.0.0.1", "expired")


def test_rediss_to_a_plain_redis_port_says_so(cluster, pki):
    plain = cluster.redis()
    url = plain.url.replace("redis://", "rediss://")
    node = cluster.node("--broker", url, "--redis-tls-ca", pki.ca, name="plain")
    refused(node, "TLS with 127.0.0.1")
    assert "TLS port" in node.log_text() or "does not speak TLS" in node.log_text()


@pytest.mark.parametrize(
    "args, words",
    [
        (["--redis-tls-cert", "{cert}"], "redis_tls_cert and redis_tls_key go together"),
        (["--redis-tls-key", "{key}"], "redis_tls_cert and redis_tls_key go together"),
        (["--redis-tls-ca", "{ca}"], "no broker URL is rediss://"),
        (["--redis-tls-ca", "/nonexistent/ca.pem"], "/nonexistent/ca.pem"),
    ],
)
def test_incomplete_tls_settings_stop_startup_with_their_reason(cluster, pki, args, words):
    cert, key = pki.client
    redis = cluster.redis()
    scheme = "redis" if "rediss" in words else "rediss"
    url = redis.url.replace("redis://", f"{scheme}://")
    args = [a.format(cert=cert, key=key, ca=pki.ca) for a in args]
    proc = subprocess.run(
        [_binary(), "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
         "--broker", url, *args],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode != 0
    assert words in proc.stderr, proc.stderr
