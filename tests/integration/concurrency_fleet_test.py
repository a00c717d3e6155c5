#!/usr/bin/python3
"""Global concurrency rules on a fleet of two real sluiced sharing one real
redis-server: one daemon may hold every unit of the limit while the other
holds none; the fleet never holds more than the limit at once, under load
from many clients on both daemons; units released on one daemon go back to
Redis and the other daemon gets them; the units of a SIGKILLed daemon come
free after lease_ttl; with Redis down each daemon holds at most its share,
and on recovery the units held in fallback are leased back, so the fleet
stays within the limit.

Needs SLUICED (the daemon binary) in the environment; run with /usr/bin/python3
(python3-msgpack).
"""

import os
import random
import signal
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Client, Daemon, DaemonPairCase, redis_key,  # noqa: E402
                     tear_down_module, wait_for)

LIMIT = 10
LEASE_TTL_S = 0.9

CONFIG = """
[daemon]
socket = "{socket}"
workers = 2

[redis]
url = "redis://127.0.0.1:{port}"
node_id = "conc-{index}"
expected_nodes = 2
heartbeat_interval = "100ms"
health_interval = "50ms"
health_timeout = "100ms"
lease_timeout = "50ms"
lease_ttl = "{ttl_ms}ms"

[[rule]]
name = "jobs"
algorithm = "concurrency"
limit = {limit}
scope = "global"

[[rule]]
name = "timed"
algorithm = "concurrency"
limit = 4
period = "60s"
scope = "global"
"""


class MonitoredCalls:
    """Counts, through MONITOR, the EVALSHA calls Redis runs on a key whose
    name contains `fragment` while the `with` block runs. Redis runs
    commands in order: MONITOR shows the block's calls before the marker
    sent after it."""

    def __init__(self, redis, fragment):
        self.redis, self.fragment, self.calls = redis, fragment.encode(), 0

    def read_until(self, end):
        while end not in self.seen:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("MONITOR connection closed")
            self.seen += data

    def __enter__(self):
        self.sock = socket.create_connection(("127.0.0.1", self.redis.port), timeout=5)
        self.seen = b""
        self.sock.sendall(b"MONITOR\r\n")
        self.read_until(b"+OK\r\n")
        self.seen = b""
        return self

    def __exit__(self, *exc):
        marker = "end-of-block-%d" % os.getpid()
        self.redis.command("ECHO", marker)
        self.read_until(marker.encode())
        self.sock.close()
        self.calls = sum(1 for line in self.seen.split(b"\r\n")
                         if b'"EVALSHA"' in line and self.fragment in line)
        return False


class JobsDaemon(Daemon):
    """A sluiced on the given Redis port, with acquires and releases of the
    "jobs" rule."""

    def __init__(self, index, redis_port):
        super().__init__("conc-%d" % index, dir_prefix="cf.")
        self.index = index
        self.start(CONFIG.format(socket=self.socket, port=redis_port, index=index,
                                 ttl_ms=int(LEASE_TTL_S * 1000), limit=LIMIT), connect=True)

    def take(self, key="k"):
        return self.client.result("acquire", "jobs", key)

    def release(self, key="k", cost=1):
        return self.client.result("release", "jobs", key, cost)

    def hold(self, count, key="k"):
        """Acquires `count` times; returns how many were allowed."""
        return sum(1 for _ in range(count) if self.take(key)["allowed"])


def held_in_redis(redis, key="k"):
    """Units each node holds in Redis for (jobs, key): {node: units}."""
    reply = redis.command("HGETALL", redis_key("q", "jobs", key)) or []
    return {reply[i]: int(reply[i + 1].split(":")[0]) for i in range(0, len(reply), 2)}


class ConcurrencyFleetCase(DaemonPairCase):
    def start_daemon(self, index, redis_port):
        return JobsDaemon(index, redis_port)

    def hold_within(self, daemon, count, seconds):
        """Acquires on `daemon` until it holds `count` units or `seconds`
        pass; returns how many it holds."""
        held = 0
        deadline = time.monotonic() + seconds
        while held < count and time.monotonic() < deadline:
            if daemon.take()["allowed"]:
                held += 1
            else:
                time.sleep(0.02)
        return held

    # Verifies one daemon can hold every unit of the limit while the other
    # holds none (a node's share, limit / N, caps a lease, not its holding),
    # and not one more; the other daemon then gets nothing.
    def test_one_daemon_holds_the_whole_limit_when_the_other_holds_none(self):
        a, b = self.daemons
        results = [a.take() for _ in range(LIMIT + 3)]
        allowed = [r for r in results if r["allowed"]]
        self.assertEqual(len(allowed), LIMIT, results)
        self.assertTrue(all(r["mode"] == "normal" for r in results), results)
        self.assertFalse(b.take()["allowed"])
        self.assertEqual(held_in_redis(self.redis), {"conc-0": LIMIT})
        health = a.client.result("health")
        self.assertEqual(health["leased_units"], 0, health)  # all of them in use
        stats = a.client.result("stats")["leases"]
        self.assertEqual(stats["granted_units"], LIMIT, stats)

    # Verifies a denial's retry_after_ms expects a unit the other daemon
    # releases (back within two renewal intervals and a lease interval),
    # not the deadline of the units this daemon holds (the rule's period,
    # 60 s).
    def test_a_denial_expects_units_the_other_daemon_releases(self):
        a, b = self.daemons
        for _ in range(2):
            self.assertTrue(b.client.result("acquire", "timed", "k")["allowed"])
        # b gives back what its pool leased beyond those two; a takes them.
        for _ in range(2):
            self.assertTrue(wait_for(
                lambda: a.client.result("acquire", "timed", "k")["allowed"], timeout=5))
        denied = b.client.result("acquire", "timed", "k")
        self.assertFalse(denied["allowed"], denied)
        back_ms = 2 * LEASE_TTL_S / 3 * 1000 + 100  # renewals, then a lease interval
        self.assertGreater(denied["retry_after_ms"], 0, denied)
        self.assertLessEqual(denied["retry_after_ms"], back_ms + 1, denied)

    # Verifies a busy key costs Redis next to nothing per acquire: releases
    # go back into the daemon's pool, not to Redis. Counted with MONITOR,
    # the script calls naming the key (heartbeats run all along, at a rate
    # of their own).
    def test_a_busy_key_costs_redis_almost_nothing_per_acquire(self):
        a, _ = self.daemons
        self.assertTrue(a.take()["allowed"])  # the first lease
        count = 3000
        with MonitoredCalls(self.redis, "jobs:k") as monitored:
            for _ in range(count):
                self.assertTrue(a.take()["allowed"])
                a.release()
        print("\n%d acquire/release pairs on one key: %d Redis script calls on it (%.4f per "
              "acquire)" % (count, monitored.calls, monitored.calls / count))
        self.assertLess(monitored.calls, count / 100)

    # Verifies acquire_all is all or nothing on holdings: a group denied by
    # a full key holds nothing on its other keys.
    def test_acquire_all_holds_nothing_when_a_key_is_full(self):
        a, _ = self.daemons
        self.assertEqual(a.hold(LIMIT, "full"), LIMIT)
        group = a.client.result("acquire_all", [["jobs", "other", 2], ["jobs", "full", 1]])
        self.assertFalse(group["allowed"], group)
        self.assertEqual(a.hold(LIMIT + 1, "other"), LIMIT)
        group = a.client.result("acquire_all", [["jobs", "third", 2], ["jobs", "fourth", 3]])
        self.assertTrue(group["allowed"], group)
        self.assertEqual(a.hold(LIMIT, "third"), LIMIT - 2)

    # Verifies units released on one daemon go back to Redis (within about
    # two renewal intervals, lease_ttl / 3 each) and the other daemon
    # acquires them, while the first gets none back.
    def test_releases_let_the_other_daemon_acquire(self):
        a, b = self.daemons
        self.assertEqual(a.hold(LIMIT), LIMIT)
        self.assertEqual(a.release(cost=LIMIT)["remaining"], LIMIT)
        self.assertEqual(a.client.result("stats")["leases"]["released_units"], LIMIT)
        self.assertEqual(a.client.result("health")["leased_units"], LIMIT)
        start = time.monotonic()
        self.assertEqual(self.hold_within(b, LIMIT, 5), LIMIT, b.logs())
        took = time.monotonic() - start
        print("\nunits released on one daemon all held by the other after %.2f s "
              "(renewal interval %.2f s)" % (took, LEASE_TTL_S / 3))
        self.assertLess(took, 3 * LEASE_TTL_S)
        self.assertFalse(a.take()["allowed"])
        self.assertEqual(held_in_redis(self.redis), {"conc-1": LIMIT})
        leases = a.client.result("stats")["leases"]
        self.assertEqual(leases["returned_units"], LIMIT, leases)
        self.assertEqual(a.client.result("health")["leased_units"], 0)

    # Verifies the fleet never holds more than the limit at once: clients on
    # both daemons (more than the limit) acquire, hold a moment and release
    # for a few seconds. A client counts a unit from its answer until just
    # before its release, so the count never exceeds what the daemons let
    # hold; Redis's holdings are sampled too.
    def test_the_fleet_never_holds_more_than_the_limit(self):
        lock = threading.Lock()
        state = {"holding": 0, "most": 0, "acquired": 0, "redis_most": 0}
        stop = time.monotonic() + 4

        def client(daemon):
            c = Client(daemon.socket)
            rng = random.Random(daemon.index)
            while time.monotonic() < stop:
                if not c.result("acquire", "jobs", "k")["allowed"]:
                    time.sleep(0.005)
                    continue
                with lock:
                    state["holding"] += 1
                    state["acquired"] += 1
                    state["most"] = max(state["most"], state["holding"])
                time.sleep(rng.uniform(0.002, 0.02))
                with lock:
                    state["holding"] -= 1
                c.result("release", "jobs", "k", 1)
            c.close()

        threads = [threading.Thread(target=client, args=(d,))
                   for d in self.daemons for _ in range(8)]
        before = self.redis.script_calls()
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            state["redis_most"] = max(state["redis_most"],
                                      sum(held_in_redis(self.redis).values()))
            time.sleep(0.01)
        for t in threads:
            t.join()
        calls = self.redis.script_calls() - before  # heartbeats included
        print("\nfleet: %d units acquired by 16 clients in 4 s, at most %d held at once "
              "(limit %d), Redis at most %d; %d script calls (%.3f per acquire)"
              % (state["acquired"], state["most"], LIMIT, state["redis_most"], calls,
                 calls / state["acquired"]))
        self.assertLessEqual(state["most"], LIMIT)
        self.assertLessEqual(state["redis_most"], LIMIT)
        self.assertGreater(state["acquired"], 200)

    # Verifies the units of a daemon killed with SIGKILL (no return, no
    # renewal) come free after lease_ttl, not before its holding expires.
    def test_a_killed_daemons_units_come_free_after_lease_ttl(self):
        a, b = self.daemons
        self.assertEqual(a.hold(LIMIT), LIMIT)
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()
        killed = time.monotonic()
        self.assertFalse(b.take()["allowed"])
        self.assertEqual(self.hold_within(b, LIMIT, LEASE_TTL_S + 2), LIMIT, b.logs())
        took = time.monotonic() - killed
        print("\nthe killed daemon's %d units held by the other %.2f s after SIGKILL "
              "(lease_ttl %.1f s)" % (LIMIT, took, LEASE_TTL_S))
        # Its last renewal came at most a renewal interval before the kill.
        self.assertGreater(took, LEASE_TTL_S * 2 / 3 - 0.1)
        self.assertLess(took, LEASE_TTL_S + 0.5)

    # Verifies fallback: with Redis down each daemon holds at most its share
    # (limit / 2), on the slots its releases find; when Redis comes back
    # (without its data), the units held in fallback are leased back before
    # the breakers close, so the fleet holds no more than the limit.
    def test_fallback_holds_the_share_and_recovery_leases_it_back(self):
        a, b = self.daemons
        self.redis.kill()
        for d in self.daemons:
            self.assertTrue(wait_for(lambda d=d: d.client.result("health")["breaker"] == "open",
                                     5))
        share = LIMIT // 2
        for d in self.daemons:
            results = [d.take() for _ in range(share + 2)]
            self.assertEqual(sum(r["allowed"] for r in results), share, results)
            self.assertTrue(all(r["mode"] == "fallback" for r in results), results)
        # A release in fallback frees a unit of the share.
        self.assertEqual(a.release()["remaining"], 1)
        self.assertTrue(a.take()["allowed"])
        self.redis.start()
        for d in self.daemons:
            self.assertTrue(wait_for(
                lambda d=d: d.client.result("health")["breaker"] == "closed", 10), d.logs())
        self.assertEqual(held_in_redis(self.redis), {"conc-0": share, "conc-1": share})
        for d in self.daemons:
            result = d.take()
            self.assertFalse(result["allowed"], result)
            self.assertEqual(result["mode"], "normal")


def tearDownModule():
    tear_down_module()


if __name__ == "__main__":
    unittest.main()
