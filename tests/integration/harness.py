"""Pieces the Python integration tests share: the daemon under test (Daemon:
its temp dir, config, log, clients and stop), a bare MessagePack-RPC client,
real redis-server, Sentinel and Cluster processes on free loopback ports, and
the process and temp-dir bookkeeping that lets a test module end what a test
left behind and fail naming it (tear_down_module).

Imported by every tests/integration/*_test.py (their directory is on
sys.path when they run as scripts). SLUICED names the daemon binary. Run
with /usr/bin/python3, which has python3-msgpack.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

import msgpack

REDIS_SERVER = os.environ.get("REDIS_SERVER", "/usr/bin/redis-server")
REDIS_CLI = os.environ.get("REDIS_CLI", "/usr/bin/redis-cli")
SLUICED = os.environ.get("SLUICED", "build/daemon/sluiced")
# SLUICE_TEST_STOP=term: Daemon.stop() ends a daemon with SIGTERM (SIGKILL
# only if it has not exited within STOP_GRACE_S), so that a tool wrapping it
# (tests/memcheck.sh runs it under valgrind) sees a normal exit and reports.
STOP_GRACEFULLY = os.environ.get("SLUICE_TEST_STOP") == "term"
STOP_GRACE_S = 60

# Every process and temp dir made through spawn() and make_dir() (Daemon,
# Redis and the rest use them); tear_down_module() ends and removes what is
# left of them at the end of a test module.
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


STATE_VERSION = 3  # kRedisStateVersion in daemon/redis_keys.h


def redis_key(kind, rule, key, prefix="sluice:", version=STATE_VERSION):
    """The name of a (rule, key)'s Redis key, as daemon/redis_keys.h makes
    it: kind "q" (global state) or "b" (penalty block); str or bytes."""
    rule = rule.encode() if isinstance(rule, str) else rule
    key = key.encode() if isinstance(key, str) else key
    pair = b"%d:%s:%s" % (len(rule), rule, key)
    return b"%sv%d:%s:{%016x}:%s" % (prefix.encode(), version, kind.encode(), _fnv1a64(pair),
                                     pair)


def renew_channel(prefix="sluice:", version=STATE_VERSION):
    """The channel the rate scripts publish a state key's name on when its
    rates are to be divided again (daemon/redis_keys.h's redisRenewChannel)."""
    return b"%sv%d:renew" % (prefix.encode(), version)


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


def tear_down_module():
    """What a test module's tearDownModule calls: ends every process spawn()
    started and removes every dir make_dir() made that is still there, then
    raises naming them. Each test cleans up after itself, so anything left
    here is a cleanup bug in a test."""
    alive = [p.args for p in STARTED_PROCS if p.poll() is None]
    left = [d for d in MADE_DIRS if os.path.exists(d)]
    for proc in STARTED_PROCS:
        end_process(proc)
    for path in MADE_DIRS:
        shutil.rmtree(path, ignore_errors=True)
    if alive or left:
        raise RuntimeError("leaked processes %s, temp dirs %s" % (alive, left))


def free_port():
    """A loopback TCP port nothing listens on at the moment of the call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_cluster_port():
    """A loopback port free together with its cluster bus port (+10000)."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


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

    def __init__(self, path=None, sock=None):
        """Connects to the socket at `path`, or talks on `sock`, a connected
        one (its first msgid is 1: no answer may be pending on it)."""
        if sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(5)
            try:
                sock.connect(path)
            except OSError:
                sock.close()
                raise
        self.sock = sock
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
        """One request; returns (error, result) of its response. An error
        notification instead ([2, "error", [{code, message}]]: the daemon
        refused the connection, or cannot read on, and closes it) raises
        ConnectionError with its message, as the close after it would."""
        self.msgid += 1
        self.send([0, self.msgid, method, list(params)])
        response = self.recv()
        if response[:2] == [2, "error"]:
            raise ConnectionError("closed by the daemon: %s" % response[2][0]["message"])
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


class Daemon:
    """A sluiced in its own temp dir under /tmp, which holds its socket
    (s.sock), its config (sluice.toml) and its log (stdout and stderr).

    start() writes the config and runs the daemon, by default until its
    socket accepts; stop() ends it with SIGKILL, closes the clients that
    connect() opened and removes the dir. A test that checks a graceful stop
    calls terminate() first. `name` tells daemons apart in messages; with
    `log_tail`, logs() gives only the log's last that many lines."""

    def __init__(self, name="sluiced", dir_prefix="sl.", log_tail=None):
        self.name = name
        self.log_tail = log_tail
        self.dir = make_dir(dir_prefix)
        self.socket = os.path.join(self.dir, "s.sock")
        self.config = os.path.join(self.dir, "sluice.toml")
        self.log = open(os.path.join(self.dir, "log"), "w+")
        self.proc = None
        self.client = None  # opened by start(connect=True)
        self.clients = []

    def write_config(self, text):
        with open(self.config, "w") as f:
            f.write(text)

    def start(self, config=None, wait=True, accept_timeout_s=10, connect=False, prefix=(),
              args=(), **popen):
        """Runs `prefix` SLUICED --config <config file> `args` (after writing
        `config` there, when given), with more Popen arguments in `popen`
        (env, pass_fds); returns the process. Unless wait=False, returns once
        the socket accepts (raising with the log if the daemon exits first);
        with connect=True, opens self.client, which health() and acquire() use."""
        if config is not None:
            self.write_config(config)
        self.proc = spawn([*prefix, SLUICED, "--config", self.config, *args],
                          stdout=self.log, stderr=subprocess.STDOUT, **popen)
        if wait:
            wait_accepting(self.socket, self.proc, self.logs, accept_timeout_s)
        if connect:
            self.client = self.connect()
        return self.proc

    def connect(self):
        """A new Client on the daemon's socket; stop() closes it."""
        client = Client(self.socket)
        self.clients.append(client)
        return client

    def ask(self, method, *params):
        """The result of one request sent on a connection of its own."""
        client = Client(self.socket)
        try:
            return client.result(method, *params)
        finally:
            client.close()

    def health(self):
        return self.client.result("health")

    def acquire(self, rule, key, cost=1):
        return self.client.result("acquire", rule, key, cost)

    def maps_library(self, name):
        """Whether the running daemon has a library whose path holds `name`
        mapped (/proc/PID/maps): "libtsan" for a ThreadSanitizer build."""
        with open("/proc/%d/maps" % self.proc.pid) as maps:
            return name in maps.read()

    def logs(self):
        self.log.flush()
        self.log.seek(0)
        if self.log_tail is None:
            return self.log.read()
        return "".join(self.log.readlines()[-self.log_tail:])

    def terminate(self, timeout_s=10):
        """A graceful stop: SIGTERM, SIGKILL if the daemon still runs after
        timeout_s; returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def stop(self):
        for client in self.clients:
            client.close()
        if self.proc is not None:
            if STOP_GRACEFULLY:
                self.terminate(STOP_GRACE_S)
            end_process(self.proc)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


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


class DaemonPairCase(unittest.TestCase):
    """Two daemons on one fresh Redis, both leasing and counting each other
    (nodes 2). A subclass sets `config`, a template of {socket}, {port} (of
    Redis), {index} and the keys of `config_args`, and `name` (the daemons
    are name-0 and name-1); or it starts daemons of its own kind by
    overriding start_daemon (a daemon with a client, logs() and stop())."""

    config = None
    config_args = {}
    name = "pair"

    def start_daemon(self, index, redis_port):
        daemon = Daemon("%s-%d" % (self.name, index))
        daemon.start(self.config.format(socket=daemon.socket, port=redis_port, index=index,
                                        **self.config_args), connect=True)
        return daemon

    def setUp(self):
        self.redis = Redis()
        self.addCleanup(self.redis.stop)
        self.daemons = []
        for index in range(2):
            daemon = self.start_daemon(index, self.redis.port)
            self.addCleanup(daemon.stop)
            self.daemons.append(daemon)
        self.assertTrue(wait_for(lambda: all(
            d.client.result("health")["nodes"] == 2 and
            d.client.result("health")["breaker"] == "closed" for d in self.daemons), 10),
            self.daemons[0].logs())


class PortTaken(RuntimeError):
    """Another process's server answers on the port a server was to take."""


class Redis:
    """A real redis-server on a loopback port (a free one unless given), in
    its own temp dir, without persistence: a restart on the same port starts
    with no data. Started at once unless start=False. `args` are more
    redis-server arguments, e.g. ["--replicaof", "127.0.0.1", "6379"];
    `auth` is what command() sends AUTH with first, (password,) or
    (user, password), when the server asks for it."""

    def __init__(self, port=None, start=True, args=(), auth=None):
        self.dir = make_dir("rd.")
        self.port = port or free_port()
        self.may_move = port is None  # the port was picked here, not given
        self.args = list(args)
        self.auth = tuple(auth) if auth else ()
        self.proc = None
        if start:
            self.start()

    def start(self):
        # Another test process may have picked the same free port: then one
        # server cannot bind it, and the other answers this one's PINGs.
        # A first start that lost the race moves to another port.
        for attempt in range(5):
            self.proc = spawn(
                [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", self.dir] + self.args,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                self.wait_answering()
                self.may_move = False  # a restart keeps its port
                return
            except PortTaken:
                end_process(self.proc)
                if not self.may_move or attempt == 4:
                    raise
                self.port = free_port()

    def wait_answering(self):
        """Waits until this server (not another on its port) answers PING."""
        deadline = time.monotonic() + 10
        while True:
            if self.command("PING") == "PONG":
                info = self.command("INFO", "server") or ""
                owner = re.search(r"process_id:(\d+)", info)
                if owner and int(owner.group(1)) == self.proc.pid:
                    return
                raise PortTaken("port %d answers for process %s, not redis-server %d" % (
                    self.port, owner.group(1) if owner else "?", self.proc.pid))
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start on port %d" % self.port)
            time.sleep(0.01)

    def command(self, *words):
        """One command (words: str or bytes) on a fresh connection: the reply
        (read_reply), None when unreachable. Never call it while the server
        is SIGSTOPped."""
        def encode(words):
            words = [w if isinstance(w, bytes) else w.encode() for w in words]
            return b"".join([b"*%d\r\n" % len(words)] + [
                b"$%d\r\n%s\r\n" % (len(w), w) for w in words])
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.sendall((encode(("AUTH",) + self.auth) if self.auth else b"") + encode(words))
                with s.makefile("rb") as f:
                    if self.auth:
                        read_reply(f)
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
                 failover_timeout_ms=2000, port=None, start=True, password=None,
                 master_auth=None):
        """`password`: the sentinel's own requirepass; `master_auth`: the
        (user, password) it authenticates to the master and replicas with."""
        self.master_port, self.name, self.quorum = master_port, name, quorum
        self.down_after_ms, self.failover_timeout_ms = down_after_ms, failover_timeout_ms
        self.password, self.master_auth = password, master_auth
        super().__init__(port=port, start=start, auth=(password,) if password else None)

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
                if self.password:
                    f.write("requirepass %s\n" % self.password)
                if self.master_auth:
                    f.write("sentinel auth-user %s %s\nsentinel auth-pass %s %s\n"
                            % (self.name, self.master_auth[0], self.name, self.master_auth[1]))
        self.proc = spawn([REDIS_SERVER, conf, "--sentinel"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_answering()

    def master_address(self, name=None):
        """SENTINEL get-master-addr-by-name: "ip:port", or None."""
        reply = self.command("SENTINEL", "get-master-addr-by-name", name or self.name)
        return "%s:%s" % tuple(reply) if isinstance(reply, list) else None


class Cluster:
    """A Redis Cluster on loopback: `masters` masters with `replicas` replicas
    each (redis-server --cluster-enabled yes, made with redis-cli --cluster
    create), node timeout `node_timeout_ms`, more redis-server `args`.
    nodes[i] are Redis objects; master_of(slot) is the Redis that serves a
    slot now."""

    def __init__(self, masters=3, replicas=1, node_timeout_ms=1000, args=()):
        self.nodes = []
        for _ in range(masters * (1 + replicas)):
            port = free_cluster_port()
            self.nodes.append(Redis(port=port, args=[
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(node_timeout_ms)] + list(args)))
        create = subprocess.run(
            [REDIS_CLI, "--cluster", "create"] +
            ["127.0.0.1:%d" % n.port for n in self.nodes] +
            ["--cluster-replicas", str(replicas), "--cluster-yes"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        if create.returncode != 0:
            self.stop()
            raise RuntimeError("redis-cli --cluster create failed: %s" % create.stdout.decode())
        if not wait_for(lambda: self.healthy(self.nodes), 30):
            self.stop()
            raise RuntimeError("the cluster never reached cluster_state:ok")

    def healthy(self, nodes):
        """Every one of `nodes` says cluster_state:ok and knows every slot, and
        every replica among them has synced with its master (a replica that
        never synced cannot take over)."""
        for node in nodes:
            info = node.command("CLUSTER", "INFO") or ""
            if "cluster_state:ok" not in info or "cluster_slots_ok:16384" not in info:
                return False
            replication = node.command("INFO", "replication") or ""
            if "role:slave" in replication and "master_link_status:up" not in replication:
                return False
        return True

    def alive(self):
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def node_id(self, node):
        return node.command("CLUSTER", "MYID")

    def master_of(self, slot, ask=None):
        """The node serving `slot` according to `ask` (default: any live node)."""
        for node in [ask] if ask else self.alive():
            for entry in node.command("CLUSTER", "SLOTS") or []:
                if entry[0] <= slot <= entry[1]:
                    return self.by_port(entry[2][1])
        return None

    def masters(self):
        ports = set()
        for entry in self.alive()[0].command("CLUSTER", "SLOTS") or []:
            ports.add(entry[2][1])
        return [self.by_port(p) for p in sorted(ports)]

    def by_port(self, port):
        return next(n for n in self.nodes if n.port == port)

    def seeds(self, count=3):
        """The [redis] line naming the first `count` nodes as seeds."""
        return "cluster_nodes = [%s]" % ", ".join(
            '"127.0.0.1:%d"' % n.port for n in self.nodes[:count])

    def stop(self):
        for node in self.nodes:
            node.stop()
