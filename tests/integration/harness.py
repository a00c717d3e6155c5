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


class Redis:
    """A real redis-server on a loopback port (a free one unless given), in
    its own temp dir, without persistence: a restart on the same port starts
    with no data. Started at once unless start=False."""

    def __init__(self, port=None, start=True):
        self.dir = make_dir("rd.")
        self.port = port or free_port()
        self.proc = None
        if start:
            self.start()

    def start(self):
        self.proc = spawn(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while self.command("PING") != "PONG":
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start on port %d" % self.port)
            time.sleep(0.01)

    def command(self, *words):
        """One command on a fresh connection: the reply (str or int), None when
        unreachable. Never call it while the server is SIGSTOPped."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.sendall(b"".join([b"*%d\r\n" % len(words)] + [
                    b"$%d\r\n%s\r\n" % (len(w.encode()), w.encode()) for w in words]))
                reply = b""
                while b"\r\n" not in reply:
                    chunk = s.recv(65536)
                    if not chunk:
                        return None
                    reply += chunk
                head, rest = reply.split(b"\r\n", 1)
                kind, body = head[:1], head[1:].decode()
                if kind == b"$":
                    size = int(body)
                    while len(rest) < size + 2:
                        chunk = s.recv(65536)
                        if not chunk:
                            return None
                        rest += chunk
                    return rest[:size].decode()
                if kind == b":":
                    return int(body)
                return body  # +status or -error
        except OSError:
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
