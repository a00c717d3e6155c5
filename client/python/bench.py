#!/usr/bin/python3
"""bench.py: decisions per second of the Python client against a running
sluiced, next to a reference: a tight loop over a raw socket with the same
MessagePack library (msgpack), the most any Python client could do.

    SLUICE_SOCKET=/path/to/sock BENCH_SECONDS=3 /usr/bin/python3 bench.py

The daemon needs a rule `bench`: a token bucket with a huge limit. Prints:

    client=python mode=pipelined decisions_per_s=<n>      AsyncClient.acquire_many
    client=python mode=sequential decisions_per_s=<n>     Client.acquire, one at a time
    client=python mode=raw_pipelined decisions_per_s=<n>  raw socket + msgpack

Pipelined modes send BATCH requests at a time, two batches in flight.
pipelined and raw_pipelined, whose ratio is the figure judged, run in
BENCH_ROUNDS (default 3) alternating rounds and each reports its best
round: on a machine shared with other work, a burst of it then lowers one
round of one mode, not the ratio.
"""

import asyncio
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import msgpack  # noqa: E402

import sluice  # noqa: E402

BATCH = 1000
IN_FLIGHT_BATCHES = 2
KEYS = 1000
RULE = "bench"


def items():
    return [(RULE, "key:%d" % i, 1) for i in range(BATCH)]


async def pipelined(path, seconds):
    client = sluice.AsyncClient(path, on_unreachable="raise", timeout_ms=10000)
    batch = items()
    done = 0

    async def loop(deadline):
        nonlocal done
        while time.monotonic() < deadline:
            results = await client.acquire_many(batch)
            done += len(results)

    await client.acquire_many(batch)  # connect and warm the keys
    started = time.monotonic()
    await asyncio.gather(*(loop(started + seconds) for _ in range(IN_FLIGHT_BATCHES)))
    elapsed = time.monotonic() - started
    await client.close()
    return done / elapsed


def sequential(path, seconds):
    client = sluice.Client(path, on_unreachable="raise")
    client.acquire(RULE, "key:0")
    done = 0
    started = time.monotonic()
    deadline = started + seconds
    while True:
        for i in range(100):
            client.acquire(RULE, "key:%d" % i)
        done += 100
        now = time.monotonic()
        if now >= deadline:
            break
    client.close()
    return done / (now - started)


def raw_pipelined(path, seconds):
    """The reference: the same requests packed and the answers decoded with
    msgpack over a blocking socket, with nothing else (no msgid matching,
    no checks, no result objects)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    packer = msgpack.Packer(use_bin_type=True)
    unpacker = msgpack.Unpacker(raw=False)
    msgid = 0

    def send_batch():
        nonlocal msgid
        frames = []
        for i in range(BATCH):
            msgid = (msgid + 1) & 0xFFFFFFFF
            frames.append(packer.pack([0, msgid, "acquire", [RULE, "key:%d" % i, 1]]))
        sock.sendall(b"".join(frames))

    sent = received = 0

    def receive(until):
        """Reads answers until `until` of them arrived in all."""
        nonlocal received
        while received < until:
            unpacker.feed(sock.recv(262144))
            for response in unpacker:
                received += 1
                response[3]["allowed"]

    for _ in range(IN_FLIGHT_BATCHES):
        send_batch()
        sent += BATCH
    started = time.monotonic()
    deadline = started + seconds
    while time.monotonic() < deadline:
        receive(sent - BATCH * (IN_FLIGHT_BATCHES - 1))
        send_batch()
        sent += BATCH
    receive(sent)
    done = received - BATCH * IN_FLIGHT_BATCHES  # those sent before the clock started
    elapsed = time.monotonic() - started
    sock.close()
    return done / elapsed


def main():
    path = os.environ.get("SLUICE_SOCKET", "/run/sluice/sluice.sock")
    seconds = float(os.environ.get("BENCH_SECONDS", "3"))
    rounds = int(os.environ.get("BENCH_ROUNDS", "3"))
    best_pipelined = best_raw = 0
    for _ in range(rounds):
        best_pipelined = max(best_pipelined, asyncio.run(pipelined(path, seconds)))
        best_raw = max(best_raw, raw_pipelined(path, seconds))
    rows = [
        ("pipelined", best_pipelined),
        ("sequential", sequential(path, seconds)),
        ("raw_pipelined", best_raw),
    ]
    for mode, rate in rows:
        print("client=python mode=%s decisions_per_s=%d" % (mode, rate))


if __name__ == "__main__":
    main()
