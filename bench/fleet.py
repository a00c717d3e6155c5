#!/usr/bin/python3
"""bench/fleet.py BUILD_DIR: the fleet benchmark behind `make bench`: N sluiced
sharing one global limit through one redis-server, under several load shapes
and Redis faults, measured from outside.

For each fleet size and shape it starts a redis-server of its own (a free
loopback port, a temporary directory, no persistence) and N daemons
(BUILD_DIR/daemon/sluiced, one worker thread each, one socket each), then one
load-generator process (this file with --load) drives every daemon at once
over non-blocking sockets in MessagePack-RPC, open loop: requests go out at
the shape's rate whatever the answers do, and each request's send time,
answer time, `allowed` and `mode` are recorded, as is every daemon's `health`
every HEALTH_POLL_S on a second connection. The total demand is always at
least DEMAND_FACTOR times the limit. The shapes (plan()):
  steady         every node the same rate;
  bursty         every node alternates a high and a low rate, in step;
  one-node       all the load on node 0, the others idle (but counted in N);
  skewed         80 % of the load on node 0, 20 % spread over the others;
  join-leave     a node is started mid-run and takes load, and later node 0
                 stops gracefully (SIGTERM) after its load ends;
  redis-sigkill  Redis is SIGKILLed, then restarted empty on the same port;
  redis-sigstop  Redis is SIGSTOPped for REDIS_STOP_S, then SIGCONTed;
  sliding-log    as steady, on a sliding_log rule (the limit in any window of
                 one period, no burst: lua/sliding_log.lua's log in Redis),
                 1,000 per SLIDING_LOG_PERIOD_S, the same rate in the most
                 units a sliding log holds; its windows are of that period;
and issue 21's, each with gated columns of its own (report21()):
  contended      as steady, with a burst of 1 % of limit x period;
  contended-gcra the same on a gcra rule (rate leases hold its TAT);
  shifting-skew  90 % of the load on one node, 10 % spread over the others;
                 the hot node changes every SHIFT_EVERY_S;
  outage-skew    90/10 on node 0, and Redis SIGKILLed for OUTAGE_S (then
                 restarted empty) during it.

From the records:
  accuracy   admissions (allowed answers, by answer time) in every window of
             one rule period, sliding by WINDOW_STEP_S, over limit x period +
             burst: min, mean, max. Windows that overlap a fault window are
             left out (and judged by the bound below); those after it count.
             So are windows in which the generator itself was not scheduled
             for longer than GENERATOR_PAUSE_LIMIT_S: it sent nothing then.
  fault      the fault window runs from the fault until every node has
             answered in mode `normal` again. Its admissions are held to two
             bounds: one computed from outside, the sum of the nodes' fallback
             shares over the window (limit // N per second and burst // N,
             with N the live count the daemons reported before the fault) plus
             the leased units they held when the fault struck (health's
             `leased_units`), which they may still spend in mode `normal`;
             and the daemons' own: what went beyond limit x T + burst + those
             leased units is at most the overshoot bound they export
             (`stats`), summed over the nodes, once per period of the window.
  stall      the longest wait from a request's send to its answer, next to
             the generator's own longest pause between two loop turns (a
             generator that was not scheduled inflates every wait by that).
  switching  ms from the fault until every node has answered in mode
             `fallback` (and its health said `redis: down`), and from the
             recovery until every node has answered in mode `normal` again
             (and said `up`).
  cost       Redis EVALSHA calls per decision, and the daemons' CPU.
The time series (admissions per BIN_S by mode, the windows, the events) go
to a JSON file for bench/plots.py.

BENCH_MODE=quick (a smoke run: one fleet size, six shapes, short runs) or
full (the default); BENCH_SHAPES=a,b runs only those shapes of the mode. Writes bench/results/fleet.md and fleet.json (the time
series bench/plots.py draws), or fleet-quick.* in quick mode, and prints the
table. Run with /usr/bin/python3 (python3-msgpack).
"""

import bisect
import gc
import json
import math
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import harness  # noqa: E402  (the tests' redis-server fixture)

REDIS_SERVER = harness.REDIS_SERVER

# The one global rule: a token bucket (a gcra rule in contended-gcra). Its burst is small next to limit x
# period because a saturated bucket admits limit x period in a window, not
# limit x period + burst: the best ratio a window can show at steady demand is
# LIMIT_PER_S / (LIMIT_PER_S + BURST) = 0.98, inside the target.
RULE = "fleet"
ALGORITHM = "token_bucket"
KEY = "fleet-key"
LIMIT_PER_S = 2000
BURST = 40
PERIOD_S = 1.0
DEMAND_FACTOR = 3  # total offered load / limit, at the least

# Daemon settings (the defaults, except the heartbeat, which is faster so
# that joins and leaves change N within a fraction of a second).
WORKERS = 1
LEASE_TIMEOUT_MS = 50
LEASE_INTERVAL_MS = 100
HEALTH_INTERVAL_MS = 100
HEALTH_TIMEOUT_MS = 250
HEARTBEAT_INTERVAL_MS = 200

# Targets (issue 4).
ACCURACY_LOW, ACCURACY_HIGH = 0.97, 1.01
STALL_TARGET_MS = LEASE_TIMEOUT_MS + 5

# Measurement.
WINDOW_STEP_S = 0.1       # accuracy windows start every this many seconds
BIN_S = 0.1               # time-series bins written for the plots
HEALTH_POLL_S = 0.05      # health request to every daemon this often
LOOP_TICK_S = 0.002       # longest sleep of the generator between sends
# A generator that was not scheduled for longer than the bucket takes to fill
# (burst / limit) sends nothing meanwhile, so the fleet loses admissions it
# could not hold: windows with such a pause are left out (and counted).
GENERATOR_PAUSE_LIMIT_S = BURST / LIMIT_PER_S
CONNECT_RETRY_S = 0.01    # a joining daemon's socket is tried this often
DRAIN_S = 3.0             # after the load ends, answers are awaited this long
START_DELAY_S = 0.1       # between telling the generator the start and the start
STARTUP_TIMEOUT_S = 10.0  # for a daemon to accept, Redis to answer, N to settle
STOP_TIMEOUT_S = 5.0      # for a daemon to exit after SIGTERM

# Shapes: timing of the events in seconds after the start of the load.
BURSTY_PERIOD_S = 0.5     # high half, then low half
BURSTY_HIGH, BURSTY_LOW = 1.6, 0.4  # x the steady rate: 4.8x and 1.2x the limit
SKEW_HOT_SHARE = 0.8
FAULT_AT_S = 3.0
REDIS_DOWN_S = 1.5        # SIGKILL to restart
REDIS_STOP_S = 3.0        # SIGSTOP to SIGCONT
JOIN_AT, LEAVE_AT = 0.35, 0.65  # of the run: a node joins, and node 0 leaves
LEAVE_GRACE_S = 0.1       # load on a leaving node ends this long before SIGTERM

# Issue 21's shapes and targets (per 1 s window, outside fault windows).
# Issue 21 asks for burst <= 3 % of limit x W. A saturated bucket admits limit
# x W in a window at steady demand, so the best ratio a window can show is
# limit / (limit + burst): 0.971 at 3 %, below the gate's 0.98 however exact
# the fleet; 0.990 at 1 %, which leaves the gate a 1 % margin for losses.
CONTENDED_BURST = int(0.01 * LIMIT_PER_S * PERIOD_S)
CONTENDED_LOW, CONTENDED_HIGH = 0.98, 1.005
CONTENDED_CALLS = 0.01     # Redis calls per decision, net of the idle fleet's
SHIFT_HOT_SHARE = 0.9
SHIFT_EVERY_S = 10.0
SHIFTS = 3                 # hot spots in a run: the run is SHIFTS x SHIFT_EVERY_S
SHIFT_REACH = 0.9          # of the hot node's max-min share ...
SHIFT_REACH_S = 2 * LEASE_INTERVAL_MS / 1000  # ... within two lease intervals
SHIFT_RATE_WINDOW_S = 0.05  # the hot node's admitted rate is measured over this
SHIFT_RATE_STEP_S = 0.01
OUTAGE_S = 5.0             # SIGKILL to restart
OUTAGE_LOW, OUTAGE_HIGH = 0.90, 1.00  # admitted / (limit x outage)
IDLE_MEASURE_S = 1.0       # the idle fleet's own Redis calls are counted this long
CONTENDED_SHAPES = ("contended", "contended-gcra")
NEW_SHAPES = CONTENDED_SHAPES + ("shifting-skew", "outage-skew")

MODES = {
    # (fleet sizes, shapes, seconds of load without and with a fault)
    "quick": ((3,), ("steady", "skewed", "redis-sigkill") + NEW_SHAPES, 5.0, 8.0),
    "full": ((3, 8), ("steady", "bursty", "one-node", "skewed", "join-leave", "redis-sigkill",
                      "redis-sigstop", "sliding-log") + NEW_SHAPES, 10.0, 14.0),
}


# A sliding_log rule holds at most 1,000 units (daemon/algorithm.h): the
# sliding-log shape's rule is LIMIT_PER_S over this period instead of one
# second, and its windows are judged over the rule's own period.
SLIDING_LOG_PERIOD_S = 0.5


def period_of(shape):
    return SLIDING_LOG_PERIOD_S if shape == "sliding-log" else PERIOD_S


def burst_of(shape):
    if shape == "sliding-log":
        return 0  # a sliding log has none: the limit in any window of one period
    return CONTENDED_BURST if shape in CONTENDED_SHAPES else BURST


def algorithm_of(shape):
    return {"contended-gcra": "gcra", "sliding-log": "sliding_log"}.get(shape, ALGORITHM)

# A health sample as the generator records it: the answer's time, then these
# fields of the answer.
# The last field, overshoot_bound, is the rule's from the `stats` asked with
# each health (None: no bound).
HEALTH_FIELDS = ("time", "redis", "breaker", "nodes", "learning", "leased_units",
                 "overshoot_bound")

CONFIG = """# Written by bench/fleet.py.
[daemon]
socket = "{socket}"
workers = {workers}
log_level = "warn"

[redis]
url = "redis://127.0.0.1:{port}"
expected_nodes = {expected_nodes}
node_id = "bench-{index}"
heartbeat_interval = "{heartbeat}ms"
health_interval = "{health_interval}ms"
health_timeout = "{health_timeout}ms"
lease_timeout = "{lease_timeout}ms"
lease_interval = "{lease_interval}ms"

[[rule]]
name = "{rule}"
algorithm = "{algorithm}"
limit = {limit}
period = "{period_ms}ms"
{burst}scope = "global"
on_redis_down = "local"
"""


# --- processes ---------------------------------------------------------------------

def cpu_seconds(pid):
    """utime + stime of a live process, from /proc/PID/stat."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_cpu_seconds():
    """CPU time every process on the machine has used (all but idle and
    iowait), from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    idle, iowait = ticks[3], ticks[4]
    return (sum(ticks[:8]) - idle - iowait) / os.sysconf("SC_CLK_TCK")


class Redis(harness.Redis):
    """The tests' redis-server (a free loopback port, its own temp dir, no
    persistence, so a restart on the same port starts empty) that also
    counts EVALSHA and EVAL calls and its CPU time across restarts (INFO
    commandstats and /proc start again at each)."""

    def __init__(self):
        self.calls_before_restarts = 0
        self.cpu_before_restarts = 0.0
        super().__init__()

    def script_calls(self):
        return self.calls_before_restarts + super().script_calls()

    def cpu_seconds(self):
        return self.cpu_before_restarts + cpu_seconds(self.proc.pid)

    def kill(self):
        self.calls_before_restarts = self.script_calls()
        self.cpu_before_restarts = self.cpu_seconds()
        super().kill()


class Daemon:
    """A sluiced with its own config, socket and log in `dir`."""

    def __init__(self, sluiced, dir, index, redis_port, expected_nodes, burst, algorithm,
                 period_s):
        self.sluiced, self.index = sluiced, index
        self.socket = os.path.join(dir, "s%d.sock" % index)
        self.config = os.path.join(dir, "d%d.toml" % index)
        self.log_path = os.path.join(dir, "d%d.log" % index)
        with open(self.config, "w") as f:
            f.write(CONFIG.format(
                socket=self.socket, workers=WORKERS, port=redis_port,
                expected_nodes=expected_nodes, index=index, heartbeat=HEARTBEAT_INTERVAL_MS,
                health_interval=HEALTH_INTERVAL_MS, health_timeout=HEALTH_TIMEOUT_MS,
                lease_timeout=LEASE_TIMEOUT_MS, lease_interval=LEASE_INTERVAL_MS, rule=RULE,
                algorithm=algorithm, limit=int(round(LIMIT_PER_S * period_s)),
                period_ms=int(round(period_s * 1000)),
                burst="burst = %d\n" % burst if burst else ""))
        self.proc = None
        self.cpu_s = 0.0  # CPU seconds it used, once stopped

    def start(self):
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([self.sluiced, "--config", self.config],
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            try:
                self.call("health")
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("sluiced %d did not start:\n%s" % (self.index, self.log()))
                time.sleep(0.01)

    def call(self, method):
        """One request on a fresh connection; returns the result."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(self.socket)
            s.sendall(msgpack.packb([0, 1, method, []]))
            unpacker = msgpack.Unpacker(raw=False)
            while True:
                data = s.recv(65536)
                if not data:
                    raise ConnectionError("sluiced %d closed the connection" % self.index)
                unpacker.feed(data)
                for _, _, error, result in unpacker:
                    if error is not None:
                        raise RuntimeError("%s: %s" % (method, error))
                    return result

    def log(self):
        with open(self.log_path) as f:
            return "".join(f.readlines()[-20:])

    def stop(self):
        """SIGTERM (graceful: unused units go back to Redis, the node leaves the
        members set), SIGKILL if it does not exit in time."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.cpu_s = cpu_seconds(self.proc.pid)
        self.proc.terminate()
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --- load shapes -----------------------------------------------------------------------

def node_load(rate, start_s=0.0, end_s=None, square=None, steps=None):
    """One daemon's load: `rate` acquires/s from start_s to end_s (None: the
    end of the run), optionally a square wave [period_s, high, low] of it,
    or steps [[from_s, rate], ...] (rate is then their largest)."""
    if steps:
        rate = max(r for _, r in steps)
    return dict(rate=rate, start_s=start_s, end_s=end_s, square=square, steps=steps)


def max_min_shares(demands, capacity):
    """Max-min fair shares of `capacity` for `demands`: a node that wants less
    than an equal share of what is left gets what it wants; the rest is split
    among the others."""
    shares = [0.0] * len(demands)
    left, open_ = float(capacity), sorted(range(len(demands)), key=lambda i: demands[i])
    while open_:
        equal = left / len(open_)
        i = open_[0]
        if demands[i] <= equal:
            shares[i] = demands[i]
            left -= demands[i]
            open_.pop(0)
        else:
            for j in open_:
                shares[j] = equal
            break
    return shares


def skew_rates(nodes, hot, total):
    """SHIFT_HOT_SHARE of `total` on node `hot`, the rest spread over the others."""
    cold = total * (1 - SHIFT_HOT_SHARE) / (nodes - 1)
    return [total * SHIFT_HOT_SHARE if i == hot else cold for i in range(nodes)]


def plan(shape, nodes, seconds, fault_seconds):
    """A shape on a fleet of `nodes`: (seconds of load, one node_load per
    daemon, the initial daemon count, events [(offset_s, action)], the
    (fault, recovery) actions or None)."""
    total = DEMAND_FACTOR * LIMIT_PER_S
    even = [node_load(total / nodes) for _ in range(nodes)]
    if shape in ("steady", "sliding-log"):
        return seconds, even, nodes, [], None
    if shape == "bursty":
        wave = [BURSTY_PERIOD_S, BURSTY_HIGH, BURSTY_LOW]
        loads = [node_load(total / nodes, square=wave) for _ in range(nodes)]
        return seconds, loads, nodes, [], None
    if shape == "one-node":
        loads = [node_load(total)] + [node_load(0) for _ in range(nodes - 1)]
        return seconds, loads, nodes, [], None
    if shape == "skewed":
        cold = total * (1 - SKEW_HOT_SHARE) / (nodes - 1)
        return (seconds, [node_load(total * SKEW_HOT_SHARE)] + [node_load(cold)] * (nodes - 1),
                nodes, [], None)
    if shape == "join-leave":
        join_s, leave_s = round(seconds * JOIN_AT, 1), round(seconds * LEAVE_AT, 1)
        loads = ([node_load(total / nodes, end_s=leave_s)] + even[1:]
                 + [node_load(total / nodes, start_s=join_s)])
        return (seconds, loads, nodes, [(join_s, "join"), (leave_s + LEAVE_GRACE_S, "leave")],
                None)
    if shape == "redis-sigkill":
        events = [(FAULT_AT_S, "redis-kill"), (FAULT_AT_S + REDIS_DOWN_S, "redis-restart")]
        return fault_seconds, even, nodes, events, ("redis-kill", "redis-restart")
    if shape == "redis-sigstop":
        events = [(FAULT_AT_S, "redis-stop"), (FAULT_AT_S + REDIS_STOP_S, "redis-cont")]
        return fault_seconds, even, nodes, events, ("redis-stop", "redis-cont")
    if shape in CONTENDED_SHAPES:
        return seconds, even, nodes, [], None
    if shape == "shifting-skew":
        phases = [skew_rates(nodes, k % nodes, total) for k in range(SHIFTS)]
        loads = [node_load(0, steps=[[k * SHIFT_EVERY_S, phases[k][i]] for k in range(SHIFTS)])
                 for i in range(nodes)]
        events = [(k * SHIFT_EVERY_S, "shift") for k in range(1, SHIFTS)]
        return SHIFTS * SHIFT_EVERY_S, loads, nodes, events, None
    if shape == "outage-skew":
        loads = [node_load(r) for r in skew_rates(nodes, 0, total)]
        events = [(FAULT_AT_S, "redis-kill"), (FAULT_AT_S + OUTAGE_S, "redis-restart")]
        return (max(fault_seconds, FAULT_AT_S + OUTAGE_S + 3.0), loads, nodes, events,
                ("redis-kill", "redis-restart"))
    raise ValueError("unknown shape " + shape)


# --- the load generator (a child process) -------------------------------------------------

class LoadNode:
    """The generator's side of one daemon: a load connection and a health
    connection, and what each request saw (index = msgid - 1)."""

    def __init__(self, spec, path):
        self.path = path
        self.rate, self.start_s, self.end_s = spec["rate"], spec["start_s"], spec["end_s"]
        self.square = spec["square"]
        self.steps = spec.get("steps")
        self.load = self.health = None
        self.load_in = msgpack.Unpacker(raw=False)
        self.health_in = msgpack.Unpacker(raw=False)
        self.out = b""
        self.credit = 0.0
        self.last = None
        self.sent, self.answered, self.allowed, self.mode = [], [], [], []
        self.health_samples = []  # one list per answer, laid out as HEALTH_FIELDS
        self.health_due = 0.0
        self.health_waiting = False
        self.polled = {}  # the answers of the poll under way: "health", "stats"
        self.next_try = 0.0

    def rate_at(self, t):
        if self.steps:
            return next((r for from_s, r in reversed(self.steps) if t >= from_s), 0.0)
        if self.square is None:
            return self.rate
        period, high, low = self.square
        return self.rate * (high if (t % period) < period / 2 else low)

    def connect(self, selector):
        """Both connections, or False when the daemon does not accept yet."""
        try:
            socks = []
            for _ in range(2 if self.rate > 0 else 1):
                s = socket.socket(socket.AF_UNIX)
                socks.append(s)
                s.connect(self.path)
        except OSError:
            for s in socks:
                s.close()
            return False
        for s in socks:
            s.setblocking(False)
        self.health = socks[0]
        selector.register(self.health, selectors.EVENT_READ, (self, "health"))
        if len(socks) == 2:
            self.load = socks[1]
            selector.register(self.load, selectors.EVENT_READ, (self, "load"))
        return True


def generate(spec_path):
    """The load generator: drives every daemon of the spec, open loop, from
    the CLOCK_MONOTONIC time read from stdin (system-wide, so the parent's
    event times compare with these), and writes the records to spec["out"]."""
    with open(spec_path) as f:
        spec = json.load(f)
    gc.disable()  # a collection over many records would pause the loop
    selector = selectors.DefaultSelector()
    nodes = [LoadNode(n, path) for n, path in zip(spec["loads"], spec["sockets"])]
    for node in nodes:
        if node.start_s == 0 and not node.connect(selector):
            raise RuntimeError("cannot connect to " + node.path)
    print("ready", flush=True)
    start = float(sys.stdin.readline())
    seconds = spec["seconds"]
    request_tail = msgpack.packb("acquire") + msgpack.packb([RULE, KEY, 1])
    health_id = 0
    outstanding = 0  # acquires sent and not answered yet
    longest_pause = 0.0
    pauses = []  # [from, to] of each gap between loop turns over GENERATOR_PAUSE_LIMIT_S
    previous = None
    while time.monotonic() < start:
        time.sleep(0.001)
    while True:
        now = time.monotonic()
        t = now - start
        if previous is not None and t < seconds:
            longest_pause = max(longest_pause, now - previous)
            if now - previous > GENERATOR_PAUSE_LIMIT_S:
                pauses.append([previous - start, t])
        previous = now
        for node in nodes:
            if node.health is None:
                if t >= node.start_s and now >= node.next_try and not node.connect(selector):
                    node.next_try = now + CONNECT_RETRY_S
                continue
            if node.load is not None and t < (node.end_s or seconds):
                if node.last is None:
                    node.last = now
                node.credit += node.rate_at(t) * (now - node.last)
                node.last = now
                due = int(node.credit)
                node.credit -= due
                outstanding += due
                for _ in range(due):
                    node.sent.append(now)
                    node.answered.append(None)
                    node.allowed.append(False)
                    node.mode.append(None)
                    # [0, msgid, "acquire", [rule, key, 1]]: a fixarray of 4.
                    node.out += b"\x94\x00" + msgpack.packb(len(node.sent)) + request_tail
            if node.out:
                try:
                    node.out = node.out[node.load.send(node.out):]
                except BlockingIOError:
                    pass
                except OSError:
                    node.out = b""
            if not node.health_waiting and now >= node.health_due and t < seconds:
                health_id += 2
                try:
                    node.health.send(msgpack.packb([0, health_id, "health", []]) +
                                     msgpack.packb([0, health_id + 1, "stats", []]))
                    node.health_waiting = True
                    node.polled = {}
                except OSError:
                    pass
                node.health_due = now + HEALTH_POLL_S
        if t >= seconds:
            if outstanding == 0 or t >= seconds + DRAIN_S:
                break
        for key, _ in selector.select(LOOP_TICK_S):
            node, kind = key.data
            try:
                data = key.fileobj.recv(1 << 20)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            received = time.monotonic()
            if not data:  # the daemon closed it (a leaving node stops)
                selector.unregister(key.fileobj)
                continue
            if kind == "load":
                node.load_in.feed(data)
                for _, msgid, error, result in node.load_in:
                    i = msgid - 1
                    node.answered[i] = received
                    outstanding -= 1
                    if error is None:
                        node.allowed[i], node.mode[i] = result["allowed"], result["mode"]
                    else:
                        node.mode[i] = "error:" + str(error.get("code"))
            else:
                node.health_in.feed(data)
                for _, _, _, answer in node.health_in:
                    node.polled["stats" if "overshoot_bound" in answer else "health"] = answer
                if len(node.polled) == 2:
                    h = node.polled["health"]
                    bound = node.polled["stats"]["overshoot_bound"].get(RULE)
                    node.health_samples.append([received] + [h[f] for f in HEALTH_FIELDS[1:-1]] +
                                               [bound])
                    node.health_waiting = False
    with open(spec["out"], "wb") as f:
        msgpack.pack(dict(
            nodes=[dict(sent=n.sent, answered=n.answered, allowed=n.allowed, mode=n.mode,
                        health=n.health_samples) for n in nodes],
            longest_pause_s=longest_pause, pauses=pauses, cpu_s=time.process_time()), f)


# --- a run -------------------------------------------------------------------------------

class Run:
    """Starts Redis and the fleet for one (fleet size, shape), drives it,
    stops everything, and keeps what was recorded."""

    def __init__(self, sluiced, nodes, shape, mode):
        self.nodes, self.shape, self.burst = nodes, shape, burst_of(shape)
        self.period_s = period_of(shape)
        self.seconds, self.loads, initial, self.plan_events, self.fault = plan(
            shape, nodes, *MODES[mode][2:])
        self.dir = tempfile.mkdtemp(prefix="slf.", dir="/tmp")  # short: socket paths <= 107 bytes
        self.redis = None
        self.daemons = []
        try:
            self.redis = Redis()
            self.daemons = [Daemon(sluiced, self.dir, i, self.redis.port, initial, self.burst,
                                   algorithm_of(shape), self.period_s)
                            for i in range(len(self.loads))]
            for d in self.daemons[:initial]:
                d.start()
            self.wait_fleet(self.daemons[:initial])
            self.idle_calls_per_s = self.idle_calls()
            self.drive()
        finally:
            for d in self.daemons:
                d.stop()
            if self.redis is not None:
                self.redis.stop()
            shutil.rmtree(self.dir, ignore_errors=True)

    def wait_fleet(self, daemons):
        """Until every daemon has Redis up and counts them all live."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for d in daemons:
            while True:
                h = d.call("health")
                if h["redis"] == "up" and h["nodes"] == len(daemons) and h["breaker"] == "closed":
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("fleet not up: daemon %d says %s\n%s"
                                       % (d.index, h, d.log()))
                time.sleep(0.02)

    def idle_calls(self):
        """The script calls per second of the idle fleet (heartbeats and the
        like), which issue 21's cost target leaves out."""
        calls, began = self.redis.script_calls(), time.monotonic()
        time.sleep(IDLE_MEASURE_S)
        return (self.redis.script_calls() - calls) / (time.monotonic() - began)

    def act(self, action):
        if action == "redis-kill":
            self.redis.kill()
        elif action == "redis-restart":
            self.redis.start()  # on the same port, empty
        elif action == "redis-stop":
            self.redis.signal(signal.SIGSTOP)
        elif action == "redis-cont":
            self.redis.signal(signal.SIGCONT)
        elif action == "join":
            self.daemons[-1].start()
        elif action == "leave":
            self.daemons[0].stop()
        elif action == "shift":
            pass  # the generator moves the load itself: the event marks the time

    def drive(self):
        out = os.path.join(self.dir, "records")
        spec_path = os.path.join(self.dir, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(dict(loads=self.loads, sockets=[d.socket for d in self.daemons],
                           seconds=self.seconds, out=out), f)
        calls_before, calls_from = self.redis.script_calls(), time.monotonic()
        cpu_before = {d.index: cpu_seconds(d.proc.pid) for d in self.daemons if d.proc}
        redis_cpu_before, own_cpu_before = self.redis.cpu_seconds(), time.process_time()
        busy_before, wall_before = busy_cpu_seconds(), time.monotonic()
        with open(os.path.join(self.dir, "load.err"), "w+") as err:
            load = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--load", spec_path],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
            try:
                if load.stdout.readline() != "ready\n":
                    raise RuntimeError("load generator: " + self.read(err))
                self.start = time.monotonic() + START_DELAY_S
                load.stdin.write("%r\n" % self.start)
                load.stdin.close()
                self.events = []
                for offset, action in self.plan_events:
                    time.sleep(max(0.0, self.start + offset - time.monotonic()))
                    self.events.append((time.monotonic() - self.start, action))
                    self.act(action)
                if load.wait(self.seconds + DRAIN_S + 30) != 0:
                    raise RuntimeError("load generator failed: " + self.read(err))
            finally:
                if load.poll() is None:
                    load.kill()
                    load.wait()
                load.stdout.close()
        busy, wall = busy_cpu_seconds() - busy_before, time.monotonic() - wall_before
        self.redis_calls = self.redis.script_calls() - calls_before
        self.net_redis_calls = max(
            self.redis_calls - self.idle_calls_per_s * (time.monotonic() - calls_from), 0.0)
        self.cpu_s = 0.0
        for d in self.daemons:
            if d.proc is not None and d.proc.poll() is None:
                d.cpu_s = cpu_seconds(d.proc.pid)
            self.cpu_s += d.cpu_s - cpu_before.get(d.index, 0.0)
        with open(out, "rb") as f:
            self.records = msgpack.unpack(f, raw=False)
        # CPUs that processes this benchmark did not start used meanwhile.
        ours = (self.cpu_s + self.redis.cpu_seconds() - redis_cpu_before + self.records["cpu_s"]
                + time.process_time() - own_cpu_before)
        self.others_cpus = (busy - ours) / wall

    @staticmethod
    def read(f):
        f.seek(0)
        return f.read()[-2000:]


# --- measurements on a run ---------------------------------------------------------------------

def first_in_mode(node, after, before, wanted):
    """Seconds from `after` until this node's first answer in mode `wanted` to
    a request sent from `after` until `before`; None when there was none. (The
    first, not the last switch: a lease that times out under load later gives
    a stray fallback answer, which the accuracy windows judge.)"""
    return min((a - after for s, a, m in zip(node["sent"], node["answered"], node["mode"])
                if after <= s < before and a is not None and m == wanted), default=None)


def ms(seconds):
    return None if seconds is None else seconds * 1000


def percentile(ordered, q):
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else 0.0


def overlaps(t0, t1, spans):
    """Whether [t0, t1) overlaps any of the spans [(from, to)]."""
    return any(t0 < e1 and t1 > e0 for e0, e1 in spans)


def slowest(values):
    """The largest per-node value; None when a node never got there."""
    values = list(values)
    return None if not values or None in values else max(values)


def first_health(node, after, field, value):
    """Seconds from `after` until this node's health said field == value."""
    index = HEALTH_FIELDS.index(field)
    return next((s[0] - after for s in node["health"] if s[0] >= after and s[index] == value),
                None)


def analyse(run):
    """The row of the table and the series of the plot for one run."""
    start = run.start
    burst = run.burst
    nodes = run.records["nodes"]
    loaded = [n for n, spec in zip(nodes, run.loads) if spec["rate"] > 0]
    # Times relative to the start of the load.
    for n in nodes:
        n["sent"] = [s - start for s in n["sent"]]
        n["answered"] = [None if a is None else a - start for a in n["answered"]]
        for sample in n["health"]:
            sample[0] -= start
    events = dict((action, t) for t, action in run.events)
    decisions = sum(len(n["sent"]) for n in nodes)
    unanswered = sum(a is None for n in nodes for a in n["answered"])
    errors = sum(1 for n in nodes for m in n["mode"] if m and m.startswith("error"))
    admitted = sorted(a for n in nodes for a, ok in zip(n["answered"], n["allowed"]) if ok)
    pauses = run.records["pauses"]
    waits = [(a - s, s, overlaps(s, a, pauses)) for n in nodes
             for s, a in zip(n["sent"], n["answered"]) if a is not None]
    stall_s, stall_at, _ = max(waits, default=(0.0, 0.0, False))
    # A wait that spans a pause of the generator is the generator's as much as the daemon's.
    own_stall_s = max((w for w, _, paused in waits if not paused), default=0.0)
    ordered = sorted(w for w, _, _ in waits)
    # The longest time the fleet admitted nothing while demand went on.
    gap_s, gap_at = max(((b - a, a) for a, b in zip(admitted, admitted[1:]) if a < run.seconds),
                        default=(0.0, 0.0))

    row = dict(nodes=run.nodes, shape=run.shape, seconds=run.seconds, decisions=decisions,
               offered_per_s=decisions / run.seconds, unanswered=unanswered, errors=errors,
               stall_ms=stall_s * 1000, stall_at_s=stall_at, own_stall_ms=own_stall_s * 1000,
               p50_ms=percentile(ordered, 0.5) * 1000, p99_ms=percentile(ordered, 0.99) * 1000,
               pause_ms=run.records["longest_pause_s"] * 1000,
               gap_ms=gap_s * 1000, gap_at_s=gap_at,
               redis_calls_per_decision=run.redis_calls / max(decisions, 1),
               cpu_percent=100 * run.cpu_s / run.seconds,
               others_cpus=run.others_cpus)

    fault = None
    if run.fault:
        t_fault, t_recovery = events[run.fault[0]], events[run.fault[1]]
        to_fallback = slowest(first_in_mode(n, t_fault, t_recovery, "fallback") for n in loaded)
        to_normal = slowest(first_in_mode(n, t_recovery, math.inf, "normal") for n in loaded)
        down = slowest(first_health(n, t_fault, "redis", "down") for n in nodes)
        up = slowest(first_health(n, t_recovery, "redis", "up") for n in nodes)
        t_end = run.seconds if to_normal is None else t_recovery + to_normal
        # The share and leased units as the daemons reported them last before the fault.
        before = [[s for s in n["health"] if s[0] < t_fault][-1] for n in nodes]
        live = before[0][HEALTH_FIELDS.index("nodes")]
        leased = sum(s[HEALTH_FIELDS.index("leased_units")] for s in before)
        share_bound = len(nodes) * ((LIMIT_PER_S // live) * (t_end - t_fault) + burst // live)
        in_fault = sum(1 for a in admitted if t_fault <= a < t_end)
        in_fallback = sum(1 for n in nodes
                          for a, ok, m in zip(n["answered"], n["allowed"], n["mode"])
                          if ok and m == "fallback" and t_fault <= a < t_end)
        # The daemons' own bound: each window of one period admits at most
        # limit x period + burst plus the fleet's overshoot bound (the sum of
        # what each node reported, at its largest over the fault window);
        # the leased units held at the fault were counted before it.
        index = HEALTH_FIELDS.index("overshoot_bound")
        reported = [[s[index] for s in n["health"] if t_fault <= s[0] < t_end] for n in nodes]
        if any(None in r for r in reported):
            overshoot_bound = math.inf
        else:
            overshoot_bound = sum(max(r, default=0) for r in reported)
        periods = math.ceil((t_end - t_fault) / run.period_s)
        overshoot = in_fault - (LIMIT_PER_S * (t_end - t_fault) + burst + leased)
        fault = dict(at_s=t_fault, recovery_s=t_recovery, end_s=t_end, admitted=in_fault,
                     admitted_fallback=in_fallback, bound=share_bound + leased, leased=leased,
                     overshoot=overshoot, overshoot_bound=overshoot_bound * periods,
                     live_nodes=live, ratio=in_fault / (share_bound + leased),
                     fallback_ms=ms(to_fallback), normal_ms=ms(to_normal), down_ms=ms(down),
                     up_ms=ms(up))
    row["fault"] = fault
    fault_span = [(fault["at_s"], fault["end_s"])] if fault else []

    # Accuracy: sliding windows of one period over the load, outside faults.
    per_window = LIMIT_PER_S * run.period_s + burst
    ratios, window_series, paused = [], [], 0
    steps = int(round((run.seconds - run.period_s) / WINDOW_STEP_S)) + 1
    lo = 0
    for k in range(steps):
        w0 = k * WINDOW_STEP_S
        w1 = w0 + run.period_s
        while lo < len(admitted) and admitted[lo] < w0:
            lo += 1
        hi = lo
        while hi < len(admitted) and admitted[hi] < w1:
            hi += 1
        ratio = (hi - lo) / per_window
        judged = not overlaps(w0, w1, fault_span)
        if judged and overlaps(w0, w1, pauses):
            judged = False
            paused += 1
        window_series.append([w0, ratio, judged])
        if judged:
            ratios.append(ratio)
    row["windows"], row["paused_windows"] = len(ratios), paused
    if fault:
        fault["max_window"] = max(r for w0, r, _ in window_series
                                  if w0 < fault["end_s"] and w0 + run.period_s > fault["at_s"])
    if ratios:
        row.update(ratio_min=min(ratios), ratio_mean=sum(ratios) / len(ratios),
                   ratio_max=max(ratios))

    analyse21(run, row, nodes, admitted, events)

    # Series for the plot: per bin, admitted by mode and offered.
    bins = int(math.ceil((run.seconds + DRAIN_S) / BIN_S))
    series = {m: [0] * bins for m in ("normal", "fallback", "other", "offered")}
    for n in nodes:
        for s, a, ok, m in zip(n["sent"], n["answered"], n["allowed"], n["mode"]):
            series["offered"][min(int(s / BIN_S), bins - 1)] += 1
            if ok and a is not None:
                key = m if m in ("normal", "fallback") else "other"
                series[key][min(int(a / BIN_S), bins - 1)] += 1
    # The live node count as the longest-lived node's health said it: its changes.
    counts = [[round(s[0], 3), s[HEALTH_FIELDS.index("nodes")]]
              for s in max((n["health"] for n in nodes), key=len)]
    live_nodes = [c for i, c in enumerate(counts)
                  if i in (0, len(counts) - 1) or c[1] != counts[i - 1][1]]
    plot = dict(nodes=run.nodes, shape=run.shape, seconds=run.seconds, bin_s=BIN_S,
                series=series, events=run.events, fault=fault, pauses=pauses,
                windows=[[round(w0, 2), round(r, 4), judged] for w0, r, judged in window_series],
                live_nodes=live_nodes, burst=run.burst, period_s=run.period_s)
    return row, plot


def analyse21(run, row, nodes, admitted, events):
    """Issue 21's measures, into `row`: the Redis calls per decision net of
    the idle fleet's; for shifting-skew, how long after each shift the new
    hot node first admitted SHIFT_REACH of its max-min share (over a window
    of SHIFT_RATE_WINDOW_S; None: not before the next shift); for
    outage-skew, the fleet's admissions from the SIGKILL to the restart over
    limit x that time."""
    row["burst"] = run.burst
    row["net_calls_per_decision"] = run.net_redis_calls / max(row["decisions"], 1)
    if run.shape == "shifting-skew":
        reach = []
        for k in range(1, SHIFTS):
            t_shift = k * SHIFT_EVERY_S
            hot = k % run.nodes
            demands = [next(r for from_s, r in reversed(load["steps"]) if t_shift >= from_s)
                       for load in run.loads]
            share = max_min_shares(demands, LIMIT_PER_S)[hot]
            times = sorted(a for a, ok in zip(nodes[hot]["answered"], nodes[hot]["allowed"])
                           if ok and a is not None and a >= t_shift)
            need = SHIFT_REACH * share * SHIFT_RATE_WINDOW_S
            found = None
            for step in range(int(round((SHIFT_EVERY_S - SHIFT_RATE_WINDOW_S) /
                                        SHIFT_RATE_STEP_S)) + 1):
                w0 = t_shift + step * SHIFT_RATE_STEP_S
                w1 = w0 + SHIFT_RATE_WINDOW_S
                if bisect.bisect_left(times, w1) - bisect.bisect_left(times, w0) >= need:
                    found = round(w1 - t_shift, 6)
                    break
            reach.append(dict(at_s=t_shift, hot=hot, share_per_s=share, reach_s=found))
        row["shifts"] = reach
    if run.shape == "outage-skew":
        t_kill, t_restart = events["redis-kill"], events["redis-restart"]
        inside = bisect.bisect_left(admitted, t_restart) - bisect.bisect_left(admitted, t_kill)
        row["outage"] = dict(admitted=inside, seconds=t_restart - t_kill,
                             ratio=inside / (LIMIT_PER_S * (t_restart - t_kill)))


# --- the report ---------------------------------------------------------------------------

def fmt(value, spec="%.0f"):
    return "-" if value is None else spec % value


def verdicts(row):
    """(accuracy, fault, stall) verdicts of a row: "PASS", "MISS" or "-"."""
    accuracy = "-"
    if row["windows"]:
        accuracy = "PASS" if (row["ratio_min"] >= ACCURACY_LOW
                              and row["ratio_max"] <= ACCURACY_HIGH) else "MISS"
    f = row["fault"]
    fault = "-" if f is None else (
        "PASS" if f["ratio"] <= 1 and f["overshoot"] <= f["overshoot_bound"] else "MISS")
    stall = "PASS" if row["own_stall_ms"] <= STALL_TARGET_MS and not row["unanswered"] else "MISS"
    return accuracy, fault, stall


def gates21(row):
    """Issue 21's gated columns of a row: {column: (value text, "PASS"/"MISS")},
    only the columns that apply to its shape."""
    def verdict(ok):
        return "PASS" if ok else "MISS"
    gates = {}
    shape = row["shape"]
    if shape in CONTENDED_SHAPES and row["windows"]:
        gates["accuracy"] = ("%.3f / %.3f" % (row["ratio_min"], row["ratio_max"]), verdict(
            row["ratio_min"] >= CONTENDED_LOW and row["ratio_max"] <= CONTENDED_HIGH))
    if shape in CONTENDED_SHAPES:
        gates["cost"] = ("%.4f" % row["net_calls_per_decision"],
                         verdict(row["net_calls_per_decision"] <= CONTENDED_CALLS))
    if shape == "shifting-skew":
        reach = [r["reach_s"] for r in row["shifts"]]
        gates["shift"] = (" / ".join(fmt(ms(r)) for r in reach),
                          verdict(None not in reach and max(reach) <= SHIFT_REACH_S))
    if shape == "outage-skew":
        gates["outage"] = ("%.3f" % row["outage"]["ratio"], verdict(
            OUTAGE_LOW <= row["outage"]["ratio"] <= OUTAGE_HIGH))
    f = row["fault"]
    if f is not None and shape in NEW_SHAPES:
        gates["overshoot"] = ("%.0f <= %.0f" % (f["overshoot"], f["overshoot_bound"]),
                              verdict(f["overshoot"] <= f["overshoot_bound"]))
    return gates


GATES21 = (
    ("accuracy", "contended: admitted / (limit x W + burst) min / max, in [%.2f, %.3f]"
     % (CONTENDED_LOW, CONTENDED_HIGH)),
    ("cost", "contended: Redis calls/decision net of the idle fleet's, <= %.2f" % CONTENDED_CALLS),
    ("shift", "shifting skew: ms from each shift until the hot node admits %.1f of its max-min "
     "share, <= %.0f" % (SHIFT_REACH, SHIFT_REACH_S * 1000)),
    ("outage", "outage under skew: admitted / (limit x outage), in [%.2f, %.2f]"
     % (OUTAGE_LOW, OUTAGE_HIGH)),
    ("overshoot", "fault run: overshoot <= the daemons' bound"),
)


def report21(rows):
    """The section of issue 21's shapes: one column per gate."""
    lines = []
    add = lines.append
    add("### Issue 21's shapes and gates")
    add("")
    add("- **contended**: as steady (every node 3 x limit / N), with burst %d (%.0f %% of limit x "
        "W; the issue allows up to 3 %%). The best a saturated bucket shows is limit / (limit + "
        "burst) = %.3f: at 3 %% it would be 0.971, below the gate however exact the fleet. The cost"
        " target counts the EVALSHA calls of the run less what the idle fleet makes on its own "
        "(heartbeats, the fleet marker), measured for %.0f s before the load. "
        "**contended-gcra**: the same on a gcra rule." % (
            CONTENDED_BURST, 100.0 * CONTENDED_BURST / (LIMIT_PER_S * PERIOD_S),
            LIMIT_PER_S / (LIMIT_PER_S + CONTENDED_BURST / PERIOD_S), IDLE_MEASURE_S))
    add("- **shifting-skew**: %d %% of the load on one node, the rest spread over the others; "
        "the hot node changes every %.0f s (%d hot spots). After each shift, the time until the "
        "new hot node's admissions over %.0f ms first reach %.1f of its max-min share of the "
        "limit (the others' demand is below an equal share, so its share is the limit less "
        "their demand); `-`: not before the next shift." % (
            SHIFT_HOT_SHARE * 100, SHIFT_EVERY_S, SHIFTS, SHIFT_RATE_WINDOW_S * 1000,
            SHIFT_REACH))
    add("- **outage-skew**: %d %% of the load on node 0; Redis SIGKILLed %.0f s after the start "
        "and restarted empty %.0f s later. The fleet's admissions between the two over limit x "
        "%.0f s." % (SHIFT_HOT_SHARE * 100, FAULT_AT_S, OUTAGE_S, OUTAGE_S))
    add("")
    add("| N | shape | burst | " + " | ".join(title for _, title in GATES21) + " |")
    add("|---:|---|---:|" + "---|" * len(GATES21))
    for row in rows:
        if row["shape"] not in NEW_SHAPES:
            continue
        gates = gates21(row)
        cells = ["%s %s" % gates[name] if name in gates else "-" for name, _ in GATES21]
        add("| %d | %s | %d | %s |" % (row["nodes"], row["shape"], row["burst"], " | ".join(cells)))
    add("")
    for name, title in GATES21:
        judged = [r for r in rows if name in gates21(r)]
        if not judged:
            continue
        missed = ["N=%d %s" % (r["nodes"], r["shape"]) for r in judged
                  if gates21(r)[name][1] == "MISS"]
        add("- %s: met in %d of %d runs%s" % (
            title.split(":")[0] + " " + name, len(judged) - len(missed), len(judged),
            "; missed: " + ", ".join(missed) if missed else ""))
    return lines


def report(rows, mode, load_before, load_after, took_s, settled_s):
    lines = []
    add = lines.append
    add("## sluice fleet benchmark (%s mode)" % mode)
    add("")
    settled = (" (after %.0f s waiting for it to fall below %.1f)" % (settled_s, SETTLE_LOAD)
               if settled_s >= 1 else "")
    add("%s, %s, %d CPUs, load average before: %s%s, after: %s; %s; sluiced with %d worker per "
        "node, every process on this machine; %.0f s." % (
            time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            " ".join(os.uname()[i] for i in (0, 2, 4)),
            os.cpu_count(), load_before, settled, load_after,
            subprocess.run([REDIS_SERVER, "--version"], capture_output=True, text=True)
            .stdout.split(" sha=")[0], WORKERS, took_s))
    add("One global token bucket, %d/s, burst %d, on one key; `on_redis_down = \"local\"`; "
        "lease_timeout %d ms, lease_interval %d ms, health_interval %d ms, health_timeout %d ms, "
        "heartbeat_interval %d ms (sliding-log: a global sliding_log rule of the same rate, %d "
        "per %d ms, no burst, judged over windows of that period). One Python process drives "
        "every node, open loop, at %dx the limit in total at the least (offered/s is what it "
        "sent)." % (
            LIMIT_PER_S, BURST, LEASE_TIMEOUT_MS, LEASE_INTERVAL_MS, HEALTH_INTERVAL_MS,
            HEALTH_TIMEOUT_MS, HEARTBEAT_INTERVAL_MS, LIMIT_PER_S * SLIDING_LOG_PERIOD_S,
            SLIDING_LOG_PERIOD_S * 1000, DEMAND_FACTOR))
    add("")
    add("- **admitted / (limit x W + burst)**: allowed answers (by answer time) in every window W "
        "of one period (%.0f s), one starting every %.0f ms, over %d. **windows**: how many were "
        "judged; windows that overlap a fault window are left out (those after it count), and so "
        "are those in which the generator itself paused longer than burst / limit = %.0f ms "
        "(it sent nothing meanwhile; their count in brackets). Target: within [%.2f, %.2f]. The "
        "best a saturated bucket can show is %d / %d = %.3f." % (
            PERIOD_S, WINDOW_STEP_S * 1000, LIMIT_PER_S * PERIOD_S + BURST,
            GENERATOR_PAUSE_LIMIT_S * 1000, ACCURACY_LOW, ACCURACY_HIGH, LIMIT_PER_S * PERIOD_S,
            LIMIT_PER_S * PERIOD_S + BURST,
            LIMIT_PER_S * PERIOD_S / (LIMIT_PER_S * PERIOD_S + BURST)))
    add("- **fault: admitted / bound**: every admission from the fault until every node has "
        "answered in mode `normal` again (the fault window), over the bound computed from "
        "outside: the nodes' fallback shares over that window "
        "(N x (limit // N x T + burst // N), N the live count before the fault) plus the "
        "`leased_units` they held at the fault. Target: <= 1. In brackets, the largest "
        "admitted / (limit x W + burst) of the windows that overlap the fault window.")
    add("- **fault: overshoot <= daemons' bound**: the fault window's admissions beyond limit x "
        "T + burst + the leased units held at the fault, against the bound the daemons export "
        "(`stats` overshoot_bound, asked with each health): the sum over the nodes of the "
        "largest each reported in the fault window, once per period the window spans. "
        "Target: overshoot <= bound; the fault verdict needs both.")
    add("- **wait p50 / p99**: of every request's wait from send to answer, as the generator "
        "saw it.")
    add("- **stall**: the longest wait for an answer seen by the generator, and when that "
        "request was sent (s after the start) / the longest of the waits that span no pause of "
        "the generator over %.0f ms (the one judged); target <= lease_timeout + 5 ms = %d ms, "
        "and every request answered. **gen. pause**: the generator's own longest gap between two "
        "loop turns, which inflates every wait in flight." % (GENERATOR_PAUSE_LIMIT_S * 1000,
                                                                STALL_TARGET_MS))
    add("- **fallback / down**: ms from the fault until every node has answered in mode "
        "`fallback` / its health has said `redis: down` (health is asked every %.0f ms); "
        "**normal / up**: the same from the recovery (restart or SIGCONT) to mode `normal` / "
        "`up`." % (HEALTH_POLL_S * 1000))
    add("- **no-admission gap**: the longest time between two admissions in the fleet, and when "
        "it began (s after the start); at 3x the limit anything over a few ms is capacity the "
        "fleet left unused.")
    add("- **Redis calls/decision**: EVALSHA calls over decisions; **sluiced CPU**: all nodes' "
        "CPU time over the run, in %% of one CPU; **others' CPUs**: CPUs that processes this "
        "benchmark did not start kept busy during the run (of %d; from /proc/stat): the "
        "machine is shared, and a run beside a busy neighbour waits for CPUs." % os.cpu_count())
    busiest = max(float(load_before.split()[0]), float(load_after.split()[0]))
    if busiest > os.cpu_count() / 2:
        add("")
        add("**Warning: the machine was busy (1-min load average up to %.2f on %d CPUs, this run "
            "included): every process here, the daemons, Redis and the generator, waited for a "
            "CPU at times; stalls, pauses and switching times are upper bounds.**"
            % (busiest, os.cpu_count()))
    add("")
    add("| N | shape | offered/s | windows (gen. pause) | "
        "admitted / (limit x W + burst) min / mean / max | "
        "fault: admitted / bound | fault: overshoot <= daemons' bound | wait p50 / p99 ms | stall ms (at s) / without gen. pauses | "
        "gen. pause ms | "
        "fallback / down ms | normal / up ms | no-admission gap ms (at s) | "
        "Redis calls/decision | sluiced CPU | others' CPUs | accuracy | fault | stall |")
    add("|---:|---|---:|---:|---|---|---|---|---:|---:|---|---|---|---:|---:|---:|---|---|---|")
    for row in rows:
        f = row["fault"]
        acc = "-" if not row["windows"] else "%.3f / %.3f / %.3f" % (
            row["ratio_min"], row["ratio_mean"], row["ratio_max"])
        fault = "-" if f is None else "%d / %.0f = %.3f (max window %.3f)" % (
            f["admitted"], f["bound"], f["ratio"], f["max_window"])
        reported = "-" if f is None else "%.0f <= %.0f" % (f["overshoot"], f["overshoot_bound"])
        switch_in = "-" if f is None else "%s / %s" % (fmt(f["fallback_ms"]), fmt(f["down_ms"]))
        switch_out = "-" if f is None else "%s / %s" % (fmt(f["normal_ms"]), fmt(f["up_ms"]))
        stall = "%.1f (%.1f) / %.1f" % (row["stall_ms"], row["stall_at_s"], row["own_stall_ms"]) + (
            ", %d unanswered" % row["unanswered"] if row["unanswered"] else "")
        add("| %d | %s | %.0f | %d (%d) | %s | %s | %s | %.2f / %.1f | %s | %.1f | %s | %s | "
            "%.0f (%.1f) | %.4f | %.0f %% | %.2f | %s |" % (
            row["nodes"], row["shape"], row["offered_per_s"], row["windows"],
            row["paused_windows"], acc, fault, reported, row["p50_ms"], row["p99_ms"], stall,
            row["pause_ms"], switch_in, switch_out, row["gap_ms"], row["gap_at_s"],
            row["redis_calls_per_decision"],
            row["cpu_percent"], row["others_cpus"], " | ".join(verdicts(row))))
    add("")
    for i, name in enumerate(("accuracy", "fault bound", "stall")):
        judged = [r for r in rows if verdicts(r)[i] != "-"]
        missed = ["N=%d %s" % (r["nodes"], r["shape"]) for r in judged if verdicts(r)[i] == "MISS"]
        add("- %s: met in %d of %d runs%s" % (
            name, len(judged) - len(missed), len(judged),
            "; missed: " + ", ".join(missed) if missed else ""))
    for row in rows:
        if row["errors"]:
            add("- N=%d %s: %d error answers" % (row["nodes"], row["shape"], row["errors"]))
    exact = [r for r in rows if "exact" in r]
    if exact:
        add("- sliding-log against the exact log at the same load, right after it "
            "(bench/exact_log.py: one EVALSHA of lua/sliding_log.lua per decision, straight from "
            "a generator to Redis, no daemons), admitted / limit in windows of one period, "
            "min / mean / max: " + "; ".join(
                "N=%d %.3f / %.3f / %.3f (sluiced's %.3f / %.3f / %.3f)" % (
                    r["nodes"], r["exact"]["min"], r["exact"]["mean"], r["exact"]["max"],
                    r["ratio_min"], r["ratio_mean"], r["ratio_max"]) for r in exact))
    add("")
    if any(r["shape"] in NEW_SHAPES for r in rows):
        lines.extend(report21(rows))
        add("")
    add("Plots: `%s-<shape>.png` (admitted/s over time against the limit, fault windows shaded), "
        "`throughput.png` (decisions/s and p99 against the baselines of latest.md and global.md)." %
        ("fleet" if mode == "full" else "fleet-quick"))
    add("")
    if os.environ.get("BENCH_SHAPES"):
        add("Reproduce: `BENCH_MODE=%s BENCH_SHAPES=%s /usr/bin/python3 bench/fleet.py "
            "build-release`." % (mode, os.environ["BENCH_SHAPES"]))
    else:
        add("Reproduce: `BENCH_MODE=%s make bench`, or only this part: `export BENCH_MODE=%s; "
            "/usr/bin/python3 bench/fleet.py build-release && /usr/bin/python3 bench/plots.py`."
            % (mode, mode))
    return "\n".join(lines) + "\n"


def exact_reference(nodes, seconds):
    """The sliding-log shape's load on the exact log (bench/exact_log.py: one
    EVALSHA per decision, straight from a generator to a Redis of its own,
    no daemons) over `nodes` connections: its windows of one period, as
    analyse() judges the shape's."""
    redis = Redis()
    try:
        out = subprocess.run(
            [sys.executable, os.path.join(HERE, "exact_log.py"), str(nodes), str(redis.port),
             str(int(LIMIT_PER_S * SLIDING_LOG_PERIOD_S)), str(int(SLIDING_LOG_PERIOD_S * 1000)),
             str(DEMAND_FACTOR), str(seconds)],
            capture_output=True, text=True, check=True).stdout
    finally:
        redis.stop()
    admitted = json.loads(out)["admitted"]
    per_window = LIMIT_PER_S * SLIDING_LOG_PERIOD_S
    steps = int(round((seconds - SLIDING_LOG_PERIOD_S) / WINDOW_STEP_S)) + 1
    ratios = [(bisect.bisect_left(admitted, k * WINDOW_STEP_S + SLIDING_LOG_PERIOD_S)
               - bisect.bisect_left(admitted, k * WINDOW_STEP_S)) / per_window
              for k in range(steps)]
    return dict(min=min(ratios), mean=sum(ratios) / len(ratios), max=max(ratios))


def load_average():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# A full run first waits, at most SETTLE_MAX_S, for the 1-minute load average
# to fall below SETTLE_LOAD: make bench runs it right after its heavier parts,
# whose load would otherwise lie on its first shapes.
SETTLE_LOAD = 1.0
SETTLE_MAX_S = 90.0


def settle():
    """Waits for the load to settle (SETTLE_LOAD); returns the seconds waited."""
    began = time.monotonic()
    while (time.monotonic() - began < SETTLE_MAX_S
           and float(load_average().split()[0]) >= SETTLE_LOAD):
        time.sleep(min(5.0, SETTLE_MAX_S - (time.monotonic() - began)))
    return time.monotonic() - began


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--load":
        generate(sys.argv[2])
        return
    mode = os.environ.get("BENCH_MODE", "full")
    if len(sys.argv) != 2 or mode not in MODES:
        sys.exit("usage: BENCH_MODE=quick|full bench/fleet.py BUILD_DIR (a build with sluiced)")
    sluiced = os.path.join(sys.argv[1], "daemon", "sluiced")
    if not os.access(sluiced, os.X_OK) or not os.access(REDIS_SERVER, os.X_OK):
        sys.exit("bench/fleet.py: needs %s and %s" % (sluiced, REDIS_SERVER))
    # SIGTERM ends the run through the same clean-up as an error.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    settled_s = settle() if mode == "full" else 0.0
    load_before = load_average()
    began = time.monotonic()
    fleets, shapes = MODES[mode][:2]
    if os.environ.get("BENCH_SHAPES"):
        wanted = os.environ["BENCH_SHAPES"].split(",")
        unknown = set(wanted) - set(shapes)
        if unknown:
            sys.exit("bench/fleet.py: BENCH_SHAPES names shapes %s mode has not: %s"
                     % (mode, ", ".join(sorted(unknown))))
        shapes = tuple(s for s in shapes if s in wanted)
    rows, plots = [], []
    for nodes in fleets:
        for shape in shapes:
            run = Run(sluiced, nodes, shape, mode)
            row, plot = analyse(run)
            if shape == "sliding-log":
                row["exact"] = exact_reference(nodes, run.seconds)
            rows.append(row)
            plots.append(plot)
            sys.stderr.write("fleet: N=%d %s: %s\n" % (nodes, shape, json.dumps(
                {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
                 if k != "fault"})))
            if row["fault"]:
                sys.stderr.write("  fault: %s\n" % json.dumps(row["fault"]))
    stem = "fleet" if mode == "full" else "fleet-quick"
    if os.environ.get("BENCH_SHAPES"):
        stem += "-shapes"  # a part of the mode's runs: the whole mode's files stay
    text = report(rows, mode, load_before, load_average(), time.monotonic() - began, settled_s)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, stem + ".md"), "w") as f:
        f.write(text)
    with open(os.path.join(RESULTS, stem + ".json"), "w") as f:
        json.dump(dict(mode=mode, limit_per_s=LIMIT_PER_S, burst=BURST, period_s=PERIOD_S,
                       runs=plots), f, separators=(",", ":"))
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
