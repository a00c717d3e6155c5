#!/usr/bin/python3
"""Fleet tests: several sluiced sharing one global limit through a real Redis.

docs/design.md, "The lease path" and "Fallback", seen from outside: a few daemons
on one redis-server, each under steady load from its own client process, while
the test breaks Redis in the ways production does (SIGKILL and a restart
without data, SIGSTOP, CLIENT PAUSE, absent at start, never reachable).

What is measured, per request: when it was sent, when its answer came back,
whether it was allowed and in which mode. From that:
- accuracy: admissions against limit x T + burst over the fleet;
- stalls: the longest wait for any answer, which must stay near lease_timeout
  whatever Redis does (no request waits on a dead Redis);
- switching: how long after a fault decisions are in the on_redis_down mode,
  and how long after recovery they are "normal" again;
- the fallback bound: admissions in mode "fallback" never exceed each node's
  share (limit / N, burst / N) over the time it was in fallback.

Assertions about the lease path (mode "normal", health's `breaker`,
`learning`, `leased_units`) are collected per test and checked in one place,
assert_leasing(), which prints each of them.

Run by ctest (label `fleet`); SLUICED names the daemon binary, REDIS_SERVER
the redis-server. Each test prints a summary line to stderr, and all of them
again as one table at the end.
"""

import json
import math
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

import msgpack

from harness import Daemon, Redis, end_process, make_dir, spawn, tear_down_module, wait_for

# The global rule every test shares. Python's msgpack is slow and the machine
# small, so the rate is modest; 600 and 60 divide by 1, 2 and 3 nodes, so the
# fallback shares are exact.
LIMIT_PER_S = 600
BURST = 60

LEASE_TIMEOUT_MS = 50
HEALTH_INTERVAL_MS = 100
HEALTH_TIMEOUT_MS = 250
HEARTBEAT_INTERVAL_MS = 200
LEASE_INTERVAL_MS = 100

# Margins for a shared 2-core CI machine: a Python client in a busy process
# adds scheduling noise of tens of milliseconds.
STALL_MARGIN_MS = 150
STALL_BOUND_MS = LEASE_TIMEOUT_MS + STALL_MARGIN_MS
# DESIGN: switching takes well under a second; with the defaults a stalled
# Redis is noticed within health_interval + health_timeout (350 ms).
SWITCH_MARGIN_MS = 250
SWITCH_BOUND_MS = 500 + SWITCH_MARGIN_MS
# Reconnects back off up to reconnect_max (1 s by default) with +-20% jitter:
# Redis is back within 1.2 s of being reachable again, plus the margin.
RECOVER_BOUND_MS = 1200 + 600
# After Redis comes back with the fleet's state, the longest the fleet may go
# without admitting anything: what fallback admitted is charged over the
# fault, so it leaves no debt (before, a fault of T left about T of silence).
# Checked after CLIENT PAUSE and SIGSTOP (where leases stuck in the frozen
# Redis's socket would otherwise run first and take the refilled bucket).
RESUME_GAP_MS = 500
LEASE_STATS = ("requested", "granted", "failed", "returned_units", "debited_units",
               "negative_cache_hits", "deferred", "fallback_entries", "fallback_ms")
# The accuracy lower bound: admitted >= this share of limit x T + burst.
ACCURACY_FLOOR = 0.97

CONFIG = """
[daemon]
socket = "{socket}"
workers = 1
log_level = "info"

[redis]
{where}
expected_nodes = {expected_nodes}
node_id = "fleet-{index}"
heartbeat_interval = "{heartbeat}ms"
health_interval = "{health_interval}ms"
health_timeout = "{health_timeout}ms"
lease_timeout = "{lease_timeout}ms"
lease_interval = "{lease_interval}ms"

[[rule]]
name = "shared"
algorithm = "token_bucket"
limit = {limit}
period = "1s"
burst = {burst}
scope = "global"
on_redis_down = "local"
"""

SUMMARY = []


def read_text(path):
    with open(path) as f:
        return f.read()


def fleet_daemon(index, redis_port, expected_nodes, where=None):
    """A sluiced (not started) on one global rule and the given Redis port, or
    where `where` says (the [redis] lines naming Redis, e.g. the Sentinel
    options)."""
    daemon = Daemon("fleet-%d" % index, log_tail=40)
    daemon.write_config(CONFIG.format(
        socket=daemon.socket, expected_nodes=expected_nodes, index=index,
        where=where or 'url = "redis://127.0.0.1:%d"' % redis_port,
        heartbeat=HEARTBEAT_INTERVAL_MS, health_interval=HEALTH_INTERVAL_MS,
        health_timeout=HEALTH_TIMEOUT_MS, lease_timeout=LEASE_TIMEOUT_MS,
        lease_interval=LEASE_INTERVAL_MS, limit=LIMIT_PER_S, burst=BURST))
    return daemon


# --- the load generator (a child process per daemon) ---------------------------

def load_main(spec):
    """Sends acquires at a fixed rate, pipelined, without waiting for answers
    (open loop: a stalled daemon does not slow the sender), and records when
    each was sent and answered. Prints "ready" once connected, starts at the
    monotonic time read from stdin, writes its records to spec["out"].

    CLOCK_MONOTONIC is system-wide, so the parent compares these times with
    the times of its own fault actions."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(spec["socket"])
    sock.setblocking(False)
    print("ready", flush=True)
    start = float(sys.stdin.readline())
    rate, end = spec["rate"], start + spec["duration"]
    drain_deadline = end + spec["drain"]
    unpacker = msgpack.Unpacker(raw=False)
    request = [spec["rule"], spec["key"], 1]
    sent = []       # sent[msgid - 1] = monotonic send time
    answers = {}    # msgid -> [recv time, allowed, mode, limit, error code]
    out = b""
    closed = False
    while time.monotonic() < start:
        time.sleep(min(0.001, max(0.0, start - time.monotonic())))
    while not closed:
        now = time.monotonic()
        if now < end:
            due = int((now - start) * rate) - len(sent)
            for _ in range(due):
                sent.append(now)
                out += msgpack.packb([0, len(sent), "acquire", request])
        elif len(answers) == len(sent) or now > drain_deadline:
            break
        if out:
            try:
                out = out[sock.send(out):]
            except BlockingIOError:
                pass
        readable, _, _ = select.select([sock], [sock] if out else [], [],
                                       0.002 if now < end else 0.05)
        if readable:
            try:
                data = sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            received = time.monotonic()
            if not data:
                closed = True
            unpacker.feed(data)
            for _, msgid, error, result in unpacker:
                if error is not None:
                    answers[msgid] = [received, False, None, None, error.get("code", "?")]
                else:
                    answers[msgid] = [received, result["allowed"], result["mode"],
                                      result["limit"], None]
    records = [[t] + answers.get(i + 1, [None, False, None, None, "unanswered"])
               for i, t in enumerate(sent)]
    with open(spec["out"], "wb") as f:
        f.write(msgpack.packb(records))


class Record:
    __slots__ = ("sent", "recv", "allowed", "mode", "limit", "error")

    def __init__(self, sent, recv, allowed, mode, limit, error):
        self.sent, self.recv, self.allowed = sent, recv, allowed
        self.mode, self.limit, self.error = mode, limit, error


class Run:
    """What one load run saw: per daemon, a Record per request in send order,
    health samples (time answered, health map), and the times of events."""

    def __init__(self, records, health, events, start, end):
        self.records, self.health, self.events = records, health, events
        self.start, self.end = start, end

    def all(self):
        return [r for node in self.records for r in node]


# --- measurements on a Run --------------------------------------------------------

def longest_stall_ms(records):
    """The longest wait from a request to its answer; inf when one never came."""
    return max(((r.recv - r.sent) * 1000 if r.recv is not None else math.inf)
               for r in records) if records else 0.0


def settled_after(records, after, before, predicate):
    """Seconds from `after` to the send time from which every request sent
    before `before` satisfies predicate; None when the last one does not."""
    window = [r for r in records if after <= r.sent < before]
    if not window:
        return None
    last_bad = max((i for i, r in enumerate(window) if not predicate(r)), default=-1)
    if last_bad == len(window) - 1:
        return None
    return window[last_bad + 1].sent - after


def slowest(values):
    """The largest of per-node values, None when any node never got there."""
    return None if any(v is None for v in values) else max(values)


def share_burst(share_limit):
    """A fallback share's burst: limit and burst are both divided by N."""
    nodes = max(1, round(LIMIT_PER_S / share_limit))
    return max(1, BURST // nodes)


def fallback_bound(records, since=-math.inf):
    """(admitted, bound) of one node's mode-"fallback" decisions sent at or
    after `since`: a token bucket at the share rate admits at most rate x time
    + burst in any interval, and these decisions were made between the first
    send and the last answer. The rate is each answer's own `limit` (the share,
    per second), so a change of N on the way is followed."""
    fb = [r for r in records if r.mode == "fallback" and r.sent >= since and r.recv is not None]
    if not fb:
        return 0, 0.0
    bound = share_burst(max(r.limit for r in fb))
    for a, b in zip(fb, fb[1:]):
        bound += (b.sent - a.sent) * max(a.limit, b.limit)
    bound += (fb[-1].recv - fb[-1].sent) * fb[-1].limit
    return sum(r.allowed for r in fb), bound


def all_ratio(run):
    """Every admission of the run (any mode) over limit x T + burst, T from
    the first request sent to the last answer."""
    every = [r for r in run.all() if r.recv is not None]
    span = max(r.recv for r in every) - min(r.sent for r in every)
    return sum(r.allowed for r in every) / (LIMIT_PER_S * span + BURST)


def first_health(run, after, predicate):
    """Seconds from `after` until every daemon's health satisfied predicate
    (the slowest daemon), or None."""
    times = []
    for samples in run.health:
        t = next((t for t, h in samples if t >= after and predicate(h)), None)
        times.append(None if t is None else t - after)
    return slowest(times)


def changes(run, key):
    """Per daemon, each change of a health field: "+0.35s:down" (time from the start)."""
    out = []
    for samples in run.health:
        seen, last = [], object()
        for t, h in samples:
            if h.get(key) != last:
                last = h.get(key)
                seen.append("%+.2fs:%s" % (t - run.start, last))
        out.append(" ".join(seen))
    return out


def ms(seconds):
    return None if seconds is None else seconds * 1000


def fmt(value, spec="%.0f"):
    return "-" if value is None else (spec % value)


def summary(name, **row):
    row = dict(test=name, **row)
    SUMMARY.append(row)
    sys.stderr.write("\n" + format_table([row]) + "\n")


# accuracy: admitted = mode "normal" admissions, bound = limit x T + burst;
# fault tests: admitted = mode "fallback" admissions from the fault on, bound =
# the nodes' shares over their time in fallback + burst shares.
# all/limit: every admission of the run, any mode, over limit x T + burst.
# down/up: health's redis field, all daemons; fallback/normal: the decisions'
# mode settled, all daemons; each in ms after the fault or the recovery.
SUMMARY_COLUMNS = [
    # (header, key, format)
    ("test", "test", "%s"), ("nodes", "nodes", "%d"),
    ("admitted", "admitted", "%d"), ("bound", "bound", "%.0f"), ("ratio", "ratio", "%.3f"),
    ("all/limit", "all_ratio", "%.3f"), ("stall ms", "stall_ms", "%.0f"),
    ("down ms", "down_ms", "%.0f"), ("fallback ms", "fallback_ms", "%.0f"),
    ("up ms", "up_ms", "%.0f"), ("normal ms", "normal_ms", "%.0f"),
]


def format_table(rows):
    cells = [[h for h, _, _ in SUMMARY_COLUMNS]]
    for row in rows:
        cells.append([fmt(row.get(key), spec) for _, key, spec in SUMMARY_COLUMNS])
    widths = [max(len(c[i]) for c in cells) for i in range(len(SUMMARY_COLUMNS))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells)


# --- the tests ----------------------------------------------------------------------

class FleetCase(unittest.TestCase):
    """Starts Redis, daemons and load processes; cleans every one of them up."""

    def setUp(self):
        self.dir = make_dir("fl.")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.daemons = []

    def start_redis(self, start=True):
        redis = Redis(start=start)
        self.addCleanup(redis.stop)
        return redis

    def start_daemons(self, count, port, expected_nodes=None, where=None):
        daemons = []
        for i in range(count):
            daemon = fleet_daemon(len(self.daemons) + i, port, expected_nodes or count, where)
            self.addCleanup(daemon.stop)
            daemon.start(connect=True)
            daemons.append(daemon)
        self.daemons += daemons
        return daemons

    def wait_fleet_up(self, daemons):
        """Until every daemon has Redis up and counts all of them live."""
        for daemon in daemons:
            ok = wait_for(lambda: (lambda h: h["redis"] == "up" and h["nodes"] == len(daemons))(
                daemon.health()), 10)
            self.assertTrue(ok, "%s: %s\n%s" % (daemon.name, daemon.health(), daemon.logs()))

    def drive(self, daemons, rates, duration, events=()):
        """Loads each daemon at its rate (acquires per second on one shared key)
        for `duration` seconds, running events [(offset_s, name, action)] on
        the way and sampling every daemon's health every 50 ms."""
        loads = []
        for i, (daemon, rate) in enumerate(zip(daemons, rates)):
            out = os.path.join(self.dir, "load%d" % i)
            spec = dict(socket=daemon.socket, rule="shared", key="fleet-key", rate=rate,
                        duration=duration, drain=5.0, out=out)
            err = os.path.join(self.dir, "load%d.err" % i)
            with open(err, "w") as err_file:
                proc = spawn([sys.executable, os.path.abspath(__file__), "--load",
                              json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=err_file, text=True)
            self.addCleanup(end_process, proc)
            loads.append((proc, out, err))
        for proc, _, err in loads:
            line = proc.stdout.readline()
            self.assertEqual(line, "ready\n", read_text(err))

        health = [[] for _ in daemons]
        stop_polling = threading.Event()

        def poll():
            while not stop_polling.is_set():
                for samples, daemon in zip(health, daemons):
                    try:
                        h = daemon.health()
                    except (OSError, ConnectionError, AssertionError):
                        continue
                    samples.append((time.monotonic(), h))
                stop_polling.wait(0.05)

        poller = threading.Thread(target=poll)
        start = time.monotonic() + 0.05
        for proc, _, _ in loads:
            proc.stdin.write("%r\n" % start)
            proc.stdin.close()
            proc.stdout.close()
        poller.start()
        fired = {}
        try:
            for offset, name, action in sorted(events, key=lambda e: e[0]):
                time.sleep(max(0.0, start + offset - time.monotonic()))
                fired[name] = time.monotonic()
                action()
            for proc, _, err in loads:
                self.assertEqual(proc.wait(timeout=duration + 30), 0, read_text(err))
        finally:
            stop_polling.set()
            poller.join()
        records = []
        for _, out, _ in loads:
            with open(out, "rb") as f:
                records.append([Record(*r) for r in msgpack.unpackb(f.read(), raw=False)])
        return Run(records, health, fired, start, start + duration)

    def print_leases(self):
        for daemon in self.daemons:
            if daemon.proc.poll() is None:
                stats = daemon.client.result("stats")
                health = daemon.health()
                sys.stderr.write("%s: allowed %s denied %s leases %s breaker %s leased_units %s\n"
                                 % (daemon.name, stats["allowed"], stats["denied"],
                                    stats.get("leases"), health.get("breaker"),
                                    health.get("leased_units")))

    def print_changes(self, run):
        """Health fields over time and each node's longest stall, relative to the start."""
        for key in ("redis", "nodes", "breaker", "learning"):
            for daemon, line in zip(self.daemons, changes(run, key)):
                sys.stderr.write("  %s %s: %s\n" % (daemon.name, key, line))
        for daemon, records in zip(self.daemons, run.records):
            worst = max((r for r in records if r.recv is not None),
                        key=lambda r: r.recv - r.sent, default=None)
            if worst is not None:
                sys.stderr.write("  %s longest stall %.0f ms, sent at %+.2fs\n"
                                 % (daemon.name, (worst.recv - worst.sent) * 1000,
                                    worst.sent - run.start))

    def logs(self):
        return "\n".join("--- %s\n%s" % (d.name, d.logs()) for d in self.daemons)

    # Shared checks ------------------------------------------------------------------

    def assert_answered_without_stalls(self, run):
        """Every request answered, without error, within the stall bound."""
        for daemon, records in zip(self.daemons, run.records):
            errors = [r.error for r in records if r.error is not None]
            self.assertEqual(errors, [], "%s: %d errors, first %s\n%s"
                             % (daemon.name, len(errors), errors[:3], self.logs()))
            stall = longest_stall_ms(records)
            self.assertLessEqual(stall, STALL_BOUND_MS,
                                 "%s: an answer took %.0f ms (bound %d = lease_timeout %d + "
                                 "margin %d)\n%s" % (daemon.name, stall, STALL_BOUND_MS,
                                                     LEASE_TIMEOUT_MS, STALL_MARGIN_MS,
                                                     self.logs()))
            self.assertIsNone(daemon.proc.poll(), daemon.name + " died\n" + self.logs())

    def assert_modes(self, run, allowed_modes):
        seen = {r.mode for r in run.all()}
        self.assertLessEqual(seen, set(allowed_modes), "modes seen: %s" % seen)

    def assert_fallback_within_shares(self, run, since=-math.inf):
        """Mode-"fallback" admissions of each node stay within its share; returns
        the fleet's (admitted, bound)."""
        admitted = bound = 0
        for daemon, records in zip(self.daemons, run.records):
            a, b = fallback_bound(records, since)
            self.assertLessEqual(a, b, "%s admitted %d in fallback, share allows %.1f"
                                 % (daemon.name, a, b))
            admitted += a
            bound += b
        return admitted, bound

    def assert_leasing(self, checks):
        """The assertions about the lease path, in one place per test: checks
        is [(description, ok)]; each is printed, and any that failed fail the
        test."""
        failed = [what for what, ok in checks if not ok]
        for what, ok in checks:
            sys.stderr.write("  leasing: %s %s\n" % ("ok  " if ok else "FAIL", what))
        if failed:
            self.fail("leasing assertions failed:\n  " + "\n  ".join(failed))


class FleetAccuracyTest(FleetCase):
    # Verifies three daemons under uneven demand (3x the limit, split
    # 50/30/20) together admit limit x T + burst, within 3% below and the
    # leases still held above, while Redis sees few commands per decision.
    def test_three_nodes_share_one_limit_under_uneven_demand(self):
        redis = self.start_redis()
        daemons = self.start_daemons(3, redis.port)
        self.wait_fleet_up(daemons)
        demand = 3 * LIMIT_PER_S
        rates = [demand * 0.5, demand * 0.3, demand * 0.2]
        calls_before = redis.script_calls()
        run = self.drive(daemons, rates, duration=6.0)
        calls_after = redis.script_calls()
        calls = calls_after - calls_before
        leased = [d.health().get("leased_units", 0) or 0 for d in daemons]

        self.assert_answered_without_stalls(run)
        self.assert_modes(run, {"normal", "fallback"})
        every = run.all()
        first = min(r.sent for r in every)
        t_sent = max(r.sent for r in every) - first
        t_answered = max(r.recv for r in every) - first
        expected = LIMIT_PER_S * t_sent + BURST
        normal = [sum(r.allowed and r.mode == "normal" for r in node) for node in run.records]
        allowed = [sum(r.allowed for r in node) for node in run.records]
        admitted = sum(normal)
        # Whatever the mode, the fleet never admits more than the one limit
        # (the fallback shares add up to it; leases come out of it).
        ceiling = LIMIT_PER_S * t_answered + BURST + sum(leased)
        self.assertLessEqual(sum(allowed), ceiling)
        fb_admitted, fb_bound = self.assert_fallback_within_shares(run)

        heartbeats = len(daemons) * t_answered * 1000 / HEARTBEAT_INTERVAL_MS
        sys.stderr.write(
            "\naccuracy: T %.2f s (first to last sent), expected limit x T + burst = %.0f\n"
            "  admitted in mode normal per node %s = %d (ratio %.3f); allowed in any mode %s = %d\n"
            "  demand per node %s/s; leased_units at the end %s\n"
            "  redis EVALSHA+EVAL calls %d before, %d after: %d for %d decisions = %.4f per decision "
            "(of which heartbeats ~%.0f; without them %.4f)\n"
            % (t_sent, expected, normal, admitted, admitted / expected, allowed, sum(allowed),
               [int(r) for r in rates], leased, calls_before, calls_after, calls, len(every),
               calls / len(every),
               heartbeats, max(0, calls - heartbeats) / len(every)))
        self.print_leases()
        sys.stderr.write("  fallback admissions %d of %.0f allowed by the shares\n"
                         % (fb_admitted, fb_bound))
        self.print_changes(run)
        summary("accuracy", nodes=3, admitted=admitted, bound=expected,
                ratio=admitted / expected, all_ratio=all_ratio(run),
                stall_ms=max(longest_stall_ms(n) for n in run.records))
        leases = [d.client.result("stats").get("leases") for d in daemons]

        self.assert_leasing([
            ("admitted in mode normal %d <= limit x T + burst + leased %.0f"
             % (admitted, expected + sum(leased)), admitted <= expected + sum(leased)),
            ("admitted in mode normal %d >= %.2f x (limit x T + burst) = %.0f"
             % (admitted, ACCURACY_FLOOR, ACCURACY_FLOOR * expected),
             admitted >= ACCURACY_FLOOR * expected),
            ("stats has a leases map with %s" % ", ".join(LEASE_STATS),
             all(isinstance(l, dict) and set(LEASE_STATS) <= set(l) for l in leases)),
        ])


class FleetFaultTest(FleetCase):
    """2-3 daemons under steady load at 2x the limit while Redis fails."""

    def fault_run(self, name, nodes, redis, port, duration, events, fault, recovery,
                  learning=False, resumes=False):
        """Drives the fleet through events and checks what every fault must
        keep true. `fault` and `recovery` name the events (None: before the
        run starts, or never). With `resumes`, the fleet must go on admitting
        within RESUME_GAP_MS of the recovery. Prints the summary; returns the
        run and the leasing checks, for the caller to add its own and assert
        them."""
        daemons = self.start_daemons(nodes, port)
        if redis is not None and redis.proc is not None:
            self.wait_fleet_up(daemons)
        rates = [2 * LIMIT_PER_S / nodes] * nodes
        run = self.drive(daemons, rates, duration, events)
        t_fault = run.events[fault] if fault else run.start
        t_recovery = run.events[recovery] if recovery else math.inf
        in_fault = lambda r: r.mode == "fallback"
        normal = lambda r: r.mode == "normal"

        self.assert_answered_without_stalls(run)
        self.assert_modes(run, {"normal", "fallback"})
        # Decisions switch to the on_redis_down mode within the bound of the fault.
        to_fallback = slowest([settled_after(n, t_fault, t_recovery, in_fault)
                               for n in run.records])
        self.assertIsNotNone(to_fallback, "decisions did not settle in mode fallback\n"
                             + self.logs())
        self.assertLessEqual(ms(to_fallback), SWITCH_BOUND_MS)
        # Health says Redis is down within the same bound, and up after recovery.
        down = first_health(run, t_fault, lambda h: h["redis"] == "down")
        self.assertIsNotNone(down, "health never said redis down\n" + self.logs())
        self.assertLessEqual(ms(down), SWITCH_BOUND_MS)
        up = None
        if recovery:
            up = first_health(run, t_recovery, lambda h: h["redis"] == "up")
            self.assertIsNotNone(up, "health never said redis up again\n" + self.logs())
            self.assertLessEqual(ms(up), RECOVER_BOUND_MS)
        else:
            self.assertTrue(all(h["redis"] == "down" for node in run.health for _, h in node))
        fb_admitted, fb_bound = self.assert_fallback_within_shares(run, since=t_fault)
        fault_end = min(t_recovery, run.end)
        during = sum(r.allowed for r in run.all() if t_fault <= r.sent < fault_end)
        back_to_normal = None
        if recovery:
            back_to_normal = slowest([settled_after(n, t_recovery, math.inf, normal)
                                      for n in run.records])
        before = [r for r in run.all() if r.sent < t_fault]
        normal_before = sum(normal(r) for r in before)

        sys.stderr.write(
            "\n%s: fault at %.2f s, recovery at %s; allowed while faulty (any mode) %d over "
            "%.2f s; fallback admissions %d of %.0f allowed by the shares; before the fault %d "
            "of %d decisions were normal\n"
            % (name, t_fault - run.start,
               fmt(None if not recovery else t_recovery - run.start, "%.2f s"),
               during, fault_end - t_fault, fb_admitted, fb_bound, normal_before, len(before)))
        self.print_leases()
        self.print_changes(run)
        summary(name, nodes=nodes, admitted=fb_admitted, bound=fb_bound,
                ratio=fb_admitted / fb_bound if fb_bound else None, all_ratio=all_ratio(run),
                stall_ms=max(longest_stall_ms(n) for n in run.records),
                down_ms=ms(down), fallback_ms=ms(to_fallback), up_ms=ms(up),
                normal_ms=ms(back_to_normal))

        checks = []
        if fault:
            # The first decisions on the cold key may come before its first
            # lease; from a second in, every decision is on leased quota. A
            # request in flight when the fault strikes may already be
            # answered by the fallback: the last 100 ms before it are left out.
            leasing_from = slowest([settled_after(n, run.start, t_fault - 0.1, normal)
                                    for n in run.records])
            checks.append(("decisions normal from at most 1000 ms after the start until the "
                           "fault (%d of %d normal; settled after %s ms)"
                           % (normal_before, len(before), fmt(ms(leasing_from))),
                           leasing_from is not None and leasing_from <= 1.0))
        if recovery:
            checks.append(("decisions back to normal within %d ms of recovery (took %s ms)"
                           % (RECOVER_BOUND_MS, fmt(ms(back_to_normal))),
                           back_to_normal is not None and ms(back_to_normal) <= RECOVER_BOUND_MS))
        if resumes:
            admitted = sorted(r.sent for r in run.all() if r.allowed and r.sent >= t_recovery)
            gap = max((b - a for a, b in zip([t_recovery] + admitted, admitted)), default=math.inf)
            checks.append(("admissions go on after the recovery: longest gap %s ms"
                           % fmt(gap * 1000), gap * 1000 <= RESUME_GAP_MS))
        if learning:
            learned = [any(h.get("learning") is True for t, h in node
                           if t >= t_recovery and h["redis"] == "up") for node in run.health]
            checks.append(("health says learning = true after reconnecting to an empty Redis "
                           "(per node %s)" % learned, all(learned)))
            named = [any("shared" in (h.get("learning_rules") or {}) for t, h in node
                         if t >= t_recovery and h["redis"] == "up") for node in run.health]
            checks.append(("health's learning_rules names the rule while it learns "
                           "(per node %s)" % named, all(named)))
        checks.append(("health has breaker, learning and leased_units",
                       all({"breaker", "learning", "leased_units"} <= set(h)
                           for node in run.health for _, h in node)))
        fault_samples = [[h.get("breaker") for t, h in node if t_fault <= t < t_recovery]
                         for node in run.health]
        checks.append(("every breaker opened during the fault",
                       all("open" in node for node in fault_samples)))
        if recovery:
            last = [node[-1][1].get("breaker") if node else None for node in run.health]
            checks.append(("every breaker closed again by the end (last: %s)" % last,
                           all(b == "closed" for b in last)))
        return run, checks

    # Verifies a Redis SIGKILLed under load: no stall, fallback within the
    # switch bound and within the shares, and after a restart on the same port
    # without data, the nodes relearn (health: learning) and lease again.
    def test_redis_killed_and_restarted_empty(self):
        redis = self.start_redis()
        _, checks = self.fault_run(
            "a_sigkill", 3, redis, redis.port, duration=8.0,
            events=[(2.0, "kill", redis.kill), (3.5, "restart", redis.restart)],
            fault="kill", recovery="restart", learning=True)
        self.assert_leasing(checks)

    # Verifies a Redis frozen by SIGSTOP for 3 s (connections stay open, nothing
    # answers): no stall, fallback, and normal again after SIGCONT, admitting
    # at once (no debt for the fault, no stale lease taking the bucket).
    def test_redis_stopped_for_three_seconds(self):
        redis = self.start_redis()
        _, checks = self.fault_run(
            "b_sigstop", 2, redis, redis.port, duration=8.5,
            events=[(2.0, "stop", lambda: redis.signal(signal.SIGSTOP)),
                    (5.0, "cont", lambda: redis.signal(signal.SIGCONT))],
            fault="stop", recovery="cont", resumes=True)
        self.assert_leasing(checks)

    # Verifies CLIENT PAUSE 2000 (every command held for 2 s) is a fault like
    # any other: no stall, fallback, normal again once the pause ends, and
    # the fleet goes on admitting at once (the debit leaves no debt).
    def test_redis_client_pause(self):
        redis = self.start_redis()

        def pause():
            self.assertEqual(redis.command("CLIENT", "PAUSE", "2000"), "OK")

        _, checks = self.fault_run(
            "c_pause", 2, redis, redis.port, duration=7.5,
            events=[(2.0, "pause", pause), (4.0, "unpaused", lambda: None)],
            fault="pause", recovery="unpaused", resumes=True)
        self.assert_leasing(checks)

    # Verifies daemons started before their Redis run in fallback, then move to
    # normal once Redis appears on the configured port.
    def test_redis_absent_at_start_then_started(self):
        redis = self.start_redis(start=False)
        _, checks = self.fault_run(
            "d_late_redis", 3, redis, redis.port, duration=6.0,
            events=[(2.0, "start", redis.start)], fault=None, recovery="start")
        self.assert_leasing(checks)

    # Verifies a Redis that refuses connections the whole time (port 1) means
    # fallback throughout at the configured share, and never a stall.
    def test_connection_refused_throughout(self):
        run, checks = self.fault_run("e_refused", 2, None, 1, duration=4.0, events=[],
                                     fault=None, recovery=None)
        self.assertEqual({r.mode for r in run.all()}, {"fallback"})
        self.assertTrue(all(r.limit == LIMIT_PER_S // 2 for r in run.all()))
        self.assert_leasing(checks)


class ReconnectTest(FleetCase):
    """[redis] reconnect_max, seen from a Redis that drops every connection."""

    def attempts(self, where, seconds):
        """Starts a daemon on a listener that accepts and closes every
        connection, for `seconds`; the times of the attempts it saw."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.addCleanup(listener.close)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        port = listener.getsockname()[1]
        self.start_daemons(1, port, where=where.format(port=port))
        times, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            ready, _, _ = select.select([listener], [], [], end - time.monotonic())
            if ready:
                conn, _ = listener.accept()
                times.append(time.monotonic())
                conn.close()
        return times

    # Verifies that a daemon tries to reconnect at least every reconnect_max
    # (and its 20 % jitter) once its backoff has grown to it, and no more
    # often than the backoff's steps allow: with reconnect_max 100 ms, two
    # links (the lease link and the renew watch) never leave 200 ms without an
    # attempt, where the default (1 s) leaves most of a second.
    def test_reconnect_max_caps_the_wait_between_attempts(self):
        seconds = 3.0
        times = self.attempts('url = "redis://127.0.0.1:{port}"\nreconnect_max = "100ms"', seconds)
        self.assertTrue(times, "the daemon never tried to connect")
        settled = [t for t in times if t - times[0] > 1.0]  # the backoff has reached its cap
        self.assertGreater(len(settled), 2, times)
        gaps = [b - a for a, b in zip(settled, settled[1:])]
        sys.stderr.write("\n  %d attempts; after the first second %d, longest gap %.0f ms\n"
                         % (len(times), len(settled), max(gaps) * 1000))
        self.assertLessEqual(max(gaps), 0.2, gaps)
        # Two links, each at most every 80 ms (100 ms less its jitter).
        self.assertLessEqual(len(settled), 2 * (seconds - 1.0) / 0.08 + 2, settled)
        self.assertGreaterEqual(len(settled), 2 * (seconds - 1.0) / 0.12 - 2, settled)


def tearDownModule():
    if SUMMARY:
        sys.stderr.write("\nfleet summary (limit %d/s, burst %d; see SUMMARY_COLUMNS)\n%s\n"
                         % (LIMIT_PER_S, BURST, format_table(SUMMARY)))
    tear_down_module()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--load":
        load_main(json.loads(sys.argv[2]))
    else:
        unittest.main(verbosity=2)
