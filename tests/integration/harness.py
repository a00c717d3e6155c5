"""Pieces the Python integration tests share: a bare MessagePack-RPC client,
a real redis-server on a free loopback port, and the process and temp-dir
bookkeeping that lets a test module check it left nothing behind.

Imported by protocol_test.py and fleet_test.py (their directory is on
sys.path when they run as scripts). Run with /usr/bin/python3, which has
python3-msgpack.
"""

import os
import shutil
import socket
import subprocess
import tempfile
import time

import msgpack

REDIS_SERVER = os.environ.get("REDIS_SERVER", "/usr/bin/redis-server")

# Every process and temp dir made through spawn() and make_dir(); a module's
# tearDownModule may check that none is left.
STARTED_PROCS = []
MADE_DIRS = []


def redis_section(port):
    """The [redis] section of a one-node test config: a real Redis on `port`,
    heartbeats every 100 ms so that health and membership follow quickly."""
    return ('\n[redis]\nurl = "redis://127.0.0.1:%d"\nexpected_nodes = 1\n'
            'heartbeat_interval = "100ms"\n' % port)


def _fnv1a64(data):
    value = 0xcbf29ce484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return value


def redis_key(kind, rule, key, prefix="sluice:"):
    """The name of a (rule, key)'s Redis key, as daemon/redis_keys.h makes
    it: kind "q" (global state) or "b" (penalty block); str or bytes."""
    rule = rule.encode() if isinstance(rule, str) else rule
    key = key.encode() if isinstance(key, str) else key
    pair = b"%d:%s:%s" % (len(rule), rule, key)
    return b"%s%s:{%016x}:%s" % (prefix.encode(), kind.encode(), _fnv1a64(pair), pair)


def _crc16(data):
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021 if crc & 0x8000 else crc << 1) & 0xFFFF
    return crc


def cluster_slot(name):
    """Redis Cluster's slot of a key name (bytes): CRC16 of its first
    non-empty {tag}, else of the whole name, mod 16384."""
    start = name.find(b"{")
    if start >= 0:
        end = name.find(b"}", start + 1)
        if end > start + 1:
            name = name[start + 1:end]
    return _crc16(name) % 16384


def make_dir(prefix):
    """A short temp dir under /tmp (Unix socket paths are limited to 108 bytes)."""
    path = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    MADE_DIRS.append(path)
    return path


def spawn(args, **kwargs):
    proc = subprocess.Popen(args, **kwargs)
    STARTED_PROCS.append(proc)
    return proc


def end_process(proc):
    """SIGKILL (which also ends a SIGSTOPped process), reap, close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


def free_port():
    """A loopback TCP port nothing listens on at the moment of the call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout):
    """Polls predicate every 10 ms; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.01)


def wait_accepting(path, proc, logs, timeout=10):
    """Waits until a daemon accepts on its socket. The socket file appears at
    bind(), a moment before listen(), so its existence is not enough."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            Client(path).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("sluiced did not start: " + logs())
            time.sleep(0.01)


class Client:
    """A bare MessagePack-RPC client: send frames, read whole responses."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        try:
            self.sock.connect(path)
        except OSError:
            self.sock.close()
            raise
        self.unpacker = msgpack.Unpacker(raw=False)
        self.msgid = 0

    def send(self, obj):
        self.sock.sendall(msgpack.packb(obj, use_bin_type=True))

    def recv(self):
        for obj in self.unpacker:
            return obj
        while True:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by the daemon")
            self.unpacker.feed(data)
            for obj in self.unpacker:
                return obj

    def call(self, method, *params):
        """One request; returns (error, result) of its response."""
        self.msgid += 1
        self.send([0, self.msgid, method, list(params)])
        response = self.recv()
        assert response[0] == 1 and response[1] == self.msgid, response
        return response[2], response[3]

    def result(self, method, *params):
        error, result = self.call(method, *params)
        assert error is None, error
        return result

    def closed_by_peer(self, timeout=5):
        self.sock.settimeout(timeout)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def close(self):
        self.sock.close()


def read_reply(f):
    """One RESP2 reply from a binary file object: str for bulk strings, status
    and error replies (an error keeps its text without the '-'), int, list
    for arrays, None for nil."""
    line = f.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed mid-reply")
    kind, body = line[:1], line[1:-2].decode()
    if kind == b"$":
        if int(body) < 0:
            return None
        data = f.read(int(body) + 2)
        if len(data) != int(body) + 2:
            raise ConnectionError("connection closed mid-reply")
        return data[:-2].decode()
    if kind == b"*":
        return None if int(body) < 0 else [read_reply(f) for _ in range(int(body))]
    if kind == b":":
        return int(body)
    return body  # +status or -error


class Redis:
    """A real redis-server on a loopback port (a free one unless given), in
    its own temp dir, without persistence: a restart on the same port starts
    with no data. Started at once unless start=False. `args` are more
    redis-server arguments, e.g. ["--replicaof", "127.0.0.1", "6379"]."""

    def __init__(self, port=None, start=True, args=()):
        self.dir = make_dir("rd.")
        self.port = port or free_port()
        self.args = list(args)
        self.proc = None
        if start:
            self.start()

    def start(self):
        self.proc = spawn(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir] + self.args,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_answering()

    def wait_answering(self):
        deadline = time.monotonic() + 10
        while self.command("PING") != "PONG":
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start on port %d" % self.port)
            time.sleep(0.01)

    def command(self, *words):
        """One command on a fresh connection: the reply (read_reply), None when
        unreachable. Never call it while the server is SIGSTOPped."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.sendall(b"".join([b"*%d\r\n" % len(words)] + [
                    b"$%d\r\n%s\r\n" % (len(w.encode()), w.encode()) for w in words]))
                with s.makefile("rb") as f:
                    return read_reply(f)
        except (OSError, ConnectionError):
            return None

    def script_calls(self):
        """Calls of EVALSHA and EVAL so far, from INFO commandstats."""
        calls = 0
        for line in (self.command("INFO", "commandstats") or "").splitlines():
            name, _, fields = line.partition(":")
            if name in ("cmdstat_evalsha", "cmdstat_eval"):
                calls += int(dict(f.split("=") for f in fields.split(","))["calls"])
        return calls

    def kill(self):
        if self.proc is not None:
            end_process(self.proc)

    def restart(self):
        """Starts again on the same port; nothing was saved, so no data."""
        self.kill()
        self.start()

    def signal(self, signum):
        self.proc.send_signal(signum)

    def stop(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class Sentinel(Redis):
    """A Redis Sentinel (redis-server --sentinel; there is no redis-sentinel
    binary) on a loopback port (a free one unless given), in its own temp
    dir, monitoring the master `name` at master_port with the given quorum
    and timings. Sentinel rewrites its config file, so it keeps what it
    learned across a restart."""

    def __init__(self, master_port, name="mymaster", quorum=2, down_after_ms=500,
                 failover_timeout_ms=2000, port=None, start=True):
        self.master_port, self.name, self.quorum = master_port, name, quorum
        self.down_after_ms, self.failover_timeout_ms = down_after_ms, failover_timeout_ms
        super().__init__(port=port, start=start)

    def start(self):
        conf = os.path.join(self.dir, "sentinel.conf")
        if not os.path.exists(conf):
            with open(conf, "w") as f:
                f.write("port %d\nbind 127.0.0.1\ndir %s\n"
                        "sentinel monitor %s 127.0.0.1 %d %d\n"
                        "sentinel down-after-milliseconds %s %d\n"
                        "sentinel failover-timeout %s %d\n"
                        % (self.port, self.dir, self.name, self.master_port, self.quorum,
                           self.name, self.down_after_ms, self.name, self.failover_timeout_ms))
        self.proc = spawn([REDIS_SERVER, conf, "--sentinel"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_answering()

    def master_address(self, name=None):
        """SENTINEL get-master-addr-by-name: "ip:port", or None."""
        reply = self.command("SENTINEL", "get-master-addr-by-name", name or self.name)
        return "%s:%s" % tuple(reply) if isinstance(reply, list) else None
