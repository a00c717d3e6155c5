#!/usr/bin/python3
"""Wire-contract tests against the real sluiced, from an independent client.

The client here is Python's msgpack (Debian python3-msgpack) over a plain
socket: nothing from sluice's own code, so these tests hold the daemon to
the wire contract of docs/design.md ("Protocol") as any other language would see it.

Run by ctest; SLUICED names the daemon binary.
"""

import collections
import os
import signal
import subprocess
import tempfile
import threading
import time
import unittest

import msgpack

from harness import SLUICED, Client, Daemon, Redis, redis_section, tear_down_module, wait_for

RESULT_KEYS = {"allowed", "remaining", "limit", "reset_after_ms", "retry_after_ms", "mode"}

BASE_CONFIG = """
[daemon]
socket = "{socket}"
workers = 2
log_level = "warn"

[limits]
max_connections = {max_connections}
max_frame_bytes = 65536
max_output_bytes = 65536
idle_timeout = "{idle}"
partial_frame_timeout = "{partial}"

[[rule]]
name = "five"
algorithm = "token_bucket"
limit = 5
period = "1s"
burst = 5

[[rule]]
name = "gcra"
algorithm = "gcra"
limit = 5
period = "1s"
burst = 5

[[rule]]
name = "window"
algorithm = "fixed_window"
limit = 5
period = "1h"

[[rule]]
name = "slow"
algorithm = "token_bucket"
limit = 1
period = "1h"

[[rule]]
name = "two_limits"
algorithm = "token_bucket"
limits = [{{ limit = 100, period = "1h" }}, {{ limit = 3, period = "1m", burst = 3 }}]

[[rule]]
name = "uploads"
algorithm = "concurrency"
limit = 2
period = "1m"

[[rule]]
name = "dry"
algorithm = "fixed_window"
limit = 1
period = "1h"
shadow = true

[[rule]]
name = "abuse"
limit = 1
period = "1h"
penalty = {{ denials = 3, window = "1m", block = "400ms" }}

[[rule]]
name = "tiers"
limit = 2
period = "1h"
[[rule.overrides]]
prefix = "pro:"
limit = 5
[[rule.overrides]]
prefix = "pro:vip:"
limit = 8
[[rule.overrides]]
key = "acme"
limit = 10
[[rule.overrides]]
glob = "*-eu"
limit = 3
"""


def cpu_seconds(pid):
    """User plus system CPU time of a process, from /proc."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def protocol_daemon(idle="5m", partial="10s", extra="", prefix=(), max_connections=16):
    """A started sluiced on BASE_CONFIG (+ `extra`) on a private socket, run
    under the command `prefix` when given; the caller stops it."""
    daemon = Daemon()
    daemon.start(BASE_CONFIG.format(socket=daemon.socket, idle=idle, partial=partial,
                                    max_connections=max_connections) + extra, prefix=prefix)
    return daemon


class ProtocolTest(unittest.TestCase):
    def setUp(self):
        self.daemon = protocol_daemon()
        self.client = self.daemon.connect()

    def tearDown(self):
        self.client.close()
        self.daemon.stop()

    # Verifies DESIGN's contract: 5 per second answers exactly 5 of 20
    # back-to-back acquires on a fresh key, for bucket, GCRA and window rules.
    def test_five_per_second_allows_exactly_five_of_twenty(self):
        for rule in ("five", "gcra", "window"):
            allowed = sum(self.client.result("acquire", rule, "k-" + rule, 1)["allowed"]
                          for _ in range(20))
            self.assertEqual(allowed, 5, rule)

    # Verifies the result map carries every contract field with the right types.
    def test_acquire_result_has_every_contract_field(self):
        result = self.client.result("acquire", "five", "fields")
        self.assertTrue(RESULT_KEYS <= set(result), result)
        self.assertIs(result["allowed"], True)
        self.assertEqual(result["limit"], 5)
        self.assertEqual(result["remaining"], 4)
        self.assertEqual(result["retry_after_ms"], 0)
        self.assertEqual(result["mode"], "local")
        for key in ("remaining", "limit", "reset_after_ms", "retry_after_ms"):
            self.assertIsInstance(result[key], int)

    # Verifies a denial carries a retry hint that is positive and at most the period.
    def test_denial_carries_retry_after(self):
        self.client.result("acquire", "slow", "r")
        result = self.client.result("acquire", "slow", "r")
        self.assertFalse(result["allowed"])
        self.assertGreater(result["retry_after_ms"], 0)
        self.assertLessEqual(result["retry_after_ms"], 3600 * 1000)

    # Verifies the one-map params form is the same as the positional form.
    def test_map_params_form_spends_like_positional(self):
        first = self.client.result("acquire", {"rule": "five", "key": "m", "cost": 2})
        second = self.client.result("acquire", "five", "m", 1)
        self.assertEqual(first["remaining"], 3)
        self.assertEqual(second["remaining"], 2)

    # Verifies a misspelt field of the map form is skipped (the default cost
    # is spent: forward compatibility) but counted in stats and logged, with
    # its name, so that the mistake can be found; peek's documented "cost"
    # is not counted.
    def test_unknown_map_fields_are_counted_and_logged(self):
        before = self.client.result("stats")["unknown_fields"]
        result = self.client.result("acquire", {"rule": "five", "key": "u", "cots": 2})
        self.assertEqual(result["remaining"], 4)
        self.client.result("peek", {"rule": "five", "key": "u", "cost": 3})
        self.client.result("acquire_all", [{"rule": "five", "key": "u", "kye": "x", 7: 1}])
        self.assertEqual(self.client.result("stats")["unknown_fields"] - before, 3)
        wait_for(lambda: '"cots"' in self.daemon.logs(), timeout=5)
        self.assertIn("acquire request had 1 unknown field(s)", self.daemon.logs())

    # Verifies keys are bytes: str and bin with the same bytes are one key, and
    # NUL bytes and braces are part of the key, not separators.
    def test_keys_are_exact_bytes(self):
        self.client.result("acquire", "slow", b"a\x00b{c}")
        self.assertFalse(self.client.result("acquire", "slow", "a\x00b{c}")["allowed"])
        self.assertTrue(self.client.result("acquire", "slow", b"a")["allowed"])
        self.assertTrue(self.client.result("acquire", "slow", b"a\x00b")["allowed"])
        long_key = b"k" * 1024
        self.assertTrue(self.client.result("acquire", "slow", long_key)["allowed"])
        self.assertFalse(self.client.result("acquire", "slow", long_key)["allowed"])

    # Verifies peek reports without spending.
    def test_peek_spends_nothing(self):
        for _ in range(3):
            result = self.client.result("peek", "five", "p")
            self.assertEqual(result["remaining"], 5)
        self.assertEqual(self.client.result("acquire", "five", "p")["remaining"], 4)

    # Verifies a cost over the limit is denied with a reason and no retry hint.
    def test_cost_over_limit_is_denied_with_reason(self):
        result = self.client.result("acquire", "five", "big", 6)
        self.assertFalse(result["allowed"])
        self.assertEqual(result["retry_after_ms"], 0)
        self.assertIn("reason", result)
        self.assertEqual(self.client.result("peek", "five", "big")["remaining"], 5)

    # Verifies a rule with two limits enforces the tighter and reports it.
    def test_two_limits_enforce_the_tighter(self):
        allowed = [self.client.result("acquire", "two_limits", "t")["allowed"] for _ in range(5)]
        self.assertEqual(allowed, [True, True, True, False, False])
        self.assertEqual(self.client.result("peek", "two_limits", "t")["limit"], 3)

    # Verifies acquire_all is all-or-nothing: a denied item spends nothing anywhere.
    def test_acquire_all_is_all_or_nothing(self):
        self.client.result("acquire", "slow", "spent")
        result = self.client.result("acquire_all", [["five", "x", 1], ["slow", "spent", 1]])
        self.assertFalse(result["allowed"])
        self.assertEqual(len(result["results"]), 2)
        self.assertTrue(RESULT_KEYS <= set(result["results"][0]))
        self.assertEqual(self.client.result("peek", "five", "x")["remaining"], 5)
        result = self.client.result("acquire_all", [["five", "x", 2], ["slow", "fresh", 1]])
        self.assertTrue(result["allowed"])
        self.assertEqual(self.client.result("peek", "five", "x")["remaining"], 3)

    # Verifies concurrency units are held until released.
    def test_release_frees_concurrency_units(self):
        self.assertTrue(self.client.result("acquire", "uploads", "u")["allowed"])
        self.assertTrue(self.client.result("acquire", "uploads", "u")["allowed"])
        self.assertFalse(self.client.result("acquire", "uploads", "u")["allowed"])
        self.client.result("release", "uploads", "u", 1)
        self.assertTrue(self.client.result("acquire", "uploads", "u")["allowed"])

    # Verifies reset (the test runs as root, an admin) frees a concurrency
    # key's held units and answers the fresh state, by position or map; a
    # missing key is fresh already, and a wrongly shaped reset is refused.
    def test_reset_makes_a_key_fresh(self):
        for _ in range(2):
            self.client.result("acquire", "uploads", "u")
        self.assertFalse(self.client.result("acquire", "uploads", "u")["allowed"])
        fresh = self.client.result("reset", "uploads", "u")
        self.assertEqual((fresh["allowed"], fresh["remaining"], fresh["mode"]), (True, 2, "local"))
        self.assertTrue(self.client.result("acquire", "uploads", "u")["allowed"])
        self.assertEqual(self.client.result("reset", {"rule": "five", "key": "never"})["remaining"],
                         5)
        error, _ = self.client.call("reset", "five")
        self.assertEqual(error["code"], "BAD_REQUEST")
        self.assertIn("reset params", error["message"])

    # Verifies overrides: each key gets its tier's limit (exact key, longest
    # prefix, glob, else the rule's), peek on a key never seen shows the
    # limit that will apply, and `rules` lists the overrides.
    def test_overrides_give_each_tier_its_limit(self):
        tiers = {"free:1": 2, "pro:1": 5, "pro:vip:1": 8, "acme": 10, "free:1-eu": 3,
                 b"pro:\x00{}": 5}
        for key, limit in tiers.items():
            self.assertEqual(self.client.result("peek", "tiers", key)["limit"], limit, key)
            allowed = [self.client.result("acquire", "tiers", key)["allowed"]
                       for _ in range(limit + 2)]
            self.assertEqual(allowed, [True] * limit + [False] * 2, key)
        listed = next(r for r in self.client.result("rules") if r["name"] == "tiers")
        self.assertEqual([o.get("prefix") or o.get("key") or o.get("glob")
                          for o in listed["overrides"]], ["pro:", "pro:vip:", "acme", "*-eu"])
        self.assertEqual(listed["overrides"][2]["limits"][0]["limit"], 10)
        self.assertEqual(listed["override_count"], 4)

    # Verifies a penalty: the third denial within the window blocks the key
    # (mode "blocked", retry_after_ms the block's rest, peek and acquire_all
    # too), other keys are untouched, stats count the block, it ends on its
    # own, and reset lifts one early.
    def test_repeat_offender_is_blocked_then_released(self):
        self.assertTrue(self.client.result("acquire", "abuse", "bad")["allowed"])
        denials = [self.client.result("acquire", "abuse", "bad") for _ in range(3)]
        self.assertEqual([d["mode"] for d in denials], ["local"] * 3)
        blocked = self.client.result("acquire", "abuse", "bad")
        self.assertEqual((blocked["allowed"], blocked["mode"]), (False, "blocked"))
        self.assertGreater(blocked["retry_after_ms"], 300)
        self.assertLessEqual(blocked["retry_after_ms"], 400)
        self.assertEqual(self.client.result("peek", "abuse", "bad")["mode"], "blocked")
        group = self.client.result("acquire_all", [["five", "g", 1], ["abuse", "bad", 1]])
        self.assertFalse(group["allowed"])
        self.assertEqual(group["results"][1]["mode"], "blocked")
        self.assertEqual(self.client.result("peek", "five", "g")["remaining"], 5)  # nothing spent
        self.assertTrue(self.client.result("acquire", "abuse", "good")["allowed"])
        stats = self.client.result("stats")
        self.assertEqual(stats["penalty_blocks"], 1)
        self.assertEqual(stats["rules"]["abuse"]["denied"]["blocked"], 2)
        # The block ends on its own (peek spends and counts nothing).
        self.assertTrue(wait_for(
            lambda: self.client.result("peek", "abuse", "bad")["mode"] == "local", 2))
        after = self.client.result("acquire", "abuse", "bad")
        self.assertEqual(after["mode"], "local")  # the block ended; the limit still holds
        for _ in range(2):
            self.client.result("acquire", "abuse", "bad")
        self.assertEqual(self.client.result("acquire", "abuse", "bad")["mode"], "blocked")
        fresh = self.client.result("reset", "abuse", "bad")
        self.assertEqual((fresh["allowed"], fresh["mode"]), (True, "local"))
        self.assertTrue(self.client.result("acquire", "abuse", "bad")["allowed"])

    # Verifies a shadow rule always allows but says it is shadow.
    def test_shadow_rule_always_allows(self):
        results = [self.client.result("acquire", "dry", "s") for _ in range(3)]
        self.assertTrue(all(r["allowed"] for r in results))
        self.assertTrue(all(r["mode"] == "shadow" for r in results))
        stats = self.client.result("stats")
        self.assertEqual(stats["shadow_denied"], 2)

    # Verifies errors are maps with a stable code and a message, and the
    # connection stays usable after each.
    def test_errors_are_maps_with_stable_codes(self):
        cases = [
            (("acquire", "nope", "k"), "UNKNOWN_RULE"),
            (("frobnicate",), "UNKNOWN_METHOD"),
            (("acquire", "five"), "BAD_REQUEST"),
            (("acquire", "five", "k", -1), "BAD_REQUEST"),
            (("acquire", "five", "k", "one"), "BAD_REQUEST"),
            (("acquire", "five", b"k" * 5000), "TOO_LARGE"),
        ]
        for call, code in cases:
            error, result = self.client.call(*call)
            self.assertIsNone(result, call)
            self.assertEqual(error["code"], code, call)
            self.assertIsInstance(error["message"], str)
            self.assertTrue(error["message"])
        self.assertTrue(self.client.result("acquire", "five", "after")["allowed"])

    # Verifies a wrongly shaped frame with a msgid gets an error, not a hang.
    def test_bad_shapes_get_errors(self):
        for frame in ([0, 7, "acquire", "notalist"], [0, 7, "acquire"], [5, 7, "acquire", []]):
            self.client.send(frame)
        for _ in range(2):
            response = self.client.recv()
            self.assertEqual(response[0], 1)
            self.assertEqual(response[2]["code"], "BAD_REQUEST")
        self.assertTrue(self.client.result("acquire", "five", "ok")["allowed"])

    # Verifies pipelined requests are all answered, matched by msgid.
    def test_pipelined_requests_are_all_answered(self):
        ids = list(range(1000, 1200))
        payload = b"".join(msgpack.packb([0, i, "acquire", ["window", "pipe", 1]]) for i in ids)
        self.client.sock.sendall(payload)
        responses = [self.client.recv() for _ in ids]
        self.assertEqual(sorted(r[1] for r in responses), ids)
        self.assertEqual(sum(r[3]["allowed"] for r in responses), 5)

    # Verifies a notification is acted on and gets no answer.
    def test_notification_acts_without_answer(self):
        self.client.send([2, "acquire", ["five", "n", 2]])
        self.client.send([2, "no_such_method", [1, 2, 3]])
        self.client.send([2, "acquire", "junk"])
        result = self.client.result("peek", "five", "n")
        self.assertEqual(result["remaining"], 3)

    # Verifies health, stats and rules answer with their documented shapes,
    # and stats split decisions by rule and mode and summarise their latency.
    def test_health_stats_and_rules(self):
        health = self.client.result("health")
        self.assertEqual(health["status"], "ok")
        self.assertEqual(health["redis"], "none")
        self.assertIsNone(health["redis_mode"])
        self.assertIsNone(health["redis_address"])
        self.assertEqual(health["nodes"], 1)
        self.assertIsNone(health["clock_offset_ms"])
        self.assertEqual(self.client.result("stats")["rules"], {})  # a fresh daemon
        for _ in range(7):
            self.client.result("acquire", "five", "h")  # 5 allowed, 2 denied
        stats = self.client.result("stats")
        self.assertEqual(stats["decisions"], 7)
        self.assertEqual(stats["keys"]["count"], 1)
        # Only rules that decided something, and only modes that occurred.
        self.assertEqual(stats["rules"], {"five": {"allowed": {"local": 5}, "denied": {"local": 2}}})
        latency = stats["decision_latency"]
        self.assertEqual(latency["count"], 9)  # every answer: health, stats, 7 acquires
        self.assertLessEqual(latency["p50_us_le"], latency["p99_us_le"])
        self.assertEqual(stats["leases"]["latency"]["count"], 0)  # local-only
        rules = self.client.result("rules")
        names = {rule["name"] for rule in rules}
        self.assertIn("two_limits", names)
        two = next(rule for rule in rules if rule["name"] == "two_limits")
        self.assertEqual(len(two["limits"]), 2)

    # Verifies bytes that are not MessagePack close only that connection.
    def test_unreadable_bytes_close_only_that_connection(self):
        bad = self.daemon.connect()
        bad.sock.sendall(b"\xc1\xc1\xc1")
        self.assertTrue(bad.closed_by_peer())
        self.assertTrue(self.client.result("acquire", "five", "still")["allowed"])

    # Verifies a frame over max_frame_bytes closes the connection.
    def test_oversized_frame_closes_connection(self):
        big = self.daemon.connect()
        big.send([0, 1, "acquire", ["five", b"x" * 70000, 1]])
        self.assertTrue(big.closed_by_peer())
        self.assertTrue(self.client.result("health")["status"] == "ok")

    # Verifies a header that declares 4 GiB in five bytes does not make the
    # daemon wait or allocate: it closes the connection.
    def test_huge_declared_length_is_refused(self):
        bad = self.daemon.connect()
        bad.sock.sendall(b"\xdb\xff\xff\xff\xff")
        self.assertTrue(bad.closed_by_peer())

    # Verifies a client that sends without ever reading is cut off at its
    # output cap, while others are served.
    def test_client_that_never_reads_is_disconnected(self):
        hog = self.daemon.connect()
        frame = msgpack.packb([0, 1, "acquire", ["window", "hog", 1]])
        hog.sock.setblocking(False)
        sent = 0
        cut = False
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                sent += hog.sock.send(frame * 512)
            except BlockingIOError:
                time.sleep(0.001)
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
        self.assertTrue(cut, "still connected after sending %d bytes" % sent)
        self.assertTrue(self.client.result("acquire", "five", "polite")["allowed"])
        stats = self.client.result("stats")
        self.assertGreaterEqual(stats["connections"]["closed"]["output_cap"], 1)

    # Verifies connections beyond max_connections are refused at once.
    def test_connections_over_the_limit_are_refused(self):
        extra = []
        try:
            for _ in range(20):
                extra.append(self.daemon.connect())
            refused = sum(1 for c in extra if c.closed_by_peer(timeout=0.5))
            self.assertGreaterEqual(refused, 20 - 15)
            stats = self.client.result("stats")
            self.assertGreaterEqual(stats["connections"]["refused"], 5)
        finally:
            for c in extra:
                c.close()


GLOBAL_RULES = """
[redis]
url = "redis://127.0.0.1:1"
expected_nodes = 4

[[rule]]
name = "shared"
algorithm = "token_bucket"
limit = 8
period = "1h"
scope = "global"
on_redis_down = "local"

[[rule]]
name = "fail_open"
limit = 8
period = "1h"
scope = "global"
on_redis_down = "open"

[[rule]]
name = "fail_closed"
limit = 8
period = "1h"
scope = "global"
on_redis_down = "closed"
"""


class GlobalRulesWithoutRedisTest(unittest.TestCase):
    """Until the lease path lands, global rules run on their Redis-down policy."""

    def setUp(self):
        self.daemon = protocol_daemon(extra=GLOBAL_RULES)
        self.client = self.daemon.connect()

    def tearDown(self):
        self.daemon.stop()

    # Verifies policy "local" decides on the node's share: limit / expected_nodes.
    def test_local_policy_uses_the_nodes_share(self):
        results = [self.client.result("acquire", "shared", "k") for _ in range(5)]
        self.assertEqual([r["allowed"] for r in results], [True, True, False, False, False])
        self.assertTrue(all(r["mode"] == "fallback" for r in results))
        self.assertEqual(results[0]["limit"], 2)

    # Verifies a global rule's key is not reset while Redis is unreachable:
    # its state is Redis's, shared by the fleet, and the answer says so.
    def test_reset_of_a_global_rule_needs_redis(self):
        error, _ = self.client.call("reset", "shared", "k")
        self.assertEqual(error["code"], "OVERLOADED")
        self.assertIn("redis is unreachable, and the state of global rule \"shared\" lives there",
                      error["message"])

    # Verifies policies "open" and "closed" answer without spending.
    def test_open_and_closed_policies(self):
        for _ in range(10):
            self.assertTrue(self.client.result("acquire", "fail_open", "k")["allowed"])
        closed = self.client.result("acquire", "fail_closed", "k")
        self.assertFalse(closed["allowed"])
        self.assertEqual(closed["mode"], "closed")
        self.assertGreater(closed["retry_after_ms"], 0)

    # Verifies acquire_all honours the policies: a closed item denies the
    # group and nothing is spent elsewhere; an open item does not deny.
    def test_acquire_all_honours_policies(self):
        result = self.client.result("acquire_all", [["five", "a", 1], ["fail_closed", "a", 1]])
        self.assertFalse(result["allowed"])
        self.assertEqual([r["mode"] for r in result["results"]], ["local", "closed"])
        self.assertEqual(self.client.result("peek", "five", "a")["remaining"], 5)
        result = self.client.result("acquire_all", [["five", "a", 1], ["fail_open", "a", 1]])
        self.assertTrue(result["allowed"])
        self.assertEqual(self.client.result("peek", "five", "a")["remaining"], 4)

    # Verifies health says the daemon is degraded while Redis is unreachable,
    # with expected_nodes standing in for the live count.
    def test_health_is_degraded(self):
        health = self.client.result("health")
        self.assertEqual(health["status"], "degraded")
        self.assertEqual(health["redis"], "down")
        self.assertEqual(health["nodes"], 4)
        self.assertIsNone(health["clock_offset_ms"])


# Rules of the Redis tests; start_daemon prepends redis_section(port).
REDIS_RULES = """
[[rule]]
name = "shared"
algorithm = "token_bucket"
limit = 8
period = "1h"
scope = "global"
on_redis_down = "local"

# Never runs out: for tests of the lease path's own cost and pacing.
[[rule]]
name = "roomy"
algorithm = "token_bucket"
limit = 1000000000
period = "1s"
scope = "global"

# Its fallback share (limit / N) shows the share following N.
[[rule]]
name = "share"
algorithm = "sliding_log"
limit = 8
period = "1h"
scope = "global"
"""


class RedisCase(unittest.TestCase):
    """A real redis-server per test, and daemons on REDIS_RULES using it."""

    def setUp(self):
        self.redis = Redis()
        self.daemons = []

    def tearDown(self):
        for daemon in self.daemons:
            daemon.stop()
        self.redis.stop()

    def start_daemon(self):
        daemon = protocol_daemon(extra=redis_section(self.redis.port) + REDIS_RULES)
        self.daemons.append(daemon)
        return daemon, daemon.connect()


class RedisHealthTest(RedisCase):
    """The daemon's control thread talks to a real Redis: health and membership.

    With Redis up, a leasable global rule decides on leases ("normal"); while
    it is down, on its on_redis_down policy; N is what the share divides by.
    """

    # Verifies health says redis "up" with a live Redis, and "down" with
    # status "degraded" within a second of Redis being killed.
    def test_health_follows_redis_up_and_down(self):
        daemon, client = self.start_daemon()
        self.assertTrue(wait_for(lambda: client.result("health")["redis"] == "up", 5),
                        daemon.logs())
        self.assertTrue(wait_for(
            lambda: client.result("health")["clock_offset_ms"] is not None, 5))
        health = client.result("health")
        self.assertEqual(health["status"], "ok")
        self.assertEqual(health["nodes"], 1)
        self.assertEqual(health["redis_mode"], "standalone")
        self.assertEqual(health["redis_address"], "127.0.0.1:%d" % self.redis.port)
        self.assertLessEqual(abs(health["clock_offset_ms"]), 50)  # one host, one clock
        self.assertTrue(wait_for(lambda: client.result("health")["breaker"] == "closed", 2))
        result = client.result("acquire", "shared", "k")
        self.assertEqual(result["mode"], "normal")  # decided on a lease
        self.assertTrue(result["allowed"])

        killed = time.monotonic()
        self.redis.kill()
        self.assertTrue(wait_for(lambda: client.result("health")["redis"] == "down", 2))
        elapsed = time.monotonic() - killed
        print("\nmeasured: health said down %.0f ms after SIGKILL" % (elapsed * 1000))
        self.assertLess(elapsed, 1.0)
        # The link's state and the breaker are published one after the other.
        self.assertTrue(wait_for(lambda: client.result("health")["breaker"] == "open", 1))
        health = client.result("health")
        self.assertEqual(health["status"], "degraded")
        self.assertEqual(health["nodes"], 1)  # the last known N stays
        self.assertEqual(client.result("acquire", "shared", "k")["mode"], "fallback")

    # Verifies the fallback share follows the live N: three daemons on one
    # Redis with expected_nodes 1 each heartbeat, one stops gracefully (it
    # leaves), and once Redis is gone a global rule of limit 8 gives each of
    # the two left a share of 4 (mode "fallback"), which a reload keeps.
    def test_fallback_share_follows_live_nodes(self):
        first, a = self.start_daemon()
        second, b = self.start_daemon()
        third, c = self.start_daemon()

        def logs():
            return first.logs() + second.logs() + third.logs()
        for client in (a, b, c):
            self.assertTrue(wait_for(lambda: client.result("health")["nodes"] == 3, 5), logs())
        third.proc.send_signal(signal.SIGTERM)
        self.assertEqual(third.proc.wait(timeout=5), 0, third.logs())
        for client in (a, b):
            self.assertTrue(wait_for(lambda: client.result("health")["nodes"] == 2, 2), logs())
        self.assertEqual(self.redis.command("ZCARD", "sluice:members"), 2)

        self.redis.kill()
        for client in (a, b):
            self.assertTrue(wait_for(lambda: client.result("health")["breaker"] == "open", 2),
                            logs())
            # Peek spends nothing.
            self.assertTrue(wait_for(
                lambda: client.result("peek", "share", "four")["limit"] == 4, 2))
            results = [client.result("acquire", "share", "four") for _ in range(10)]
            self.assertEqual(results[0]["limit"], 4)
            self.assertEqual(sum(r["allowed"] for r in results), 4)
            self.assertTrue(all(r["mode"] == "fallback" for r in results))

        # A reload rebuilds the rules from the file (expected_nodes 1) but
        # keeps dividing by the last live N.
        self.assertEqual(a.result("reload"), {"reloaded": True})
        self.assertEqual(a.result("peek", "share", "four")["limit"], 4)


class LeasingTest(RedisCase):
    """Global rules lease from a real Redis: the bucket is the fleet's.

    The rule "shared" is a token bucket of 8 per hour: nothing refills during
    a test, so every unit a daemon admits, holds or gives back shows in what
    another daemon can still get.
    """

    def start_daemon(self):
        """A daemon whose breaker has closed: it leases from here on."""
        daemon, client = super().start_daemon()
        self.assertTrue(wait_for(lambda: client.result("health")["breaker"] == "closed", 5),
                        daemon.logs())
        return daemon, client

    def acquire_many(self, client, key, count):
        """Pipelines `count` acquires of one unit; returns the results."""
        for i in range(count):
            client.send([0, 1000 + i, "acquire", ["shared", key, 1]])
        results = {}
        while len(results) < count:
            response = client.recv()
            self.assertIsNone(response[2])
            results[response[1]] = response[3]
        return [results[1000 + i] for i in range(count)]

    # Verifies a global key evicted from a full key table gives its slice's
    # unspent units back to Redis at once, as one going idle does later.
    def test_evicted_keys_return_their_units(self):
        wide = ('\n[[rule]]\nname = "wide"\nlimit = 100000\nperiod = "1s"\n'
                'scope = "global"\n\n[keys]\nmax_keys = 20\n')
        daemon = protocol_daemon(extra=redis_section(self.redis.port) + REDIS_RULES + wide)
        self.daemons.append(daemon)
        client = daemon.connect()
        self.assertTrue(wait_for(lambda: client.result("health")["breaker"] == "closed", 5),
                        daemon.logs())
        for i in range(100):
            for _ in range(5):
                self.assertTrue(client.result("acquire", "wide", "k%d" % i)["allowed"])
        stats = client.result("stats")
        self.assertGreater(stats["keys"]["forced_evictions"], 0)
        # Of what the leases granted and nobody spent, at most the 20 keys
        # still in the table hold some; the evicted ones gave theirs back.
        def most_returned():
            leases = client.result("stats")["leases"]
            unspent = leases["granted_units"] - leases["spent_units"]
            return unspent > 0 and leases["returned_units"] >= unspent / 2
        self.assertTrue(wait_for(most_returned, 2), client.result("stats")["leases"])

    # Verifies a graceful stop gives back the units a daemon leased and did
    # not spend: the next daemon gets exactly what the first did not admit.
    def test_stop_returns_unused_units(self):
        first, a = self.start_daemon()
        results = self.acquire_many(a, "r", 6)
        self.assertTrue(all(r["mode"] == "normal" for r in results), results)
        admitted = sum(r["allowed"] for r in results)
        # The slice refills in the background once spent below its low-water
        # mark (a slow, sanitized daemon leases in small batches, so the
        # refill may still be on its way).
        self.assertTrue(wait_for(lambda: (lambda leases: leases["granted_units"] >
                                          leases["spent_units"])(a.result("stats")["leases"]), 2),
                        "precondition: the daemon holds leased units")
        leases = a.result("stats")["leases"]
        self.assertEqual(leases["spent_units"], admitted)
        first.proc.send_signal(signal.SIGTERM)
        self.assertEqual(first.proc.wait(timeout=5), 0, first.logs())

        second, b = self.start_daemon()
        results = self.acquire_many(b, "r", 12)
        self.assertEqual(sum(r["allowed"] for r in results), 8 - admitted,
                         first.logs() + second.logs())

    # Verifies the negative cache: once Redis said the bucket is empty, more
    # denials cost Redis no command, and they say when to retry.
    def test_over_limit_key_costs_redis_nothing(self):
        daemon, client = self.start_daemon()
        results = self.acquire_many(client, "hot", 20)
        self.assertEqual(sum(r["allowed"] for r in results), 8)
        before = self.redis.script_calls()
        results = self.acquire_many(client, "hot", 200)
        self.assertFalse(any(r["allowed"] for r in results))
        self.assertTrue(all(r["mode"] == "normal" for r in results))
        self.assertTrue(all(r["retry_after_ms"] > 60_000 for r in results), results[0])
        # Heartbeats (every 100 ms here) are EVALSHAs too; leases would be 200.
        self.assertLessEqual(self.redis.script_calls() - before, 10)
        self.assertGreaterEqual(client.result("stats")["leases"]["negative_cache_hits"], 200)

    # Verifies what a daemon admits while Redis is stalled is debited when it
    # comes back, so the fleet does not get those units twice.
    def test_fallback_admissions_are_debited_on_recovery(self):
        first, a = self.start_daemon()
        self.redis.signal(signal.SIGSTOP)
        try:
            self.assertTrue(wait_for(lambda: a.result("health")["breaker"] == "open", 2))
            results = [a.result("acquire", "shared", "d") for _ in range(3)]
            self.assertTrue(all(r["allowed"] and r["mode"] == "fallback" for r in results),
                            results)
        finally:
            self.redis.signal(signal.SIGCONT)
        self.assertTrue(wait_for(lambda: a.result("health")["breaker"] == "closed", 5),
                        first.logs())
        self.assertEqual(a.result("stats")["leases"]["debited_units"], 3)

        second, b = self.start_daemon()
        results = self.acquire_many(b, "d", 12)
        self.assertEqual(sum(r["allowed"] for r in results), 5, second.logs())

    # Verifies 10,000 keys going cold-to-leased at once are paced, not piled
    # on Redis: unpaced, the last of 10,000 queued scripts wait past their
    # deadline and the link drops a healthy Redis as dead (the breaker
    # opened in this test before leases were paced). Every request is
    # answered and allowed, the breaker never opens, and answers that waited
    # past lease_timeout for their key's first lease say "fallback".
    def test_many_cold_keys_at_once_do_not_trip_the_breaker(self):
        daemon, client = self.start_daemon()
        count = 10_000
        # 14 connections (16 is the limit), each sending its 715 requests in
        # one write while a thread of its own reads its answers (as a client
        # does: one that does not read is cut off at the 64 KiB output cap).
        # Only `client` may be open first (start-up's probes close
        # asynchronously).
        def open_connections():
            connections = client.result("stats")["connections"]
            return connections["accepted"] - sum(connections["closed"].values())
        self.assertTrue(wait_for(lambda: open_connections() == 1, 5))
        clients = [daemon.connect() for _ in range(14)]
        answers = {}
        failures = []
        def read(c, conn):
            try:
                conn.sock.settimeout(30)
                for _ in range(c, count, len(clients)):
                    response = conn.recv()
                    if response[2] is not None:
                        failures.append(response)
                    answers[response[1]] = response[3]
            except OSError as e:
                failures.append("connection %d: %r" % (c, e))
        readers = [threading.Thread(target=read, args=(c, conn)) for c, conn in enumerate(clients)]
        for reader in readers:
            reader.start()
        for c, conn in enumerate(clients):
            try:
                conn.sock.sendall(b"".join(
                    msgpack.packb([0, i, "acquire", ["roomy", "cold-%d" % i, 1]],
                                  use_bin_type=True)
                    for i in range(c, count, len(clients))))
            except OSError as e:
                failures.append("connection %d: sending: %r" % (c, e))
        for reader in readers:
            reader.join(60)
        self.assertEqual(failures, [], (client.result("stats")["connections"], daemon.logs()))
        self.assertEqual(len(answers), count)
        self.assertTrue(all(r["allowed"] for r in answers.values()))
        modes = collections.Counter(r["mode"] for r in answers.values())

        # Leases leave as the pipeline has room, the last ones after their
        # requests' waits have expired: wait until every one is answered.
        def leases_answered():
            stats = client.result("stats")["leases"]
            answered = stats["granted"] + stats["empty"] + stats["failed"]
            return stats if stats["requested"] >= count and answered == stats["requested"] else None
        stats = wait_for(leases_answered, 10) or client.result("stats")["leases"]
        print("\nmeasured: %d cold keys at once: %s; lease latency avg %d us, max %d us"
              % (count, dict(modes), stats["latency_us_avg"], stats["latency_us_max"]))
        self.assertEqual(stats["fallback_entries"], 0, daemon.logs())
        self.assertEqual(client.result("health")["breaker"], "closed")
        self.assertEqual(stats["failed"], 0)
        self.assertGreaterEqual(stats["requested"], count)
        # Only a request whose wait expired is answered by its policy.
        self.assertLessEqual(modes["fallback"], stats["deferred_expired"])
        self.assertEqual(modes["normal"] + modes["fallback"], count)

    # Verifies a request for a cold key waits for its first lease rather
    # than being refused, and the answer comes from the lease.
    def test_cold_key_waits_for_its_first_lease(self):
        daemon, client = self.start_daemon()
        result = client.result("acquire", "shared", "cold")
        self.assertTrue(result["allowed"])
        self.assertEqual(result["mode"], "normal")
        stats = client.result("stats")["leases"]
        self.assertGreaterEqual(stats["deferred"], 1)
        self.assertEqual(stats["deferred_expired"], 0)


class TimeoutTest(unittest.TestCase):
    # Verifies an idle connection and a half-sent frame are both closed.
    def test_idle_and_partial_frames_are_closed(self):
        daemon = protocol_daemon(idle="300ms", partial="200ms")
        try:
            idle = daemon.connect()
            partial = daemon.connect()
            partial.sock.sendall(msgpack.packb([0, 1, "acquire", ["five", "k", 1]])[:5])
            self.assertTrue(partial.closed_by_peer(timeout=3))
            self.assertTrue(idle.closed_by_peer(timeout=3))
            fresh = daemon.connect()
            stats = fresh.result("stats")
            self.assertGreaterEqual(stats["connections"]["closed"]["idle"], 1)
            self.assertGreaterEqual(stats["connections"]["closed"]["partial_frame"], 1)
        finally:
            daemon.stop()


class LifecycleTest(unittest.TestCase):
    # Verifies SIGTERM answers what was sent, removes the socket and exits 0.
    def test_sigterm_answers_in_flight_then_exits_cleanly(self):
        daemon = protocol_daemon()
        try:
            client = daemon.connect()
            payload = b"".join(msgpack.packb([0, i, "acquire", ["window", "stop", 1]])
                               for i in range(50))
            client.sock.sendall(payload)
            first = client.recv()
            daemon.proc.send_signal(signal.SIGTERM)
            responses = [first] + [client.recv() for _ in range(49)]
            self.assertEqual(sorted(r[1] for r in responses), list(range(50)))
            self.assertEqual(daemon.proc.wait(timeout=10), 0)
            self.assertFalse(os.path.exists(daemon.socket))
        finally:
            daemon.stop()

    # Verifies that running out of file descriptors pauses accepting instead
    # of spinning, and that clients are served again once descriptors free up.
    def test_out_of_descriptors_does_not_spin(self):
        daemon = protocol_daemon(prefix=("prlimit", "--nofile=48:48"), max_connections=1000)
        try:
            # One connection opened and closed first: UBSan's vptr check
            # needs a pipe for a type it has not seen, which a daemon out of
            # descriptors cannot open (it then reports a valid object as
            # invalid), so the check of a closing connection is cached now.
            warm = Client(daemon.socket)
            self.assertEqual(warm.result("health")["status"], "ok")
            warm.close()
            time.sleep(0.2)
            clients = []
            for _ in range(60):
                try:
                    clients.append(Client(daemon.socket))
                except OSError:
                    break
            time.sleep(0.2)
            before = cpu_seconds(daemon.proc.pid)
            time.sleep(1.0)
            self.assertLess(cpu_seconds(daemon.proc.pid) - before, 0.3)
            for c in clients:
                c.close()
            deadline = time.monotonic() + 5
            while True:
                try:
                    client = Client(daemon.socket)
                    self.assertEqual(client.result("health")["status"], "ok")
                    client.close()
                    break
                except (OSError, ConnectionError):
                    self.assertLess(time.monotonic(), deadline)
                    time.sleep(0.05)
            self.assertIn("pausing accepts", daemon.logs())
        finally:
            daemon.stop()

    # Verifies a stale socket file from a dead daemon is replaced at start.
    def test_stale_socket_is_replaced(self):
        first = protocol_daemon()
        first.proc.kill()
        first.proc.wait()
        self.assertTrue(os.path.exists(first.socket))
        proc = subprocess.Popen([SLUICED, "--config", first.config],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            client = None
            while client is None and time.monotonic() < deadline:
                try:
                    client = Client(first.socket)
                except OSError:
                    time.sleep(0.01)
            self.assertIsNotNone(client)
            self.assertEqual(client.result("health")["status"], "ok")
        finally:
            proc.kill()
            proc.wait()
            first.stop()

    # Verifies --check-config names the file and line of a bad value.
    def test_check_config_names_file_and_line(self):
        with tempfile.TemporaryDirectory(dir="/tmp") as d:
            path = os.path.join(d, "bad.toml")
            with open(path, "w") as f:
                f.write('[[rule]]\nname = "x"\nlimit = 5\nperiod = "5 sec"\n')
            proc = subprocess.run([SLUICED, "--check-config", path],
                                  capture_output=True, text=True)
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn(path + ":4:", proc.stderr)

    # Verifies --check-config says how many rules a valid file has.
    def test_check_config_counts_rules(self):
        with tempfile.TemporaryDirectory(dir="/tmp") as d:
            path = os.path.join(d, "good.toml")
            rule = '[[rule]]\nname = "%s"\nlimit = 5\nperiod = "5s"\n'
            for names, said in [(["x"], "ok, 1 rule\n"), (["x", "y"], "ok, 2 rules\n")]:
                with open(path, "w") as f:
                    f.write("".join(rule % name for name in names))
                proc = subprocess.run([SLUICED, "--check-config", path],
                                      capture_output=True, text=True)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.assertEqual(proc.stdout, path + ": " + said)

    # Verifies --check-config refuses a socket whose directory does not
    # exist, at its line and with the fix, instead of calling the file valid
    # and letting the daemon die at bind.
    def test_check_config_refuses_a_socket_in_a_missing_directory(self):
        with tempfile.TemporaryDirectory(dir="/tmp") as d:
            path = os.path.join(d, "socket.toml")
            missing = os.path.join(d, "missing")
            with open(path, "w") as f:
                f.write('[daemon]\nsocket = "%s/s.sock"\n' % missing)
            proc = subprocess.run([SLUICED, "--check-config", path],
                                  capture_output=True, text=True)
            self.assertEqual(proc.returncode, 1, proc.stdout)
            self.assertIn(path + ":2:10: [daemon] socket", proc.stderr)
            self.assertIn("which does not exist; create it (mkdir -p %s" % missing, proc.stderr)
            os.mkdir(missing)
            proc = subprocess.run([SLUICED, "--check-config", path],
                                  capture_output=True, text=True)
            self.assertEqual(proc.returncode, 0, proc.stderr)

    # Verifies --check-config tells to quote an octal socket_mode, which TOML
    # refuses unquoted.
    def test_check_config_hints_to_quote_an_octal_socket_mode(self):
        with tempfile.TemporaryDirectory(dir="/tmp") as d:
            path = os.path.join(d, "mode.toml")
            with open(path, "w") as f:
                f.write('[daemon]\nsocket_mode = 0660\n')
            proc = subprocess.run([SLUICED, "--check-config", path],
                                  capture_output=True, text=True)
            self.assertEqual(proc.returncode, 1, proc.stdout)
            self.assertIn(path + ":2:", proc.stderr)
            self.assertIn('write socket_mode = "0660"', proc.stderr)


def tearDownModule():
    tear_down_module()


if __name__ == "__main__":
    unittest.main(verbosity=2)
