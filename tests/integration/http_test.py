#!/usr/bin/python3
"""The HTTP check endpoint ([http], docs/http.md) of the real sluiced: every
status, header and problem body over TCP and a Unix socket; the shipped
nginx snippet (conf/nginx/) in front of it, driven with curl; and two nginx
instances, each with its own sluiced on one Redis, holding one global limit
between them, also with Redis gone.

Needs SLUICED (the daemon binary) in the environment and Debian's nginx and
curl; run with /usr/bin/python3 (python3-msgpack).
"""

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Daemon, Redis, free_port, make_dir, spawn, end_process,  # noqa: E402
                     tear_down_module, wait_for)

NGINX = os.environ.get("NGINX", "/usr/sbin/nginx")
CURL = os.environ.get("CURL", "/usr/bin/curl")
SNIPPETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "conf", "nginx")
SHIPPED_ADDRESS = "127.0.0.1:9470"

CONFIG = """
[daemon]
socket = "{socket}"
workers = 2

[http]
listen = "{listen}"
deny_status = {deny_status}

[[rule]]
name = "three"
algorithm = "token_bucket"
limit = 3
period = "10s"

[[rule]]
name = "pair"
algorithm = "fixed_window"
limits = [{{ limit = 2, period = "1h" }}, {{ limit = 100, period = "1d" }}]

[[rule]]
name = "slots"
algorithm = "concurrency"
limit = 4
period = "1m"
"""

# Two daemons on one Redis: one global limit of LIMIT a second between them.
FLEET_LIMIT = 40
FLEET_CONFIG = """
[daemon]
socket = "{socket}"
workers = 1

[http]
listen = "127.0.0.1:{http_port}"
deny_status = 403

[redis]
url = "redis://127.0.0.1:{redis_port}"
expected_nodes = 2
node_id = "http-{index}"
# A slow machine (or a sanitizer) must not answer a cold key by fallback.
lease_timeout = "2s"
heartbeat_interval = "100ms"

[[rule]]
name = "api"
algorithm = "token_bucket"
limit = {limit}
period = "1s"
burst = {limit}
scope = "global"
on_redis_down = "local"
"""


def start_daemon(test, config_text, http_port=None, name="http"):
    """A sluiced with `config_text` (its {socket} filled in), stopped at the
    test's end, once its HTTP port (when given) accepts."""
    daemon = Daemon(name)
    test.addCleanup(daemon.stop)
    daemon.start(config_text.replace("{socket}", daemon.socket))
    if http_port is not None:
        test.assertTrue(wait_for(lambda: connects(http_port), 10), daemon.logs())
    return daemon


def connects(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost")
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def ask(connection, path, method="GET", headers=None):
    """(status, headers dict, body text) of one request."""
    connection.request(method, path, headers=headers or {})
    response = connection.getresponse()
    return response.status, dict(response.getheaders()), response.read().decode()


class HttpEndpointTest(unittest.TestCase):
    """The endpoint on its own, asked with http.client."""

    def setUp(self):
        self.port = free_port()
        start_daemon(self, CONFIG.format(socket="{socket}", listen="127.0.0.1:%d" % self.port,
                                         deny_status=429), self.port)
        self.http = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        self.addCleanup(self.http.close)

    def test_allowed_checks_are_200_and_the_first_denial_429_with_retry_after(self):
        for remaining in (2, 1, 0):
            status, headers, body = ask(self.http, "/v1/check?rule=three&key=a")
            self.assertEqual(status, 200, body)
            self.assertRegex(headers["RateLimit"], r'^"three";r=%d;t=\d+$' % remaining)
            self.assertEqual(headers["RateLimit-Policy"], '"three";q=3;w=10')
            self.assertNotIn("Retry-After", headers)
            self.assertTrue(json.loads(body)["allowed"])
        status, headers, body = ask(self.http, "/v1/check?rule=three&key=a")
        self.assertEqual(status, 429)
        self.assertEqual(headers["Content-Type"], "application/problem+json")
        self.assertIn(int(headers["Retry-After"]), (3, 4))  # 10 s / 3 units, rounded up
        self.assertRegex(headers["RateLimit"], r'^"three";r=0;t=\d+$')
        problem = json.loads(body)
        self.assertEqual(problem["status"], 429)
        self.assertEqual(problem["title"], "Too Many Requests")
        self.assertEqual(problem["type"], "about:blank")
        self.assertGreater(problem["retry_after_ms"], 0)
        # Another key has its own units.
        self.assertEqual(ask(self.http, "/v1/check?rule=three&key=b")[0], 200)

    def test_headers_carry_the_parameters_and_the_query_wins(self):
        headers = {"Sluice-Rule": "three", "Sluice-Key": "h", "Sluice-Cost": "2"}
        status, answer, _ = ask(self.http, "/v1/check", "POST", headers)
        self.assertEqual(status, 200)
        self.assertRegex(answer["RateLimit"], r'^"three";r=1;')
        # The query's key and cost win over the headers'.
        status, answer, _ = ask(self.http, "/v1/check?key=q&cost=3", "GET", headers)
        self.assertEqual(status, 200)
        self.assertRegex(answer["RateLimit"], r'^"three";r=0;')

    def test_key_header_takes_the_key_from_the_address_the_proxy_saw(self):
        path = "/v1/check?rule=three&key_header=X-Forwarded-For"
        for forwarded in ("1.1.1.1, 10.0.0.9", "2.2.2.2, 10.0.0.9", "10.0.0.9"):
            status, _, _ = ask(self.http, path, headers={"X-Forwarded-For": forwarded})
            self.assertEqual(status, 200)
        status, _, _ = ask(self.http, path, headers={"X-Forwarded-For": "3.3.3.3, 10.0.0.9"})
        self.assertEqual(status, 429)  # one key, whatever the client wrote before it
        # Envoy appends the client's path to its own query: the client's own
        # key, cost and rule there change nothing.
        envoy = ("/v1/check?rule=three&cost=1&key_header=X-Forwarded-For&x="
                 "/api?key=victim&cost=3&rule=nosuch")
        status, headers, body = ask(self.http, envoy, headers={"X-Forwarded-For": "10.0.0.8"})
        self.assertEqual(status, 200, body)
        self.assertRegex(headers["RateLimit"], r'^"three";r=2;')
        self.assertEqual(ask(self.http, "/v1/peek?rule=three&key=victim")[1]["RateLimit"][:13],
                         '"three";r=3;t')
        status, _, body = ask(self.http, path)
        self.assertEqual(status, 400)
        self.assertIn("X-Forwarded-For", json.loads(body)["detail"])

    def test_peek_spends_nothing(self):
        for _ in range(5):
            status, headers, _ = ask(self.http, "/v1/peek?rule=three&key=p")
            self.assertEqual(status, 200)
            self.assertRegex(headers["RateLimit"], r'^"three";r=3;')
        self.assertEqual(ask(self.http, "/v1/check?rule=three&key=p&cost=3")[0], 200)
        status, headers, _ = ask(self.http, "/v1/peek?rule=three&key=p&cost=1")
        self.assertEqual(status, 429)

    def test_client_mistakes_are_4xx_problems_naming_what_is_wrong(self):
        cases = [
            ("/v1/check?key=a", "GET", 400, "parameter rule"),
            ("/v1/check?rule=three", "GET", 400, "parameter key"),
            ("/v1/check?rule=three&key=a&cost=-1", "GET", 400, "parameter cost"),
            ("/v1/check?rule=three&key=" + "k" * 5000, "GET", 400, "max_key_bytes"),
            ("/v1/check?rule=nosuch&key=a", "GET", 404, "nosuch"),
            ("/v2/check?rule=three&key=a", "GET", 404, "/v1/check"),
            ("/v1/check?rule=three&key=a", "DELETE", 405, "GET or POST"),
        ]
        for path, method, status, detail in cases:
            got, headers, body = ask(self.http, path[:120] if status != 400 else path, method)
            self.assertEqual(got, status, (path[:60], body))
            self.assertEqual(headers["Content-Type"], "application/problem+json")
            problem = json.loads(body)
            self.assertEqual(problem["status"], status)
            self.assertIn(detail, problem["detail"])

    def test_several_limits_and_concurrency_rules_describe_their_policies(self):
        status, headers, _ = ask(self.http, "/v1/check?rule=pair&key=a")
        self.assertEqual(status, 200)
        self.assertEqual(headers["RateLimit-Policy"], '"pair/0";q=2;w=3600, "pair/1";q=100;w=86400')
        self.assertRegex(headers["RateLimit"], r'^"pair/0";r=1;')
        status, headers, _ = ask(self.http, "/v1/check?rule=slots&key=a")
        self.assertEqual(status, 200)
        self.assertEqual(headers["RateLimit-Policy"], '"slots";q=4;qu="concurrent-requests"')


def read_responses(sock, count):
    """`count` whole responses read off `sock`: (status, headers, body)
    each, and whether the daemon closed the connection after them."""
    data = b""
    responses = []
    while len(responses) < count:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            head = data[:end].decode()
            lines = head.split("\r\n")
            headers = dict(line.split(": ", 1) for line in lines[1:])
            length = int(headers["Content-Length"])
            if len(data) >= end + 4 + length:
                responses.append((int(lines[0].split()[1]), headers,
                                  data[end + 4:end + 4 + length].decode()))
                data = data[end + 4 + length:]
                continue
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return responses


class HttpWireTest(unittest.TestCase):
    """The endpoint's HTTP/1.1 on a raw socket: pipelining, Connection:
    close, HTTP/1.0 and the bounds."""

    def setUp(self):
        self.port = free_port()
        start_daemon(self, CONFIG.format(socket="{socket}", listen="127.0.0.1:%d" % self.port,
                                         deny_status=429), self.port)

    def connect(self):
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        self.addCleanup(sock.close)
        return sock

    def test_pipelined_requests_are_answered_in_order_on_one_connection(self):
        sock = self.connect()
        requests = b"".join(b"GET /v1/check?rule=three&key=pipe HTTP/1.1\r\nHost: s\r\n\r\n"
                            for _ in range(4))
        sock.sendall(requests + b"GET /v1/peek?rule=three&key=pipe HTTP/1.1\r\nHost: s\r\n\r\n")
        answers = read_responses(sock, 5)
        # The peek (cost 0) passes, and sees what the four checks left.
        self.assertEqual([status for status, _, _ in answers], [200, 200, 200, 429, 200])
        self.assertEqual([h["RateLimit"].split(";")[1] for _, h, _ in answers],
                         ["r=2", "r=1", "r=0", "r=0", "r=0"])
        # Still open: one more request is answered.
        sock.sendall(b"GET /v1/peek?rule=three&key=other HTTP/1.1\r\nHost: s\r\n\r\n")
        self.assertEqual(read_responses(sock, 1)[0][0], 200)

    def test_connection_close_and_http_1_0_are_answered_then_closed(self):
        for request in (b"GET /v1/peek?rule=three&key=c HTTP/1.1\r\nHost: s\r\n"
                        b"Connection: close\r\n\r\n",
                        b"GET /v1/peek?rule=three&key=c HTTP/1.0\r\n\r\n"):
            sock = self.connect()
            sock.sendall(request)
            answers = read_responses(sock, 1)
            self.assertEqual(answers[0][0], 200)
            self.assertEqual(answers[0][1]["Connection"], "close")
            self.assertEqual(sock.recv(1), b"", "the connection stayed open")

    def test_a_refused_request_is_answered_while_its_client_still_sends_its_body(self):
        # A small send buffer: the body goes out only as the daemon reads it.
        # A daemon that closed at its answer would reset the connection and
        # fail this sendall; it lingers, reading and dropping the body.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
        sock.settimeout(5)
        sock.connect(("127.0.0.1", self.port))
        self.addCleanup(sock.close)
        body = b"b" * 300_000
        sock.sendall(b"POST /v1/check?rule=three&key=l HTTP/1.1\r\nHost: s\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        answers = read_responses(sock, 1)
        self.assertEqual([status for status, _, _ in answers], [413])
        self.assertEqual(sock.recv(1), b"", "an orderly end of the stream, no reset")

    def test_malformed_and_oversized_requests_get_their_problem_and_a_close(self):
        cases = [
            (b"GET /v1/check HTTP/1.1\r\nHost: s\r\nBad Name: x\r\n\r\n", 400),
            (b"POST /v1/check HTTP/1.1\r\nHost: s\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
            (b"POST /v1/check HTTP/1.1\r\nHost: s\r\nContent-Length: 9999999\r\n\r\n", 413),
            # Just past [limits] max_frame_bytes (64 KiB).
            (b"GET /v1/check HTTP/1.1\r\nHost: s\r\nX: " + b"x" * 65500 + b"\r\n\r\n", 431),
            (b"GET /v1/check HTTP/2.0\r\nHost: s\r\n\r\n", 505),
        ]
        for request, status in cases:
            sock = self.connect()
            # The daemon lingers after its answer: the whole request is sent.
            sock.sendall(request)
            answers = read_responses(sock, 1)
            self.assertEqual(len(answers), 1, request[:60])
            got, headers, body = answers[0]
            self.assertEqual(got, status, body)
            self.assertEqual(headers["Content-Type"], "application/problem+json")
            self.assertEqual(json.loads(body)["status"], status)
            self.assertEqual(sock.recv(1), b"")


class HttpUnixSocketTest(unittest.TestCase):
    def test_a_unix_socket_listener_answers_checks(self):
        daemon = Daemon("http-unix")
        self.addCleanup(daemon.stop)
        path = os.path.join(daemon.dir, "http.sock")
        daemon.start(CONFIG.format(socket=daemon.socket, listen="unix:" + path, deny_status=429))
        self.assertTrue(wait_for(lambda: os.path.exists(path), 10), daemon.logs())
        connection = UnixHTTPConnection(path)
        self.addCleanup(connection.close)
        status, headers, _ = ask(connection, "/v1/check?rule=three&key=u")
        self.assertEqual(status, 200)
        self.assertRegex(headers["RateLimit"], r'^"three";r=2;')
        self.assertEqual(daemon.terminate(), 0)
        self.assertFalse(os.path.exists(path), "the socket file outlived the daemon")


class HttpAddressTakenTest(unittest.TestCase):
    def test_a_taken_address_stops_the_daemon_saying_what_to_do(self):
        taken = socket.socket()
        self.addCleanup(taken.close)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        daemon = Daemon("http-taken")
        self.addCleanup(daemon.stop)
        proc = daemon.start(CONFIG.format(socket=daemon.socket,
                                          listen="127.0.0.1:%d" % taken.getsockname()[1],
                                          deny_status=429), wait=False)
        self.assertEqual(proc.wait(timeout=20), 1, daemon.logs())
        self.assertIn("choose another [http] listen", daemon.logs())


class Nginx:
    """A Debian nginx in its own temp dir on a free port, serving a static
    page at / and /api/ behind the shipped snippet, which asks a sluiced at
    `sluice_address`."""

    def __init__(self, test, sluice_address, rule):
        self.dir = make_dir("ng.")
        os.chmod(self.dir, 0o755)  # nginx's workers read the page as another user
        self.port = free_port()
        for name in ("sluice.conf", "sluice-check.conf"):
            with open(os.path.join(SNIPPETS, name)) as f:
                text = f.read()
            self_check = text if name != "sluice.conf" else text.replace(SHIPPED_ADDRESS,
                                                                          sluice_address)
            if name == "sluice.conf":
                test.assertNotEqual(self_check, text, "the snippet no longer names " +
                                    SHIPPED_ADDRESS)
            with open(os.path.join(self.dir, name), "w") as f:
                f.write(self_check)
        os.makedirs(os.path.join(self.dir, "www"))
        with open(os.path.join(self.dir, "www", "index.html"), "w") as f:
            f.write("hello\n")
        conf = os.path.join(self.dir, "nginx.conf")
        with open(conf, "w") as f:
            f.write("""
# One process: a SIGKILL at the end of the test leaves no orphaned worker.
master_process off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {dir}/www;
        include {dir}/sluice.conf;
        location /api/ {{
            set $sluice_rule "{rule}";
            include {dir}/sluice-check.conf;
            # Served here: an index redirect would run the check again.
            try_files /index.html =404;
        }}
    }}
}}
""".format(dir=self.dir, port=self.port, rule=rule))
        self.proc = spawn([NGINX, "-p", self.dir, "-c", conf, "-g", "daemon off;"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        test.addCleanup(self.stop)
        test.assertTrue(wait_for(lambda: connects(self.port) or self.proc.poll() is not None, 10))
        test.assertIsNone(self.proc.poll(), self.errors())

    def errors(self):
        try:
            with open(os.path.join(self.dir, "error.log")) as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        end_process(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


def curl(port, path):
    """(status, headers with lower-case names) of one curl request."""
    out = subprocess.run([CURL, "-s", "-o", "/dev/null", "-D", "-", "--max-time", "5",
                          "http://127.0.0.1:%d%s" % (port, path)],
                         capture_output=True, text=True, check=True).stdout
    lines = out.replace("\r", "").strip().split("\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


class NginxSnippetTest(unittest.TestCase):
    def test_the_snippet_admits_the_limit_then_answers_429_with_the_headers(self):
        port = free_port()
        start_daemon(self, CONFIG.format(socket="{socket}", listen="127.0.0.1:%d" % port,
                                         deny_status=403), port)
        nginx = Nginx(self, "127.0.0.1:%d" % port, "three")
        for remaining in (2, 1, 0):
            status, headers = curl(nginx.port, "/api/")
            self.assertEqual(status, 200, nginx.errors())
            self.assertRegex(headers["ratelimit"], r'^"three";r=%d;t=\d+$' % remaining)
            self.assertEqual(headers["ratelimit-policy"], '"three";q=3;w=10')
            self.assertNotIn("retry-after", headers)
        status, headers = curl(nginx.port, "/api/")
        self.assertEqual(status, 429, nginx.errors())
        self.assertIn(int(headers["retry-after"]), (3, 4))
        self.assertRegex(headers["ratelimit"], r'^"three";r=0;')
        self.assertEqual(headers["content-type"], "application/problem+json")
        # Outside the limited location nothing is asked.
        self.assertEqual(curl(nginx.port, "/")[0], 200)


class NginxFleetTest(unittest.TestCase):
    """Two nginx, each with its own sluiced, one Redis, one global rule."""

    def hammer(self, ports, rate, seconds):
        """Sends `rate` requests a second, spread over `ports`, for `seconds`;
        returns the list of (status, headers) answered."""
        answers = []
        lock = threading.Lock()
        per_thread = 2
        threads = len(ports) * per_thread
        interval = threads / rate

        def run(port, start):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            next_at = start
            while next_at < start + seconds:
                time.sleep(max(0.0, next_at - time.monotonic()))
                connection.request("GET", "/api/")
                response = connection.getresponse()
                response.read()
                with lock:
                    answers.append((response.status, dict(response.getheaders())))
                next_at += interval
            connection.close()

        start = time.monotonic() + 0.05
        workers = [threading.Thread(target=run, args=(port, start + i * interval / threads))
                   for port in ports for i in range(per_thread)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return answers

    def test_two_nginx_hold_one_global_limit_and_keep_answering_without_redis(self):
        redis = Redis()
        self.addCleanup(redis.stop)
        nginx_ports = []
        daemons = []
        for index in range(2):
            http_port = free_port()
            daemons.append(start_daemon(self, FLEET_CONFIG.format(
                socket="{socket}", http_port=http_port, redis_port=redis.port, index=index, limit=FLEET_LIMIT),
                http_port, "fleet-%d" % index))
            nginx_ports.append(Nginx(self, "127.0.0.1:%d" % http_port, "api").port)
        self.assertTrue(wait_for(lambda: all(
            d.ask("health")["nodes"] == 2 and d.ask("health")["breaker"] == "closed"
            for d in daemons), 10), daemons[0].logs())

        seconds = 3
        answers = self.hammer(nginx_ports, 3 * FLEET_LIMIT, seconds)
        allowed = sum(1 for status, _ in answers if status == 200)
        denied = [headers for status, headers in answers if status == 429]
        self.assertEqual(allowed + len(denied), len(answers),
                         sorted({status for status, _ in answers}))
        # The whole fleet admits about the limit: the burst plus limit x T,
        # however the requests fall on the two nodes.
        bound = FLEET_LIMIT * seconds + FLEET_LIMIT
        self.assertLessEqual(allowed, bound * 1.05, (allowed, len(answers)))
        self.assertGreaterEqual(allowed, FLEET_LIMIT * seconds * 0.9, (allowed, len(answers)))
        print("nginx fleet: %d of %d requests admitted in %d s at a limit of %d/s" % (
            allowed, len(answers), seconds, FLEET_LIMIT), file=sys.stderr)
        for headers in denied:
            self.assertGreaterEqual(int(headers["Retry-After"]), 1)
            self.assertRegex(headers["RateLimit"], r'^"api";r=\d+;t=\d+$')

        # Without Redis each node answers on its share (on_redis_down = "local").
        redis.kill()
        self.assertTrue(wait_for(lambda: all(
            d.ask("health")["breaker"] == "open" for d in daemons), 10), daemons[0].logs())
        answers = self.hammer(nginx_ports, 3 * FLEET_LIMIT, 1)
        statuses = {status for status, _ in answers}
        self.assertLessEqual(statuses, {200, 429}, statuses)
        self.assertIn(200, statuses)


def tearDownModule():
    tear_down_module()


if __name__ == "__main__":
    unittest.main()
