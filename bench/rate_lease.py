#!/usr/bin/python3
"""bench/rate_lease.py BUILD_DIR [LABEL]: one sluiced alone on a hot global key
at 3x its limit, measured from outside with bench/fleet.py's machinery (its
redis-server, daemon, open-loop generator and analysis): Redis script calls
(EVALSHA, heartbeats included) per decision, and admissions per window of
one period over limit x period + burst. Rows for burst 30 and burst 1,000 of
a 1,000/s token bucket, and of a 1,000/s gcra rule; heartbeats every second (the default), so that they
are 0.0003 calls per decision of the 3,000/s offered.

Prints one markdown table row per algorithm and burst (for bench/results/rate_leases.md);
LABEL names the build in them. Run with /usr/bin/python3 (python3-msgpack).
BENCH_SECONDS (10) sets the length of each run.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fleet  # noqa: E402


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: bench/rate_lease.py BUILD_DIR [LABEL]")
    sluiced = os.path.join(sys.argv[1], "daemon", "sluiced")
    label = sys.argv[2] if len(sys.argv) == 3 else sys.argv[1]
    seconds = float(os.environ.get("BENCH_SECONDS", "10"))
    fleet.LIMIT_PER_S = 1000
    fleet.HEARTBEAT_INTERVAL_MS = 1000
    fleet.MODES["rate"] = ((1,), ("one-node",), seconds, seconds)
    print("| build | algorithm | burst | decisions | Redis calls per decision | "
          "admitted / (limit x 1 s + burst): min / mean / max |")
    print("|---|---|---|---|---|---|")
    for algorithm in ("token_bucket", "gcra"):
        fleet.ALGORITHM = algorithm
        for burst in (30, 1000):
            fleet.BURST = burst
            fleet.GENERATOR_PAUSE_LIMIT_S = burst / fleet.LIMIT_PER_S
            run = fleet.Run(sluiced, 1, "one-node", "rate")
            row, _ = fleet.analyse(run)
            print("| %s | %s | %d | %d | %.5f | %s |" % (
                label, algorithm, burst, row["decisions"], row["redis_calls_per_decision"],
                " / ".join("%.3f" % row.get(k, float("nan"))
                           for k in ("ratio_min", "ratio_mean", "ratio_max"))))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
