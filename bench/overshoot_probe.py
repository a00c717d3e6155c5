#!/usr/bin/python3
"""bench/overshoot_probe.py: the overshoot bound one sluiced exports while it
holds the whole rate of a hot key with Redis up (bench/results/fleet-shapes.md,
"Branch rate21k: the overshoot bound less the holders' burst shares").

One redis-server and one sluiced per case (tests/integration/harness.py starts
them on free ports), a global rule of 2,000/s with burst 40 or 400 on
token_bucket and gcra, driven for 2 s from one client (each acquire waits for
its answer); `stats` overshoot_bound is read after every 20 acquires. Prints
the last value read and the largest (which includes the start, before the key
holds a rate). Run: SLUICED=BUILD/daemon/sluiced /usr/bin/python3
bench/overshoot_probe.py
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))
from harness import Daemon, Redis, redis_section, tear_down_module  # noqa: E402

CONFIG = """
[daemon]
socket = "{socket}"
workers = 1
{redis}
lease_interval = "100ms"

[[rule]]
name = "hot"
algorithm = "{algorithm}"
limit = 2000
period = "1s"
burst = {burst}
scope = "global"
on_redis_down = "local"
"""


def main():
    redis = Redis()
    try:
        for algorithm in ("token_bucket", "gcra"):
            for burst in (40, 400):
                daemon = Daemon("probe")
                daemon.start(CONFIG.format(socket=daemon.socket, redis=redis_section(redis.port),
                                           algorithm=algorithm, burst=burst), connect=True)
                key = "hot-%s-%d" % (algorithm, burst)
                seen = []
                end = time.monotonic() + 2.0
                while time.monotonic() < end:
                    for _ in range(20):
                        daemon.acquire("hot", key)
                    seen.append(daemon.client.result("stats")["overshoot_bound"]["hot"])
                print("%s, burst %d: overshoot bound %s at the end, %s at the most"
                      % (algorithm, burst, seen[-1], max(seen)))
                daemon.stop()
    finally:
        redis.stop()
        tear_down_module()


if __name__ == "__main__":
    main()
