#!/usr/bin/python3
"""Policies on global rules, on a fleet of two real sluiced sharing one real
redis-server: an override's limit is what the fleet shares (and, with Redis
down, each node's share of it); a key that one daemon's penalty blocks is
blocked on the other from its next lease, until the block ends or an admin
resets the key, and a daemon that knows of a block holds it while Redis is
down; requests that may wait on a paced global rule leave the fleet one
interval apart, each daemon's in arrival order, whichever connection (and
worker) they came on.

Needs SLUICED (the daemon binary) in the environment; run with /usr/bin/python3
(python3-msgpack).
"""

import os
import signal
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Client, DaemonPairCase, redis_key,  # noqa: E402
                     tear_down_module, wait_for)

CONFIG = """
[daemon]
socket = "{socket}"
workers = 2

[redis]
url = "redis://127.0.0.1:{port}"
node_id = "policy-{index}"
expected_nodes = 2
heartbeat_interval = "100ms"
health_interval = "50ms"
health_timeout = "100ms"
lease_timeout = "50ms"

# Per minute, so that refill during a test is a unit or two.
[[rule]]
name = "tiers"
algorithm = "token_bucket"
limit = 10
period = "1m"
scope = "global"
overrides = [{{ prefix = "pro:", limit = 100 }}, {{ key = "acme", limit = 40 }}]

[[rule]]
name = "abuse"
algorithm = "token_bucket"
limit = 5
period = "1m"
scope = "global"
penalty = {{ denials = 3, window = "10s", block = "{block_ms}ms" }}


# 10 a second for the whole fleet, one at a time; requests may wait 5 s.
[[rule]]
name = "paced"
algorithm = "gcra"
limit = 10
period = "1s"
pace = true
max_wait = "5s"
scope = "global"
"""

BLOCK_MS = 3000
WAITERS_PER_DAEMON = 10
INTERVAL_S = 0.1


class FleetCase(DaemonPairCase):
    config = CONFIG
    config_args = {"block_ms": BLOCK_MS}
    name = "policy"

    def admitted(self, rule, key, per_daemon):
        """Acquires `per_daemon` times on each daemon, alternating; returns
        the number allowed, after checking every answer leased (mode normal)."""
        allowed = 0
        for _ in range(per_daemon):
            for daemon in self.daemons:
                decision = daemon.acquire(rule, key)
                self.assertEqual(decision["mode"], "normal", decision)
                allowed += decision["allowed"]
        return allowed


class OverrideFleetTest(FleetCase):
    # Verifies the tier case on the fleet: a "pro:" key gets its
    # tier's limit, an exact key its own, and any other key the rule's, each
    # shared by both daemons (not per daemon); peek on either daemon shows
    # the limit that applies.
    def test_override_limit_is_shared_by_the_fleet(self):
        for key, limit in (("pro:1", 100), ("acme", 40), ("free:1", 10)):
            for daemon in self.daemons:
                self.assertEqual(daemon.client.result("peek", "tiers", key)["limit"], limit, key)
            allowed = self.admitted("tiers", key, limit)  # twice the limit in all
            # Per minute: refill during the run is at most a unit or two.
            self.assertGreaterEqual(allowed, limit, key)
            self.assertLessEqual(allowed, limit + 2, key)

    # Verifies the per-override fallback shares: with Redis stopped, each
    # daemon admits its share (limit / 2 live nodes) of each key's own limit.
    def test_fallback_share_of_an_override_is_its_limit_divided(self):
        self.redis.signal(signal.SIGSTOP)
        try:
            self.assertTrue(wait_for(lambda: all(
                d.client.result("health")["breaker"] == "open" for d in self.daemons), 5))
            for key, limit in (("pro:2", 100), ("acme", 40), ("free:2", 10)):
                daemon = self.daemons[0]
                decisions = [daemon.acquire("tiers", key) for _ in range(limit)]
                self.assertEqual({d["mode"] for d in decisions}, {"fallback"}, key)
                allowed = sum(d["allowed"] for d in decisions)
                self.assertEqual(allowed, limit // 2, key)
        finally:
            self.redis.signal(signal.SIGCONT)


class PenaltyFleetTest(FleetCase):
    def block_on_first(self, key):
        """Spends the bucket (5) on the first daemon, then denies it until
        its penalty blocks the key; returns the first blocked answer."""
        first = self.daemons[0]
        decisions = [first.acquire("abuse", key) for _ in range(9)]
        modes = [d["mode"] for d in decisions]
        self.assertEqual(sum(d["allowed"] for d in decisions), 5, decisions)
        # The third denial after the five blocks the key: the fourth is blocked.
        self.assertEqual(modes, ["normal"] * 8 + ["blocked"], decisions)
        # The block reaches Redis a round trip after the answer; the other
        # daemon's next lease finds it from then on.
        block_key = redis_key("b", "abuse", key).decode()
        self.assertTrue(wait_for(lambda: self.redis.command("PTTL", block_key) > 0, 1))
        return decisions[-1]

    # Verifies the penalty case on a fleet: a key hammered past 3
    # denials on one daemon is blocked there, and on the other daemon from
    # its first lease of the key (which it never saw before), each with the
    # block's time left; only the daemon that counted the denials counts a
    # block; both let the key be decided normally once the block ends.
    def test_block_on_one_daemon_holds_on_both_until_it_ends(self):
        first, second = self.daemons
        blocked = self.block_on_first("bad")
        self.assertGreater(blocked["retry_after_ms"], BLOCK_MS - 500)
        self.assertLessEqual(blocked["retry_after_ms"], BLOCK_MS)
        learned = second.acquire("abuse", "bad")
        self.assertEqual((learned["allowed"], learned["mode"]), (False, "blocked"), learned)
        self.assertGreater(learned["retry_after_ms"], BLOCK_MS - 1000)
        self.assertLessEqual(learned["retry_after_ms"], BLOCK_MS)
        self.assertEqual(second.client.result("peek", "abuse", "bad")["mode"], "blocked")
        self.assertTrue(second.acquire("abuse", "good")["allowed"])  # other keys untouched
        self.assertEqual(first.client.result("stats")["penalty_blocks"], 1)
        self.assertEqual(second.client.result("stats")["penalty_blocks"], 0)
        for daemon in self.daemons:
            self.assertTrue(wait_for(
                lambda: daemon.client.result("peek", "abuse", "bad")["mode"] == "normal",
                BLOCK_MS / 1000 + 2))
            after = daemon.acquire("abuse", "bad")
            # The block is over; the bucket (5 a minute) is still spent.
            self.assertEqual((after["allowed"], after["mode"]), (False, "normal"), after)

    # Verifies an admin reset on one daemon lifts the block on both: at once
    # where it is called (the key's state is fresh: a full bucket), and on
    # the other within the recheck interval (1 s) plus a lease.
    def test_reset_on_one_daemon_lifts_the_block_on_both(self):
        first, second = self.daemons
        self.block_on_first("reset-me")
        self.assertEqual(second.acquire("abuse", "reset-me")["mode"], "blocked")
        fresh = first.client.result("reset", "abuse", "reset-me")
        self.assertEqual(fresh["remaining"], 5)
        self.assertTrue(first.acquire("abuse", "reset-me")["allowed"])
        lifted = wait_for(lambda: second.acquire("abuse", "reset-me")["allowed"], 2.5)
        self.assertTrue(lifted, second.client.result("peek", "abuse", "reset-me"))

    # Verifies a daemon holds a block it knows of for its whole length while
    # Redis is down (it cannot ask whether it was lifted), then decides the
    # key by its policy again.
    def test_known_block_holds_while_redis_is_down(self):
        first, second = self.daemons
        self.block_on_first("held")
        self.assertEqual(second.acquire("abuse", "held")["mode"], "blocked")
        self.redis.signal(signal.SIGSTOP)
        try:
            self.assertTrue(wait_for(lambda: all(
                d.client.result("health")["breaker"] == "open" for d in self.daemons), 5))
            # Blocked on both throughout, past the recheck interval (1 s).
            until = time.monotonic() + 1.2
            while time.monotonic() < until:
                for daemon in self.daemons:
                    held = daemon.acquire("abuse", "held")
                    self.assertEqual(held["mode"], "blocked", held)
                    self.assertGreater(held["retry_after_ms"], 0)
                time.sleep(0.05)
            self.assertTrue(wait_for(
                lambda: second.acquire("abuse", "held")["mode"] == "fallback", BLOCK_MS / 1000 + 1))
        finally:
            self.redis.signal(signal.SIGCONT)


class WaitingFleetTest(FleetCase):
    # Verifies bounded waiting on a global rule: 10 waiters on each daemon,
    # sent at once to a rule paced at 10 a second for the fleet, are all
    # allowed, one interval apart across the fleet (never three within 1.5
    # intervals), each daemon's in arrival order once the key's first lease
    # has come back (before it, a unit that lease brings for the first in
    # line may go to a request that asks before the first is asked again),
    # with waited_ms; a request
    # that may not wait that long is denied at once.
    def test_waiters_on_both_daemons_leave_one_interval_apart(self):
        released = []  # (time, daemon index, msgid, result)
        def drive(index, daemon):
            for i in range(WAITERS_PER_DAEMON):
                daemon.client.send([0, 100 + i, "acquire", ["paced", "provider", 1]])
            for _ in range(WAITERS_PER_DAEMON):
                daemon.client.sock.settimeout(10)
                response = daemon.client.recv()
                released.append((time.monotonic(), index, response[1], response[2], response[3]))
        start = time.monotonic()
        threads = [threading.Thread(target=drive, args=(i, d)) for i, d in enumerate(self.daemons)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(15)
        self.assertEqual(len(released), 2 * WAITERS_PER_DAEMON)
        for _, _, _, error, result in released:
            self.assertIsNone(error)
            self.assertTrue(result["allowed"], result)
            self.assertEqual(result["mode"], "normal")
        times = sorted(t - start for t, *_ in released)
        gaps = [b - a for a, b in zip(times, times[2:])]
        print("\nmeasured: %d waiters on 2 daemons, released over %.2f s (ideal %.2f s); "
              "closest three within %.0f ms" % (len(times), times[-1] - times[0],
                                                (len(times) - 1) * INTERVAL_S, min(gaps) * 1000))
        self.assertGreaterEqual(min(gaps), 1.5 * INTERVAL_S)
        self.assertLess(times[-1] - times[0], (len(times) - 1) * INTERVAL_S * 1.5)
        for index in range(2):
            mine = [msgid for _, msgid in sorted((t, msgid) for t, i, msgid, *_ in released
                                                 if i == index)]
            self.assertEqual(mine, sorted(mine))
        for t, _, _, _, result in released:
            self.assertLessEqual(abs(result["waited_ms"] / 1000 - (t - start)), 0.05, result)
        error, result = self.daemons[0].client.call("acquire", "paced", "provider", 1, 0)
        self.assertIsNone(error)
        self.assertFalse(result["allowed"])

    def test_waiters_on_several_connections_leave_in_arrival_order(self):
        # Four connections, so both workers hold waiters of the one key; a
        # waiter is sent every 20 ms, in turn on each connection, and the
        # key's units (one per 100 ms) must go to them in that order.
        daemon = self.daemons[0]
        clients = [Client(daemon.socket) for _ in range(4)]
        count = 12
        released = []  # (time, msgid, result)
        lock = threading.Lock()
        def read(client, expected):
            client.sock.settimeout(10)
            for _ in range(expected):
                response = client.recv()
                with lock:
                    released.append((time.monotonic(), response[1], response[2], response[3]))
        readers = [threading.Thread(target=read, args=(c, count // len(clients))) for c in clients]
        for reader in readers:
            reader.start()
        for i in range(count):
            clients[i % len(clients)].send([0, i, "acquire", ["paced", "several", 1]])
            time.sleep(0.02)
        for reader in readers:
            reader.join(15)
        for client in clients:
            client.close()
        self.assertEqual(len(released), count)
        for _, _, error, result in released:
            self.assertIsNone(error)
            self.assertTrue(result["allowed"], result)
        order = [msgid for _, msgid, *_ in sorted(released)]
        print("\nmeasured: %d waiters on 4 connections released in order %s" % (count, order))
        self.assertEqual(order, list(range(count)))


    def test_waiters_that_leave_do_not_hold_up_the_line(self):
        # In line on one key (a unit per 100 ms): 0 and 1 wait on one
        # connection, 2 with a wait too short for its turn, 3, 4 and 4b on a
        # connection that closes, then 5 and 6. 2 is refused once it is
        # first and Redis says its unit comes after its wait. A connection
        # closed by its client can read nothing more: 3, 4 and 4b leave the
        # line with it at once, and take no unit. 5 and 6 are held up by
        # none of them: a place left in the line would have cost them a
        # whole wait (5 s).
        daemon = self.daemons[0]
        first, short, gone = (Client(daemon.socket) for _ in range(3))
        start = time.monotonic()
        first.send([0, 0, "acquire", ["paced", "leave", 1]])
        first.send([0, 1, "acquire", ["paced", "leave", 1]])
        time.sleep(0.02)
        short.send([0, 2, "acquire", ["paced", "leave", 1, 150]])
        time.sleep(0.02)
        gone.send([0, 3, "acquire", ["paced", "leave", 1]])
        gone.send([0, 4, "acquire", ["paced", "leave", 1]])
        gone.send([0, 40, "acquire", ["paced", "leave", 1]])
        time.sleep(0.02)
        first.send([0, 5, "acquire", ["paced", "leave", 1]])
        first.send([0, 6, "acquire", ["paced", "leave", 1]])
        time.sleep(0.02)
        gone.close()
        short.sock.settimeout(5)
        _, msgid, error, result = short.recv()
        refused_after = time.monotonic() - start
        self.assertEqual(msgid, 2)
        self.assertIsNone(error)
        self.assertFalse(result["allowed"], result)
        self.assertLessEqual(result["waited_ms"], 150)
        self.assertGreater(result["retry_after_ms"], 0)
        self.assertLess(refused_after, 0.5)
        first.sock.settimeout(5)
        released = []
        for _ in range(4):
            _, msgid, error, result = first.recv()
            self.assertIsNone(error)
            self.assertTrue(result["allowed"], result)
            released.append((msgid, time.monotonic() - start))
        print("\nmeasured: 2 refused after %.0f ms; released %s" % (
            refused_after * 1000, ", ".join("%d at %.0f ms" % (m, t * 1000) for m, t in released)))
        self.assertEqual([m for m, _ in released], [0, 1, 5, 6])
        # Units at 0, 100 (1), 200 (5) and 300 ms (6).
        self.assertLess(released[-1][1], 0.3 + 0.15)
        self.assertEqual(daemon.client.result("stats")["leases"]["spent_units"], 4)
        for client in (first, short):
            client.close()

    def test_a_line_longer_than_the_wait_refuses_at_once(self):
        # A unit per 100 ms and waits of 300 ms: the fleet could give a line
        # 1 (the burst) + 3 units within a wait. 0 is allowed at once; 1 to 4
        # stand in line (1 and 2 get theirs at 100 and 200 ms, 3's would
        # come just after its wait); 5 to 9 would stand behind more than 3
        # units and are refused at once, with a hint of when the line will
        # have gone.
        daemon = self.daemons[0]
        for i in range(10):
            daemon.client.send([0, i, "acquire", ["paced", "bounded", 1, 300]])
        daemon.client.sock.settimeout(5)
        answers = {}
        for _ in range(10):
            _, msgid, error, result = daemon.client.recv()
            self.assertIsNone(error)
            answers[msgid] = result
        for msgid in (0, 1, 2):
            self.assertTrue(answers[msgid]["allowed"], (msgid, answers[msgid]))
        for msgid in range(5, 10):
            self.assertFalse(answers[msgid]["allowed"], (msgid, answers[msgid]))
            self.assertLessEqual(answers[msgid]["waited_ms"], 50, (msgid, answers[msgid]))
            self.assertGreaterEqual(answers[msgid]["retry_after_ms"], 300, (msgid, answers[msgid]))

    def test_stopping_answers_every_waiter_at_once(self):
        daemon = self.daemons[0]
        for i in range(6):
            daemon.client.send([0, i, "acquire", ["paced", "stop", 1]])
        # The first is allowed at once; the rest stand in line for seconds.
        daemon.client.sock.settimeout(5)
        _, msgid, error, result = daemon.client.recv()
        self.assertEqual((msgid, error, result["allowed"]), (0, None, True))
        time.sleep(0.15)
        stopped = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        answers = [daemon.client.recv() for _ in range(5)]
        self.assertLess(time.monotonic() - stopped, 1.0)
        allowed = [m for _, m, e, r in answers if e is None and r["allowed"]]
        refused = [m for _, m, e, r in answers if e is None and not r["allowed"]]
        # One more unit may have come due before the signal.
        self.assertLessEqual(len(allowed), 1)
        self.assertEqual(sorted(allowed + refused), [1, 2, 3, 4, 5])
        self.assertEqual(daemon.proc.wait(10), 0)

def tearDownModule():
    tear_down_module()


if __name__ == "__main__":
    unittest.main()
