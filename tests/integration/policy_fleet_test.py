#!/usr/bin/python3
"""Policies on global rules, on a fleet of two real sluiced sharing one real
redis-server: an override's limit is what the fleet shares (and, with Redis
down, each node's share of it).

Needs SLUICED (the daemon binary) in the environment; run with /usr/bin/python3
(python3-msgpack).
"""

import os
import signal
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (MADE_DIRS, STARTED_PROCS, Client, Redis, end_process,  # noqa: E402
                     make_dir, spawn, wait_accepting, wait_for)

SLUICED = os.environ.get("SLUICED", "sluiced")

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
"""


class Daemon:
    """A sluiced in its own temp dir on the given Redis port."""

    def __init__(self, index, redis_port):
        self.dir = make_dir("pf.")
        self.socket = os.path.join(self.dir, "s.sock")
        config = os.path.join(self.dir, "sluice.toml")
        with open(config, "w") as f:
            f.write(CONFIG.format(socket=self.socket, port=redis_port, index=index))
        self.log = open(os.path.join(self.dir, "log"), "w+")
        self.proc = spawn([SLUICED, "--config", config], stdout=self.log,
                          stderr=subprocess.STDOUT)
        wait_accepting(self.socket, self.proc, self.logs)
        self.client = Client(self.socket)

    def acquire(self, rule, key):
        return self.client.result("acquire", rule, key)

    def logs(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        self.client.close()
        end_process(self.proc)
        self.log.close()


class PolicyFleetTest(unittest.TestCase):
    def setUp(self):
        self.redis = Redis()
        self.daemons = [Daemon(i, self.redis.port) for i in range(2)]
        self.assertTrue(wait_for(lambda: all(
            d.client.result("health")["nodes"] == 2 and
            d.client.result("health")["breaker"] == "closed" for d in self.daemons), 10),
            self.daemons[0].logs())

    def tearDown(self):
        for daemon in self.daemons:
            daemon.stop()
        self.redis.stop()

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


def tearDownModule():
    for proc in STARTED_PROCS:
        end_process(proc)
    for path in MADE_DIRS:
        subprocess.run(["rm", "-rf", path], check=False)


if __name__ == "__main__":
    unittest.main()
