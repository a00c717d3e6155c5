#!/usr/bin/python3
"""Bad-input and exhaustion tests against the real sluiced: hostile or broken
clients that try to make the daemon allocate, wait, hold descriptors or answer
wrongly, each followed by the checks that it did not.

protocol_test.py already covers one of each basic case (a frame over the
limit, a 4 GiB str header, bytes that are not MessagePack, one idle and one
half-sent frame, a client that never reads, a few connections over the limit,
running out of descriptors). This file pushes further: every kind of length
header, nesting 100,000 deep, the whole catalogue of malformed requests and
notifications, slowloris trickles, a flood of connections, a million
pipelined requests never read, 300,000 distinct keys against a small table,
and keys at and over max_key_bytes, in the local table and in Redis.

After each attack a test asserts three things
(MeasuredDaemon.assert_unharmed): the process is alive, a fresh client's
acquire is answered within PROMPT_ANSWER_S, and the daemon's resident memory
(VmRSS from /proc/PID/status) grew by at most what the limits in play allow
plus RSS_SLACK_BYTES.

Run by ctest with SLUICED naming the daemon binary; about 10 s. Under a
sanitizer or valgrind (seen in the daemon's memory map) the time bounds
stretch and the RSS bounds are not checked.
"""

import os
import select
import socket
import sys
import threading
import time
import unittest

import msgpack

from harness import (STATE_VERSION, Client, Daemon, Redis, redis_section, tear_down_module,
                     wait_for)

# A fresh client's acquire after an attack must be answered within this; a
# normal answer takes well under a millisecond, so this only allows for a
# busy shared CI machine. Scaled by MeasuredDaemon.slowdown under instrumentation.
PROMPT_ANSWER_S = 0.2

PROMPT_TRIES = 3

# A graceful stop (SIGTERM) must end the daemon within this (scaled too).
STOP_TIMEOUT_S = 10

# An instrumented daemon, recognised by the runtime mapped into it, runs this
# many times slower; its memory is not the daemon's own (shadow memory, and a
# quarantine that keeps freed blocks: 256 MB under ASan, 20 MB under
# memcheck), so RSS bounds are not checked for it.
INSTRUMENTED_SLOWDOWN = {"libasan": 5, "libtsan": 10, "vgpreload_memcheck": 30}

# What the daemon's RSS may grow by beyond what the limits in play allow:
# glibc's per-thread malloc arenas grow in steps and keep freed memory for
# reuse, and newly touched stack and heap pages add a little. Measured (each
# test prints its figure): at most 0.6 MiB over the limit-derived bound (the
# long keys), 0.4 MiB where the bound is 0. 4 MiB leaves room for a busier
# allocator; a daemon that buffered an attacker's bytes (16 to 100 MiB sent
# in these tests) or believed a declared length (GiBs) fails by far.
# Under valgrind the bounds do not hold: memcheck keeps 20 MB of freed blocks
# in quarantine, and the two key-churn tests exceed them.
RSS_SLACK_BYTES = 4 << 20

# The limits of the daemon under test; the bounds below are derived from them.
MAX_CONNECTIONS = 64
MAX_FRAME_BYTES = 256 << 10
MAX_OUTPUT_BYTES = 1 << 20
MAX_KEYS = 10_000
MAX_KEY_MEMORY_BYTES = 4 << 20
WORKERS = 2
# What the key table may add to RSS under churn. key_table.h bounds its live
# bytes: max_memory of linked entries plus up to an eighth of that retired and
# not yet freed. Each worker allocates the entries it inserts from its own
# glibc arena, which keeps the pages of freed entries for reuse, so with keys
# churning through every worker each arena can come to hold pages for about a
# whole table (measured: 4.8 MiB in each of the 2 arenas for max_memory =
# 4 MiB of 4 KB keys). The bucket array is allocated at start: in the baseline.
KEY_TABLE_BOUND_BYTES = WORKERS * MAX_KEY_MEMORY_BYTES * 9 // 8
# The daemon's default max_key_bytes, on purpose not set in the config: the
# test holds the documented default to what the daemon enforces.
DEFAULT_MAX_KEY_BYTES = 4096
DEFAULT_MAX_DEPTH = 16
DEFAULT_MAX_ITEMS = 1024
# Bytes each read of a connection offers (daemon/connection.cpp,
# kReadChunkBytes): a half-received frame may take max_frame_bytes plus this.
READ_CHUNK_BYTES = 64 << 10

# The daemon's fd count is taken once it has held still this long.
FD_SETTLE_S = 0.2
# health's "handles" (the libuv handles open on every loop) counts each loop
# as of its last tick, at most a second old here (no Redis): the count is
# settled once it has stayed the same for longer than that.
HANDLES_SETTLE_S = 1.2

# Short timeouts for TimeoutTest: a slowloris sends one byte per
# TRICKLE_INTERVAL_S, often enough never to be idle, so only the
# partial-frame timeout can close it.
PARTIAL_FRAME_TIMEOUT_MS = 1500
IDLE_TIMEOUT_MS = 2500
TRICKLE_INTERVAL_S = 1.0
# The worker checks timeouts every min(idle, partial) / 4 (worker.cpp); a
# close may come that much late, plus scheduling on a busy shared machine.
TIMEOUT_SLACK_S = 2.0

CONFIG = """
[daemon]
socket = "{socket}"
workers = {workers}
log_level = "error"

[limits]
max_connections = {max_connections}
max_frame_bytes = {max_frame_bytes}
max_output_bytes = {max_output_bytes}
idle_timeout = "{idle}"
partial_frame_timeout = "{partial}"

[keys]
max_keys = {max_keys}
max_memory = {max_key_memory}

[[rule]]
name = "five"
algorithm = "token_bucket"
limit = 5
period = "1s"

[[rule]]
name = "once"
algorithm = "fixed_window"
limit = 1
period = "1h"

[[rule]]
name = "once_too"
algorithm = "fixed_window"
limit = 1
period = "1h"

[[rule]]
name = "roomy"
algorithm = "token_bucket"
limit = 1000000000
period = "1s"
"""

GLOBAL_RULE = """
[[rule]]
name = "global_once"
algorithm = "token_bucket"
limit = 1
period = "1h"
scope = "global"
"""


def proc_status(pid, field):
    """A numeric field of /proc/PID/status (VmRSS in KiB, Threads)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def rss_bytes(pid):
    return proc_status(pid, "VmRSS") * 1024


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def held_fd_count(pid):
    """The descriptors of a listing of pid's that are still open once it is
    read: the kernel lists them one by one while the daemon accepts and
    closes, and under ASan a listing during a flood was seen to name two
    descriptors that were both closed by the time it was read (1 run in 3),
    one more than the one being refused that the bound allows for."""
    held = 0
    for name in os.listdir("/proc/%d/fd" % pid):
        try:
            os.readlink("/proc/%d/fd/%s" % (pid, name))
            held += 1
        except OSError:
            pass
    return held


def packb(obj):
    return msgpack.packb(obj, use_bin_type=True)


def nested_array(depth, inner=b"\xc0"):
    """`depth` one-element arrays around `inner`, as raw MessagePack."""
    return b"\x91" * depth + inner


class MeasuredDaemon(Daemon):
    """A sluiced on a private socket with CONFIG's limits (overridable), and
    the measurements the tests make of it."""

    def __init__(self, idle="1m", partial="10s", extra="", count_handles=False, **limits):
        super().__init__(dir_prefix="ex.")
        values = dict(socket=self.socket, workers=WORKERS, max_connections=MAX_CONNECTIONS,
                      max_frame_bytes=MAX_FRAME_BYTES, max_output_bytes=MAX_OUTPUT_BYTES,
                      idle=idle, partial=partial, max_keys=MAX_KEYS,
                      max_key_memory=MAX_KEY_MEMORY_BYTES)
        values.update(limits)
        self.start(CONFIG.format(**values) + extra, accept_timeout_s=60)
        self.pid = self.proc.pid
        self.instrumented = [name for name in INSTRUMENTED_SLOWDOWN if self.maps_library(name)]
        self.slowdown = max([INSTRUMENTED_SLOWDOWN[n] for n in self.instrumented] or [1])
        # Warm every worker before the baseline is taken: its first requests
        # touch its buffers and arena, and its loop's first connection opens
        # a descriptor it keeps (libuv's reserve for running out of them).
        # Connections open at once are spread over the workers.
        clients = [Client(self.socket) for _ in range(WORKERS)]
        for client in clients:
            client.result("acquire", "roomy", "warm-up")
            client.result("stats")
        for client in clients[1:]:
            client.close()
        if not wait_for(lambda: clients[0].result("health")["connections"] == 1, 10):
            raise RuntimeError("warm-up connections stay open: " + self.logs())
        clients[0].close()
        self.baseline_fds = self.settled_fds()
        self.baseline_rss = rss_bytes(self.pid)
        # With count_handles, assert_fds_back_to_baseline checks the handles too.
        self.count_handles = count_handles
        self.baseline_handles = self.settled_handles() if count_handles else None

    def settled_handles(self, timeout_s=10):
        """health's handle count, asked on one connection, once it has not
        changed for HANDLES_SETTLE_S; None if it keeps changing."""
        client = Client(self.socket)
        try:
            last, since = client.result("health")["handles"], time.monotonic()
            deadline = since + timeout_s * self.slowdown
            while time.monotonic() < deadline:
                if time.monotonic() - since >= HANDLES_SETTLE_S:
                    return last
                time.sleep(0.05)
                now = client.result("health")["handles"]
                if now != last:
                    last, since = now, time.monotonic()
            return None
        finally:
            client.close()

    def settled_fds(self):
        """The fd count once it has not changed for FD_SETTLE_S (a closed
        client's descriptor goes a loop turn later)."""
        last, since = fd_count(self.pid), time.monotonic()
        deadline = since + 5
        while time.monotonic() - since < FD_SETTLE_S and time.monotonic() < deadline:
            time.sleep(0.02)
            now = fd_count(self.pid)
            if now != last:
                last, since = now, time.monotonic()
        return last

    def assert_fds_back_to_baseline(self, test, timeout_s):
        """The fd count settles at its baseline within timeout_s, and so
        does the libuv handle count when it was taken (count_handles)."""
        back = wait_for(lambda: self.settled_fds() == self.baseline_fds, timeout_s * self.slowdown)
        fds = sorted(os.readlink("/proc/%d/fd/%s" % (self.pid, fd))
                     for fd in os.listdir("/proc/%d/fd" % self.pid))
        test.assertTrue(back, "%d fds, baseline %d: %s" % (len(fds), self.baseline_fds, fds))
        if self.count_handles:
            test.assertIsNotNone(self.baseline_handles, "the handle count never settled")
            handles = self.settled_handles()
            sys.stderr.write("\nmeasured: %s libuv handles, baseline %d "
                             % (handles, self.baseline_handles))
            test.assertEqual(handles, self.baseline_handles)

    def stop(self):
        """Stops the daemon with SIGTERM (SIGKILL after STOP_TIMEOUT_S);
        returns its exit status, and its log when that is not 0."""
        status = self.terminate(STOP_TIMEOUT_S * self.slowdown)
        logs = self.logs() if status != 0 else ""
        super().stop()
        return status, logs

    def assert_unharmed(self, test, allowed_growth_bytes=0):
        """The daemon is alive, answers a fresh client's acquire within
        PROMPT_ANSWER_S (the best of PROMPT_TRIES), and its RSS grew by at
        most allowed_growth_bytes + RSS_SLACK_BYTES since start."""
        test.assertIsNone(self.proc.poll(), "sluiced died:\n" + self.logs())
        # The best of PROMPT_TRIES: a harmed daemon fails every one, a busy
        # machine rarely.
        waits = []
        for _ in range(PROMPT_TRIES):
            started = time.monotonic()
            client = Client(self.socket)
            try:
                result = client.result("acquire", "roomy", "polite-%f" % started)
            finally:
                client.close()
            waits.append(time.monotonic() - started)
            test.assertTrue(result["allowed"])
        test.assertLess(min(waits), PROMPT_ANSWER_S * self.slowdown,
                        "a fresh client waited %s ms" % [round(w * 1e3) for w in waits])
        self.assert_rss_within(test, allowed_growth_bytes)

    def assert_rss_within(self, test, allowed_growth_bytes, rss=None, since=None):
        """RSS (now, or the `rss` measured earlier) grew by at most
        allowed_growth_bytes + RSS_SLACK_BYTES since start (or since the RSS
        `since`). Not checked for an instrumented daemon."""
        rss = rss_bytes(self.pid) if rss is None else rss
        growth = rss - (self.baseline_rss if since is None else since)
        if self.instrumented:
            sys.stderr.write("\nnot measured: RSS under %s " % self.instrumented[0])
            return
        sys.stderr.write("\nmeasured: %s: RSS grew %.2f MiB (bound %.2f MiB + %.0f MiB slack) "
                         % (test.id().rsplit(".", 1)[-1], growth / 2**20,
                            allowed_growth_bytes / 2**20, RSS_SLACK_BYTES / 2**20))
        test.assertLessEqual(
            growth, allowed_growth_bytes + RSS_SLACK_BYTES,
            "RSS grew by %.1f MiB; bound %.1f MiB + slack"
            % (growth / 2**20, allowed_growth_bytes / 2**20))


def raw_connect(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    return sock


def closed_soon(sock, timeout):
    """Whether the daemon closes `sock` within `timeout` s (bytes it sends
    first are read and dropped)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        ready, _, _ = select.select([sock], [], [], left)
        if ready:
            try:
                if not sock.recv(65536):
                    return True
            except (ConnectionResetError, BrokenPipeError):
                return True


def send_until_closed(sock, data):
    """Sends `data`, stopping quietly when the daemon closes the connection
    first (it may refuse a frame before its end arrives)."""
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def read_responses_until(client, msgid, timeout=5):
    """Every response on `client` up to and including the one for `msgid`."""
    client.sock.settimeout(timeout)
    responses = []
    while True:
        response = client.recv()
        responses.append(response)
        if response[1] == msgid:
            return responses


class ExhaustionCase(unittest.TestCase):
    """Each test gets its own daemon, which must stop cleanly afterwards:
    SIGTERM answers what was read, closes every connection and exits 0."""

    def make_daemon(self):
        return MeasuredDaemon()

    def setUp(self):
        self.daemon = self.make_daemon()

    def tearDown(self):
        status, logs = self.daemon.stop()
        self.assertEqual(status, 0, "sluiced did not stop cleanly:\n" + logs)


class OversizedInputTest(ExhaustionCase):
    # Verifies every header that declares gigabytes in a few bytes (str, bin,
    # ext, array, map; 32-bit lengths, alone or where a key belongs) closes
    # the connection at once without waiting for the bytes: when the msgid
    # was read first it is answered TOO_LARGE, then closed.
    def test_gigabyte_headers_are_refused_at_once(self):
        headers = {
            "str32": b"\xdb\xff\xff\xff\xff",
            "bin32": b"\xc6\xff\xff\xff\xff",
            "ext32": b"\xc9\xff\xff\xff\xff\x01",
            "array32": b"\xdd\xff\xff\xff\xff",
            "map32": b"\xdf\xff\xff\xff\xff",
            "bin32 just over the frame limit": b"\xc6" + MAX_FRAME_BYTES.to_bytes(4, "big"),
        }
        for name, header in headers.items():
            bare = raw_connect(self.daemon.socket)
            bare.sendall(header)
            self.assertTrue(closed_soon(bare, 1.0), name)
            bare.close()

            request = Client(self.daemon.socket)
            request.sock.sendall(b"\x94\x00\x0b\xa7acquire\x92\xa4five" + header)
            response = request.recv()
            self.assertEqual(response[1], 11, name)
            self.assertEqual(response[2]["code"], "TOO_LARGE", name)
            self.assertTrue(request.closed_by_peer(timeout=1.0), name)
            request.close()
        # A closed connection is counted once the daemon has read the
        # client's end of the stream (it lingers until then), which may come
        # after this client's next request on another connection.
        def unreadable():
            closed = self.daemon.ask("stats")["connections"]["closed"]["unreadable"]
            return closed if closed >= 2 * len(headers) else None
        self.assertTrue(wait_for(unreadable, 5), self.daemon.ask("stats")["connections"])
        self.daemon.assert_unharmed(self)

    # Verifies the boundary: a key header that fits in max_frame_bytes is
    # waited for, not refused; once its bytes are in, the key (over
    # max_key_bytes) is answered TOO_LARGE and the connection goes on.
    def test_large_key_under_the_frame_limit_is_an_error_not_a_close(self):
        client = Client(self.daemon.socket)
        key_bytes = MAX_FRAME_BYTES - 64
        head = b"\x94\x00\x0c\xa7acquire\x92\xa4five\xc6" + key_bytes.to_bytes(4, "big")
        client.sock.sendall(head)
        self.assertFalse(closed_soon(client.sock, 0.3), "refused a frame that fits")
        client.sock.sendall(b"k" * key_bytes)
        response = client.recv()
        self.assertEqual(response[1], 12)
        self.assertEqual(response[2]["code"], "TOO_LARGE")
        self.assertIn("max_key_bytes", response[2]["message"])
        self.assertTrue(client.result("acquire", "five", "after-big-key")["allowed"])
        client.close()
        self.daemon.assert_unharmed(self)

    # Verifies real frames over max_frame_bytes, streamed by several clients
    # at once (16 MiB each of small, individually valid values), are cut off
    # near the limit: no client gets its whole frame in, and the daemon's RSS
    # grows by at most each connection's input buffer (max_frame_bytes plus
    # one read chunk).
    def test_streamed_frames_over_the_limit_are_cut_off_with_bounded_memory(self):
        clients = 4
        element = b"\xc4\xff" + b"x" * 255  # bin8 of 255 bytes
        count = 65535
        frame = b"\x94\x00\x01\xa7acquire\x92\xa4five\xdc" + count.to_bytes(2, "big") + element * count
        sent = [0] * clients
        cut = [False] * clients

        def stream(i):
            sock = raw_connect(self.daemon.socket)
            try:
                view = memoryview(frame)
                while sent[i] < len(frame):
                    sent[i] += sock.send(view[sent[i]:sent[i] + 65536])
            except (BrokenPipeError, ConnectionResetError):
                cut[i] = True
            finally:
                sock.close()

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
        self.assertEqual(cut, [True] * clients, "sent %s of %d bytes" % (sent, len(frame)))
        self.assertTrue(all(s < len(frame) // 4 for s in sent), sent)
        self.daemon.assert_unharmed(self, clients * (MAX_FRAME_BYTES + READ_CHUNK_BYTES))


class NestingTest(ExhaustionCase):
    # Verifies 100,000 levels of arrays, or of maps, close the connection at
    # max_depth, answering BAD_REQUEST first when a msgid was read.
    def test_nesting_100000_deep_is_rejected_at_the_depth_limit(self):
        depth = 100_000
        for inner in (nested_array(depth), b"\x81\xa1k" * depth + b"\xc0"):
            bare = raw_connect(self.daemon.socket)
            send_until_closed(bare, inner)
            self.assertTrue(closed_soon(bare, 1.0))
            bare.close()

            client = Client(self.daemon.socket)
            send_until_closed(client.sock, b"\x94\x00\x0d\xa4nope\x91" + inner)
            response = client.recv()
            self.assertEqual(response[1], 13)
            self.assertEqual(response[2]["code"], "BAD_REQUEST")
            self.assertIn("max_depth", response[2]["message"])
            self.assertTrue(client.closed_by_peer(timeout=1.0))
            client.close()
        self.daemon.assert_unharmed(self)

    # Verifies the limit is exactly max_depth: a frame nested max_depth deep
    # is answered and the connection goes on; one level more is refused.
    def test_depth_limit_is_exact(self):
        client = Client(self.daemon.socket)
        # The frame array is depth 1 and params depth 2; params holding
        # k - 2 more arrays (the innermost empty) make the frame k deep.
        at_limit = b"\x94\x00\x0e\xa6health\x91" + nested_array(DEFAULT_MAX_DEPTH - 3, b"\x90")
        client.sock.sendall(at_limit)
        response = client.recv()
        self.assertEqual(response[1], 14)
        self.assertIsNone(response[2])
        over = b"\x94\x00\x0f\xa6health\x91" + nested_array(DEFAULT_MAX_DEPTH - 2, b"\x90")
        client.sock.sendall(over)
        response = client.recv()
        self.assertEqual((response[1], response[2]["code"]), (15, "BAD_REQUEST"))
        self.assertTrue(client.closed_by_peer(timeout=1.0))
        client.close()


class MalformedRpcTest(ExhaustionCase):
    # Verifies the whole catalogue of wrongly shaped frames on one connection:
    # those with a readable msgid (any integer in a [0, ...] frame) get
    # exactly one error each with the right code, frames that are not
    # requests get no answer at all, every one is counted in stats, and the
    # connection then serves on.
    def test_each_malformed_request_gets_its_error_or_silence(self):
        answered = [
            ([0, 1, "acquire"], "BAD_REQUEST"),                    # 3 elements
            ([0, 2, "acquire", ["five", "k"], "extra"], "BAD_REQUEST"),  # 5
            ([0, 3], "BAD_REQUEST"),
            ([0, 4, "acquire", "notalist"], "BAD_REQUEST"),         # params not an array
            ([0, 5, "acquire", {"rule": "five", "key": "k"}], "BAD_REQUEST"),
            ([0, 6, "acquire", None], "BAD_REQUEST"),
            ([0, 7, "health", 5], "BAD_REQUEST"),
            ([0, 8, "nope", []], "UNKNOWN_METHOD"),
            ([0, 9, "x" * 10_000, [1, 2, 3]], "UNKNOWN_METHOD"),
            ([0, 10, "", []], "UNKNOWN_METHOD"),
            ([0, 11, 5, []], "BAD_REQUEST"),                        # method not a str
            ([0, 12, b"acquire", ["five", "k"]], "BAD_REQUEST"),    # method a bin
            ([0, 13, "acquire", ["five", "k", 1, 2, 3]], "BAD_REQUEST"),  # 5 params
            ([0, 14, "acquire", []], "BAD_REQUEST"),
            ([0, 15, "acquire", ["five", "k", 2**40]], "BAD_REQUEST"),
            ([0, 16, "acquire", ["five", "k", 1.0]], "BAD_REQUEST"),
            ([0, 17, "acquire", ["five", "k", -1]], "BAD_REQUEST"),
            ([0, 18, "acquire", [5, "k"]], "BAD_REQUEST"),
            ([0, 19, "acquire", ["five", 5]], "BAD_REQUEST"),
            ([0, 20, "acquire", ["nope", "k"]], "UNKNOWN_RULE"),
            ([0, 21, "acquire_all", [[]]], "BAD_REQUEST"),
            ([0, 22, "acquire_all", [[["five", "k"]] * (DEFAULT_MAX_ITEMS + 1)]], "TOO_LARGE"),
            ([0, 23, "health", list(range(DEFAULT_MAX_ITEMS + 1))], "TOO_LARGE"),
            ([0, 24, "acquire", [{"rule": "five"}]], "BAD_REQUEST"),
        ]
        silent = [
            [], [1, 30, None, None], [3, 31, "acquire", ["five", "k"]],
            ["0", 32, "acquire", ["five", "k"]], [-1, 33, "acquire", ["five", "k"]],
            5, "acquire", {"a": 1}, None,
        ]
        # Any integer is a msgid: both ends of uint32, past it (a client
        # counting without wrapping), and negative ones.
        edge_ids = [0, 2**32 - 1, 2**32, 2**64 - 1, -1, -2**63]
        edges = [[0, i, "peek", ["five", "edge"]] for i in edge_ids]
        client = Client(self.daemon.socket)
        before = client.result("stats")["errors"]
        client.sock.sendall(b"".join(packb(f) for f, _ in answered) +
                            b"".join(packb(f) for f in silent) +
                            b"".join(packb(f) for f in edges) +
                            packb([0, 999, "peek", ["five", "sentinel"]]))
        responses = read_responses_until(client, 999)
        got = {r[1]: (r[2] or {}).get("code") for r in responses}
        expected = {f[1]: code for f, code in answered}
        expected.update({i: None for i in edge_ids + [999]})
        self.assertEqual(got, expected)
        self.assertEqual(len(responses), len(expected), "a frame was answered twice")
        for r in responses:
            if r[2] is not None:
                self.assertIsInstance(r[2]["message"], str)
                self.assertTrue(r[2]["message"])
        after = client.result("stats")["errors"]
        grew = {code: after[code] - before[code] for code in after}
        want = {code: sum(1 for _, c in answered if c == code) for code in after}
        want["BAD_REQUEST"] += len(silent)
        self.assertEqual(grew, want)
        self.assertTrue(client.result("acquire", "five", "still-serving")["allowed"])
        client.close()
        self.daemon.assert_unharmed(self)

    # Verifies a request whose msgid is not an integer, which no answer could
    # reach, is told so by an error notification and its connection closed,
    # so that the client's call fails at once instead of hanging; the
    # requests before it on the connection are answered first.
    def test_a_request_without_an_integer_msgid_is_notified_and_closed(self):
        for msgid in (1.5, None, "34", [1], b"7"):
            client = Client(self.daemon.socket)
            client.sock.sendall(packb([0, 5, "peek", ["five", "first"]]) +
                                packb([0, msgid, "acquire", ["five", "k"]]))
            first = client.recv()
            self.assertEqual((first[0], first[1], first[2]), (1, 5, None), msgid)
            note = client.recv()
            self.assertEqual(note[:2], [2, "error"], msgid)
            self.assertEqual(note[2][0]["code"], "BAD_REQUEST", msgid)
            self.assertIn("integer msgid", note[2][0]["message"], msgid)
            self.assertTrue(client.closed_by_peer(timeout=2.0), msgid)
            client.close()
        client = Client(self.daemon.socket)
        self.assertTrue(client.result("acquire", "five", "still-serving")["allowed"])
        client.close()
        self.daemon.assert_unharmed(self)

    # Verifies notifications are never answered, whatever is wrong with them,
    # that a valid one among them still takes effect, and that the connection
    # stays usable: the next answer on it is the request sent after them.
    def test_junk_notifications_get_no_answer(self):
        junk = [
            [2, "acquire", "junk"], [2, "acquire", ["nope", "k"]], [2, "nope", []],
            [2, 5, []], [2, "acquire"], [2, "acquire", ["five", "k"], 1],
            [2, "acquire", ["five", b"x" * (DEFAULT_MAX_KEY_BYTES + 1)]],
            [2, "acquire", ["five", "k", -5]], [2, "stats", []], [2, "health", [1, {"a": []}]],
            [2, "acquire_all", [[]]], [2, "x" * 5000, list(range(100))],
            [2, "release", ["five", "k", 2**40]], [2, "peek", []],
        ]
        client = Client(self.daemon.socket)
        before = client.result("stats")["errors"]
        client.sock.sendall(b"".join(packb(f) for f in junk) * 100 +
                            packb([2, "acquire", ["five", "notified", 2]]) +
                            packb([0, 77, "peek", ["five", "notified"]]))
        response = client.recv()
        self.assertEqual(response[1], 77)
        self.assertEqual(response[3]["remaining"], 3)
        self.assertFalse(closed_soon(client.sock, 0.2), "answered or closed after the peek")
        after = client.result("stats")["errors"]
        self.assertGreaterEqual(sum(after.values()) - sum(before.values()), 100 * (len(junk) - 2))
        client.close()
        self.daemon.assert_unharmed(self)


class TimeoutTest(ExhaustionCase):
    def make_daemon(self):
        return MeasuredDaemon(idle="%dms" % IDLE_TIMEOUT_MS,
                              partial="%dms" % PARTIAL_FRAME_TIMEOUT_MS, count_handles=True)

    # Verifies slowloris clients sending one byte per TRICKLE_INTERVAL_S
    # (never idle, never finishing a frame) are all closed by the
    # partial-frame timeout, none answered, while a polite client is served
    # promptly meanwhile; descriptors return to the baseline.
    def test_slowloris_is_closed_by_the_partial_frame_timeout(self):
        count = 20
        frame = packb([0, 1, "acquire", ["five", "slowloris"]])
        socks = [raw_connect(self.daemon.socket) for _ in range(count)]
        started = time.monotonic()
        open_socks = set(socks)
        sent = 0
        closed_after = []
        while open_socks and time.monotonic() - started < 10:
            for s in open_socks:
                try:
                    s.send(frame[sent:sent + 1])
                except (BrokenPipeError, ConnectionResetError):
                    pass
            sent += 1
            self.assertLess(sent, len(frame), "a frame completed before any timeout")
            tick_end = time.monotonic() + TRICKLE_INTERVAL_S
            while open_socks and time.monotonic() < tick_end:
                ready, _, _ = select.select(list(open_socks), [], [],
                                            max(0, tick_end - time.monotonic()))
                for s in ready:
                    try:
                        data = s.recv(4096)
                    except ConnectionResetError:
                        data = b""
                    self.assertEqual(data, b"", "a slowloris was answered")
                    closed_after.append(time.monotonic() - started)
                    open_socks.discard(s)
            if sent == 1:
                self.daemon.assert_unharmed(self)
        for s in socks:
            s.close()
        self.assertEqual(len(closed_after), count)
        limit_s = PARTIAL_FRAME_TIMEOUT_MS / 1000
        self.assertGreaterEqual(min(closed_after), limit_s - 0.05)
        self.assertLessEqual(max(closed_after), limit_s + TIMEOUT_SLACK_S * self.daemon.slowdown)
        closed = self.daemon.ask("stats")["connections"]["closed"]
        self.assertEqual(closed["partial_frame"], count)
        self.assertEqual(closed["idle"], 0)
        self.daemon.assert_fds_back_to_baseline(self, 2)
        self.daemon.assert_unharmed(self)

    # Verifies idle connections (silent from the start, or silent after an
    # answer) are closed by the idle timeout, while one that sends a request
    # every TRICKLE_INTERVAL_S outlives it; descriptors return to the baseline.
    def test_idle_connections_are_closed_and_active_ones_kept(self):
        silent = [raw_connect(self.daemon.socket) for _ in range(40)]
        answered = Client(self.daemon.socket)
        answered.result("acquire", "five", "then-idle")
        idle = silent + [answered.sock]
        active = Client(self.daemon.socket)
        started = time.monotonic()
        idle_s = IDLE_TIMEOUT_MS / 1000
        deadline = started + idle_s + TIMEOUT_SLACK_S * self.daemon.slowdown
        closed_after = []
        # Until every idle one is closed, and for at least two pings past the
        # idle timeout, the active client pings once per TRICKLE_INTERVAL_S.
        while (idle and time.monotonic() < deadline) or \
                time.monotonic() - started < idle_s + 2 * TRICKLE_INTERVAL_S:
            self.assertTrue(active.result("acquire", "roomy", "active")["allowed"])
            tick_end = time.monotonic() + TRICKLE_INTERVAL_S
            while idle and time.monotonic() < tick_end:
                ready, _, _ = select.select(idle, [], [], max(0, tick_end - time.monotonic()))
                for s in ready:
                    self.assertTrue(closed_soon(s, 0.1))
                    closed_after.append(time.monotonic() - started)
                    idle.remove(s)
            time.sleep(max(0, tick_end - time.monotonic()))
        self.assertEqual(idle, [], "still open after %.1f s" % (time.monotonic() - started))
        self.assertGreaterEqual(min(closed_after), idle_s - 0.05)
        for s in silent:
            s.close()
        answered.close()
        self.assertEqual(active.result("health")["status"], "ok")
        active.close()
        self.assertEqual(self.daemon.ask("stats")["connections"]["closed"]["idle"], len(silent) + 1)
        self.daemon.assert_fds_back_to_baseline(self, 2)
        self.daemon.assert_unharmed(self)


class FloodTest(ExhaustionCase):
    def make_daemon(self):
        return MeasuredDaemon(count_handles=True)

    # Verifies a flood of 1,000 connections against max_connections: exactly
    # MAX_CONNECTIONS are kept and serve, the rest are closed at once, the
    # daemon's descriptors never exceed its baseline plus MAX_CONNECTIONS
    # (plus one being refused), and return to the baseline afterwards, as do
    # its libuv handles, which counted the kept connections meanwhile.
    def test_connection_flood_is_refused_without_exhausting_descriptors(self):
        flood = 1000
        socks = []
        most_fds = 0
        for i in range(flood):
            socks.append(raw_connect(self.daemon.socket))
            if i % 25 == 0:
                most_fds = max(most_fds, held_fd_count(self.daemon.pid))
        # Sort the connections into refused (closed by the daemon) and kept,
        # until the refusals are all in or the time is up.
        kept = list(socks)
        refused = 0
        deadline = time.monotonic() + 3 * self.daemon.slowdown
        while refused < flood - MAX_CONNECTIONS and time.monotonic() < deadline:
            most_fds = max(most_fds, held_fd_count(self.daemon.pid))
            ready, _, _ = select.select(kept, [], [], 0.05)
            for s in ready:
                self.assertTrue(closed_soon(s, 0.1), "readable but not closed")
                kept.remove(s)
                refused += 1
        self.assertEqual(refused, flood - MAX_CONNECTIONS)
        self.assertFalse(any(closed_soon(s, 0.01) for s in kept))
        self.assertEqual(len(kept), MAX_CONNECTIONS)
        self.assertLessEqual(most_fds, self.daemon.baseline_fds + MAX_CONNECTIONS + 1)

        # One more while full: told why and refused at once, not left waiting.
        started = time.monotonic()
        extra = raw_connect(self.daemon.socket)
        extra.settimeout(PROMPT_ANSWER_S * self.daemon.slowdown)
        note = msgpack.unpackb(extra.recv(65536))
        self.assertEqual((note[0], note[1], note[2][0]["code"]), (2, "error", "OVERLOADED"))
        self.assertIn(f"max_connections = {MAX_CONNECTIONS}", note[2][0]["message"])
        self.assertTrue(closed_soon(extra, PROMPT_ANSWER_S * self.daemon.slowdown))
        self.assertLess(time.monotonic() - started, PROMPT_ANSWER_S * self.daemon.slowdown)
        extra.close()

        for i, s in enumerate(kept):
            s.setblocking(True)
            s.settimeout(5)
            s.sendall(packb([0, i, "health", []]))
        for i, s in enumerate(kept):
            unpacker = msgpack.Unpacker(raw=False)
            unpacker.feed(s.recv(65536))
            self.assertEqual(next(unpacker)[1], i)
        # A new connection would be refused while the kept ones are open:
        # the count is asked on one of them.
        asker = Client(sock=kept[0])
        counted = wait_for(lambda: asker.result("health")["handles"]
                           >= self.daemon.baseline_handles + MAX_CONNECTIONS - 1, 3)
        self.assertTrue(counted, "the kept connections' handles are not counted")
        for s in socks:
            s.close()
        self.daemon.assert_fds_back_to_baseline(self, 3)
        stats = self.daemon.ask("stats")
        self.assertEqual(stats["connections"]["refused"], flood - MAX_CONNECTIONS + 1)
        self.daemon.assert_unharmed(self)


class NeverReadingTest(ExhaustionCase):
    # Verifies clients that each pipeline up to a million requests and never
    # read are disconnected at max_output_bytes, long before the million, and
    # the daemon's RSS grows by at most two output buffers each (the one being
    # written and the one filling) plus an input buffer.
    def test_million_pipelined_requests_never_read_are_cut_at_the_output_cap(self):
        clients = 4
        requests = 1_000_000
        batch = 1000
        chunk = b"".join(packb([0, i, "acquire", ["five", "hog-%d" % (i % 10)]])
                         for i in range(batch))
        sent = [0] * clients
        cut = [False] * clients
        most_rss = [0]

        def hog(i):
            sock = raw_connect(self.daemon.socket)
            try:
                while sent[i] < requests:
                    sock.sendall(chunk)
                    sent[i] += batch
                    if sent[i] % 20_000 == 0:
                        most_rss[0] = max(most_rss[0], rss_bytes(self.daemon.pid))
            except (BrokenPipeError, ConnectionResetError):
                cut[i] = True
            finally:
                sock.close()

        threads = [threading.Thread(target=hog, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        self.assertEqual(cut, [True] * clients, "sent %s requests" % sent)
        self.assertTrue(all(s < requests // 10 for s in sent), sent)
        stats = self.daemon.ask("stats")
        self.assertEqual(stats["connections"]["closed"]["output_cap"], clients)
        bound = clients * (2 * MAX_OUTPUT_BYTES + READ_CHUNK_BYTES)
        self.daemon.assert_rss_within(self, bound, rss=most_rss[0])
        self.daemon.assert_unharmed(self, bound)


def acquire_each(daemon, keys, rule="roomy"):
    """Acquires each key once, pipelined over WORKERS connections in windows
    of 2,000 requests, whose answers (87 bytes each) fit in the socket
    buffer, so the daemon's output buffers stay small; returns the results,
    and raises on any error answer."""
    window = 2000
    clients = [Client(daemon.socket) for _ in range(WORKERS)]
    results = []
    try:
        for start in range(0, len(keys), window * len(clients)):
            pending = []
            for c, client in enumerate(clients):
                part = keys[start + c * window:start + (c + 1) * window]
                pending.append(len(part))
                client.sock.sendall(b"".join(
                    packb([0, n, "acquire", [rule, key]]) for n, key in enumerate(part)))
            for client, count in zip(clients, pending):
                for _ in range(count):
                    response = client.recv()
                    if response[2] is not None:
                        raise AssertionError("error answer: %s" % response[2])
                    results.append(response[3])
    finally:
        for client in clients:
            client.close()
    return results


class KeyTableTest(ExhaustionCase):
    # Verifies 300,000 distinct keys, pipelined, against max_keys = 10,000:
    # every request is decided, the table stays at its cap with the rest
    # counted as forced evictions, and RSS stops growing once it is full.
    def test_distinct_keys_stay_at_the_table_cap(self):
        total = 300_000
        keys = [b"key-%010d" % i for i in range(total)]
        fill = 2 * MAX_KEYS
        self.assertTrue(all(r["allowed"] for r in acquire_each(self.daemon, keys[:fill])))
        full_rss = rss_bytes(self.daemon.pid)
        self.assertTrue(all(r["allowed"] for r in acquire_each(self.daemon, keys[fill:])))
        keys_stats = self.daemon.ask("stats")["keys"]
        self.assertLessEqual(keys_stats["count"], MAX_KEYS + WORKERS)
        self.assertGreaterEqual(keys_stats["count"], MAX_KEYS - WORKERS)
        self.assertGreaterEqual(keys_stats["inserts"], total)
        self.assertGreaterEqual(keys_stats["forced_evictions"] + keys_stats["idle_evictions"],
                                total - MAX_KEYS - WORKERS)
        # Once full, the table grows no more.
        self.daemon.assert_rss_within(self, 0, since=full_rss)
        self.daemon.assert_unharmed(self, KEY_TABLE_BOUND_BYTES)


class LongKeyTest(ExhaustionCase):
    """A table sized for a million keys whose max_memory admits only about a
    thousand keys of max_key_bytes: sparse, so eviction must search."""

    def make_daemon(self):
        return MeasuredDaemon(max_keys=1_000_000)

    # Verifies 20,000 distinct keys of max_key_bytes into that table are all
    # decided (none OVERLOADED: the table always finds an entry to evict),
    # linked entries stay within max_memory (plus one per racing insert), and
    # RSS within KEY_TABLE_BOUND_BYTES.
    def test_long_keys_in_a_sparse_table_evict_and_stay_within_max_memory(self):
        count = 20_000
        keys = [b"%05d" % i + b"L" * (DEFAULT_MAX_KEY_BYTES - 5) for i in range(count)]
        self.assertTrue(all(r["allowed"] for r in acquire_each(self.daemon, keys)))
        keys_stats = self.daemon.ask("stats")["keys"]
        entry_bytes = DEFAULT_MAX_KEY_BYTES + 128
        self.assertLessEqual(keys_stats["bytes"], MAX_KEY_MEMORY_BYTES + WORKERS * entry_bytes)
        self.assertGreaterEqual(keys_stats["forced_evictions"],
                                count - MAX_KEY_MEMORY_BYTES // DEFAULT_MAX_KEY_BYTES)
        self.daemon.assert_unharmed(self, KEY_TABLE_BOUND_BYTES)


# Keys that must all be told apart: prefixes of one another, equal up to a
# NUL, braces (a Redis hash tag), empty, and max_key_bytes long differing
# only in the last byte.
DISTINCT_KEYS = [
    b"", b"\x00", b"\x00\x00", b"a", b"a\x00", b"\x00a", b"a\x00b", b"a\x00c", b"a\x00b\x00",
    b"{a}", b"{a}b", b"{a}\x00b", b"{", b"}", b"{}", b"a}", b"{a", b"{a}{b}", b"\xff\xfe",
    b"k" * DEFAULT_MAX_KEY_BYTES, b"k" * (DEFAULT_MAX_KEY_BYTES - 1) + b"j",
    b"k" * (DEFAULT_MAX_KEY_BYTES - 1), b"k" * (DEFAULT_MAX_KEY_BYTES - 1) + b"\x00",
]


class KeyBytesTest(ExhaustionCase):
    def assert_separate_budgets(self, client, rule):
        """Each of DISTINCT_KEYS gets its own one-unit budget under `rule`."""
        first = [client.result("acquire", rule, key) for key in DISTINCT_KEYS]
        self.assertTrue(all(r["allowed"] for r in first), [r["allowed"] for r in first])
        second = [client.result("acquire", rule, key) for key in DISTINCT_KEYS]
        self.assertFalse(any(r["allowed"] for r in second), [r["allowed"] for r in second])
        return first

    # Verifies keys with NUL bytes, braces and of exactly max_key_bytes each
    # have their own budget, per rule, with str and bin the same key.
    def test_odd_keys_have_separate_budgets(self):
        client = Client(self.daemon.socket)
        self.assert_separate_budgets(client, "once")
        # The same bytes under another rule are another budget.
        self.assertTrue(client.result("acquire", "once_too", b"a\x00b")["allowed"])
        # str and bin of the same bytes are one key.
        self.assertFalse(client.result("acquire", "once", "{a}\x00b")["allowed"])
        self.assertFalse(client.result("acquire", "once", "k" * DEFAULT_MAX_KEY_BYTES)["allowed"])
        client.close()
        self.daemon.assert_unharmed(self)

    # Verifies a key one byte over max_key_bytes gets a clear TOO_LARGE error
    # in every form a key can come in, spends nothing, and the connection
    # goes on.
    def test_key_one_byte_over_the_limit_is_a_clear_error(self):
        over = b"k" * (DEFAULT_MAX_KEY_BYTES + 1)
        client = Client(self.daemon.socket)
        calls = [
            ("acquire", "once", over), ("acquire", "once", over.decode()),
            ("acquire", {"rule": "once", "key": over}), ("peek", "once", over),
            ("release", "once", over, 1),
            ("acquire_all", [["once", b"fine", 1], ["once", over, 1]]),
        ]
        for call in calls:
            error, result = client.call(*call)
            self.assertIsNone(result, call[0])
            self.assertEqual(error["code"], "TOO_LARGE", call[0])
            self.assertIn("max_key_bytes", error["message"])
        # Nothing was spent, by the acquire_all's fine item either.
        self.assertTrue(client.result("acquire", "once", b"fine")["allowed"])
        self.assertTrue(client.result("acquire", "once", over[:-1])["allowed"])
        client.close()
        self.daemon.assert_unharmed(self)


class GlobalKeyBytesTest(ExhaustionCase):
    """The same keys on a global rule: each leases from its own Redis key."""

    def make_daemon(self):
        self.redis = Redis()
        self.addCleanup(self.redis.stop)
        return MeasuredDaemon(extra=redis_section(self.redis.port) + GLOBAL_RULE)

    # Verifies keys with NUL bytes, braces and of max_key_bytes, on a global
    # rule leasing from a real Redis, each have their own budget and their own
    # Redis key (no two keys share global state).
    def test_odd_keys_have_separate_global_state(self):
        client = Client(self.daemon.socket)
        self.assertTrue(wait_for(lambda: client.result("health")["breaker"] == "closed", 5),
                        self.daemon.logs())
        first = KeyBytesTest.assert_separate_budgets(self, client, "global_once")
        self.assertTrue(all(r["mode"] == "normal" for r in first), [r["mode"] for r in first])
        count = self.redis.command(
            "EVAL", "return #redis.call('KEYS', ARGV[1])", "0", "sluice:v%d:q:*" % STATE_VERSION)
        self.assertEqual(count, len(DISTINCT_KEYS))
        client.close()
        self.daemon.assert_unharmed(self)


class DeferredFramesTest(ExhaustionCase):
    """Requests that wait for a lease keep their questions: bounded in bytes."""

    # Most bytes of questions (rules and keys) one worker keeps for requests
    # waiting on a lease (daemon/waiting.h, kMaxDeferredBytes).
    MAX_DEFERRED_BYTES = 16 << 20
    FRAMES = 1000     # 60 MB of padded frames, against an 8 MiB bound on RSS
    KEY_FRAMES = 400  # 24 MB of keys: more than one worker keeps
    ITEMS = 15        # keys per acquire_all: about 60 KB of keys in one frame
    KEY_BYTES = 4000  # under the default max_key_bytes (4096)
    PAD_BYTES = 60_000

    def make_daemon(self):
        self.redis = Redis()
        self.addCleanup(self.redis.stop)
        # Long enough that a sanitizer build parses every request before
        # the first lease call times out, or the breaker opens on a
        # heartbeat that the paused writes hold (a TSan build on a slow
        # host opened it after 130-170 of the frames, which the policy
        # then answered); the test unpauses Redis at the end.
        section = redis_section(self.redis.port) + 'lease_timeout = "10s"\nhealth_timeout = "10s"\n'
        return MeasuredDaemon(extra=section + GLOBAL_RULE)

    def hold_writes(self, client):
        self.assertTrue(wait_for(lambda: client.result("health")["breaker"] == "closed", 5),
                        self.daemon.logs())
        self.assertEqual(self.redis.command("CLIENT", "PAUSE", "10000", "WRITE"), "OK")
        self.addCleanup(self.redis.command, "CLIENT", "UNPAUSE")

    # Verifies that a client sending cold-key acquire_alls of 15 keys of 4 KB
    # each, while Redis holds every write (so each waits up to
    # lease_timeout), cannot make its worker keep more than the deferred-bytes
    # cap of keys: the rest are answered by the policy.
    def test_requests_waiting_for_leases_keep_bounded_bytes_of_keys(self):
        client = Client(self.daemon.socket)
        self.hold_writes(client)
        hog = Client(self.daemon.socket)  # one connection: one worker
        for i in range(self.KEY_FRAMES):
            items = [{"rule": "global_once", "key": ("cold-%d-%d-" % (i, j)).ljust(self.KEY_BYTES, "x")}
                     for j in range(self.ITEMS)]
            hog.send([0, i, "acquire_all", [items]])
        held = self.ITEMS * (self.KEY_BYTES + len("global_once"))
        # Until the worker has read up to the cap (a sanitizer build may
        # take more than a second).
        wait_for(lambda: client.result("stats")["leases"]["deferred"] * held >
                 self.MAX_DEFERRED_BYTES - held, 10)
        # Besides what waits, the keys cost memory elsewhere: in the key table
        # and in the lease calls held while Redis pauses writes (the build
        # that kept whole frames measured the same 40 MiB here).
        bound = 3 * self.MAX_DEFERRED_BYTES
        self.daemon.assert_rss_within(self, bound)
        deferred = client.result("stats")["leases"]["deferred"]
        self.assertLessEqual(deferred * held, self.MAX_DEFERRED_BYTES)
        self.assertGreater(deferred * held, self.MAX_DEFERRED_BYTES - held)
        self.assertLess(deferred, self.KEY_FRAMES)
        hog.close()
        client.close()
        self.daemon.assert_unharmed(self, bound)

    # Verifies that padding a waiting request with a 60 KB map entry the
    # parser skips costs the daemon nothing: a waiting request holds its
    # rule and key, not its frame.
    def test_padded_requests_waiting_for_leases_hold_only_their_keys(self):
        client = Client(self.daemon.socket)
        self.hold_writes(client)
        hog = Client(self.daemon.socket)
        pad = b"x" * self.PAD_BYTES
        for i in range(self.FRAMES):
            hog.send([0, i, "acquire", [{"rule": "global_once", "key": "cold-%d" % i, "pad": pad}]])
        deferred = lambda: client.result("stats")["leases"]["deferred"]
        self.assertTrue(wait_for(lambda: deferred() == self.FRAMES, 9),
                        "every padded request waits (its frame is not kept): %d" % deferred())
        self.daemon.assert_rss_within(self, 8 << 20)
        hog.close()
        client.close()
        self.daemon.assert_unharmed(self, 8 << 20)


def tearDownModule():
    tear_down_module()


if __name__ == "__main__":
    unittest.main(verbosity=2)
