#!/usr/bin/python3
"""Sentinel tests: sluiced on a Redis Sentinel deployment, from config alone.

Real processes on loopback, started here: one master, one replica and three
sentinels (redis-server --sentinel, down-after-milliseconds 500,
failover-timeout 2000), and daemons whose [redis] names the master and the
sentinels instead of a url.

- Failover under load: two daemons share a global limit at twice its rate
  (85/15: leasing alone would let the busy node take more than its share,
  which learning mode must not) while the master is SIGKILLed. Every request is answered, never later than
  the stall bound; the decisions fall back to the shares; once the sentinels
  have promoted the replica, both daemons follow it (health's redis_address),
  lease again (mode "normal", leases answered in stats) within the failover
  time + 1 s, and start learning mode (the new master is a new run_id), in
  which each node admits no more than its share: the demand-weighted one
  (the rate it held, asked of the new master again) or the equal one.
  What a node spent on a rate lease through the outage is debited to the
  new master.
- Resolution failures: a master name the sentinels do not know, and no
  sentinel reachable at all. The daemon answers from its fallback share and
  keeps asking, so it connects once the sentinels can answer.
- A sentinel that hangs (SIGSTOP) while it holds the daemon's subscription
  to +switch-master: the subscription moves to a live sentinel (the watch
  link's PINGs go unanswered), and Redis stays up for the daemon.

Run by ctest (labels `sentinel`); SLUICED names the daemon binary,
REDIS_SERVER the redis-server. The load generator and the measurements are
fleet_test.py's.
"""

import math
import os
import signal
import sys
import threading
import time
import unittest

from fleet_test import (BURST, LIMIT_PER_S, RECOVER_BOUND_MS, SUMMARY, FleetCase, first_health,
                        format_table, longest_stall_ms, ms, settled_after, share_burst, slowest,
                        summary)
from harness import (Client, Redis, Sentinel, redis_key, renew_channel, tear_down_module,
                     wait_for)

MASTER = "mymaster"
# Sentinel's own timings (the sentinels' config): a dead master is
# subjectively down after DOWN_AFTER_MS, and a failover may take up to
# FAILOVER_TIMEOUT_MS before another sentinel tries.
DOWN_AFTER_MS = 500
FAILOVER_TIMEOUT_MS = 2000
# How long the sentinels may take to promote the replica after the kill on
# this machine: down-after, agreement among the sentinels, the election and
# the promotion, with room for a busy machine.
FAILOVER_BOUND_S = 10.0
# Once the sentinels name the new master, the daemons must lease again within
# this (the brief: failover time + 1 s).
RESUME_AFTER_SWITCH_MS = 1000
# A hung sentinel holding the daemon's subscription must lose it to a live one
# within this: the watch link's probe interval and deadline (sentinel.h), a
# reconnect's first backoff step and a handshake, with room for a busy machine.
WATCH_MOVE_BOUND_S = 5.0


def sentinel_section(sentinels, master=MASTER):
    return 'sentinel_master = "%s"\nsentinels = [%s]' % (
        master, ", ".join('"127.0.0.1:%d"' % s.port for s in sentinels))


class SentinelCase(FleetCase):
    """FleetCase with a master, a replica and three sentinels that know each
    other and the replica (a failover needs both)."""

    def start_deployment(self, replica=True, sentinels=3):
        self.master = self.start_redis()
        self.replica = None
        if replica:
            self.replica = Redis(args=["--replicaof", "127.0.0.1", str(self.master.port)])
            self.addCleanup(self.replica.stop)
        self.sentinels = []
        for _ in range(sentinels):
            sentinel = Sentinel(self.master.port, MASTER, quorum=2, down_after_ms=DOWN_AFTER_MS,
                                failover_timeout_ms=FAILOVER_TIMEOUT_MS)
            self.addCleanup(sentinel.stop)
            self.sentinels.append(sentinel)
        if replica:
            self.assertTrue(wait_for(lambda: "master_link_status:up" in (
                self.replica.command("INFO", "replication") or ""), 10), "replica never synced")
        ready = wait_for(lambda: all(
            len(s.command("SENTINEL", "replicas", MASTER) or []) == (1 if replica else 0) and
            len(s.command("SENTINEL", "sentinels", MASTER) or []) == sentinels - 1
            for s in self.sentinels), 15)
        self.assertTrue(ready, "the sentinels never found each other and the replica")

    def address(self, redis):
        return "127.0.0.1:%d" % redis.port


class SentinelFailoverTest(SentinelCase):
    # Verifies that two daemons under load at twice the limit follow a
    # failover after the master is SIGKILLed: no request goes unanswered or
    # waits past the stall bound, decisions fall back to the shares, and
    # once the sentinels name the promoted replica, both daemons connect to
    # it and lease again within a second, in learning mode, each admitting
    # no more than its share until learning ends; what fallback admitted
    # (on the equal share or a rate lease) is debited to the new master, and
    # the fleet stays within the limit and the fallback budgets.
    def test_master_killed_the_fleet_follows_the_failover(self):
        self.start_deployment()
        where = sentinel_section(self.sentinels)
        daemons = self.start_daemons(2, 0, where=where)
        self.wait_fleet_up(daemons)
        for daemon in daemons:
            health = daemon.health()
            self.assertEqual(health["redis_mode"], "sentinel")
            self.assertEqual(health["redis_address"], self.address(self.master))

        switched = {}
        stats_before = {}

        def watch_for_switch():
            # The failover time as the sentinels see it: when one of them
            # first names the replica.
            if wait_for(lambda: any(s.master_address() == self.address(self.replica)
                                    for s in self.sentinels), FAILOVER_BOUND_S):
                switched["at"] = time.monotonic()

        watcher = threading.Thread(target=watch_for_switch)

        def kill_master():
            for daemon in daemons:
                client = Client(daemon.socket)
                stats_before[daemon.name] = client.result("stats")["leases"]
                client.close()
            self.master.kill()
            watcher.start()

        demands = [2 * LIMIT_PER_S * 0.85, 2 * LIMIT_PER_S * 0.15]
        run = self.drive(daemons, demands, duration=9.0,
                         events=[(2.0, "kill", kill_master)])
        watcher.join()
        t_kill = run.events["kill"]
        self.assertIn("at", switched, "the sentinels never promoted the replica within %.0f s"
                      % FAILOVER_BOUND_S)
        t_switch = switched["at"]
        failover_ms = (t_switch - t_kill) * 1000

        # Decisions never stop, and fall back to the shares while no master answers.
        self.assert_answered_without_stalls(run)
        self.assert_modes(run, {"normal", "fallback"})
        fb_admitted, fb_bound = self.assert_fallback_within_shares(run, since=t_kill)
        to_fallback = slowest([settled_after(n, t_kill, t_switch, lambda r: r.mode == "fallback")
                               for n in run.records])
        back_to_normal = slowest([settled_after(n, t_kill, math.inf, lambda r: r.mode == "normal")
                                  for n in run.records])
        down = first_health(run, t_kill, lambda h: h["redis"] == "down")
        up = [next((t for t, h in node if t >= t_kill and h["redis"] == "up"), None)
              for node in run.health]
        sys.stderr.write("\nfailover: the sentinels named the replica %.0f ms after the kill; "
                         "decisions normal again %s ms after it; redis up again per node %s\n"
                         % (failover_ms, fmt_ms(back_to_normal),
                            [fmt_ms(None if t is None else t - t_kill) for t in up]))
        self.print_leases()
        self.print_changes(run)

        def answered(leases):
            return leases["granted"] + leases["empty"]

        share = LIMIT_PER_S / len(daemons)
        # The demand-weighted shares, max-min of the demands: the light node
        # gets what it wants, the hot one the rest.
        light = min(min(demands), share)
        rates = [light if d == min(demands) else LIMIT_PER_S - light for d in demands]
        outage_ends = []  # per daemon: when its breaker closed (the last sample before)
        checks = [
            ("decisions fell back within the switch bound (%s ms)" % fmt_ms(to_fallback),
             to_fallback is not None),
            ("decisions normal again within failover %.0f ms + %d ms of the kill (took %s ms)"
             % (failover_ms, RESUME_AFTER_SWITCH_MS, fmt_ms(back_to_normal)),
             back_to_normal is not None and
             ms(back_to_normal) <= failover_ms + RESUME_AFTER_SWITCH_MS),
        ]
        for daemon, samples, records, rate in zip(daemons, run.health, run.records, rates):
            after = [h for t, h in samples if t >= t_switch]
            health = daemon.health()
            leases = daemon.client.result("stats")["leases"]
            debited = leases["debited_units"] - stats_before[daemon.name]["debited_units"]
            fallback_admitted = sum(r.allowed for r in records
                                    if r.sent >= t_kill and r.mode == "fallback")
            checks += [
                ("%s: health names the new master %s (last: %s)"
                 % (daemon.name, self.address(self.replica), health["redis_address"]),
                 health["redis_address"] == self.address(self.replica)),
                ("%s: breaker closed again by the end (%s)" % (daemon.name, health["breaker"]),
                 health["breaker"] == "closed"),
                ("%s: learning mode after the master changed" % daemon.name,
                 any(h["learning"] is True and h["redis"] == "up" for h in after)),
                # Answered leases: a rate asked again alone (learning) brings
                # no tokens, and counts as empty.
                ("%s: leases answered after the failover (%d before the kill, %d at the end)"
                 % (daemon.name, answered(stats_before[daemon.name]), answered(leases)),
                 answered(leases) > answered(stats_before[daemon.name])),
                # The promoted replica holds the state: fallback's admissions
                # are its debt, those of the equal share and of a rate lease
                # alike (but for the few admitted after the debits were sent,
                # in half-open, which the next outage's debit carries).
                ("%s: fallback admissions debited to the new master (%d units of %d)"
                 % (daemon.name, debited, fallback_admitted),
                 debited >= 0.9 * fallback_admitted and debited > 0),
            ]
            # Learning: from the breaker closing until learning ends (one
            # period, 1 s, after it closes; sampled health bounds when), a
            # node admits at most its equal share's rate and burst, plus what
            # its slice held when it closed (at most a share's burst), or,
            # when it held a rate through the outage (its demand-weighted
            # share, issue 21), that rate: it ended when the node found the
            # master changed, and the node asks the new master for it again.
            closed_at = next((i for i, (t, h) in enumerate(samples)
                              if t >= t_switch and h["breaker"] == "closed"), None)
            if closed_at is None or closed_at == 0:
                checks.append(("%s: breaker closed after the switch" % daemon.name, False))
                continue
            closing = samples[closed_at - 1][0]
            learning_end = closing + 0.9
            window = [r for r in records if closing <= r.sent < learning_end and r.recv is not None]
            admitted = sum(r.allowed for r in window)
            bound = max(share, rate) * (learning_end - closing) + 2 * share_burst(share)
            checks.append(("%s: admitted %d from the breaker closing to the end of learning "
                           "(%.2f s), within its share %.0f" % (daemon.name, admitted,
                                                               learning_end - closing, bound),
                           admitted <= bound))
            outage_ends.append(closing)
        # The outage, fleet-wide: a node spends its rate lease (the
        # demand-weighted share) or its equal share, never more than the
        # limit between them beyond each node's fallback budget of one
        # period (its share's rate and burst), which a node without a rate
        # beside a holder may spend (docs/design.md, "The overshoot bound").
        if len(outage_ends) == len(daemons):
            outage_end = max(outage_ends)
            fleet = sum(r.allowed for records in run.records for r in records
                        if t_kill <= r.sent < outage_end and r.recv is not None)
            fleet_bound = (LIMIT_PER_S * (outage_end - t_kill) + BURST +
                           len(daemons) * (share + share_burst(share)))
            checks.append(("the fleet admitted %d from the kill until every breaker closed "
                           "(%.2f s), within the limit and the fallback budgets %.0f"
                           % (fleet, outage_end - t_kill, fleet_bound), fleet <= fleet_bound))
        # The rate leases' renew channel followed the master too: a word
        # published on the new master reaches both daemons.
        heard = [d.client.result("stats")["leases"]["renew_words"] for d in daemons]
        self.replica.command("PUBLISH", renew_channel(), redis_key("q", "shared", "k"))
        for daemon, before in zip(daemons, heard):
            checks.append(("%s: hears the renew channel on the new master" % daemon.name,
                           wait_for(lambda: daemon.client.result("stats")["leases"]["renew_words"]
                                    > before, 2)))
        summary("sentinel_failover", nodes=len(daemons), admitted=fb_admitted, bound=fb_bound,
                ratio=fb_admitted / fb_bound if fb_bound else None,
                stall_ms=max(longest_stall_ms(n) for n in run.records), down_ms=ms(down),
                fallback_ms=ms(to_fallback), up_ms=ms(slowest([
                    None if t is None else t - t_kill for t in up])),
                normal_ms=ms(back_to_normal))
        self.assert_leasing(checks)


class SentinelResolveTest(SentinelCase):
    """The daemon cannot find a master: it answers from its share and keeps asking."""

    def assert_fallback_then_up(self, daemon, make_reachable, master):
        """The daemon answers acquires from its fallback share while it finds
        no master; after make_reachable() it connects to `master` within the
        reconnect backoff's cap (it kept retrying)."""
        for _ in range(3):
            result = daemon.client.result("acquire", "shared", "k")
            self.assertEqual(result["mode"], "fallback", result)
            self.assertEqual(result["limit"], LIMIT_PER_S)  # expected_nodes 1: the whole limit
        health = daemon.health()
        self.assertEqual((health["redis"], health["status"], health["redis_address"]),
                         ("down", "degraded", None), health)
        make_reachable()
        reachable_at = time.monotonic()
        up = wait_for(lambda: daemon.health()["redis"] == "up", RECOVER_BOUND_MS / 1000)
        self.assertTrue(up, "%s\n%s" % (daemon.health(), daemon.logs()))
        sys.stderr.write("\n  %s: up %.0f ms after the sentinels could answer\n"
                         % (daemon.name, (time.monotonic() - reachable_at) * 1000))
        self.assertEqual(daemon.health()["redis_address"], self.address(master))
        self.assertTrue(wait_for(lambda: daemon.client.result(
            "acquire", "shared", "k")["mode"] == "normal", 2), daemon.logs())

    # Verifies that a master name no sentinel knows leaves the daemon in
    # fallback, asking again with backoff, until a sentinel monitors it.
    def test_unknown_master_name_falls_back_and_keeps_asking(self):
        self.start_deployment(replica=False, sentinels=1)
        daemon = self.start_daemons(1, 0, where=sentinel_section(self.sentinels, "elsewhere"))[0]
        self.assertTrue(wait_for(lambda: "does not know the master elsewhere" in daemon.logs(), 5),
                        daemon.logs())
        self.assert_fallback_then_up(
            daemon, lambda: self.assertEqual(self.sentinels[0].command(
                "SENTINEL", "MONITOR", "elsewhere", "127.0.0.1", str(self.master.port), "1"),
                "OK"), self.master)

    # Verifies that with no sentinel reachable (nothing listens on their
    # ports) the daemon answers from fallback and connects once one starts.
    def test_no_sentinel_reachable_falls_back_and_keeps_asking(self):
        master = self.start_redis()
        sentinels = [Sentinel(master.port, MASTER, quorum=1, start=False) for _ in range(2)]
        for sentinel in sentinels:
            self.addCleanup(sentinel.stop)
        daemon = self.start_daemons(1, 0, where=sentinel_section(sentinels))[0]
        self.assertTrue(wait_for(lambda: "no sentinel named the master" in daemon.logs(), 5),
                        daemon.logs())
        self.assert_fallback_then_up(daemon, sentinels[1].start, master)


class SentinelAuthTest(SentinelCase):
    """A sentinel that requires a password, and a master that admits one ACL
    user only (its default user is off)."""

    USER, PASSWORD, SENTINEL_PASSWORD = "sluice", "master-secret", "sentinel-secret"

    def start_auth_deployment(self):
        master = Redis(args=["--user", self.USER, "on", ">" + self.PASSWORD, "~*", "&*", "+@all",
                             "--user", "default", "off"], auth=(self.USER, self.PASSWORD))
        self.addCleanup(master.stop)
        sentinel = Sentinel(master.port, MASTER, quorum=1, password=self.SENTINEL_PASSWORD,
                            master_auth=(self.USER, self.PASSWORD))
        self.addCleanup(sentinel.stop)
        # The sentinel has logged in to the master once it knows its run id.
        self.assertTrue(wait_for(lambda: (lambda m: isinstance(m, list) and "runid" in m and
                                          m[m.index("runid") + 1] != "")(
            sentinel.command("SENTINEL", "master", MASTER)), 10), "the sentinel never reached the master")
        return master, sentinel

    def auth_section(self, sentinel, sentinel_password):
        return sentinel_section([sentinel]) + (
            '\nsentinel_password = "%s"\nusername = "%s"\npassword = "%s"'
            % (sentinel_password, self.USER, self.PASSWORD))

    # Verifies the daemon logs in to the sentinel with sentinel_password and
    # to the master the sentinel names with username and password: it leases
    # from that master (mode "normal", scripts run there).
    def test_password_protected_sentinel_and_acl_master(self):
        master, sentinel = self.start_auth_deployment()
        daemon = self.start_daemons(1, 0, where=self.auth_section(sentinel, self.SENTINEL_PASSWORD))[0]
        self.assertTrue(wait_for(lambda: daemon.health()["redis"] == "up", 5), daemon.logs())
        health = daemon.health()
        self.assertEqual((health["redis_mode"], health["redis_address"]),
                         ("sentinel", self.address(master)), health)
        self.assertTrue(wait_for(lambda: daemon.client.result(
            "acquire", "shared", "k")["mode"] == "normal", 2), daemon.logs())
        self.assertGreater(master.script_calls(), 0)

    # Verifies the passwords may be kept out of the config: the daemon reads
    # sentinel_password_file and password_file (each chmod 600, one line)
    # and logs in to the sentinel and the master with them.
    def test_passwords_read_from_files(self):
        master, sentinel = self.start_auth_deployment()
        files = {}
        for name, secret in (("sentinel", self.SENTINEL_PASSWORD), ("master", self.PASSWORD)):
            files[name] = os.path.join(self.dir, name + ".password")
            with open(os.open(files[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(secret + "\n")
        where = sentinel_section([sentinel]) + (
            '\nsentinel_password_file = "%s"\nusername = "%s"\npassword_file = "%s"'
            % (files["sentinel"], self.USER, files["master"]))
        daemon = self.start_daemons(1, 0, where=where)[0]
        with open(daemon.config) as config:
            self.assertNotIn(self.PASSWORD, config.read())
        self.assertTrue(wait_for(lambda: daemon.health()["redis"] == "up", 5), daemon.logs())
        self.assertTrue(wait_for(lambda: daemon.client.result(
            "acquire", "shared", "k")["mode"] == "normal", 2), daemon.logs())
        self.assertGreater(master.script_calls(), 0)

    # Verifies a wrong sentinel password is reported (the log names the
    # sentinel and Redis's refusal) and leaves the daemon answering from its
    # share, never connected.
    def test_wrong_sentinel_password_is_reported_and_falls_back(self):
        master, sentinel = self.start_auth_deployment()
        daemon = self.start_daemons(1, 0, where=self.auth_section(sentinel, "not-the-password"))[0]
        self.assertTrue(wait_for(lambda: "WRONGPASS" in daemon.logs(), 5), daemon.logs())
        self.assertIn(self.address(sentinel), daemon.logs())
        result = daemon.client.result("acquire", "shared", "k")
        self.assertEqual(result["mode"], "fallback", result)
        self.assertEqual(daemon.health()["redis"], "down")
        self.assertEqual(master.script_calls(), 0)


class SentinelWatchTest(SentinelCase):
    """The daemon's subscription to +switch-master stays on a live sentinel."""

    def subscribed(self, sentinel):
        """Connections to `sentinel` subscribed to a channel: the daemons'
        watch links (sentinels subscribe on masters and replicas, not on
        each other)."""
        clients = sentinel.command("CLIENT", "LIST") or ""
        return sum(1 for line in clients.splitlines() if " sub=1 " in line)

    # Verifies that a sentinel that hangs (SIGSTOP: its connections stay
    # open, it answers nothing) while it holds the daemon's subscription is
    # noticed: the subscription moves to a live sentinel within
    # WATCH_MOVE_BOUND_S, and Redis stays up for the daemon meanwhile.
    def test_hung_sentinel_loses_the_subscription_to_a_live_one(self):
        self.start_deployment(replica=False)
        daemon = self.start_daemons(1, 0, where=sentinel_section(self.sentinels))[0]
        self.wait_fleet_up([daemon])
        watched = wait_for(lambda: next((s for s in self.sentinels if self.subscribed(s)), None), 5)
        self.assertIsNotNone(watched, "no sentinel holds the subscription\n" + daemon.logs())
        others = [s for s in self.sentinels if s is not watched]
        self.assertEqual([self.subscribed(s) for s in others], [0, 0])

        watched.signal(signal.SIGSTOP)  # its stop() still ends it (SIGKILL)
        stopped_at = time.monotonic()
        moved = wait_for(lambda: any(self.subscribed(s) for s in others), WATCH_MOVE_BOUND_S)
        took_s = time.monotonic() - stopped_at
        self.assertTrue(moved, "the subscription stayed on the hung sentinel for %.0f s\n%s"
                        % (WATCH_MOVE_BOUND_S, daemon.logs()))
        sys.stderr.write("\n  the subscription moved %.0f ms after the sentinel hung\n"
                         % (took_s * 1000))
        self.assertEqual(daemon.health()["redis"], "up")


def fmt_ms(seconds):
    return "-" if seconds is None else "%.0f" % (seconds * 1000)


def tearDownModule():
    if SUMMARY:
        sys.stderr.write("\nsentinel summary (limit %d/s, burst %d)\n%s\n"
                         % (LIMIT_PER_S, BURST, format_table(SUMMARY)))
    tear_down_module()


if __name__ == "__main__":
    unittest.main(verbosity=2)
