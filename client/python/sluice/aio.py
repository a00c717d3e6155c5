"""aio.py: the asyncio sluice client, one connection to sluiced's Unix socket
(asyncio.open_unix_connection) shared by every task of one event loop.

Concurrency model: any number of tasks may await calls at once; each call
writes its frames at once (frames never interleave: writes are synchronous
on the loop) and awaits one future, resolved by the connection's reader
task, which decodes every answer that arrives and matches it to its call by
msgid, so answers may come in any order. A client belongs to the loop of its
first call; it is not thread-safe (use sluice.Client across threads).

Timeouts bound the whole call, in milliseconds (negative: no bound); a call
that times out forgets its msgids, so a late answer is discarded, and the
connection goes on serving the others.

Reconnection (libsluice's rule, sluice.h): a connection that died (EOF,
socket error, malformed stream) is replaced at the start of the next call,
before anything is written. A request is written again only when not one
byte of it reached the socket: when the transport's first send of it fails
(the daemon restarted and the reader has not seen the EOF yet), that send
took nothing, the transport closes, and the call reconnects once and sends
it again. Requests in flight when a connection dies fail with
ConnectionClosed and are never re-sent: the daemon may have acted on them.
"""

import asyncio

import msgpack

from . import _wire
from .errors import CallTimeout, ConnectError, ConnectionClosed, ProtocolError, UNREACHABLE

# A write buffer over this waits for the socket to take some (drain()).
WRITE_BUFFER_HIGH_BYTES = 256 * 1024


class _Conn:
    """One connection: its streams, its reader task and the decoder it
    feeds, and the calls in flight on it; `dead` is the exception it died of."""

    __slots__ = ("reader", "writer", "pending", "dead", "task", "unpacker")

    def __init__(self, reader, writer):
        self.reader = reader
        self.writer = writer
        self.pending = {}  # msgid -> (batch, index)
        self.dead = None
        self.task = None
        self.unpacker = msgpack.Unpacker(raw=False, max_buffer_size=_wire.MAX_BUFFER_BYTES)


class _Batch:
    """The requests of one call, as in client.py; `future` is resolved when
    the last answer is in (or set to CallTimeout by the call's timer)."""

    __slots__ = ("results", "left", "convert", "future", "conn", "first_msgid", "end_msgid")

    def __init__(self, count, convert, future):
        self.results = [None] * count
        self.left = count
        self.convert = convert
        self.future = future
        self.conn = None
        self.first_msgid = self.end_msgid = None


class AsyncClient:
    """An asyncio client of sluiced.

        client = sluice.AsyncClient("/run/sluice/sluice.sock")
        if not (await client.acquire("api", "user:42")).allowed: ...

    The options are sluice.Client's: timeout_ms (the default of every call;
    an acquire that may wait adds its max_wait_ms), on_unreachable
    ("fail_open", "fail_closed" or "raise", for acquire, acquire_all and
    acquire_many; counted in unreachable_decisions) and first_msgid.
    Nothing connects until the first call (or connect()).
    """

    def __init__(self, socket_path=_wire.DEFAULT_SOCKET, *, timeout_ms=_wire.DEFAULT_TIMEOUT_MS,
                 on_unreachable=_wire.FAIL_OPEN, first_msgid=1):
        self.socket_path = socket_path
        self.timeout_ms = timeout_ms
        self.on_unreachable = _wire.check_policy(on_unreachable)
        self.unreachable_decisions = 0
        self._msgids = _wire.MsgidCounter(_wire.check_msgid(first_msgid))
        self._conn = None
        self._loop = None  # the event loop of the first call
        self._connecting = None  # the future of a connect in progress
        self._closed = False
        self._packer = msgpack.Packer(use_bin_type=True, autoreset=False)

    # ---- public calls ------------------------------------------------------

    async def acquire(self, rule, key, cost=1, *, max_wait_ms=None, timeout_ms=None):
        """As sluice.Client.acquire."""
        params = _wire.item_params(rule, key, cost, max_wait_ms)
        timeout_ms = _wire.call_timeout_ms(timeout_ms, self.timeout_ms, max_wait_ms)
        try:
            return await self._call("acquire", params, timeout_ms, _wire.as_decision)
        except UNREACHABLE as exc:
            return self._policy(_wire.policy_decision(self.on_unreachable, exc), exc)

    async def acquire_all(self, items, *, timeout_ms=None):
        """As sluice.Client.acquire_all."""
        params = [_wire.items_params(items)]
        if not params[0]:
            raise ValueError("acquire_all needs at least one item")
        timeout_ms = _wire.call_timeout_ms(timeout_ms, self.timeout_ms)
        try:
            return await self._call("acquire_all", params, timeout_ms,
                                    _wire.as_all(len(params[0])))
        except UNREACHABLE as exc:
            return self._policy(_wire.policy_all(self.on_unreachable, exc, len(params[0])), exc)

    async def acquire_many(self, items, *, timeout_ms=None, return_exceptions=False):
        """As sluice.Client.acquire_many: every request written at once."""
        params = _wire.items_params(items)
        timeout_ms = _wire.call_timeout_ms(timeout_ms, self.timeout_ms)
        try:
            results = await self._call_many("acquire", params, timeout_ms, _wire.as_decision)
        except UNREACHABLE as exc:
            results = [exc] * len(params)
        return _wire.settle_many(results, self.on_unreachable, self._policy, return_exceptions)

    async def peek(self, rule, key, *, timeout_ms=None):
        return await self._call("peek", _wire.key_params(rule, key),
                                _wire.call_timeout_ms(timeout_ms, self.timeout_ms),
                                _wire.as_decision)

    async def release(self, rule, key, cost=1, *, timeout_ms=None):
        return await self._call("release", _wire.item_params(rule, key, cost),
                                _wire.call_timeout_ms(timeout_ms, self.timeout_ms),
                                _wire.as_release)

    async def reset(self, rule, key, *, timeout_ms=None):
        return await self._call("reset", _wire.key_params(rule, key),
                                _wire.call_timeout_ms(timeout_ms, self.timeout_ms),
                                _wire.as_decision)

    async def reserve(self, rule, key, estimate, ttl_ms=_wire.DEFAULT_TTL_MS, *,
                      timeout_ms=None):
        """As sluice.Client.reserve."""
        params = _wire.reserve_params(rule, key, estimate, ttl_ms)
        timeout_ms = _wire.call_timeout_ms(timeout_ms, self.timeout_ms)
        try:
            return await self._call("reserve", params, timeout_ms, _wire.as_reservation)
        except UNREACHABLE as exc:
            return self._policy(_wire.policy_reservation(self.on_unreachable, exc), exc)

    async def settle(self, reservation_id, actual, *, timeout_ms=None):
        """As sluice.Client.settle."""
        if reservation_id is None or reservation_id == 0:
            return _wire.no_settlement()
        return await self._call("settle", _wire.settle_params(reservation_id, actual),
                                _wire.call_timeout_ms(timeout_ms, self.timeout_ms),
                                _wire.as_settlement)

    async def cancel(self, reservation_id, *, timeout_ms=None):
        """As sluice.Client.cancel."""
        if reservation_id is None or reservation_id == 0:
            return _wire.no_settlement()
        return await self._call("cancel", _wire.settle_params(reservation_id),
                                _wire.call_timeout_ms(timeout_ms, self.timeout_ms),
                                _wire.as_settlement)

    async def health(self, *, timeout_ms=None):
        return await self._call("health", [], _wire.call_timeout_ms(timeout_ms, self.timeout_ms),
                                _wire.as_health)

    async def call(self, method, params=(), *, timeout_ms=None):
        return await self._call(method, list(params),
                                _wire.call_timeout_ms(timeout_ms, self.timeout_ms), _wire.as_is)

    async def connect(self, *, timeout_ms=None):
        deadline = _wire.deadline_of(_wire.call_timeout_ms(timeout_ms, self.timeout_ms))
        await self._ready_conn(deadline)

    async def close(self):
        """Closes the connection; calls in flight fail with ConnectionClosed."""
        self._closed = True
        conn = self._conn
        if conn is not None:
            self._kill(conn, ConnectionClosed("the client was closed"))
            if conn.task is not None:
                await asyncio.gather(conn.task, return_exceptions=True)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        await self.close()

    # ---- the machinery -----------------------------------------------------

    def _policy(self, decision, exc):
        if decision is None:
            raise exc
        self.unreachable_decisions += 1
        return decision

    async def _call(self, method, params, timeout_ms, convert):
        result = (await self._call_many(method, [params], timeout_ms, convert))[0]
        if isinstance(result, BaseException):
            raise result
        return result

    async def _call_many(self, method, params_list, timeout_ms, convert):
        """Sends one request per params (all `method`) and returns their
        results (_wire.take_answers). Raises CallTimeout, or the ConnectError /
        ConnectionClosed that kept the frames from being sent."""
        deadline = _wire.deadline_of(timeout_ms)
        loop = asyncio.get_running_loop()
        batch = _Batch(len(params_list), convert, loop.create_future())
        if params_list:
            await self._send(batch, method, params_list, deadline)
            if batch.left > 0:
                await self._await(batch, deadline, loop)
        return batch.results

    async def _await(self, batch, deadline, loop):
        """Waits for the batch's answers until the deadline; forgets the
        unanswered ones when it ends otherwise (timeout, cancellation)."""
        timer = None
        if deadline is not None:
            timer = loop.call_at(loop.time() + _wire.seconds_left(deadline),
                                 self._expire, batch)
        try:
            await batch.future
        finally:
            if timer is not None:
                timer.cancel()
            if batch.left > 0:
                self._forget(batch)

    def _expire(self, batch):
        if not batch.future.done():
            batch.future.set_exception(CallTimeout("sluiced did not answer in time"))

    def _forget(self, batch):
        if batch.conn is not None:
            _wire.forget(batch.conn.pending, batch)

    async def _send(self, batch, method, params_list, deadline):
        """Writes every request of the batch; reconnects once when the first
        send took nothing of them (see the top of the file). A connection
        that dies while writing fails the batch's requests (in its results)."""
        may_reconnect = True
        while True:
            conn = await self._ready_conn(deadline)
            transport = conn.writer.transport
            if transport.is_closing():
                # Dying, and the reader has not said so yet: nothing of
                # these is written, so a new connection may send them.
                self._kill(conn, ConnectionClosed("connection lost"))
                if may_reconnect:
                    may_reconnect = False
                    continue
                raise conn.dead
            data = self._msgids.frames(conn.pending, batch, method, params_list, 0,
                                       len(params_list), self._packer)
            batch.conn = conn
            buffered_before = transport.get_write_buffer_size()
            conn.writer.write(data)
            if transport.is_closing() and conn.dead is None:
                # The transport's send failed: with an empty buffer that send
                # was of these bytes and took none of them.
                nothing_sent = buffered_before == 0
                self._kill(conn, ConnectionClosed("connection lost while writing"))
                if nothing_sent and may_reconnect:
                    may_reconnect = False
                    self._reset(batch)
                    continue
                return
            if transport.get_write_buffer_size() > WRITE_BUFFER_HIGH_BYTES:
                try:
                    await asyncio.wait_for(conn.writer.drain(), _wire.seconds_left(deadline))
                except asyncio.TimeoutError:
                    self._forget(batch)
                    raise CallTimeout("timed out writing to sluiced") from None
                except (ConnectionError, OSError):
                    pass  # the reader task fails the batch
            return

    def _reset(self, batch):
        count = len(batch.results)
        batch.results = [None] * count
        batch.left = count
        batch.conn = None
        batch.first_msgid = batch.end_msgid = None
        batch.future = asyncio.get_running_loop().create_future()

    async def _ready_conn(self, deadline):
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None:
                raise RuntimeError("an AsyncClient serves the event loop of its first call only")
            self._loop = loop
        if self._closed:
            raise ConnectionClosed("the client was closed")
        conn = self._conn
        if conn is not None and conn.dead is None:
            return conn
        if self._connecting is not None:
            # Another task is connecting: share its connection.
            return await asyncio.shield(self._connecting)
        self._connecting = loop.create_future()
        try:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_unix_connection(self.socket_path, limit=_wire.READ_CHUNK_BYTES),
                    _wire.seconds_left(deadline))
            except asyncio.TimeoutError:
                raise CallTimeout("timed out connecting to %s" % self.socket_path) from None
            except OSError as exc:
                raise ConnectError("cannot connect to %s: %s" % (self.socket_path, exc)) from None
            conn = _Conn(reader, writer)
            self._conn = conn
            conn.task = loop.create_task(self._read_loop(conn))
            self._connecting.set_result(conn)
            return conn
        except asyncio.CancelledError:
            self._connecting.cancel()
            raise
        except BaseException as exc:
            self._connecting.set_exception(exc)
            self._connecting.exception()  # retrieved: no "never retrieved" warning
            raise
        finally:
            self._connecting = None

    def _kill(self, conn, exc):
        if conn.dead is not None:
            return
        conn.dead = exc
        for batch, index in conn.pending.values():
            batch.results[index] = exc
            batch.left -= 1
            if batch.left == 0 and not batch.future.done():
                batch.future.set_result(None)
        conn.pending.clear()
        if self._conn is conn:
            self._conn = None
        conn.writer.close()

    async def _read_loop(self, conn):
        read = conn.reader.read
        pending = conn.pending
        take_answers = _wire.take_answers
        try:
            while conn.dead is None:
                data = await read(_wire.READ_CHUNK_BYTES)
                if not data:
                    self._kill(conn, ConnectionClosed("connection closed by sluiced"))
                    return
                unpacker = conn.unpacker
                unpacker.feed(data)
                for batch in take_answers(pending, unpacker):
                    if not batch.future.done():
                        batch.future.set_result(None)
        except ProtocolError as exc:
            self._kill(conn, exc)
        except (ConnectionError, OSError) as exc:
            self._kill(conn, ConnectionClosed("connection lost: %s" % exc))
        except asyncio.CancelledError:
            self._kill(conn, ConnectionClosed("the reader was cancelled"))
            raise
        except Exception as exc:  # msgpack's BufferFull, FormatError, ...
            self._kill(conn, ProtocolError("undecodable stream from sluiced: %r" % exc))
