#!/usr/bin/python3
"""A global sliding_log rule on a fleet of two real sluiced sharing one real
redis-server: the log lives in Redis as a sorted set of admission times
(lua/sliding_log.lua), leased into the daemons' slices, so either daemon
alone may spend the fleet's whole limit, the fleet together stays within it
(plus the overshoot bound: units leased and unspent), answers say "normal"
while Redis is up, unspent units leave the log when a daemon stops, and with
Redis gone each daemon decides on its share (mode "fallback").

Needs SLUICED (the daemon binary) in the environment; run with /usr/bin/python3
(python3-msgpack).
"""

import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (DaemonPairCase, redis_key, tear_down_module,  # noqa: E402
                     wait_for)

LIMIT = 20
PERIOD_S = 2.0

CONFIG = """
[daemon]
socket = "{socket}"
workers = 2

[redis]
url = "redis://127.0.0.1:{port}"
node_id = "log-{index}"
expected_nodes = 2
heartbeat_interval = "100ms"
health_interval = "50ms"
health_timeout = "100ms"
lease_timeout = "200ms"

# 20 in any 2 s, for the whole fleet.
[[rule]]
name = "log"
algorithm = "sliding_log"
limit = 20
period = "2s"
scope = "global"

# 6 an hour: nothing leaves the log during a test.
[[rule]]
name = "hourly"
algorithm = "sliding_log"
limit = 6
period = "1h"
scope = "global"
"""


class SlidingLogFleetTest(DaemonPairCase):
    config = CONFIG
    name = "log"

    def spend(self, daemon, rule, key, times, mode="normal"):
        """Acquires `times` times back to back; returns the number allowed,
        after checking every answer's mode."""
        allowed = 0
        for _ in range(times):
            decision = daemon.acquire(rule, key)
            self.assertEqual(decision["mode"], mode, (rule, key, decision))
            allowed += decision["allowed"]
        return allowed

    def logged(self, rule, key):
        """Units in the Redis log of (rule, key), in the window or not."""
        return self.redis.command("ZCARD", redis_key("q", rule, key))

    # Verifies the log is the fleet's: one daemon alone spends the whole
    # limit (its share would be half) on leases (mode normal), every unit
    # it spent is an entry of the Redis log, and the other daemon then gets
    # nothing until those entries leave the window.
    def test_one_daemon_alone_spends_the_fleet_limit(self):
        a, b = self.daemons
        self.assertEqual(self.spend(a, "hourly", "k", 10), 6)
        self.assertEqual(self.logged("hourly", "k"), 6)
        self.assertEqual(self.spend(b, "hourly", "k", 6), 0)
        denied = b.acquire("hourly", "k")
        self.assertGreater(denied["retry_after_ms"], 3_500_000, denied)
        peek = b.client.result("peek", "hourly", "k")
        self.assertEqual((peek["remaining"], peek["mode"]), (0, "normal"), peek)

    # Verifies that units a daemon leased and did not spend leave the log
    # when it stops gracefully: the log keeps exactly the units admitted,
    # so the other daemon gets the rest.
    def test_stop_removes_unspent_units_from_the_log(self):
        a, b = self.daemons
        # A burst makes the next batch cover more than one request.
        self.assertEqual(self.spend(a, "hourly", "k", 2), 2)
        self.assertTrue(wait_for(
            lambda: a.client.result("health")["leased_units"] > 0 or
            self.spend(a, "hourly", "k", 1) == 0, 5))
        stats = a.client.result("stats")
        spent = stats["rules"]["hourly"]["allowed"]["normal"]
        held = a.client.result("health")["leased_units"]
        print("\nhourly: %d spent, %d leased and unspent at the stop" % (spent, held))
        self.assertEqual(self.logged("hourly", "k"), spent + held)
        # The units held are the node's overshoot bound on the rule.
        self.assertEqual(stats["overshoot_bound"], {"log": 0, "hourly": held})
        a.terminate()
        self.assertEqual(self.logged("hourly", "k"), spent)
        self.assertEqual(self.spend(b, "hourly", "k", 10), 6 - spent)

    # Verifies the fleet stays within the limit in every window of one
    # period while both daemons ask at once, well over the limit, for a few
    # periods: at most LIMIT plus the fleet's overshoot bound (the sum of
    # the daemons' `stats`, the units they held leased and unspent). Answers are timed at the client, after the daemon
    # decided, so a window here may hold a unit or two a daemon admitted
    # just before it.
    def test_fleet_stays_within_the_limit_in_every_window(self):
        times = [[], []]
        modes = set()
        bound = [0]
        stop = time.monotonic() + 4 * PERIOD_S

        def run(index):
            daemon = self.daemons[index]
            while time.monotonic() < stop:
                decision = daemon.acquire("log", "k")
                modes.add(decision["mode"])
                if decision["allowed"]:
                    times[index].append(time.monotonic())
                time.sleep(0.01)

        # Health on connections of its own: the threads own the clients.
        watchers = [d.connect() for d in self.daemons]
        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            bound[0] = max(bound[0], sum(w.result("stats")["overshoot_bound"]["log"]
                                         for w in watchers))
            time.sleep(0.05)
        for thread in threads:
            thread.join()
        for watcher in watchers:
            watcher.close()
        admitted = sorted(times[0] + times[1])
        most = max(sum(1 for t in admitted if start <= t < start + PERIOD_S)
                   for start in admitted)
        print("\nlog: %d and %d admitted in %.0f s; at most %d in a window of %.0f s "
              "(limit %d, the fleet's overshoot bound at most %d)"
              % (len(times[0]), len(times[1]), 4 * PERIOD_S, most, PERIOD_S, LIMIT, bound[0]))
        self.assertEqual(modes, {"normal"})
        self.assertLessEqual(most, LIMIT + bound[0] + 2)
        self.assertGreaterEqual(len(admitted), 3 * LIMIT)
        # Both daemons got units: the log is shared, not split.
        self.assertGreater(min(len(times[0]), len(times[1])), 0)

    # Verifies the fallback: with Redis gone each daemon decides on its
    # share of the log (half the limit, mode "fallback"), and its overshoot
    # bound is that share (it holds no leased units).
    def test_redis_down_falls_back_to_the_share(self):
        for daemon in self.daemons:
            self.assertEqual(daemon.client.result("stats")["overshoot_bound"],
                             {"log": 0, "hourly": 0})
        self.redis.kill()
        for daemon in self.daemons:
            self.assertTrue(wait_for(
                lambda: daemon.client.result("health")["breaker"] == "open", 5))
            self.assertEqual(daemon.client.result("stats")["overshoot_bound"],
                             {"log": 10, "hourly": 3})
            self.assertEqual(self.spend(daemon, "hourly", "down", 6, mode="fallback"), 3)


def tearDownModule():
    tear_down_module()


if __name__ == "__main__":
    unittest.main()
