#!/usr/bin/python3
"""Rate leases on a hot key (docs/design.md, "Rate leases on hot keys"): one
real sluiced on one real redis-server, driven at 3x a global rule's limit
with a small burst, for a token bucket rule and again for a gcra one. The
key switches to a rate lease: Redis holds the node's rate in the key's
state, the daemon refills its slice at it and
asks Redis only to renew, so a second of load costs a handful of script
calls, while admissions stay within limit x T + burst plus the slice's cap.
A node that crashes holding the rate holds it only until its lease ends;
then another node gets the whole rate. While Redis is down, a node goes on
spending the rate it held, past the rate's end, so an outage longer than
the lease keeps the shares that followed demand.

Needs SLUICED (the daemon binary) in the environment; run with /usr/bin/python3
(python3-msgpack). The load is paced with sleeps (it is the offered load, not
a clock standing in for one); the daemon's clocks are its own.
"""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Daemon, Redis, redis_key, renew_channel, tear_down_module,  # noqa: E402
                     wait_for)

LIMIT = 200
BURST = 6
LEASE_TTL_S = 1.0
LEASE_INTERVAL_S = 0.1
CAP = int(LIMIT * LEASE_INTERVAL_S)  # the slice's refill cap: one interval of the rate

CONFIG = """
[daemon]
socket = "{socket}"
workers = 1

[redis]
url = "redis://127.0.0.1:{port}"
node_id = "{node}"
expected_nodes = 1
heartbeat_interval = "1s"
lease_ttl = "{lease_ttl}"

[[rule]]
name = "hot"
algorithm = "{algorithm}"
limit = 200
period = "1s"
burst = 6
scope = "global"
"""


def drive(daemon, seconds, rate):
    """Acquires at `rate` per second for `seconds`, paced; returns (asked,
    allowed, modes seen)."""
    asked = allowed = 0
    modes = set()
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        if elapsed >= seconds:
            return asked, allowed, modes
        while asked < elapsed * rate:
            decision = daemon.acquire("hot", "k")
            asked += 1
            allowed += decision["allowed"]
            modes.add(decision["mode"])
        time.sleep(0.002)


def drive_all(loads, seconds):
    """Acquires on each (daemon, rate per second) of `loads` at its rate for
    `seconds`, paced; returns (asked, allowed, modes seen) for each."""
    seen = [[0, 0, set()] for _ in loads]
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        if elapsed >= seconds:
            return [tuple(s) for s in seen]
        for (daemon, rate), s in zip(loads, seen):
            while s[0] < elapsed * rate:
                decision = daemon.acquire("hot", "k")
                s[0] += 1
                s[1] += decision["allowed"]
                s[2].add(decision["mode"])
        time.sleep(0.002)


# The rates of a token bucket's state key: a MessagePack array {T, at_us,
# then node, rate, until_us, demand per node} while any is held.
RATES_LUA = """
local s = redis.call('GET', KEYS[1])
if not s or string.byte(s, 1) < 128 then return {} end
local v, out = cmsgpack.unpack(s), {}
for i = 3, #v - 3, 4 do
  out[#out + 1] = v[i]
  out[#out + 1] = string.format('%d:%d:%d', v[i + 1], v[i + 2], v[i + 3])
end
return out
"""


class RateLeaseTest(unittest.TestCase):
    ALGORITHM = "token_bucket"

    def setUp(self):
        self.redis = Redis()
        self.addCleanup(self.redis.stop)

    def start(self, node, lease_ttl="1s"):
        daemon = Daemon(node)
        daemon.start(CONFIG.format(socket=daemon.socket, port=self.redis.port, node=node,
                                   algorithm=self.ALGORITHM, lease_ttl=lease_ttl),
                     connect=True)
        self.addCleanup(daemon.stop)
        self.assertTrue(wait_for(lambda: daemon.health()["breaker"] == "closed", 10), daemon.logs())
        return daemon

    def watch_renew_channel(self):
        """("hot", "k")'s state key and a subscription to the `renew`
        channel its messages go to (python3-redis), closed when the test
        ends."""
        import redis  # python3-redis
        state_key = redis_key("q", "hot", "k")
        watch = redis.Redis(host="127.0.0.1", port=self.redis.port).pubsub()
        watch.subscribe(renew_channel())
        self.addCleanup(watch.close)
        watch.get_message(timeout=1.0)  # the subscription's confirmation
        return state_key, watch

    def rates(self):
        """The rates held on ("hot", "k"), node -> "rate:until_us:demand", read
        out of the key's state (lua/token_bucket.lua's KEYS[1])."""
        flat = self.redis.command("EVAL", RATES_LUA, "1", redis_key("q", "hot", "k")) or []
        return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}

    # Verifies that a hot key holds a rate lease: after a second at 3x the
    # limit, the rates in Redis's state give this node the whole limit, the next
    # two seconds cost at most a few script calls per second (renewals and
    # heartbeats), and they admit no more than limit x 2 s + burst + the cap,
    # and at least 90 % of limit x 2 s.
    def test_a_hot_key_leases_a_rate_and_costs_redis_only_its_renewals(self):
        daemon = self.start("rate-a")
        drive(daemon, 1.0, 3 * LIMIT)
        held = self.rates()
        self.assertIn("rate-a", held, daemon.logs())
        self.assertEqual(held["rate-a"].split(":")[0], str(LIMIT))
        calls_before = self.redis.script_calls()
        asked, allowed, modes = drive(daemon, 2.0, 3 * LIMIT)
        calls = self.redis.script_calls() - calls_before
        self.assertEqual(modes, {"normal"})
        self.assertGreaterEqual(asked, 2 * 3 * LIMIT * 0.9)
        # Renewals every half lease (4) and heartbeats (2), with slack; the
        # token path pays about one call per five decisions here.
        self.assertLessEqual(calls, 10, "%d calls for %d decisions" % (calls, asked))
        self.assertLessEqual(allowed, LIMIT * 2 + BURST + CAP)
        self.assertGreaterEqual(allowed, LIMIT * 2 * 0.9)

    # Verifies that a node that crashes holding the rate holds it only until
    # its lease ends: a second node on the same key gets nothing while it
    # stands, and the whole rate once it has ended.
    def test_a_crashed_nodes_rate_ends_with_its_lease(self):
        first = self.start("rate-a")
        drive(first, 1.0, 3 * LIMIT)
        self.assertIn("rate-a", self.rates())
        first.proc.kill()
        first.proc.wait()
        crashed_at = time.monotonic()
        second = self.start("rate-b")
        self.assertTrue(wait_for(lambda: "rate-a" not in self.rates(), LEASE_TTL_S + 1))
        self.assertLessEqual(time.monotonic() - crashed_at, LEASE_TTL_S + 0.5)
        drive(second, 1.5, 3 * LIMIT)
        held = self.rates()
        self.assertIn("rate-b", held, second.logs())
        self.assertEqual(held["rate-b"].split(":")[0], str(LIMIT))
        _, allowed, _ = drive(second, 1.0, 3 * LIMIT)
        self.assertGreaterEqual(allowed, LIMIT * 0.9)

    # Verifies that an outage longer than the rate lease keeps the
    # demand-weighted shares: a hot node beside a light one holds most of
    # the limit, and through 2.5 s without Redis (the lease is 1 s) it keeps
    # admitting at its rate, past the rate's end, where its equal share
    # (limit / 2) would admit about 100/s after the first second; the two
    # together stay within limit x T + burst + their caps.
    def test_an_outage_longer_than_the_lease_keeps_the_demand_weighted_shares(self):
        hot, light = self.start("rate-a"), self.start("rate-b")
        self.assertTrue(wait_for(lambda: hot.health()["nodes"] == 2, 5), hot.logs())
        drive_all([(hot, 3 * LIMIT), (light, 20)], 2.0)
        held = self.rates()
        self.assertIn("rate-a", held, hot.logs())
        self.assertIn("rate-b", held, light.logs())  # so the two rates sum to the limit at most
        hot_rate = int(held["rate-a"].split(":")[0])
        self.assertGreaterEqual(hot_rate, 150, held)
        self.assertGreater(int(held["rate-b"].split(":")[0]), 0, held)
        self.redis.kill()
        outage_s = 2.5
        (_, hot_allowed, hot_modes), (_, light_allowed, _) = drive_all(
            [(hot, 3 * LIMIT), (light, 20)], outage_s)
        self.assertIn("fallback", hot_modes)
        # The equal share past the rate's end: at most hot_rate x 1 s + (limit
        # / 2) x 1.5 s + burst / 2 = 330 for a rate of 180/s.
        self.assertGreaterEqual(hot_allowed, 0.85 * hot_rate * outage_s,
                                "%d admitted at a rate of %d/s" % (hot_allowed, hot_rate))
        self.assertLessEqual(hot_allowed + light_allowed, LIMIT * outage_s + BURST + 2 * CAP)


    # Verifies that rate a node gives up reaches a short holder at once:
    # a (600/s) and b (120/s) share the limit (100 each, both short of
    # their asks). When a stops (SIGTERM: it gives its rate up), the script
    # publishes the key's name on the `renew` channel, and b holds its
    # whole ask (120/s, asked as measured: 110 or more) within 250 ms of the
    # message; b's own schedule would renew only once its ask has brought
    # 200 units (1.7 s).
    def test_a_rate_given_up_reaches_a_short_holder_through_the_renew_channel(self):
        state_key, watch = self.watch_renew_channel()
        giver, holder = self.start("rate-a"), self.start("rate-b")
        self.assertTrue(wait_for(lambda: giver.health()["nodes"] == 2, 5), giver.logs())
        drive_all([(giver, 3 * LIMIT), (holder, 120)], 2.0)
        held = self.rates()
        self.assertEqual(held.get("rate-a", "").split(":")[0], "100", held)
        self.assertEqual(held.get("rate-b", "").split(":")[0], "100", held)
        while watch.get_message(timeout=0.01) is not None:  # what the start published
            pass
        giver.proc.terminate()
        message = None
        heard_at = None
        start = time.monotonic()
        asked = 0
        while time.monotonic() - start < 3.0:
            elapsed = time.monotonic() - start
            while asked < elapsed * 120:
                holder.acquire("hot", "k")
                asked += 1
            if message is None:
                message = watch.get_message(timeout=0.002)
                if message is not None:
                    heard_at = time.monotonic()
            if heard_at is not None and int(self.rates().get("rate-b", "0:").split(":")[0]) >= 110:
                break
            time.sleep(0.002)
        self.assertIsNotNone(message, holder.logs())
        self.assertEqual(message["data"], state_key)
        self.assertGreaterEqual(int(self.rates().get("rate-b", "0:").split(":")[0]), 110, holder.logs())
        self.assertLessEqual(time.monotonic() - heard_at, 0.25)
        self.assertNotIn("rate-a", self.rates())
        self.assertGreaterEqual(holder.client.result("stats")["leases"]["renew_words"], 1)

    # Verifies that a node that starts beside a holder of the whole limit
    # gets its share at once: a holds all 200/s alone (a rate of 5 s, so it
    # would renew only 2.5 s later), then b asks at the same 600/s. b's rate
    # op gets nothing while a holds the limit, so the script publishes the
    # key's name on the `renew` channel, a renews at once and keeps its
    # share (100), and b holds at least 3/4 of its share within 500 ms and
    # admits its half of the limit from then on.
    def test_a_newcomer_beside_a_holder_of_the_whole_limit_gets_its_share_at_once(self):
        state_key, watch = self.watch_renew_channel()
        holder, newcomer = self.start("rate-a", "5s"), self.start("rate-b", "5s")
        self.assertTrue(wait_for(lambda: holder.health()["nodes"] == 2, 5), holder.logs())
        drive(holder, 1.0, 3 * LIMIT)
        self.assertEqual(self.rates().get("rate-a", "").split(":")[0], str(LIMIT), holder.logs())
        while watch.get_message(timeout=0.01) is not None:  # what the start published
            pass
        start = time.monotonic()
        shared_at = None
        while time.monotonic() - start < 3.0 and shared_at is None:
            drive_all([(holder, 3 * LIMIT), (newcomer, 3 * LIMIT)], 0.02)
            if int(self.rates().get("rate-b", "0:").split(":")[0]) >= 0.75 * LIMIT / 2:
                shared_at = time.monotonic()
        self.assertIsNotNone(shared_at, "%s\n%s" % (self.rates(), newcomer.logs()))
        self.assertLessEqual(shared_at - start, 0.5, self.rates())
        message = watch.get_message(timeout=1.0)
        self.assertIsNotNone(message)
        self.assertEqual(message["data"], state_key)
        (_, holder_allowed, _), (_, newcomer_allowed, _) = drive_all(
            [(holder, 3 * LIMIT), (newcomer, 3 * LIMIT)], 1.0)
        self.assertGreaterEqual(newcomer_allowed, 0.35 * LIMIT,
                                "%d and %d admitted" % (holder_allowed, newcomer_allowed))
        self.assertLessEqual(holder_allowed + newcomer_allowed, LIMIT + BURST + 2 * CAP)


class GcraRateLeaseTest(RateLeaseTest):
    """The same, on a gcra rule: lua/gcra.lua holds rates as the bucket does."""
    ALGORITHM = "gcra"


def tearDownModule():
    tear_down_module()


if __name__ == "__main__":
    unittest.main()
