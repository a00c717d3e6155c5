#!/usr/bin/python3
"""Global rules of several limits on a fleet of two real sluiced sharing one
real redis-server: each limit leases from Redis on its own (a part of the
rule, rules.h), so one daemon alone may spend the fleet's whole limit of
each, the fleet together never more than any of them, answers say "normal",
and acquire_all, peek and reset treat the rule as one; with Redis stopped,
each daemon decides on its share of each limit.

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
from harness import (DaemonPairCase, redis_key, tear_down_module,  # noqa: E402
                     wait_for)

# Periods of hours and days, so that nothing refills during a test, except
# "pair"'s per-second limit.
CONFIG = """
[daemon]
socket = "{socket}"
workers = 2

[redis]
url = "redis://127.0.0.1:{port}"
node_id = "multi-{index}"
expected_nodes = 2
heartbeat_interval = "100ms"
health_interval = "50ms"
health_timeout = "100ms"
lease_timeout = "200ms"

# 10 a second and 30 an hour, for the whole fleet.
[[rule]]
name = "pair"
algorithm = "token_bucket"
limits = [{{ limit = 10, period = "1s" }}, {{ limit = 30, period = "1h" }}]
scope = "global"

[[rule]]
name = "single"
algorithm = "token_bucket"
limit = 3
period = "1h"
scope = "global"
{binding}
"""

# For each algorithm with a rate lease script, a rule whose first limit binds
# and one whose second does: one daemon alone spends exactly the binding
# limit, where its share of it would be half.
ALGORITHMS = ("token_bucket", "gcra", "fixed_window", "sliding_window", "sliding_log")
BINDING = "".join("""
[[rule]]
name = "{algorithm}-first"
algorithm = "{algorithm}"
limits = [{{ limit = 8, period = "{short}" }}, {{ limit = 12, period = "{long}" }}]
scope = "global"

[[rule]]
name = "{algorithm}-second"
algorithm = "{algorithm}"
limits = [{{ limit = 12, period = "{short}" }}, {{ limit = 8, period = "{long}" }}]
scope = "global"
""".format(algorithm=algorithm,
           short="24h" if "window" in algorithm else "1h",
           long="48h" if "window" in algorithm else "2h") for algorithm in ALGORITHMS)
BINDING_LIMIT = 8


class MultiLimitFleetTest(DaemonPairCase):
    config = CONFIG
    config_args = {"binding": BINDING}
    name = "multi"

    def spend(self, daemon, rule, key, times, mode="normal"):
        """Acquires `times` times back to back; returns the number allowed,
        after checking every answer's mode."""
        allowed = 0
        for _ in range(times):
            decision = daemon.acquire(rule, key)
            self.assertEqual(decision["mode"], mode, (rule, key, decision))
            allowed += decision["allowed"]
        return allowed

    # Verifies the uneven load the share cannot serve: one daemon alone
    # spends the fleet's whole limit, whichever of the rule's limits binds
    # and whatever the algorithm, leasing (mode normal); the other daemon
    # then gets nothing, so the fleet stays within the limit.
    def test_one_daemon_alone_spends_the_fleet_limit_of_each_limit(self):
        for algorithm in ALGORITHMS:
            for binding in ("first", "second"):
                rule = "%s-%s" % (algorithm, binding)
                alone = self.spend(self.daemons[0], rule, "k", 3 * BINDING_LIMIT)
                self.assertEqual(alone, BINDING_LIMIT, rule)
                self.assertEqual(self.spend(self.daemons[1], rule, "k", BINDING_LIMIT), 0, rule)

    # Verifies the per-second limit and the hourly one of one rule, each
    # leased across the fleet: a burst on one daemon gets the fleet's 10
    # (its share would be 5), and over a few seconds of both daemons
    # asking at once the fleet admits the hour's 30 and no more, however
    # the requests are spread.
    def test_fleet_total_stays_within_each_limit(self):
        burst = self.spend(self.daemons[0], "pair", "k", 15)
        started = time.monotonic()
        self.assertGreaterEqual(burst, 10)
        self.assertLessEqual(burst, 11)  # a unit may refill during the burst
        counts = [0, 0]
        modes = set()

        def run(index):
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                decision = self.daemons[index].acquire("pair", "k")
                modes.add(decision["mode"])
                counts[index] += decision["allowed"]
                time.sleep(0.01)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
        total = burst + sum(counts)
        print("pair: burst %d, then %s in %.1f s; fleet total %d of 30 an hour"
              % (burst, counts, elapsed, total))
        self.assertEqual(modes, {"normal"})
        # 10 a second would allow about 50 in the time: the hour binds.
        self.assertLessEqual(total, 30)
        self.assertGreaterEqual(total, 27)  # units a slice holds at the end
        # Each part has its own state in Redis, under its own name (the
        # per-second one's is gone already: its bucket is full again).
        self.assertGreater(self.redis.command("PTTL", redis_key("q", b"pair\x1f1", "k")), 0)
        self.assertEqual(self.redis.command("EXISTS", redis_key("q", "pair", "k")), 0)

    # Verifies acquire_all is all or nothing across the parts and the other
    # items: a denied item leaves every limit's units where they were, and
    # the answer reports the rule as one item.
    def test_acquire_all_spends_all_limits_or_none(self):
        daemon = self.daemons[0]
        rule = "token_bucket-first"
        self.assertEqual(self.spend(daemon, "single", "k", 3), 3)
        result = daemon.client.result("acquire_all", [[rule, "k", 1], ["single", "k", 1]])
        self.assertFalse(result["allowed"])
        self.assertEqual(len(result["results"]), 2)
        self.assertEqual(result["results"][0]["mode"], "normal")
        self.assertTrue(result["results"][0]["allowed"])  # alone, it would pass
        self.assertEqual(self.spend(daemon, rule, "k", 10), BINDING_LIMIT)
        result = daemon.client.result("acquire_all", [[rule, "j", 1], ["gcra-first", "j", 1]])
        self.assertTrue(result["allowed"], result)
        self.assertEqual([r["mode"] for r in result["results"]], ["normal", "normal"])
        self.assertEqual(self.spend(daemon, rule, "j", 10), BINDING_LIMIT - 1)

    # Verifies peek reports the most restrictive limit, as a local rule of
    # several limits does, and that the rules and stats methods show the
    # configured rule once, with no part.
    def test_peek_rules_and_stats_show_the_rule_as_configured(self):
        daemon = self.daemons[0]
        peek = daemon.client.result("peek", "gcra-second", "k")
        self.assertEqual((peek["allowed"], peek["limit"], peek["remaining"]),
                         (True, 8, 8), peek)
        self.assertEqual(self.spend(daemon, "gcra-second", "k", 5), 5)
        peek = daemon.client.result("peek", "gcra-second", "k")
        self.assertEqual((peek["allowed"], peek["mode"]), (True, "normal"), peek)
        self.assertEqual(self.spend(daemon, "gcra-second", "k", 3), 3)
        # The hourly limit of 12 would allow; the 8 in 2 h denies, for 15 min.
        denied = daemon.acquire("gcra-second", "k")
        self.assertEqual((denied["allowed"], denied["limit"], denied["mode"]),
                         (False, 8, "normal"), denied)
        self.assertGreater(denied["retry_after_ms"], 60_000, denied)
        peek = daemon.client.result("peek", "gcra-second", "k")
        self.assertEqual((peek["remaining"], peek["mode"]), (0, "normal"), peek)
        rules = daemon.client.result("rules")
        self.assertEqual(sorted(rule["name"] for rule in rules), sorted(
            ["pair", "single"] + ["%s-%s" % (a, b) for a in ALGORITHMS
                                  for b in ("first", "second")]))
        rule = next(rule for rule in rules if rule["name"] == "gcra-second")
        self.assertEqual([limit["limit"] for limit in rule["limits"]], [12, 8])
        stats = daemon.client.result("stats")["rules"]
        self.assertEqual(stats, {"gcra-second": {"allowed": {"normal": 8},
                                                 "denied": {"normal": 1}}})

    # Verifies reset forgets the key on every limit, across the fleet.
    def test_reset_restores_every_limit(self):
        rule = "token_bucket-second"
        self.assertEqual(self.spend(self.daemons[0], rule, "k", 10), BINDING_LIMIT)
        answer = self.daemons[0].client.result("reset", rule, "k")
        self.assertEqual(answer["remaining"], BINDING_LIMIT, answer)
        self.assertTrue(wait_for(lambda: self.redis.command(
            "EXISTS", redis_key("q", rule.encode() + b"\x1f1", "k")) == 0, 2))
        self.assertEqual(self.spend(self.daemons[1], rule, "k", 10), BINDING_LIMIT)

    # Verifies fallback: with Redis stopped, each daemon decides on its share
    # (half) of each limit: a burst gets half the per-second limit, and a few
    # seconds get half the hour's, on each daemon. Once Redis is back, what
    # they admitted counts against each limit.
    def test_each_daemon_gets_its_share_of_each_limit_while_redis_is_down(self):
        self.redis.signal(signal.SIGSTOP)
        try:
            self.assertTrue(wait_for(lambda: all(
                d.client.result("health")["breaker"] == "open" for d in self.daemons), 5))
            for daemon in self.daemons:
                self.assertEqual(self.spend(daemon, "pair", "down", 8, "fallback"), 5)
            deadline = time.monotonic() + 3.5  # 5 a second: the hour's 15 after 2 s
            totals = [5, 5]
            while time.monotonic() < deadline:
                for index, daemon in enumerate(self.daemons):
                    totals[index] += self.spend(daemon, "pair", "down", 1, "fallback")
                time.sleep(0.02)
            self.assertEqual(totals, [15, 15])
            for daemon in self.daemons:
                self.assertEqual(self.spend(daemon, "token_bucket-second", "down", 10,
                                            "fallback"), BINDING_LIMIT // 2)
        finally:
            self.redis.signal(signal.SIGCONT)
        # On recovery each daemon debits what each part admitted to that
        # part's own state (admissions over the same span count once, as for
        # a rule of one limit: lua/token_bucket.lua): of the 8 in 2 h, the 4
        # each daemon admitted leave 4 (without the debit, 8).
        self.assertTrue(wait_for(lambda: all(
            d.client.result("health")["breaker"] == "closed" for d in self.daemons), 5))
        self.assertEqual([d.client.result("stats")["leases"]["debited_units"]
                          for d in self.daemons], [15 + 15 + 4 + 4] * 2)
        self.assertEqual(self.spend(self.daemons[0], "token_bucket-second", "down", 10),
                         BINDING_LIMIT // 2)


def tearDownModule():
    tear_down_module()


if __name__ == "__main__":
    unittest.main()
