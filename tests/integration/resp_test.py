#!/usr/bin/python3
"""The Redis protocol front ([resp], docs/resp.md) of the real sluiced, asked
by unmodified Redis clients: redis-cli, Debian's python3-redis and npm's
ioredis (resp_node/, installed by `npm ci` in a temp dir) run
CL.THROTTLE, SLUICE.ACQUIRE and pipelines; two daemons on one Redis hold one
global CL.THROTTLE limit; malformed RESP gets -ERR and the daemon answers
on; max_parameter_sets refuses one set too many. The main socket's bounds
hold for RESP connections, which live on the same workers: idle and
partial-frame timeouts, max_connections, and [access] on a Unix listener
(that test connects as another user and needs root).

Needs SLUICED (the daemon binary) in the environment, redis-server and
redis-cli, node and npm; run with /usr/bin/python3 (python3-msgpack, python3-redis).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import unittest

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (REDIS_CLI, Daemon, Redis, free_port, make_dir,  # noqa: E402
                     tear_down_module, wait_for)

NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resp_node")

CONFIG = """
[daemon]
socket = "{socket}"
workers = 2

[resp]
listen = "{listen}"
max_parameter_sets = 3

[[rule]]
name = "api"
algorithm = "token_bucket"
limit = 5
period = "1h"
"""

PAIR_CONFIG = """
[daemon]
socket = "{socket}"
workers = 1

[resp]
listen = "127.0.0.1:{resp_port}"
scope = "global"

[redis]
url = "redis://127.0.0.1:{redis_port}"
expected_nodes = 2
node_id = "resp-{index}"
# A slow machine (or a sanitizer) must not answer a cold key by fallback.
lease_timeout = "2s"
heartbeat_interval = "100ms"
"""


def connects(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def start(test, text, port, name="resp"):
    daemon = Daemon(name)
    test.addCleanup(daemon.stop)
    daemon.start(text.replace("{socket}", daemon.socket))
    test.assertTrue(wait_for(lambda: connects(port), 10), daemon.logs())
    return daemon


def cli(port, *words, stdin=None):
    return subprocess.run([REDIS_CLI, "-p", str(port), *words], input=stdin,
                          capture_output=True, text=True, timeout=10).stdout


class RespClientsTest(unittest.TestCase):
    def setUp(self):
        self.port = free_port()
        self.daemon = start(self, CONFIG.format(socket="{socket}",
                                                listen="127.0.0.1:%d" % self.port), self.port)
        self.client = redis.Redis(port=self.port)
        self.addCleanup(self.client.close)

    def test_redis_cli_throttles_acquires_and_pipes(self):
        self.assertEqual(cli(self.port, "PING").strip(), "PONG")
        # max_burst 2: three pass at once, the fourth is limited.
        replies = [cli(self.port, "CL.THROTTLE", "u", "2", "10", "60").split() for _ in range(4)]
        self.assertEqual([r[:3] for r in replies],
                         [["0", "3", "2"], ["0", "3", "1"], ["0", "3", "0"], ["1", "3", "0"]])
        self.assertEqual(replies[0][3], "-1")
        self.assertIn(int(replies[3][3]), (5, 6))  # 60 s / 10, truncated as redis-cell does
        acquired = cli(self.port, "SLUICE.ACQUIRE", "api", "k", "2").split()
        self.assertEqual(acquired[:3] + acquired[4:], ["1", "3", "5", "0", "local"])
        self.assertTrue(1_400_000 < int(acquired[3]) <= 1_440_000, acquired)  # 2/5 of an hour
        # Commands on stdin go one after another on one connection.
        out = cli(self.port, stdin="ECHO one\nSLUICE.PEEK api k\nECHO two\n").split()
        self.assertEqual(out[0], "one")
        self.assertEqual(out[1:3], ["1", "3"])
        self.assertEqual(out[-1], "two")

    def test_python_redis_runs_throttle_and_a_pipeline_in_order(self):
        self.assertTrue(self.client.ping())
        first = self.client.execute_command("CL.THROTTLE", "py", 4, 1, 3600)
        self.assertEqual(first, [0, 5, 4, -1, 3600])
        self.assertEqual(self.client.execute_command("CL.THROTTLE", "py", 4, 1, 3600, 4)[:3],
                         [0, 5, 0])
        self.assertEqual(self.client.execute_command("CL.THROTTLE", "py", 4, 1, 3600, 0)[:3],
                         [0, 5, 0])  # quantity 0 spends nothing and is never limited
        limited = self.client.execute_command("CL.THROTTLE", "py", 4, 1, 3600)
        self.assertEqual(limited[:3], [1, 5, 0])
        self.assertGreater(limited[3], 3500)
        pipe = self.client.pipeline(transaction=False)
        for i in range(200):
            pipe.execute_command("ECHO", "m%d" % i)
            pipe.execute_command("SLUICE.ACQUIRE", "api", "p%d" % (i % 3))
        replies = pipe.execute()
        self.assertEqual([r for r in replies[0::2]], [b"m%d" % i for i in range(200)])
        allowed = [r[0] for r in replies[1::2]]
        self.assertEqual(sum(allowed), 15)  # five a key, three keys
        self.assertEqual(allowed[:15], [1] * 15)

    def test_ioredis_runs_throttle_acquire_and_a_pipeline(self):
        # A copy of resp_node/ with ioredis from `npm ci`, so npm writes
        # nothing into the tree.
        work = make_dir("sl-ioredis.")
        self.addCleanup(shutil.rmtree, work, True)
        for name in ("package.json", "package-lock.json", "throttle.js"):
            shutil.copy(os.path.join(NODE_DIR, name), work)
        npm = subprocess.run(["npm", "ci", "--prefer-offline", "--no-audit", "--no-fund"],
                             cwd=work, capture_output=True, text=True, timeout=90)
        self.assertEqual(npm.returncode, 0, npm.stdout + npm.stderr)
        run = subprocess.run(["node", "throttle.js", str(self.port)], cwd=work,
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(run.returncode, 0, run.stderr)
        out = json.loads(run.stdout)
        self.assertEqual([t[:3] for t in out["throttle"]],
                         [[0, 3, 2], [0, 3, 1], [0, 3, 0], [1, 3, 0]])
        self.assertEqual(out["acquire"][:3], [1, 4, 5])
        self.assertEqual(out["piped"][0::2], ["m%d" % i for i in range(50)])
        self.assertTrue(all(p[:3] == [1, 4, 5] for p in out["piped"][1::2]), out["piped"][:4])
        self.assertIn("unknown command 'GET'", out["unknown"])

    def test_errors_name_the_problem_and_the_daemon_answers_on(self):
        with self.assertRaisesRegex(redis.ResponseError, "UNKNOWN_RULE"):
            self.client.execute_command("SLUICE.ACQUIRE", "nosuch", "k")
        with self.assertRaisesRegex(redis.ResponseError, "unknown command 'GET'"):
            self.client.get("x")
        with self.assertRaisesRegex(redis.ResponseError, "period"):
            self.client.execute_command("CL.THROTTLE", "k", 1, 1, 0)
        for garbage in (b"*1\r\n$-5\r\n", b"*99999999\r\n", b"*1\r\n:1\r\n",
                        b"*1\r\n$99999999\r\n", b"\x00\xff" * 40000):
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                s.sendall(garbage)
                reply = s.makefile("rb").readline()
                self.assertTrue(reply.startswith(b"-ERR Protocol error"), (garbage[:20], reply))
        self.assertTrue(self.client.ping())

    def test_malformed_resp_is_answered_while_its_client_still_sends(self):
        # A small send buffer: what follows the malformed command goes out
        # only as the daemon reads it. A daemon that closed at its -ERR would
        # reset the connection and fail this sendall; it lingers, reading
        # and dropping the rest.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
            s.settimeout(5)
            s.connect(("127.0.0.1", self.port))
            s.sendall(b"*1\r\n$-5\r\n" + b"x" * 300_000)
            reply = s.makefile("rb").read()  # to the end of the stream, no reset
            self.assertTrue(reply.startswith(b"-ERR Protocol error"), reply[:80])
            self.assertEqual(reply.count(b"\r\n"), 1, reply[:200])

    def test_one_parameter_set_too_many_is_refused(self):
        for count in (1, 2, 3):
            self.client.execute_command("CL.THROTTLE", "k", 1, count, 60)
        with self.assertRaisesRegex(redis.ResponseError, "max_parameter_sets"):
            self.client.execute_command("CL.THROTTLE", "k", 1, 4, 60)
        # A set already held is still answered.
        self.assertEqual(self.client.execute_command("CL.THROTTLE", "k", 1, 3, 60)[1], 2)


LIMITS_CONFIG = """
[daemon]
socket = "{socket}"
socket_mode = "0666"
workers = 2

[limits]
max_connections = 4
idle_timeout = "400ms"
partial_frame_timeout = "200ms"

[resp]
listen = "{listen}"

[access]
users = [1234]
"""

NOBODY = 65534


def closed_by_daemon(sock):
    """Reads until the daemon closes `sock`; what it sent, or None on a timeout."""
    sock.settimeout(5)
    data = b""
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return data
            data += chunk
    except socket.timeout:
        return None
    except ConnectionResetError:
        return data


class RespLimitsTest(unittest.TestCase):
    """A Unix [resp] listen with tight [limits] and an [access] list."""

    def setUp(self):
        self.daemon = Daemon("resp-limits")
        self.addCleanup(self.daemon.stop)
        os.chmod(self.daemon.dir, 0o755)  # another user reaches the socket through it
        self.path = os.path.join(self.daemon.dir, "resp.sock")
        self.daemon.start(LIMITS_CONFIG.format(socket=self.daemon.socket,
                                               listen="unix:" + self.path))
        self.assertTrue(wait_for(lambda: os.path.exists(self.path), 10), self.daemon.logs())

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(sock.close)
        sock.settimeout(5)
        sock.connect(self.path)
        return sock

    def ping(self, sock):
        sock.sendall(b"PING\r\n")
        return sock.recv(64)

    def test_half_sent_and_silent_connections_are_closed_at_their_timeouts(self):
        half = self.connect()
        half.sendall(b"*2\r\n$4\r\nECHO\r\n$5\r\nhel")
        silent = self.connect()
        self.assertEqual(self.ping(silent), b"+PONG\r\n")
        self.assertEqual(closed_by_daemon(half), b"")
        self.assertEqual(closed_by_daemon(silent), b"")
        closed = self.daemon.ask("stats")["connections"]["closed"]
        self.assertEqual(closed["partial_frame"], 1, closed)
        self.assertGreaterEqual(closed["idle"], 1, closed)

    def test_a_connection_past_max_connections_is_told_and_closed(self):
        # The socket's connections and the listener's count together; the
        # harness may hold one on the socket.
        served = []
        for _ in range(5):
            sock = self.connect()
            try:
                sock.sendall(b"PING\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused and closed already; what it was told is still there
            reply = sock.recv(4096)
            if reply != b"+PONG\r\n":
                break
            served.append(sock)
        self.assertIn(len(served), (3, 4))
        self.assertTrue(reply.startswith(b"-ERR max number of clients reached"), reply)
        self.assertIn(b"max_connections", reply)
        self.assertEqual(self.ping(served[0]), b"+PONG\r\n")

    @unittest.skipUnless(os.geteuid() == 0, "connecting as another user needs root")
    def test_a_user_access_does_not_allow_is_told_and_closed(self):
        os.seteuid(NOBODY)
        try:
            refused = self.connect()
        finally:
            os.seteuid(0)
        reply = closed_by_daemon(refused)
        self.assertEqual(reply, b"-FORBIDDEN this user may not use sluiced ([access])\r\n")
        self.assertEqual(self.ping(self.connect()), b"+PONG\r\n")  # root is allowed


class RespAddressTakenTest(unittest.TestCase):
    def test_a_taken_address_stops_the_daemon_saying_what_to_do(self):
        taken = socket.socket()
        self.addCleanup(taken.close)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        daemon = Daemon("resp-taken")
        self.addCleanup(daemon.stop)
        proc = daemon.start(CONFIG.format(socket=daemon.socket,
                                          listen="127.0.0.1:%d" % taken.getsockname()[1]),
                            wait=False)
        self.assertEqual(proc.wait(timeout=20), 1, daemon.logs())
        self.assertIn("choose another [resp] listen", daemon.logs())


class RespFleetTest(unittest.TestCase):
    def test_two_daemons_on_one_redis_hold_one_throttle_limit(self):
        server = Redis()
        self.addCleanup(server.stop)
        clients = []
        daemons = []
        for index in range(2):
            port = free_port()
            daemons.append(start(self, PAIR_CONFIG.format(socket="{socket}", resp_port=port,
                                                          redis_port=server.port, index=index),
                                 port, "resp-%d" % index))
            client = redis.Redis(port=port)
            self.addCleanup(client.close)
            clients.append(client)
        self.assertTrue(wait_for(lambda: all(
            d.ask("health")["nodes"] == 2 and d.ask("health")["breaker"] == "closed"
            for d in daemons), 10), daemons[0].logs())
        # max_burst 9, one a day: ten in all, however they fall on the nodes.
        replies = [clients[i % 2].execute_command("CL.THROTTLE", "shared", 9, 1, 86400)
                   for i in range(30)]
        self.assertEqual(sum(1 for r in replies if r[0] == 0), 10,
                         (replies, daemons[0].logs(), daemons[1].logs()))
        self.assertTrue(all(r[1] == 10 for r in replies))


def tearDownModule():
    tear_down_module()


if __name__ == "__main__":
    unittest.main()
