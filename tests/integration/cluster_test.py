#!/usr/bin/python3
"""Cluster tests: sluiced on a Redis Cluster, from config alone.

Real processes on loopback, started here: three masters and three replicas
(redis-server --cluster-enabled yes, joined by redis-cli --cluster create,
node timeout 1 s), and two daemons whose [redis] names three of the nodes as
cluster_nodes instead of a url.

- Many keys and adversarial ones ({, }, {}, NUL bytes, 1 KiB) on a global
  rule: each key's budget is enforced exactly across the two daemons, its
  state lives on the master of the slot of its hash tag (Redis's own CLUSTER
  KEYSLOT agrees, for the state and the block key alike), the keys spread
  over every master, and the fleet counts both daemons (membership works).
  Penalties (a script on the state and the block key at once) block
  adversarial keys across the fleet.
- Resharding: a slot is MIGRATING from its master to another (IMPORTING):
  a fresh key of that slot is created on the target through ASK + ASKING;
  once the slot's keys are MIGRATEd and the slot assigned, a daemon whose
  map is stale follows MOVED to the new owner, where the key's spent budget
  moved with it (the fleet still admits exactly the limit).
- A master SIGKILLed: keys on the other masters keep leasing ("normal")
  throughout; keys on the dead master follow on_redis_down ("fallback"),
  never waiting past the stall bound, and lease again from the promoted
  replica within the failover time + 1 s; Redis stays "up" in health.

Run by ctest (label `cluster`); SLUICED names the daemon binary,
REDIS_SERVER and REDIS_CLI the Redis tools.
"""

import os
import re
import sys
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Cluster, Daemon, cluster_slot, free_port, redis_key,  # noqa: E402
                     tear_down_module, wait_for)

# "budget": an exact count (a refill every 3 minutes is far beyond a test).
BUDGET = 20
# "steady": leased all the time; the failover test asks for more than this.
STEADY_PER_S = 50
STEADY_BURST = 20
LEASE_TIMEOUT_MS = 50
# No answer may take longer than this, whatever happens to a master.
STALL_BOUND_MS = LEASE_TIMEOUT_MS + 250
# How long the cluster may take to promote a replica after its master died
# (node timeout 1 s, then the election), with room for a busy machine.
FAILOVER_BOUND_S = 15.0
# Once a live node names the promoted replica, the daemons must lease from it
# within this: a slot map reload (every 250 ms while a slot's master is
# unreachable) plus the brief's 1 s.
RESUME_AFTER_PROMOTION_S = 2.0

CONFIG = """
[daemon]
socket = "{socket}"
workers = 1
log_level = "info"
metrics = "127.0.0.1:{metrics_port}"

[redis]
{seeds}
expected_nodes = 2
node_id = "cluster-{index}"
heartbeat_interval = "200ms"
health_interval = "100ms"
health_timeout = "{health_timeout}ms"
lease_timeout = "{lease_timeout}ms"
# A key that holds a rate asks Redis only to renew it, at most halfway
# through the lease: with the default 5 s, the failover test's key could
# ride its rate through a whole failover without asking the dead master.
lease_ttl = "1s"

[[rule]]
name = "budget"
algorithm = "token_bucket"
limit = {budget}
period = "1h"
burst = {budget}
scope = "global"
on_redis_down = "local"

[[rule]]
name = "abuse"
algorithm = "token_bucket"
limit = 5
period = "1h"
scope = "global"
penalty = {{ denials = 3, window = "10s", block = "1m" }}

[[rule]]
name = "steady"
algorithm = "token_bucket"
limit = {steady}
period = "1s"
burst = {steady_burst}
scope = "global"
on_redis_down = "local"
"""

ADVERSARIAL_KEYS = [b"{", b"}", b"{}", b"}{", b"a{b}c", b"{user1000}", b"\x00{x}\x00", b"{\x00}",
                    b"{" * 1024, b"}" * 1024, b"k" * 1024]


def start_daemon(test, index, seeds, lease_timeout_ms, health_timeout_ms):
    """A sluiced on the cluster named by `seeds`, stopped when `test` ends."""
    daemon = Daemon("cluster-%d" % index, log_tail=40)
    daemon.metrics_port = free_port()
    test.addCleanup(daemon.stop)
    daemon.start(CONFIG.format(socket=daemon.socket, seeds=seeds, index=index,
                               metrics_port=daemon.metrics_port,
                               lease_timeout=lease_timeout_ms, health_timeout=health_timeout_ms,
                               budget=BUDGET, steady=STEADY_PER_S, steady_burst=STEADY_BURST),
                 connect=True)
    return daemon


def try_agains(daemon):
    """The daemon's count of calls sent again after -TRYAGAIN, from stats and
    from /metrics (which must agree)."""
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % daemon.metrics_port,
                                timeout=5) as response:
        body = response.read().decode()
    match = re.search(r"^sluice_redis_tryagains_total (\S+)$", body, re.MULTILINE)
    scraped = float(match.group(1)) if match else None
    return daemon.client.result("stats")["leases"]["tryagains"], scraped


def error_count(node, error):
    """How often `node` answered an error starting with `error` (INFO errorstats)."""
    for line in (node.command("INFO", "errorstats") or "").splitlines():
        if line.startswith("errorstat_%s:" % error):
            return int(line.split("count=")[1].split(",")[0])
    return 0


def command_calls(node, command):
    for line in (node.command("INFO", "commandstats") or "").splitlines():
        if line.startswith("cmdstat_%s:" % command):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


class ClusterCase(unittest.TestCase):
    """A fresh cluster and two daemons on it, both up and counting each other."""

    lease_timeout_ms = LEASE_TIMEOUT_MS
    health_timeout_ms = 250

    def setUp(self):
        # Without full coverage required, the masters of the other slots
        # keep serving while one master is down (Redis's default, yes, has
        # every master answer CLUSTERDOWN until the failover ends).
        self.cluster = Cluster(masters=3, replicas=1, node_timeout_ms=1000,
                               args=["--cluster-require-full-coverage", "no"])
        self.addCleanup(self.cluster.stop)
        self.daemons = []
        for index in range(2):
            self.daemons.append(start_daemon(self, index, self.cluster.seeds(),
                                             self.lease_timeout_ms, self.health_timeout_ms))
        for daemon in self.daemons:
            up = wait_for(lambda: (lambda h: h["redis"] == "up" and h["breaker"] == "closed" and
                                   h["nodes"] == 2)(daemon.health()), 10)
            self.assertTrue(up, "%s: %s\n%s" % (daemon.name, daemon.health(), daemon.logs()))

    def spend(self, key, requests_each=BUDGET):
        """Alternates `requests_each` acquires per daemon of `key` on "budget";
        returns the decisions."""
        decisions = []
        for _ in range(requests_each):
            for daemon in self.daemons:
                decisions.append(daemon.acquire("budget", key))
        return decisions

    def key_in_slot(self, rule, slot, prefix):
        """A key of `rule` whose state key falls in `slot`."""
        i = 0
        while cluster_slot(redis_key("q", rule, "%s%d" % (prefix, i))) != slot:
            i += 1
        return "%s%d" % (prefix, i)


class ClusterKeysTest(ClusterCase):
    # Verifies the adversarial keys and many plain ones on a cluster:
    # every key's budget is enforced exactly across two daemons, in mode
    # "normal"; the state lives on the master of its slot, which Redis's
    # CLUSTER KEYSLOT computes as we do for the state and the block name
    # alike; the keys spread over all three masters; both daemons count two
    # live nodes (heartbeats work in a cluster). Exactness is what is
    # tested, not timing: a lease that fails (a loaded machine stalled a
    # node past 250 ms in CI) sends its key to its share, by design, so the
    # timeouts here are long.
    lease_timeout_ms = 1000
    health_timeout_ms = 1000

    def test_many_and_adversarial_keys_each_have_one_slot_and_an_exact_budget(self):
        keys = [("user-%d" % i).encode() for i in range(40)] + ADVERSARIAL_KEYS
        holders = set()
        slots = set()
        for key in keys:
            decisions = self.spend(key)
            allowed = sum(d["allowed"] for d in decisions)
            self.assertEqual(allowed, BUDGET, (key[:16], decisions))
            self.assertEqual({d["mode"] for d in decisions}, {"normal"}, key[:16])
            state, block = redis_key("q", "budget", key), redis_key("b", "budget", key)
            slot = cluster_slot(state)
            master = self.cluster.master_of(slot)
            self.assertEqual(master.command("CLUSTER", "KEYSLOT", state), slot)
            self.assertEqual(master.command("CLUSTER", "KEYSLOT", block), slot)
            self.assertEqual(master.command("EXISTS", state), 1, key[:16])
            holders.add(master.port)
            slots.add(slot)
        self.assertEqual(len(holders), 3, "the keys did not spread over the masters")
        self.assertGreater(len(slots), len(keys) - 3)
        for daemon in self.daemons:
            self.assertEqual(daemon.health()["nodes"], 2)


    # Verifies that a penalty, whose script takes the state and the block key
    # together, works on a cluster for adversarial keys: the daemon that
    # counts the denials blocks the key, the block key lands on the state's
    # master (the script would fail with CROSSSLOT otherwise), and the other
    # daemon finds the block on its first lease of the key.
    def test_penalty_blocks_adversarial_keys_across_the_fleet(self):
        first, second = self.daemons
        for key in ADVERSARIAL_KEYS:
            decisions = [first.acquire("abuse", key) for _ in range(9)]
            self.assertEqual([d["mode"] for d in decisions], ["normal"] * 8 + ["blocked"],
                             (key[:16], decisions))
            self.assertEqual(sum(d["allowed"] for d in decisions), 5)
            block = redis_key("b", "abuse", key)
            master = self.cluster.master_of(cluster_slot(redis_key("q", "abuse", key)))
            self.assertTrue(wait_for(lambda: master.command("PTTL", block) > 0, 2), key[:16])
            other = second.acquire("abuse", key)
            self.assertEqual((other["allowed"], other["mode"]), (False, "blocked"), other)


class ClusterReshardTest(ClusterCase):
    # Verifies a resharding step: while a slot is MIGRATING to another
    # master, a fresh key of that slot is created on the target through ASK
    # (the target counts ASKING) and decided normally; after the slot's keys
    # are MIGRATEd and the slot is assigned to the target, the daemons follow
    # MOVED (the old owner counts it) and find the key's spent budget there:
    # the fleet admits exactly the limit in all. A penalty rule's call (its
    # state, still on the source, and its absent block key) meanwhile gets
    # -TRYAGAIN, and the daemon counts the calls it sends again in stats and
    # on /metrics.
    def test_migrating_slot_answers_ask_then_moved_and_the_budget_moves(self):
        first, second = self.daemons
        source, target = self.cluster.masters()[:2]
        slot = next(s for s in range(16384) if self.cluster.master_of(s, ask=source) is source)
        old_key = self.key_in_slot("budget", slot, "old-")
        admitted = sum(first.acquire("budget", old_key)["allowed"] for _ in range(5))
        self.assertEqual(admitted, 5)
        split_key = self.key_in_slot("abuse", slot, "split-")
        self.assertTrue(first.acquire("abuse", split_key)["allowed"])
        self.assertEqual(source.command("CLUSTER", "COUNTKEYSINSLOT", str(slot)), 2)
        self.assertEqual(try_agains(second), (0, 0))

        source_id, target_id = self.cluster.node_id(source), self.cluster.node_id(target)
        self.assertEqual(target.command("CLUSTER", "SETSLOT", str(slot), "IMPORTING", source_id), "OK")
        self.assertEqual(source.command("CLUSTER", "SETSLOT", str(slot), "MIGRATING", target_id), "OK")
        asking_before = command_calls(target, "asking")
        fresh_key = self.key_in_slot("budget", slot, "fresh-")
        fresh = [second.acquire("budget", fresh_key) for _ in range(3)]
        self.assertEqual([d["allowed"] for d in fresh], [True] * 3, fresh)
        self.assertEqual({d["mode"] for d in fresh}, {"normal"}, fresh)
        self.assertGreater(command_calls(target, "asking"), asking_before)
        self.assertEqual(target.command("CLUSTER", "COUNTKEYSINSLOT", str(slot)), 1)

        # The second daemon holds nothing of split_key: it leases, and the
        # source has the state but not the block key.
        second.acquire("abuse", split_key)
        self.assertTrue(wait_for(lambda: try_agains(second)[0] > 0, 2), try_agains(second))
        self.assertTrue(wait_for(lambda: (lambda t: t[0] == t[1])(try_agains(second)), 2),
                        try_agains(second))

        # Move the slot's keys, then the slot itself, as redis-cli --cluster reshard does.
        state = redis_key("q", "budget", old_key)
        split_state = redis_key("q", "abuse", split_key)
        self.assertEqual(source.command("MIGRATE", "127.0.0.1", str(target.port), "", "0", "5000",
                                        "KEYS", state, split_state), "OK")
        for node in self.cluster.masters():
            node.command("CLUSTER", "SETSLOT", str(slot), "NODE", target_id)
        self.assertTrue(wait_for(lambda: self.cluster.master_of(slot, ask=source) is target, 5))
        moved_before = error_count(source, "MOVED")
        rest = [second.acquire("budget", old_key) for _ in range(BUDGET)]
        rest += [first.acquire("budget", old_key) for _ in range(BUDGET)]
        self.assertEqual({d["mode"] for d in rest}, {"normal"}, rest)
        self.assertEqual(admitted + sum(d["allowed"] for d in rest), BUDGET)
        self.assertGreater(error_count(source, "MOVED"), moved_before)
        self.assertEqual(target.command("CLUSTER", "COUNTKEYSINSLOT", str(slot)), 3)


class ClusterFailoverTest(ClusterCase):
    # Verifies losing a master under steady leasing: keys on the other
    # masters stay "normal" throughout; the dead master's key falls back
    # (never waiting past the stall bound) and leases again from the promoted
    # replica within RESUME_AFTER_PROMOTION_S of a live node naming it; both
    # daemons keep Redis "up" in health, enter learning mode once the
    # promoted replica shows up in the slot map, and debit to it what the
    # key admitted by its policy meanwhile.
    def test_master_killed_other_keys_keep_leasing_and_its_keys_recover(self):
        masters = self.cluster.masters()
        victim = masters[0]
        keys = {}  # one key per master, by port
        for master in masters:
            slot = next(s for s in range(0, 16384, 7)
                        if self.cluster.master_of(s, ask=master) is master)
            keys[master.port] = self.key_in_slot("steady", slot, "steady-%d-" % master.port)
        victim_key = keys[victim.port]
        victim_slot = cluster_slot(redis_key("q", "steady", victim_key))
        others = [k for port, k in keys.items() if port != victim.port]

        records = []  # (t, key, mode, latency_s, allowed)

        def round_of_requests():
            for daemon in self.daemons:
                for key in keys.values():
                    sent = time.monotonic()
                    decision = daemon.acquire("steady", key)
                    records.append((sent, key, decision["mode"], time.monotonic() - sent,
                                    decision["allowed"]))

        warmup_end = time.monotonic() + 1.0
        while time.monotonic() < warmup_end:
            round_of_requests()
            time.sleep(0.01)
        debited_before = sum(d.client.result("stats")["leases"]["debited_units"]
                             for d in self.daemons)
        killed = time.monotonic()
        victim.kill()
        survivors = [n for n in self.cluster.alive()]
        promoted = None
        deadline = killed + FAILOVER_BOUND_S + RESUME_AFTER_PROMOTION_S + 2
        back = None
        learning = set()  # daemons seen in learning mode after the promotion
        while time.monotonic() < deadline:
            round_of_requests()
            if promoted is None:
                owner = self.cluster.master_of(victim_slot, ask=survivors[0])
                if owner is not None and owner is not victim:
                    promoted = time.monotonic()
            else:
                learning |= {i for i, d in enumerate(self.daemons) if d.health()["learning"]}
            recent = [r for r in records[-len(keys) * 2:] if r[1] == victim_key]
            if promoted is not None and back is None and all(r[2] == "normal" for r in recent):
                back = time.monotonic()
            if back is not None and time.monotonic() > back + 0.5:
                break
            time.sleep(0.01)

        logs = "\n".join(d.logs() for d in self.daemons)
        self.assertIsNotNone(promoted, "no replica was promoted within %.0f s" % FAILOVER_BOUND_S)
        slowest = max(r[3] for r in records)
        self.assertLessEqual(slowest * 1000, STALL_BOUND_MS, "an answer took %.0f ms" % (slowest * 1000))
        after_kill = [r for r in records if r[0] >= killed]
        self.assertEqual({r[2] for r in after_kill if r[1] in others}, {"normal"},
                         "keys on live masters left normal mode\n" + logs)
        victim_modes = [r[2] for r in after_kill if r[1] == victim_key]
        self.assertIn("fallback", victim_modes, "the dead master's key never fell back\n" + logs)
        self.assertIsNotNone(back, "the dead master's key never leased again\n" + logs)
        self.assertLessEqual(back - promoted, RESUME_AFTER_PROMOTION_S,
                             "leasing resumed %.2f s after the promotion" % (back - promoted))
        # The promoted replica may lack the dead master's last writes: each
        # daemon holds to its share for a while (learning mode).
        self.assertEqual(learning, {0, 1}, "learning mode after the failover\n" + logs)
        # What the dead master's key admitted by its policy is debited to the
        # promoted replica (only a debit lost on its way when the master
        # died is not): one unit per admission.
        fallback_admitted = sum(1 for r in after_kill if r[2] == "fallback" and r[4])
        wait_for(lambda: sum(d.client.result("stats")["leases"]["debited_units"]
                             for d in self.daemons) - debited_before >= fallback_admitted, 2)
        debited = sum(d.client.result("stats")["leases"]["debited_units"]
                      for d in self.daemons) - debited_before
        sys.stderr.write("\ncluster failover: %d admitted by policy, %d debited\n"
                         % (fallback_admitted, debited))
        self.assertGreater(fallback_admitted, 0)
        self.assertGreaterEqual(debited, fallback_admitted / 2)
        self.assertLessEqual(debited, fallback_admitted)
        # Asked for at well over its limit, the dead master's key is admitted
        # by the fleet at most at its limit from the kill on: what the
        # replica's state allows, plus what the two slices held at the kill
        # and the two shares' bursts while the master was down (learning
        # holds each node to its share after the promotion).
        t_end = max(r[0] for r in records)
        victim_asked = sum(1 for r in after_kill if r[1] == victim_key)
        victim_admitted = sum(1 for r in after_kill if r[1] == victim_key and r[4])
        bound = STEADY_PER_S * (t_end - killed) + STEADY_BURST + 2 * STEADY_BURST
        sys.stderr.write("cluster failover: the dead master's key: %d asked, %d admitted, "
                         "bound %.0f\n" % (victim_asked, victim_admitted, bound))
        # The bound is a real limit here: demand was well above it (how far
        # depends on how fast this machine sends; a loaded one sent 1.5x).
        self.assertGreater(victim_asked, 1.25 * bound)
        self.assertLessEqual(victim_admitted, bound)
        for daemon in self.daemons:
            health = daemon.health()
            self.assertEqual(health["redis"], "up", health)
            self.assertEqual(health["redis_mode"], "cluster", health)
            self.assertNotIn("127.0.0.1:%d" % victim.port, health["redis_address"], health)
        sys.stderr.write("\ncluster failover: promoted %.2f s after the kill, leasing again "
                         "%.2f s after that; slowest answer %.0f ms\n"
                         % (promoted - killed, back - promoted, slowest * 1000))


def tearDownModule():
    tear_down_module()


if __name__ == "__main__":
    unittest.main(verbosity=2)
