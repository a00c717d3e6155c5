"""client.py: the synchronous sluice client, one connection to sluiced's
Unix socket shared by any number of threads.

Thread model: every method may be called from any thread at once. Requests
are pipelined: each call takes msgids, writes its frames under the write
lock (frames never interleave) and waits for its answers, which are matched
by msgid, so the daemon may answer in any order. There is no reader thread:
one waiting caller at a time reads the socket for everybody (it holds the
connection's `reading` flag), hands each answer to its call under the
client lock and wakes the others; when its own answers are in it leaves
and another waiter takes over. `_lock` (with `_cond`) guards the connection
slot, msgids, the calls in flight and the counters; `_write_lock` is taken
before `_lock`, never after, and is held only while writing or connecting.

Timeouts bound the whole call (connect, write, wait), in milliseconds; a
negative timeout waits without bound. A call that times out leaves the
connection open unless part of its frame was written: its msgids are
forgotten, so a late answer is discarded, and other calls go on.

Reconnection (libsluice's rule, sluice.h): a connection that died (EOF,
socket error, malformed stream, a frame written in part) is replaced at the
start of the next call, before anything is written. A request is written
again only when not one byte of it reached the socket: a daemon that
restarted since the last call is noticed when the first write fails
(EPIPE) without taking a byte, and then the call reconnects once and sends
it. Requests in flight when a connection dies fail with ConnectionClosed and
are never re-sent, because the daemon may have acted on them.

Sockets are closed only by a thread that holds the write lock and knows no
reader is inside recv() on them (or by the reader itself), so a descriptor
is never closed under another thread's feet and reused.
"""

import errno
import select
import socket
import threading

import msgpack

from . import _wire
from .errors import CallTimeout, ConnectError, ConnectionClosed, ProtocolError, UNREACHABLE

# Requests of one acquire_many in flight at once: bounds what the daemon
# holds for the connection (its max_output_bytes) while a batch is written.
BATCH_WINDOW = 512
_PEER_GONE = (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN)


class _WriteFailed(Exception):
    def __init__(self, written, cause):
        super().__init__(cause)
        self.written = written
        self.cause = cause


class _Conn:
    """One connection: its socket, the decoder its reader feeds, and the
    calls in flight on it (msgid -> (batch, index)); `dead` is the
    exception it died of."""

    __slots__ = ("sock", "unpacker", "pending", "reading", "dead", "close_when_idle")

    def __init__(self, sock):
        self.sock = sock
        self.unpacker = msgpack.Unpacker(raw=False, max_buffer_size=_wire.MAX_BUFFER_BYTES)
        self.pending = {}
        self.reading = False
        self.dead = None
        self.close_when_idle = False


class _Batch:
    """The requests of one call; results[i] is the result of request i
    (convert() of its answer's result), or the exception that ended it."""

    __slots__ = ("conn", "results", "left", "convert", "first_msgid", "end_msgid")

    def __init__(self, count, convert):
        self.conn = None
        self.results = [None] * count
        self.left = count
        self.convert = convert
        self.first_msgid = self.end_msgid = None


def _wait_writable(sock, timeout_s):
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    return bool(poller.poll(None if timeout_s is None else timeout_s * 1000.0))


def _wait_readable(sock, timeout_s):
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(None if timeout_s is None else timeout_s * 1000.0))


class Client:
    """A thread-safe client of sluiced.

        client = sluice.Client("/run/sluice/sluice.sock")
        if not client.acquire("api", "user:42").allowed: ...

    `timeout_ms` is the default timeout of every call (an acquire that may
    wait adds its max_wait_ms). `on_unreachable` decides what acquire,
    acquire_all and acquire_many return when the daemon cannot be asked
    (ConnectError, CallTimeout, ConnectionClosed): "fail_open" (the default)
    an allowed decision, "fail_closed" a denied one (retry after 1 s), both
    with mode "unreachable" and the exception in `error`, counted in
    `unreachable_decisions`; "raise" raises. Other calls always raise.
    `first_msgid` is where msgids start (tests use it to cross 2^32).
    Nothing connects until the first call (or connect()).
    """

    def __init__(self, socket_path=_wire.DEFAULT_SOCKET, *, timeout_ms=_wire.DEFAULT_TIMEOUT_MS,
                 on_unreachable=_wire.FAIL_OPEN, first_msgid=1):
        self.socket_path = socket_path
        self.timeout_ms = timeout_ms
        self.on_unreachable = _wire.check_policy(on_unreachable)
        self._msgids = _wire.MsgidCounter(_wire.check_msgid(first_msgid))
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._write_lock = threading.Lock()
        self._conn = None
        self._closed = False
        self._unreachable_decisions = 0

    # ---- public calls ------------------------------------------------------

    def acquire(self, rule, key, cost=1, *, max_wait_ms=None, timeout_ms=None):
        """May `key` spend `cost` units of `rule` now? Spends them when
        allowed. With max_wait_ms (token_bucket and gcra rules) the daemon
        answers "allowed" once the units are due, if within that time."""
        params = _wire.item_params(rule, key, cost, max_wait_ms)
        timeout_ms = _wire.call_timeout_ms(timeout_ms, self.timeout_ms, max_wait_ms)
        try:
            return self._call("acquire", params, timeout_ms, _wire.as_decision)
        except UNREACHABLE as exc:
            return self._policy(_wire.policy_decision(self.on_unreachable, exc), exc)

    def acquire_all(self, items, *, timeout_ms=None):
        """All or nothing over items, each (rule, key) or (rule, key, cost)."""
        params = [_wire.items_params(items)]
        if not params[0]:
            raise ValueError("acquire_all needs at least one item")
        timeout_ms = _wire.call_timeout_ms(timeout_ms, self.timeout_ms)
        try:
            return self._call("acquire_all", params, timeout_ms, _wire.as_all(len(params[0])))
        except UNREACHABLE as exc:
            return self._policy(_wire.policy_all(self.on_unreachable, exc, len(params[0])), exc)

    def acquire_many(self, items, *, timeout_ms=None, return_exceptions=False):
        """Independent acquires of items ((rule, key) or (rule, key, cost)),
        pipelined on the connection; the Decisions in the items' order. A
        request the daemon answered with an error raises its ServerError,
        or stands in the list with return_exceptions=True."""
        params = _wire.items_params(items)
        timeout_ms = _wire.call_timeout_ms(timeout_ms, self.timeout_ms)
        try:
            results = self._call_many("acquire", params, timeout_ms, _wire.as_decision)
        except UNREACHABLE as exc:
            results = [exc] * len(params)
        return _wire.settle_many(results, self.on_unreachable, self._policy, return_exceptions)

    def peek(self, rule, key, *, timeout_ms=None):
        """The key's state, as acquire with cost 0 would see it; spends nothing."""
        return self._call("peek", _wire.key_params(rule, key),
                          _wire.call_timeout_ms(timeout_ms, self.timeout_ms), _wire.as_decision)

    def release(self, rule, key, cost=1, *, timeout_ms=None):
        """Gives `cost` units of a concurrency rule back."""
        return self._call("release", _wire.item_params(rule, key, cost),
                          _wire.call_timeout_ms(timeout_ms, self.timeout_ms), _wire.as_release)

    def reset(self, rule, key, *, timeout_ms=None):
        """Admin only: forgets the key's state; the fresh state's Decision."""
        return self._call("reset", _wire.key_params(rule, key),
                          _wire.call_timeout_ms(timeout_ms, self.timeout_ms), _wire.as_decision)

    def reserve(self, rule, key, estimate, ttl_ms=_wire.DEFAULT_TTL_MS, *, timeout_ms=None):
        """Decides like acquire of `estimate` (never waiting) and, when
        allowed, opens a reservation: a Reservation whose `id` settle or
        cancel takes. Unsettled after ttl_ms, it settles at its estimate.
        When the daemon cannot be asked, on_unreachable decides (counted):
        a Reservation with id None, which settle and cancel do not send."""
        params = _wire.reserve_params(rule, key, estimate, ttl_ms)
        timeout_ms = _wire.call_timeout_ms(timeout_ms, self.timeout_ms)
        try:
            return self._call("reserve", params, timeout_ms, _wire.as_reservation)
        except UNREACHABLE as exc:
            return self._policy(_wire.policy_reservation(self.on_unreachable, exc), exc)

    def settle(self, reservation_id, actual, *, timeout_ms=None):
        """Settles reservation `reservation_id` at `actual` units: gives back
        estimate - actual, or charges the excess as debt (the key's
        remaining goes below 0). A Settlement; an id not open raises
        UnknownReservation; id None asks nothing (no_settlement)."""
        if reservation_id is None or reservation_id == 0:
            return _wire.no_settlement()
        return self._call("settle", _wire.settle_params(reservation_id, actual),
                          _wire.call_timeout_ms(timeout_ms, self.timeout_ms), _wire.as_settlement)

    def cancel(self, reservation_id, *, timeout_ms=None):
        """Gives reservation `reservation_id` back whole (settle at 0)."""
        if reservation_id is None or reservation_id == 0:
            return _wire.no_settlement()
        return self._call("cancel", _wire.settle_params(reservation_id),
                          _wire.call_timeout_ms(timeout_ms, self.timeout_ms), _wire.as_settlement)

    def health(self, *, timeout_ms=None):
        return self._call("health", [], _wire.call_timeout_ms(timeout_ms, self.timeout_ms),
                          _wire.as_health)

    def call(self, method, params=(), *, timeout_ms=None):
        """Any method (stats, rules, ...): its result as decoded MessagePack."""
        return self._call(method, list(params),
                          _wire.call_timeout_ms(timeout_ms, self.timeout_ms), _wire.as_is)

    @property
    def unreachable_decisions(self):
        """Decisions the on_unreachable policy made so far."""
        with self._lock:
            return self._unreachable_decisions

    def connect(self, *, timeout_ms=None):
        """Connects now (calls connect on their own when needed)."""
        deadline = _wire.deadline_of(_wire.call_timeout_ms(timeout_ms, self.timeout_ms))
        with self._write_lock:
            self._ready_conn(deadline)

    def close(self):
        """Closes the connection; calls in flight fail with ConnectionClosed.
        The client is not used afterwards."""
        with self._write_lock:
            with self._lock:
                self._closed = True
                conn = self._conn
            if conn is not None:
                self._kill(conn, ConnectionClosed("the client was closed"))
                self._retire(conn)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    # ---- the machinery -----------------------------------------------------

    def _policy(self, decision, exc):
        if decision is None:
            raise exc
        with self._lock:
            self._unreachable_decisions += 1
        return decision

    def _call(self, method, params, timeout_ms, convert):
        result = self._call_many(method, [params], timeout_ms, convert)[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def _call_many(self, method, params_list, timeout_ms, convert):
        """Sends one request per params (all `method`), pipelined in windows
        of BATCH_WINDOW, and returns their results (_wire.take_answers): an
        exception stands for each request that failed. Raises CallTimeout,
        or the ConnectError / ConnectionClosed that kept the first frames
        from being sent."""
        deadline = _wire.deadline_of(timeout_ms)
        count = len(params_list)
        batch = _Batch(count, convert)
        sent = 0
        try:
            while sent < count:
                end = min(count, sent + BATCH_WINDOW // 2 if sent else BATCH_WINDOW)
                self._send_chunk(batch, method, params_list, sent, end, deadline)
                sent = end
                if sent < count:
                    self._wait(batch, deadline, in_flight=BATCH_WINDOW // 2, sent=sent)
            self._wait(batch, deadline, in_flight=0, sent=count)
        except BaseException:
            self._forget(batch)
            raise
        return batch.results

    def _send_chunk(self, batch, method, params_list, start, end, deadline):
        """Writes requests [start, end) of a batch. The first chunk of a
        batch may reconnect once when not one byte of it was written."""
        may_reconnect = start == 0
        with self._write_lock:
            while True:
                conn = batch.conn if start > 0 else self._ready_conn(deadline)
                if start > 0 and conn.dead is not None:
                    raise conn.dead
                packer = msgpack.Packer(use_bin_type=True, autoreset=False)
                with self._lock:
                    data = self._msgids.frames(conn.pending, batch, method, params_list,
                                               start, end, packer)
                batch.conn = conn
                try:
                    self._write(conn.sock, data, deadline)
                    return
                except _WriteFailed as failed:
                    cause = failed.cause
                    if failed.written == 0 and isinstance(cause, CallTimeout):
                        raise cause from None  # nothing sent: the connection is fine
                    if failed.written == 0 and may_reconnect and isinstance(cause, OSError) \
                            and cause.errno in _PEER_GONE:
                        # The daemon went away since the last call and saw
                        # nothing of these: a new connection may send them.
                        may_reconnect = False
                        self._kill(conn, ConnectionClosed("connection lost: %s" % cause))
                        self._reset(batch)
                        continue
                    if isinstance(cause, CallTimeout):
                        # Part of a frame is on the wire: nothing can follow it.
                        self._kill(conn, ConnectionClosed(
                            "connection dropped: a request was written in part"))
                        raise cause from None
                    lost = ConnectionClosed("connection lost while writing: %s" % cause)
                    self._kill(conn, lost)
                    raise lost from None

    def _reset(self, batch):
        count = len(batch.results)
        batch.results = [None] * count
        batch.left = count
        batch.conn = None
        batch.first_msgid = batch.end_msgid = None

    @staticmethod
    def _write(sock, data, deadline):
        view = memoryview(data)
        written = 0
        while written < len(view):
            try:
                written += sock.send(view[written:])
            except (BlockingIOError, InterruptedError):
                left = _wire.seconds_left(deadline)
                if left == 0 or not _wait_writable(sock, left):
                    raise _WriteFailed(written, CallTimeout("timed out writing to sluiced"))
            except OSError as exc:
                raise _WriteFailed(written, exc)

    def _ready_conn(self, deadline):
        """The live connection, made now when there is none (write lock held)."""
        with self._lock:
            if self._closed:
                raise ConnectionClosed("the client was closed")
            conn = self._conn
        if conn is not None and conn.dead is None:
            return conn
        if conn is not None:
            self._retire(conn)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            left = _wire.seconds_left(deadline)
            sock.settimeout(left)
            sock.connect(self.socket_path)
            sock.setblocking(False)
        except socket.timeout:
            sock.close()
            raise CallTimeout("timed out connecting to %s" % self.socket_path) from None
        except OSError as exc:
            sock.close()
            raise ConnectError("cannot connect to %s: %s" % (self.socket_path, exc)) from None
        conn = _Conn(sock)
        with self._lock:
            self._conn = conn
        return conn

    def _retire(self, conn):
        """Closes a dead connection's socket now, or has its reader close it."""
        with self._lock:
            if self._conn is conn:
                self._conn = None
            if conn.reading:
                conn.close_when_idle = True
                return
        conn.sock.close()

    def _kill(self, conn, exc):
        """Marks a connection dead and fails every request in flight on it."""
        with self._lock:
            if conn.dead is not None:
                return
            conn.dead = exc
            for batch, index in conn.pending.values():
                batch.results[index] = exc
                batch.left -= 1
            conn.pending.clear()
            # It stays in the slot, to be closed by whoever replaces it.
            self._cond.notify_all()
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _forget(self, batch):
        """Drops a failed batch's requests still in flight: their answers,
        should they come, are discarded."""
        if batch.conn is not None:
            with self._lock:
                _wire.forget(batch.conn.pending, batch)

    def _wait(self, batch, deadline, in_flight, sent):
        """Waits until at most `in_flight` of the batch's `sent` requests are
        unanswered, reading for everybody while no one else does."""
        cond = self._cond
        with cond:
            try:
                while batch.left - (len(batch.results) - sent) > in_flight:
                    conn = batch.conn
                    left = _wire.seconds_left(deadline)
                    if left == 0:
                        raise CallTimeout("sluiced did not answer in time")
                    if conn.dead is None and not conn.reading:
                        conn.reading = True
                        cond.release()
                        try:
                            self._read(conn, left)
                        finally:
                            cond.acquire()
                            conn.reading = False
                            if conn.close_when_idle:
                                conn.sock.close()
                    else:
                        cond.wait(left)
            finally:
                # Whoever waits next may have to become the reader.
                cond.notify_all()

    def _read(self, conn, timeout_s):
        """One read (waiting up to timeout_s) and the hand-out of every whole
        answer it completed. Called without the lock, as the only reader."""
        try:
            if not _wait_readable(conn.sock, timeout_s):
                return
            data = conn.sock.recv(_wire.READ_CHUNK_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._kill(conn, ConnectionClosed("connection lost: %s" % exc))
            return
        if not data:
            self._kill(conn, ConnectionClosed("connection closed by sluiced"))
            return
        try:
            unpacker = conn.unpacker
            unpacker.feed(data)
            messages = list(unpacker)
        except Exception as exc:  # msgpack's BufferFull, FormatError, ...
            self._kill(conn, ProtocolError("undecodable stream from sluiced: %r" % exc))
            return
        with self._lock:
            try:
                _wire.take_answers(conn.pending, messages)
            except ProtocolError as exc:
                failed = exc
            else:
                failed = None
            self._cond.notify_all()
        if failed is not None:
            self._kill(conn, failed)
