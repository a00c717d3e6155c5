#!/usr/bin/python3
"""bench/slow_keys.py OLD_BUILD NEW_BUILD: what keys of a slow global rule
cost Redis, from two builds of sluiced side by side.

A slow rule (10/s, burst 10: a per-user limit) refills one unit per lease
interval, and its burst holds fewer than four batches of a key's demand, so
its keys lease a few units at a time. For each row, one redis-server and
NODES sluiced (one worker each) of a build: KEYS keys of the rule, each
offered RATE/s evenly spaced and staggered, open loop, each key's requests
dealt to the daemons in turn (one connection each), as a load balancer
spreads a user's requests over a fleet; counted over SECONDS after a
warm-up. Each row runs ROUNDS times per build, old and new
in turn (old, new, new, old, ...), and the table shows the medians:
  - Redis calls per decision: every EVALSHA Redis served over the counted
    span, less the idle daemon's heartbeats (measured for 2 s before the
    load), over the decisions answered in it;
  - denied: the share of those decisions denied.
and new/old for the calls. A key at 30/s (3x its limit) holds a rate lease:
it shows the hot path unchanged.

Knobs (environment): BENCH_KEYS (200), BENCH_NODES (1), BENCH_SECONDS (6),
BENCH_WARMUP (2), BENCH_ROUNDS (2), BENCH_RATES ("2,5,10,30": per key and
second), BENCH_ALGORITHM (token_bucket; a window's rule has no burst).
Run with /usr/bin/python3 (python3-msgpack).
"""

import os
import re
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import harness  # noqa: E402  (the tests' redis-server and daemon fixtures)
import msgpack  # noqa: E402

LIMIT, BURST = 10, 10
RULE = "slow"
IDLE_S = 2.0      # heartbeats are counted this long before the load
DRAIN_S = 3.0     # after the load, answers are awaited this long
POLL_S = 0.0005   # the generator's sleep when nothing is due or readable

CONFIG = """# Written by bench/slow_keys.py.
[daemon]
socket = "{socket}"
workers = 1
log_level = "warn"

[redis]
url = "redis://127.0.0.1:{port}"
expected_nodes = {nodes}
node_id = "slow-{index}"

[[rule]]
name = "{rule}"
algorithm = "{algorithm}"
limit = {limit}
period = "1s"
{burst}scope = "global"
on_redis_down = "local"
"""


def evalsha_calls(redis):
    info = redis.command("INFO", "commandstats") or ""
    found = re.search(r"cmdstat_evalsha:calls=(\d+)", info)
    return int(found.group(1)) if found else 0


def drive(paths, keys, rate, warmup_s, seconds, count):
    """Offers every key `rate`/s, open loop, for warmup_s + seconds; returns
    (decisions, denied) answered for requests sent after the warm-up, the
    monotonic times the counted span began and ended, and what count()
    returned at each."""
    socks = []
    for path in paths:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(path)
        sock.setblocking(False)
        socks.append(sock)
    unpackers = [msgpack.Unpacker(raw=False) for _ in socks]
    outs = [b""] * len(socks)
    tails = [msgpack.packb("acquire") + msgpack.packb([RULE, "k%06d" % i, 1]) for i in range(keys)]
    total = keys * rate
    start = time.monotonic()
    last, credit, sent, msgid = start, 0.0, 0, 0
    pending, counted_from = set(), None
    decisions = denied = 0
    span = [None, None]
    counts = [None, None]
    while True:
        now = time.monotonic()
        t = now - start
        if span[0] is None and t >= warmup_s:
            span[0], counted_from, counts[0] = now, msgid + 1, count()
        if t < warmup_s + seconds:
            credit += total * (now - last)
            last = now
            due = int(credit)
            credit -= due
            for _ in range(due):
                msgid += 1
                # [0, msgid, "acquire", [rule, key, 1]]: a fixarray of 4.
                node = (sent // keys) % len(socks)
                outs[node] += b"\x94\x00" + msgpack.packb(msgid) + tails[sent % keys]
                pending.add(msgid)
                sent += 1
        else:
            if span[1] is None:
                span[1], counts[1] = now, count()
            if not pending or t >= warmup_s + seconds + DRAIN_S:
                break
        read = False
        for i, sock in enumerate(socks):
            if outs[i]:
                try:
                    outs[i] = outs[i][sock.send(outs[i]):]
                except BlockingIOError:
                    pass
            try:
                unpackers[i].feed(sock.recv(1 << 20))
            except BlockingIOError:
                continue
            read = True
            for _, answered, error, result in unpackers[i]:
                pending.discard(answered)
                if counted_from is not None and answered >= counted_from:
                    decisions += 1
                    if error is not None or not result["allowed"]:
                        denied += 1
        if not read:
            time.sleep(POLL_S)
    for sock in socks:
        sock.close()
    return decisions, denied, span, counts


def measure(build, algorithm, nodes, keys, rate, warmup_s, seconds):
    harness.SLUICED = os.path.join(build, "daemon", "sluiced")
    redis = harness.Redis()
    daemons = [harness.Daemon(dir_prefix="slk.") for _ in range(nodes)]
    try:
        for index, daemon in enumerate(daemons):
            burst = "" if algorithm.endswith("window") else "burst = %d\n" % BURST
            daemon.start(CONFIG.format(socket=daemon.socket, port=redis.port, rule=RULE,
                                       algorithm=algorithm, limit=LIMIT, burst=burst,
                                       nodes=nodes, index=index))
        before = evalsha_calls(redis)
        time.sleep(IDLE_S)
        heartbeats_per_s = (evalsha_calls(redis) - before) / IDLE_S
        decisions, denied, (begin, end), (first, last) = drive(
            [d.socket for d in daemons], keys, rate, warmup_s, seconds,
            lambda: evalsha_calls(redis))
        return decisions, denied, last - first, heartbeats_per_s, begin, end
    finally:
        for daemon in daemons:
            daemon.stop()
        harness.end_process(redis.proc)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: bench/slow_keys.py OLD_BUILD NEW_BUILD")
    builds = {"old": sys.argv[1], "new": sys.argv[2]}
    keys = int(os.environ.get("BENCH_KEYS", "200"))
    nodes = int(os.environ.get("BENCH_NODES", "1"))
    algorithm = os.environ.get("BENCH_ALGORITHM", "token_bucket")
    seconds = float(os.environ.get("BENCH_SECONDS", "6"))
    warmup_s = float(os.environ.get("BENCH_WARMUP", "2"))
    rounds = int(os.environ.get("BENCH_ROUNDS", "2"))
    rates = [float(r) for r in os.environ.get("BENCH_RATES", "2,5,10,30").split(",")]
    print("%d keys of a global %s of %d/s%s, %d daemon(s), %g s counted "
          "after %g s, %d rounds per build; load average before: %s" % (
              keys, algorithm, LIMIT,
              "" if algorithm.endswith("window") else " (burst %d)" % BURST,
              nodes, seconds, warmup_s, rounds,
              " ".join(open("/proc/loadavg").read().split()[:3])))
    print()
    print("| per key | old: calls per decision | new: calls per decision | new/old "
          "| old: denied | new: denied |")
    print("|---|---|---|---|---|---|")
    for rate in rates:
        figures = {"old": [], "new": []}
        order = ["old", "new"]
        for _ in range(rounds):
            for name in order:
                figures[name].append(
                    run_row(builds[name], algorithm, nodes, keys, rate, warmup_s, seconds))
            order.reverse()
        calls = {n: statistics.median(c for c, _ in figures[n]) for n in figures}
        denied = {n: statistics.median(d for _, d in figures[n]) for n in figures}
        ratio = calls["new"] / calls["old"] if calls["old"] > 0 else float("nan")
        print("| %g/s | %.4f | %.4f | %.3f | %.3f | %.3f |" % (
            rate, calls["old"], calls["new"], ratio, denied["old"], denied["new"]))
        sys.stdout.flush()


def run_row(build, algorithm, nodes, keys, rate, warmup_s, seconds):
    """(Redis calls per decision net of heartbeats, denied share) of one run."""
    decisions, denied, calls, heartbeats_per_s, begin, end = measure(
        build, algorithm, nodes, keys, rate, warmup_s, seconds)
    net = calls - heartbeats_per_s * (end - begin)
    return max(net, 0.0) / max(decisions, 1), denied / max(decisions, 1)


if __name__ == "__main__":
    main()
