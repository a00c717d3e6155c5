#!/usr/bin/python3
"""The fleet's `remaining` on a global rule, as
docs/protocol.md, "Remaining on a global rule" defines it: two real sluiced
on one real redis-server share a limit of 100, and every allowed answer
reports an estimate of what the whole fleet has left, not only what the
answering node's slice holds.

The test spends the limit one acquire at a time, alternating between the
two daemons, and after each acquire waits until neither has a lease in
flight (their lease counters: every lease requested is answered). So it
knows at which acquire each daemon last read Redis, what the other daemon
held then (its granted units less what it spent) and what the other spent
since; the documented relation then gives every answer exactly:

    remaining = T - H + S   (within 1 for the buckets, whose Redis state
                             may refill a unit during the run)

T the fleet's true remaining (100 less what the fleet admitted), H what the
other daemon held unspent at this daemon's last lease answer, S what the
other spent since. It follows that T - H <= remaining <= T + S, the bound
that section states, and that no answer says 0 while the fleet has more
than the other daemon holds. Daemon 0 answers through MessagePack, the HTTP
front (RateLimit's r=) and the RESP front (SLUICE.ACQUIRE) in turn: every
front reports the same estimate.

Needs SLUICED (the daemon binary) in the environment; run with /usr/bin/python3
(python3-msgpack, python3-redis).
"""

import os
import socket
import sys
import time
import unittest

import redis as redis_client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon, DaemonPairCase, tear_down_module, wait_for  # noqa: E402

LIMIT = 100
# An hour: the buckets refill a unit per 36 s, so at most one during a run;
# a window boundary (on the hour) is detected and the run repeated.
PERIOD_S = 3600

CONFIG = """
[daemon]
socket = "{socket}"
workers = 2

[redis]
url = "redis://127.0.0.1:{port}"
node_id = "remaining-{index}"
expected_nodes = 2
heartbeat_interval = "100ms"
health_interval = "100ms"
# Generous: a cold key waits this long for its first lease before its
# policy decides, and an answer in mode fallback would spoil the count.
health_timeout = "1s"
lease_timeout = "1s"

[http]
listen = "unix:{dir}/http.sock"

[resp]
listen = "unix:{dir}/resp.sock"
"""

ALGORITHMS = ("token_bucket", "gcra", "fixed_window", "sliding_window")
RULES = "".join("""
[[rule]]
name = "{algorithm}"
algorithm = "{algorithm}"
limit = {limit}
period = "{period}s"
scope = "global"
""".format(algorithm=algorithm, limit=LIMIT, period=PERIOD_S) for algorithm in ALGORITHMS)


def http_check(path, rule, key):
    """GET /v1/check on the HTTP front's Unix socket: (allowed, r=, mode)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(path)
        s.sendall(("GET /v1/check?rule=%s&key=%s HTTP/1.1\r\nHost: sluice\r\n"
                   "Connection: close\r\n\r\n" % (rule, key)).encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode()
    lines = head.split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.split(": ", 1) for line in lines[1:])
    # RateLimit: "rule";r=REMAINING;t=RESET_S
    params = dict(item.split("=", 1) for item in headers["RateLimit"].split(";")[1:])
    return status == 200, int(params["r"]), headers["Sluice-Mode"]


class RemainingFleetTest(DaemonPairCase):

    def start_daemon(self, index, redis_port):
        daemon = Daemon("remaining-%d" % index)
        daemon.start(CONFIG.format(socket=daemon.socket, port=redis_port, index=index,
                                   dir=daemon.dir) + RULES, connect=True)
        daemon.resp = redis_client.Redis(unix_socket_path=os.path.join(daemon.dir, "resp.sock"),
                                         socket_timeout=5)
        self.addCleanup(daemon.resp.close)
        return daemon

    def leases(self, daemon):
        """(leases answered, leases requested, units granted) so far."""
        leases = daemon.client.result("stats")["leases"]
        return (leases["granted"] + leases["empty"] + leases["failed"], leases["requested"],
                leases["granted_units"])

    def settle(self):
        """Waits until neither daemon has a lease in flight (twice the same
        counters, every lease requested answered); returns their counters."""
        last = [None]

        def settled():
            now = [self.leases(d) for d in self.daemons]
            done = now == last[0] and all(answered == requested for answered, requested, _ in now)
            last[0] = now
            return done
        self.assertTrue(wait_for(settled, 5), [self.leases(d) for d in self.daemons])
        return last[0]

    def acquire(self, index, step, rule, key):
        """One acquire on daemon `index`: (allowed, remaining). Daemon 0
        answers through MessagePack, HTTP and RESP in turn."""
        daemon = self.daemons[index]
        front = step // 2 % 3 if index == 0 else 0
        if front == 1:
            allowed, remaining, mode = http_check(os.path.join(daemon.dir, "http.sock"), rule, key)
        elif front == 2:
            reply = daemon.resp.execute_command("SLUICE.ACQUIRE", rule, key)
            allowed, remaining, mode = bool(reply[0]), int(reply[1]), reply[5].decode()
        else:
            decision = daemon.acquire(rule, key)
            allowed, remaining, mode = decision["allowed"], decision["remaining"], decision["mode"]
        # Leased quota only: a fallback answer spends the node's share.
        self.assertEqual(mode, "normal", (rule, index, front))
        return allowed, remaining

    def spend_alternating(self, rule, key):
        """Spends the limit one acquire at a time, alternating daemons; per
        allowed answer (daemon, remaining, T, H, S). None if a window
        boundary passed during the run."""
        window = int(time.time()) // PERIOD_S
        counters = self.settle()
        granted_at_start = [c[2] for c in counters]
        answered = [c[0] for c in counters]
        allowed_by = [0, 0]
        # Per daemon, as of its last lease answer: what the other daemon held
        # unspent then, and what the other had admitted by then.
        read = [None, None]
        rows = []
        admitted = 0
        for step in range(LIMIT + 20):
            index = step % 2
            other = 1 - index
            held_before = counters[index][2] - granted_at_start[index] - allowed_by[index]
            allowed, remaining = self.acquire(index, step, rule, key)
            if allowed:
                allowed_by[index] += 1
                admitted += 1
                # Answered on the daemon's last lease answer before it (a
                # refill ahead this acquire asked for answers after it), or,
                # when the daemon held nothing (a cold key, or a window's
                # slice that asked no refill ahead near the window's end),
                # on the lease it waited for.
                last_read = read[index]
                if last_read is None or held_before == 0:
                    last_read = (counters[other][2] - granted_at_start[other] - allowed_by[other],
                                 allowed_by[other])
                held, other_admitted_then = last_read
                rows.append((index, remaining, LIMIT - admitted, held,
                             allowed_by[other] - other_admitted_then))
            counters = self.settle()
            for d in (0, 1):
                if counters[d][0] != answered[d]:
                    answered[d] = counters[d][0]
                    held_by_other = counters[1 - d][2] - granted_at_start[1 - d] - allowed_by[1 - d]
                    read[d] = (held_by_other, allowed_by[1 - d])
        if int(time.time()) // PERIOD_S != window:
            return None
        self.assertGreaterEqual(admitted, LIMIT - 1)  # units a slice may keep at the end
        self.assertLessEqual(admitted, LIMIT + 1)     # a bucket may refill one
        return rows

    # Verifies every allowed answer of every algorithm against the relation
    # remaining = T - H + S (docs/protocol.md), through every front of
    # daemon 0; so T - H <= remaining <= T + S, remaining <= the limit, and
    # an answer says 0 only when the other daemon holds what is left.
    def test_allowed_answers_report_the_fleets_remaining(self):
        for algorithm in ALGORITHMS:
            tolerance = 1 if algorithm in ("token_bucket", "gcra") else 0
            for attempt in range(3):
                rows = self.spend_alternating(algorithm, "k%d" % attempt)
                if rows is not None:
                    break
            self.assertIsNotNone(rows, "three window boundaries in a row")
            errors = [remaining - truth for _, remaining, truth, _, _ in rows]
            print("%s: %d allowed; remaining - true: min %d, max %d, mean |.| %.1f"
                  % (algorithm, len(rows), min(errors), max(errors),
                     sum(abs(e) for e in errors) / len(errors)), file=sys.stderr)
            for index, remaining, truth, held, spent in rows:
                where = (algorithm, index, remaining, truth, held, spent)
                self.assertLessEqual(remaining, LIMIT, where)
                expected = min(max(truth - held + spent, 0), LIMIT)
                self.assertLessEqual(abs(remaining - expected), tolerance, where)
                self.assertGreaterEqual(remaining, truth - held - tolerance, where)
                self.assertLessEqual(remaining, truth + spent + tolerance, where)
                if remaining == 0:
                    self.assertLessEqual(truth, held + tolerance, where)


def tearDownModule():
    tear_down_module()


if __name__ == "__main__":
    unittest.main()
