#!/usr/bin/python3
"""bench/budget.py BUILD_DIR: the reserve/settle simulation of issue 22, seeded.

Three sluiced (BUILD_DIR/daemon/sluiced) share one global budget through one
redis-server: a `fixed_window` rule of BUDGET units an hour. STREAMS
concurrent streams per daemon (threads, each on its own connection) spend it
like LLM calls: a cost drawn from a lognormal (seeded per run and stream) is
known only after the "call", so each stream reserves an estimate, then
settles the cost. Two estimates are measured, each on a fresh key:

  cap  the request's hard cap (a cost never exceeds it: max_tokens);
  p95  the cost's 95th percentile (a cost may exceed it: debt).

A stream stops after MAX_DENIALS denials in a row (each followed by the
answer's retry_after_ms, at most 50 ms). Per run and estimate it reports the
settled spend over the budget (overshoot, utilisation), the Redis script
calls per reserve + settle pair, and whether any reserve was answered off
the lease path (mode other than normal: Redis too slow or down, when each
node spends its on_redis_down share alone and that policy's bound applies);
the runs that stayed on leases are summed apart as well. `--runs N` repeats with seeds SEED..SEED+N-1
on the same fleet (a fresh key each run).

Run with /usr/bin/python3 (python3-msgpack). `--quick` is the short version
that `make test` runs (budget_sim_python): one run, few streams, and it exits
non-zero when the hard-cap estimate overspent or the fleet answered errors.
"""

import argparse
import math
import os
import random
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import harness  # noqa: E402  (the tests' daemon and redis-server fixtures)

MU = 6.0      # lognormal cost: median e^6 ~ 403 units, mean ~ 484
SIGMA = 0.6
P95 = int(math.exp(MU + 1.6449 * SIGMA))  # ~1076
CAP = int(math.exp(MU + 3.0 * SIGMA))     # ~2440: costs are drawn below it
MAX_DENIALS = 5

CONFIG = """
[daemon]
socket = "{socket}"
workers = 2
log_level = "warn"

[[rule]]
name = "budget"
algorithm = "fixed_window"
limit = {budget}
period = "1h"
scope = "global"
on_redis_down = "local"
"""


def draw(rng):
    """One call's cost: lognormal, below the hard cap."""
    while True:
        cost = int(rng.lognormvariate(MU, SIGMA))
        if 1 <= cost < CAP:
            return cost


class Totals:
    def __init__(self):
        self.lock = threading.Lock()
        self.spent = 0
        self.pairs = 0
        self.off_lease = 0  # reserves allowed in another mode than normal
        self.errors = []


def stream(daemon, key, estimate_kind, seed, totals):
    rng = random.Random(seed)
    client = harness.Client(daemon.socket)
    spent = pairs = denials = off_lease = 0
    try:
        while denials < MAX_DENIALS:
            cost = draw(rng)
            estimate = CAP if estimate_kind == "cap" else P95
            error, reserved = client.call("reserve", "budget", key, estimate, 30000)
            if error is not None:
                totals.errors.append(error)
                return
            if not reserved["allowed"]:
                denials += 1
                time.sleep(min(reserved["retry_after_ms"], 50) / 1000)
                continue
            denials = 0
            off_lease += reserved["mode"] != "normal"
            error, _ = client.call("settle", reserved["id"], cost)
            if error is not None:
                totals.errors.append(error)
                return
            spent += cost
            pairs += 1
    finally:
        client.close()
        with totals.lock:
            totals.spent += spent
            totals.pairs += pairs
            totals.off_lease += off_lease


def run_once(daemons, redis, budget, streams, estimate_kind, seed):
    key = "tenant-%s-%d" % (estimate_kind, seed)
    totals = Totals()
    calls_before = redis.script_calls()
    threads = []
    for d, daemon in enumerate(daemons):
        for s in range(streams):
            t = threading.Thread(target=stream,
                                 args=(daemon, key, estimate_kind, seed * 100003 + d * 1009 + s,
                                       totals))
            t.start()
            threads.append(t)
    for t in threads:
        t.join()
    calls = redis.script_calls() - calls_before
    return {
        "estimate": estimate_kind,
        "seed": seed,
        "spent": totals.spent,
        "overshoot": max(totals.spent - budget, 0) / budget,
        "utilisation": totals.spent / budget,
        "pairs": totals.pairs,
        "calls_per_pair": calls / max(totals.pairs, 1),
        "off_lease": totals.off_lease,
        "errors": totals.errors,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_dir")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--streams", type=int, default=64, help="per daemon")
    parser.add_argument("--budget", type=int, default=2_000_000)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.streams, args.budget = 1, 4, 200_000
    os.environ.setdefault("SLUICED", os.path.join(args.build_dir, "daemon", "sluiced"))
    harness.SLUICED = os.environ["SLUICED"]

    redis = harness.Redis()
    daemons = []
    try:
        for i in range(3):
            daemon = harness.Daemon("budget-%d" % i)
            daemon.start(CONFIG.format(socket=daemon.socket, budget=args.budget) +
                         harness.redis_section(redis.port).replace("expected_nodes = 1",
                                                                   "expected_nodes = 3"))
            daemons.append(daemon)
        for daemon in daemons:
            harness.wait_for(lambda: daemon.ask("health")["redis"] == "up", 10)
        results = []
        for run in range(args.runs):
            for kind in ("cap", "p95"):
                results.append(run_once(daemons, redis, args.budget, args.streams, kind,
                                        args.seed + run))
    finally:
        for daemon in daemons:
            daemon.stop()
        redis.stop()
        harness.tear_down_module()

    print("budget %d units, 3 daemons x %d streams, lognormal(mu=%.1f, sigma=%.1f) costs "
          "(p95 %d, cap %d), %d run(s)" % (args.budget, args.streams, MU, SIGMA, P95, CAP,
                                          args.runs))
    print("| estimate | runs | max overshoot | mean utilisation | min utilisation | "
          "Redis calls per reserve+settle | runs with reserves off the lease path | errors |")
    print("|---|---|---|---|---|---|---|---|")
    failed = False
    for kind in ("cap", "p95"):
        rows = [r for r in results if r["estimate"] == kind]
        errors = sum(len(r["errors"]) for r in rows)
        print("| %s | %d | %.3f %% | %.2f %% | %.2f %% | %.4f | %d | %d |" % (
            kind, len(rows), 100 * max(r["overshoot"] for r in rows),
            100 * sum(r["utilisation"] for r in rows) / len(rows),
            100 * min(r["utilisation"] for r in rows),
            max(r["calls_per_pair"] for r in rows),
            sum(1 for r in rows if r["off_lease"] > 0), errors))
        clean = [r for r in rows if r["off_lease"] == 0]
        if clean and len(clean) < len(rows):
            print("|   %s, runs all on leases | %d | %.3f %% | %.2f %% | %.2f %% | %.4f | 0 | |" % (
                kind, len(clean), 100 * max(r["overshoot"] for r in clean),
                100 * sum(r["utilisation"] for r in clean) / len(clean),
                100 * min(r["utilisation"] for r in clean),
                max(r["calls_per_pair"] for r in clean)))
        if errors:
            print("  first error: %s" % next(e for r in rows for e in r["errors"]))
            failed = True
        # Off the lease path (Redis slow or down) each node spends its share
        # alone: the on_redis_down bound, not the reservations', applies.
        if kind == "cap" and any(r["overshoot"] > 0 and r["off_lease"] == 0 for r in rows):
            failed = True
    return 1 if args.quick and failed else 0


if __name__ == "__main__":
    sys.exit(main())
