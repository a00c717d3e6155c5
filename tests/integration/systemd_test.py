#!/usr/bin/python3
"""sluiced under systemd, without a running systemd: readiness, status, reload,
stop and watchdog notifications read from a NOTIFY_SOCKET the test binds, and
socket activation through a listening socket the test (or
systemd-socket-activate) holds and passes as fd 3, as systemd does.

Needs SLUICED (the daemon binary) in the environment; run with /usr/bin/python3
(python3-msgpack). Also checks `systemd-analyze security` of the shipped unit.
"""

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Client, Daemon, Redis, end_process, free_port, redis_section,  # noqa: E402
                     tear_down_module, wait_for)
UNIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "systemd",
                    "sluiced.service")

# ptrace(2) requests that stop one thread without a signal, so the rest of
# the process runs on (a SIGSTOP would stop every thread).
PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
WAIT_ALL = 0x40000000  # __WALL: wait for a thread that is not the leader


def thread_id(pid, name):
    """The id of the thread of `pid` named `name` (its comm)."""
    for tid in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
            if f.read().strip() == name:
                return int(tid)
    raise LookupError("no thread %s in %d" % (name, pid))


@contextlib.contextmanager
def frozen(tid):
    """Holds thread `tid` stopped (ptrace seize + interrupt) for the body."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    for request in (PTRACE_SEIZE, PTRACE_INTERRUPT):
        if libc.ptrace(request, tid, None, None) != 0:
            raise OSError(ctypes.get_errno(), "ptrace(%#x, %d)" % (request, tid))
    os.waitpid(tid, WAIT_ALL)
    try:
        yield
    finally:
        libc.ptrace(PTRACE_DETACH, tid, None, None)


CONFIG = """
[daemon]
socket = "{socket}"
workers = 2
log_level = "info"

[[rule]]
name = "one"
algorithm = "token_bucket"
limit = 1
period = "1h"
"""

# A global rule; the test prepends redis_section(port).
REDIS_RULE = """
[[rule]]
name = "shared"
algorithm = "token_bucket"
limit = 100
period = "1h"
scope = "global"
"""


class Notifications:
    """A NOTIFY_SOCKET: the datagrams sluiced sends, as dicts of their fields."""

    def __init__(self, directory):
        self.path = os.path.join(directory, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.seen = []

    def next(self, timeout=5):
        """The next message, or None after `timeout` seconds without one."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096)
        except socket.timeout:
            return None
        fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
        self.seen.append(fields)
        return fields

    def wait(self, key, timeout=5):
        """Reads until a message has `key`; returns that message or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = self.next(max(deadline - time.monotonic(), 0.01))
            if message is not None and key in message:
                return message
        return None

    def close(self):
        self.sock.close()


class SystemdCase(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon(dir_prefix="sd.")
        self.addCleanup(self.daemon.stop)
        self.notify = Notifications(self.daemon.dir)
        self.addCleanup(self.notify.close)
        self.write_config("")

    def write_config(self, extra):
        self.daemon.write_config(CONFIG.format(socket=self.daemon.socket) + extra)

    def start(self, watchdog_us=None, listen_fd=None, args=()):
        """sluiced with NOTIFY_SOCKET (and WATCHDOG_USEC), not waiting for its
        socket (the tests wait for READY=1); with `listen_fd`, that socket is
        passed as fd 3 with LISTEN_FDS=1, as systemd does."""
        env = dict(os.environ, NOTIFY_SOCKET=self.notify.path)
        if watchdog_us is not None:
            env["WATCHDOG_USEC"] = str(watchdog_us)
        prefix, pass_fds = (), ()
        if listen_fd is not None:
            # LISTEN_PID must be the daemon's own pid: let the shell that
            # becomes sluiced set it, and move the socket to fd 3.
            prefix = ["/bin/sh", "-c",
                      'LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" "$@" 3<&%d' % listen_fd]
            pass_fds = (listen_fd,)
        return self.daemon.start(wait=False, prefix=prefix, args=args, env=env,
                                 pass_fds=pass_fds)

    def stop(self, proc):
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=10), 0, self.daemon.logs())


class NotifyTest(SystemdCase):
    # Verifies READY=1 comes once the socket accepts (not before), with a
    # STATUS= line, then watchdog pings at half the interval, RELOADING=1 and
    # READY=1 around a SIGHUP, and STOPPING=1 on SIGTERM.
    def test_ready_watchdog_reload_and_stop(self):
        proc = self.start(watchdog_us=200_000)
        ready = self.notify.wait("READY", timeout=10)
        self.assertIsNotNone(ready, self.daemon.logs())
        # The first message is READY=1: nothing was announced before.
        self.assertEqual(self.notify.seen[0].get("READY"), "1", self.notify.seen)
        self.assertTrue(ready["STATUS"].startswith("normal:"), ready)
        client = Client(self.daemon.socket)  # accepting at READY=1, without retrying
        self.assertTrue(client.result("acquire", "one", "k")["allowed"])

        started = time.monotonic()
        pings = 0
        while time.monotonic() - started < 1.0:
            message = self.notify.next(timeout=1)
            if message and message.get("WATCHDOG") == "1":
                pings += 1
        print("\nmeasured: %d watchdog pings in 1 s with WatchdogSec=200ms" % pings)
        # One every 100 ms; a loaded machine (sanitizers, parallel tests) may
        # delay some, but systemd would restart a daemon that missed two.
        self.assertGreaterEqual(pings, 4)
        self.assertLessEqual(pings, 12)

        proc.send_signal(signal.SIGHUP)
        self.assertIsNotNone(self.notify.wait("RELOADING"), self.notify.seen[-5:])
        reloaded = self.notify.wait("READY")
        self.assertIsNotNone(reloaded)
        self.assertTrue(reloaded["STATUS"].startswith("reloaded;"), reloaded)

        proc.send_signal(signal.SIGTERM)
        self.assertIsNotNone(self.notify.wait("STOPPING"), self.notify.seen[-5:])
        self.assertEqual(proc.wait(timeout=10), 0, self.daemon.logs())
        client.close()
        self.assertFalse(os.path.exists(self.daemon.socket))  # its own socket: removed

    # Verifies the watchdog is fed only while every worker's loop answers:
    # with one worker thread held stopped, WATCHDOG=1 stops and the log says
    # which worker; once it runs again, the pings come back.
    def test_stuck_worker_withholds_the_watchdog(self):
        proc = self.start(watchdog_us=200_000)
        self.assertIsNotNone(self.notify.wait("READY", timeout=10), self.daemon.logs())
        self.assertIsNotNone(self.notify.wait("WATCHDOG", timeout=2))
        with frozen(thread_id(proc.pid, "sluice-w1")):
            # A ping answered just before the freeze may still feed one round.
            self.notify.wait("never", timeout=0.3)
            pings = 0
            started = time.monotonic()
            while time.monotonic() - started < 1.0:
                message = self.notify.next(timeout=0.1)
                pings += bool(message and message.get("WATCHDOG") == "1")
            self.assertEqual(pings, 0, "the watchdog was fed while worker 1 was stopped")
        self.assertIsNotNone(self.notify.wait("WATCHDOG", timeout=2), self.daemon.logs())
        self.stop(proc)
        self.assertIn("worker 1 has not answered the watchdog ping", self.daemon.logs())
        self.assertIn("every worker answers again", self.daemon.logs())

    # Verifies a daemon whose config does not load never says READY=1.
    def test_bad_config_never_says_ready(self):
        self.write_config("[[rule]]\nname = 3\n")
        proc = self.start()
        self.assertEqual(proc.wait(timeout=10), 1)
        self.assertIsNone(self.notify.next(timeout=0.2))
        self.assertIn("sluice.toml", self.daemon.logs())

    # Verifies STATUS= follows Redis: fallback while Redis is unreachable,
    # normal once it answers, fallback again when it dies.
    def test_status_follows_redis(self):
        port = free_port()
        self.write_config(redis_section(port) + REDIS_RULE)
        proc = self.start()
        ready = self.notify.wait("READY", timeout=10)
        self.assertIsNotNone(ready, self.daemon.logs())
        self.assertTrue(ready["STATUS"].startswith("fallback:"), ready)

        redis = Redis(port=port)
        try:
            normal = self.notify.wait("STATUS", timeout=10)
            while normal is not None and not normal["STATUS"].startswith("normal:"):
                normal = self.notify.wait("STATUS", timeout=10)
            self.assertIsNotNone(normal, self.notify.seen)
            self.assertIn("1 live nodes", normal["STATUS"])
            redis.kill()
            fallback = self.notify.wait("STATUS", timeout=10)
            self.assertIsNotNone(fallback, self.notify.seen)
            self.assertTrue(fallback["STATUS"].startswith("fallback:"), fallback)
        finally:
            redis.stop()
        self.stop(proc)


class SocketActivationTest(SystemdCase):
    def listening_socket(self):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.daemon.socket)
        os.chmod(self.daemon.socket, 0o660)
        listener.listen(64)
        return listener

    # Verifies sluiced serves a socket passed as fd 3, leaves it in place when
    # it stops, and that a client who connects while no daemon runs (systemd
    # holds the socket) is answered by the next daemon: restarts lose nothing.
    def test_passed_socket_survives_a_restart(self):
        listener = self.listening_socket()
        try:
            first = self.start(listen_fd=listener.fileno())
            self.assertIsNotNone(self.notify.wait("READY", timeout=10), self.daemon.logs())
            client = Client(self.daemon.socket)
            self.assertTrue(client.result("acquire", "one", "a")["allowed"])
            client.close()
            self.stop(first)
            self.assertIn("passed by systemd", self.daemon.logs())
            self.assertTrue(os.path.exists(self.daemon.socket))  # systemd's socket: left alone

            # No daemon: the connection waits in the backlog.
            waiting = Client(self.daemon.socket)
            waiting.send([0, 1, "acquire", ["one", "b", 1]])
            second = self.start(listen_fd=listener.fileno())
            response = waiting.recv()
            self.assertIsNone(response[2], response)
            self.assertTrue(response[3]["allowed"], response)
            waiting.close()
            self.stop(second)
        finally:
            listener.close()

    # Verifies the real systemd-socket-activate starts sluiced on the first
    # connection and sluiced answers it on the socket it was handed.
    def test_systemd_socket_activate(self):
        proc = self.daemon.start(wait=False, prefix=[
            "systemd-socket-activate", "-l", self.daemon.socket,
            "-E", "NOTIFY_SOCKET=" + self.notify.path])
        try:
            self.assertTrue(wait_for(lambda: os.path.exists(self.daemon.socket), 10),
                            self.daemon.logs())
            client = Client(self.daemon.socket)
            client.send([0, 7, "acquire", ["one", "c", 1]])
            response = client.recv()
            self.assertEqual(response[1], 7)
            self.assertTrue(response[3]["allowed"], response)
            self.assertIsNotNone(self.notify.wait("READY", timeout=10), self.daemon.logs())
            client.close()
            self.stop(proc)  # the same process: systemd-socket-activate execs sluiced
            self.assertIn("passed by systemd", self.daemon.logs())
        finally:
            end_process(proc)


class UnitTest(unittest.TestCase):
    # Verifies the shipped unit's hardening scores at most 2.0 in
    # `systemd-analyze security` (lower is safer; 10 is fully exposed).
    def test_security_exposure_is_at_most_two(self):
        result = subprocess.run(["systemd-analyze", "security", "--offline=yes", UNIT],
                                capture_output=True, text=True)
        match = re.search(r"Overall exposure level for sluiced\.service: ([0-9.]+)", result.stdout)
        self.assertIsNotNone(match, result.stdout + result.stderr)
        print("\nmeasured: systemd-analyze security: %s" % match.group(1))
        self.assertLessEqual(float(match.group(1)), 2.0)


def tearDownModule():
    tear_down_module()


if __name__ == "__main__":
    unittest.main(verbosity=2)
