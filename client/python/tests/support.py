"""support.py: what the Python client's tests share: the import paths (this
package from the source tree, tests/integration/harness.py for the daemon
under test), a daemon with the rules every test module uses, and the rule
numbers the tests compute expectations from.

The tests run with /usr/bin/python3 (python3-msgpack) and unittest; SLUICED
names the daemon binary, FORMAT_HEADERS libsluice's header formatter as a
filter (tests/support/format_headers.c).
"""

import os
import shutil
import signal
import socket
import sys
import threading

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(PACKAGE_DIR))
sys.path.insert(0, PACKAGE_DIR)
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))

import harness  # noqa: E402

# `wide`: a window no test empties and that does not refill within a test
# (366 days long), so a fresh key's remaining after cost c is WIDE - c,
# which tells every answer of a pipeline apart.
WIDE = 1_000_000_000
# `small`: SMALL a minute, for denials.
SMALL = 3
# `held`: 10 a second with no burst, waiting up to 2 s: the second acquire
# on a key is held about 100 ms before it is answered.
HELD_INTERVAL_MS = 100
# `conc`: CONC units held at once.
CONC = 2
# `budget`: BUDGET units in a window no test ends, for reserve and settle:
# a refund or a debt shows in the next answer's remaining exactly.
BUDGET = 10
# `capped`: BUDGET units like `budget`, and a key may owe at most CAPPED_DEBT:
# a settle's excess past it is unpaid.
CAPPED_DEBT = 2

CONFIG = """
[daemon]
socket = "{socket}"
workers = 1
log_level = "warn"

[[rule]]
name = "wide"
algorithm = "fixed_window"
limit = %d
period = "366d"

[[rule]]
name = "small"
algorithm = "token_bucket"
limit = %d
period = "1m"

[[rule]]
name = "held"
algorithm = "token_bucket"
limit = 10
period = "1s"
burst = 1
max_wait = "2s"

[[rule]]
name = "conc"
algorithm = "concurrency"
limit = %d

[[rule]]
name = "budget"
algorithm = "fixed_window"
limit = %d
period = "366d"

[[rule]]
name = "capped"
algorithm = "fixed_window"
limit = %d
period = "366d"
max_debt = %d
""" % (WIDE, SMALL, CONC, BUDGET, BUDGET, CAPPED_DEBT)


def start_daemon(test, config=CONFIG):
    """A sluiced with CONFIG on a socket of its own, stopped at the test's
    cleanup."""
    daemon = harness.Daemon(dir_prefix="slpy.")
    test.addCleanup(daemon.stop)
    daemon.start(config.format(socket=daemon.socket))
    return daemon


def restart_daemon(daemon, config=CONFIG):
    """Kills the daemon (SIGKILL: it answers nothing more) and starts a fresh
    one, with no state, on the same socket."""
    harness.end_process(daemon.proc)
    os.unlink(daemon.socket)
    daemon.start(config.format(socket=daemon.socket))


def tear_down_module():
    harness.tear_down_module()


def _stopped(pid):
    """Whether every thread of process `pid` is stopped (state T)."""
    task_dir = "/proc/%d/task" % pid
    for tid in os.listdir(task_dir):
        try:
            with open(os.path.join(task_dir, tid, "stat")) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        if state not in ("T", "t"):
            return False
    return True


def stop(pid):
    """SIGSTOPs process `pid` and waits until every thread of it has stopped
    (a signal takes effect a moment after kill() returns)."""
    os.kill(pid, signal.SIGSTOP)
    if not harness.wait_for(lambda: _stopped(pid), 5):
        os.kill(pid, signal.SIGCONT)
        raise RuntimeError("process %d did not stop" % pid)


class stopped:
    """`with stopped(daemon):` the daemon is stopped (stop()) and SIGCONTinued
    at the end."""

    def __init__(self, daemon):
        self.pid = daemon.proc.pid

    def __enter__(self):
        stop(self.pid)
        return self

    def __exit__(self, *exc_info):
        os.kill(self.pid, signal.SIGCONT)


class RecordingUnpacker:
    """Stands in for a connection's msgpack.Unpacker and notes the msgid of
    every frame it decodes, in the order they arrived."""

    def __init__(self, unpacker):
        self.unpacker = unpacker
        self.arrived = []

    def feed(self, data):
        self.unpacker.feed(data)

    def __iter__(self):
        for message in self.unpacker:
            self.arrived.append(message[1])
            yield message


def record_arrivals(client):
    """The RecordingUnpacker now decoding for a connected client."""
    recorder = RecordingUnpacker(client._conn.unpacker)
    client._conn.unpacker = recorder
    return recorder


class FakeDaemon:
    """A stand-in for sluiced on a Unix socket of its own, for answers the
    real daemon never gives. answer(request) returns what to send back for
    each request, a list of MessagePack values or raw bytes; connections
    are served one after another on a thread. Closed at the test's cleanup."""

    def __init__(self, test, answer):
        self.answer = answer
        self.dir = harness.make_dir("slfk.")
        self.socket = os.path.join(self.dir, "s.sock")
        self.connections = 0
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.socket)
        self.listener.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        test.addCleanup(self.close)

    def _serve(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.connections += 1
            with conn:
                unpacker = msgpack.Unpacker(raw=False)
                while True:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        break
                    if not data:
                        break
                    unpacker.feed(data)
                    for request in unpacker:
                        for reply in self.answer(request):
                            conn.sendall(reply if isinstance(reply, bytes) else
                                         msgpack.packb(reply, use_bin_type=True))

    def close(self):
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self.thread.join(5)
        shutil.rmtree(self.dir, ignore_errors=True)


def odd_answers(request):
    """FakeDaemon answers for the protocol tests: before each answer a
    notification and an answer to a msgid nobody asked for (both to be
    skipped); a peek of key "garbage" gets a frame that is no response."""
    _, msgid, method, params = request
    if method == "peek" and params[1] == "garbage":
        return [["not", "a", "response"]]
    decision = {"allowed": True, "remaining": 7, "limit": 9, "reset_after_ms": 1,
                "retry_after_ms": 0, "mode": "local", "future_field": [1, 2]}
    if params and params[1] == "bad-decision":
        decision = {"remaining": 7}
    return [[2, "note", []], [1, (msgid + 1000) & 0xFFFFFFFF, None, {}],
            [1, msgid, None, decision]]
