#!/usr/bin/python3
"""Redis state versions on one real redis-server (docs/operations.md,
"Upgrading the Redis state"): a daemon that writes another state version
than the fleet's marker names is refused (it stays up, answers by
on_redis_down, health says both versions, one log line names them and the
upgrade section) and writes nothing to Redis's rule state; once the last
daemon of the fleet's version stops, the marker expires within a members'
TTL and the new version claims it and leases from its own keys. The other
version is faked with SLUICE_TEST_STATE_VERSION, a seam only tests use.

Needs SLUICED (the daemon binary) in the environment; run with /usr/bin/python3
(python3-msgpack).
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (STATE_VERSION, Daemon, Redis, redis_key,  # noqa: E402
                     tear_down_module, wait_for)

CONFIG = """
[daemon]
socket = "{socket}"

[redis]
url = "redis://127.0.0.1:{port}"
node_id = "{name}"
expected_nodes = 2
heartbeat_interval = "100ms"
health_interval = "50ms"
health_timeout = "100ms"

[[rule]]
name = "api"
algorithm = "token_bucket"
limit = 100
period = "1m"
scope = "global"
"""

# The marker lives a members' TTL (3 heartbeat intervals) after the last
# claim of its version; its successor claims it at its next heartbeat.
MARKER_TTL_MS = 300
REFUSED_LINE = ("runs Redis state version %d and this daemon writes version %d")


class StateVersionTest(unittest.TestCase):
    def setUp(self):
        self.redis = Redis()
        self.addCleanup(self.redis.stop)

    def daemon(self, name, version=None):
        daemon = Daemon(name)
        self.addCleanup(daemon.stop)
        env = dict(os.environ)
        if version is not None:
            env["SLUICE_TEST_STATE_VERSION"] = str(version)
        daemon.start(CONFIG.format(socket=daemon.socket, port=self.redis.port, name=name),
                     connect=True, env=env)
        return daemon

    def wait_health(self, daemon, **fields):
        last = {}

        def matches():
            last.update(daemon.health())
            return all(last.get(k) == v for k, v in fields.items())
        self.assertTrue(wait_for(matches, 5), "%s: %s\n%s" % (fields, last, daemon.logs()))

    def state_keys(self, version):
        return self.redis.command("EVAL", "return #redis.call('KEYS', ARGV[1])", "0",
                                  "sluice:v%d:*" % version)

    # Verifies the whole path of a mixed fleet: the incumbent version leases,
    # the other is refused with one clear log line and health's view, leases
    # nothing, and takes the prefix over once the incumbent is gone.
    def test_a_daemon_of_another_state_version_is_refused_until_the_fleet_is_gone(self):
        new = STATE_VERSION + 1
        old_daemon = self.daemon("old")
        self.wait_health(old_daemon, breaker="closed", state_version=STATE_VERSION,
                         fleet_state_version=STATE_VERSION, status="ok")
        self.assertEqual(self.redis.command("GET", "sluice:version"), str(STATE_VERSION))
        ttl_ms = self.redis.command("PTTL", "sluice:version")
        self.assertTrue(0 < ttl_ms <= MARKER_TTL_MS, ttl_ms)
        self.assertEqual(old_daemon.acquire("api", "k")["mode"], "normal")
        self.assertEqual(self.redis.command("EXISTS", redis_key("q", "api", "k")), 1)

        new_daemon = self.daemon("new", version=new)
        self.wait_health(new_daemon, breaker="half_open", status="degraded", redis="up",
                         state_version=new, fleet_state_version=STATE_VERSION)
        decision = new_daemon.acquire("api", "k")
        self.assertTrue(decision["allowed"], decision)
        self.assertEqual(decision["mode"], "fallback", decision)
        # It stays refused, rechecking every heartbeat, with one log line.
        self.assertFalse(wait_for(lambda: new_daemon.health()["breaker"] != "half_open", 1))
        line = REFUSED_LINE % (STATE_VERSION, new)
        self.assertEqual(new_daemon.logs().count(line), 1, new_daemon.logs())
        self.assertIn('docs/operations.md, "Upgrading the Redis state"', new_daemon.logs())
        self.assertEqual(self.state_keys(new), 0)
        self.assertEqual(self.redis.command("GET", "sluice:version"), str(STATE_VERSION))
        # The incumbent is untouched.
        self.assertEqual(old_daemon.acquire("api", "k")["mode"], "normal")
        self.assertEqual(old_daemon.health()["breaker"], "closed")

        # The last daemon of the old version stops: within the marker's TTL
        # and a heartbeat the new version claims the prefix and leases from
        # its own keys, debiting what it admitted while refused.
        self.assertEqual(old_daemon.terminate(), 0)
        self.wait_health(new_daemon, breaker="closed", status="ok", fleet_state_version=new)
        self.assertIn("now runs this daemon's Redis state version %d" % new, new_daemon.logs())
        self.assertEqual(self.redis.command("GET", "sluice:version"), str(new))
        decision = new_daemon.acquire("api", "k")
        self.assertEqual(decision["mode"], "normal", decision)
        self.assertEqual(self.redis.command("EXISTS", redis_key("q", "api", "k", version=new)), 1)

        # Now the old version is the one refused.
        back = self.daemon("back")
        self.wait_health(back, breaker="half_open", status="degraded",
                         state_version=STATE_VERSION, fleet_state_version=new)
        self.assertIn(REFUSED_LINE % (new, STATE_VERSION), back.logs())
        self.assertEqual(back.acquire("api", "k")["mode"], "fallback")


def tearDownModule():
    tear_down_module()


if __name__ == "__main__":
    unittest.main()
