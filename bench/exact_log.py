#!/usr/bin/python3
"""The exact sliding log, for bench/fleet.py's sliding-log shape to compare
with: one EVALSHA of lua/sliding_log.lua per decision (a lease of one unit,
which admits exactly what the seeds' ZSET log admits), sent straight from
this generator to Redis over NODES connections, no daemons, at the shape's
load: open loop, DEMAND x LIMIT per PERIOD_MS in total, for SECONDS.

    exact_log.py NODES REDIS_PORT LIMIT PERIOD_MS DEMAND SECONDS

Prints one JSON object: admitted (the answer times of the admitted
requests, s after the start), decisions, unanswered.
"""

import json
import os
import selectors
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LUA = os.path.join(HERE, "..", "lua")
KEY = "exact-log-key"
LOOP_TICK_S = 0.001
DRAIN_S = 2.0


def command(*args):
    """One command in RESP."""
    out = b"*%d\r\n" % len(args)
    for arg in args:
        arg = arg if isinstance(arg, bytes) else str(arg).encode()
        out += b"$%d\r\n%s\r\n" % (len(arg), arg)
    return out


def integers(buffer):
    """The arrays of integers at the head of `buffer`: (their first
    integers, the rest of the buffer). An error reply raises."""
    firsts = []
    while buffer.startswith(b"*") and b"\r\n" in buffer:
        head, _, rest = buffer.partition(b"\r\n")
        count = int(head[1:])
        parts = rest.split(b"\r\n", count)
        if len(parts) <= count:
            break  # not all here yet
        firsts.append(int(parts[0][1:]))
        buffer = parts[count]
    if buffer.startswith(b"-"):
        raise RuntimeError(buffer.split(b"\r\n")[0].decode())
    return firsts, buffer


def main():
    nodes, port, limit, period_ms, demand, seconds = (
        int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
        float(sys.argv[5]), float(sys.argv[6]))
    with open(os.path.join(LUA, "common.lua")) as common, \
            open(os.path.join(LUA, "sliding_log.lua")) as log:
        source = common.read() + log.read()
    setup = socket.create_connection(("127.0.0.1", port))
    setup.sendall(command("SCRIPT", "LOAD", source))
    reply = b""
    while not (reply.endswith(b"\r\n") and (reply.startswith(b"-") or reply.count(b"\r\n") == 2)):
        data = setup.recv(4096)
        if not data:
            raise RuntimeError("Redis closed the connection during SCRIPT LOAD")
        reply += data
    if reply.startswith(b"-"):
        raise RuntimeError("SCRIPT LOAD: " + reply.decode().strip())
    sha = reply.split(b"\r\n")[1]
    setup.close()
    request = command("EVALSHA", sha, 1, KEY, "lease", 1, 1, limit, period_ms, limit, 0)
    rate = demand * limit * 1000.0 / period_ms / nodes

    selector = selectors.DefaultSelector()
    conns = []
    for _ in range(nodes):
        s = socket.create_connection(("127.0.0.1", port))
        s.setblocking(False)
        conn = dict(sock=s, sent=0, answered=0, admitted=[], inbox=b"", out=b"", credit=0.0,
                    last=None)
        selector.register(s, selectors.EVENT_READ, conn)
        conns.append(conn)
    start = time.monotonic()
    while True:
        now = time.monotonic()
        t = now - start
        for conn in conns:
            if t < seconds:
                if conn["last"] is not None:
                    conn["credit"] += rate * (now - conn["last"])
                conn["last"] = now
                due = int(conn["credit"])
                conn["credit"] -= due
                conn["sent"] += due
                conn["out"] += request * due
            if conn["out"]:
                try:
                    conn["out"] = conn["out"][conn["sock"].send(conn["out"]):]
                except BlockingIOError:
                    pass
        pending = sum(c["sent"] - c["answered"] for c in conns)
        if t >= seconds and (pending == 0 or t >= seconds + DRAIN_S):
            break
        for key, _ in selector.select(LOOP_TICK_S):
            conn = key.data
            try:
                data = key.fileobj.recv(1 << 20)
            except BlockingIOError:
                continue
            received = time.monotonic() - start
            granted, conn["inbox"] = integers(conn["inbox"] + data)
            conn["answered"] += len(granted)
            conn["admitted"].extend(received for g in granted if g > 0)
    json.dump(dict(admitted=sorted(a for c in conns for a in c["admitted"]),
                   decisions=sum(c["sent"] for c in conns),
                   unanswered=sum(c["sent"] - c["answered"] for c in conns)), sys.stdout)


if __name__ == "__main__":
    main()
