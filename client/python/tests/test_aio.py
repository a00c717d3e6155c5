#!/usr/bin/python3
"""sluice.AsyncClient against a real sluiced: every method, a pipeline of
10,000 calls answered out of order, many concurrent awaiters on one
connection, timeouts against a stopped daemon, reconnection after a restart
without sending a request again, msgids wrapping at 2^32, and the
on_unreachable policy; reserve, settle and cancel."""

import asyncio
import os
import time
import unittest

import support
from support import BUDGET, CAPPED_DEBT, CONC, SMALL, WIDE

import sluice

TIMEOUT_MS = 300
TIMEOUT_SLACK_S = 1.5


class AsyncCase(unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        self.daemon = support.start_daemon(self)

    async def asyncSetUp(self):
        # IsolatedAsyncioTestCase runs its loop in debug mode, which records
        # a stack for every future and task: thousands of awaiters then run
        # several times slower, and time out on a loaded machine.
        asyncio.get_running_loop().set_debug(False)
        self.client = self.make_client()

    def make_client(self, path=None, **options):
        options.setdefault("on_unreachable", "raise")
        client = sluice.AsyncClient(path or self.daemon.socket, **options)
        self.addAsyncCleanup(client.close)
        return client

    async def wait_written(self, client, count):
        """Waits until `count` requests are in flight on the connection (an
        AsyncClient writes a call's frames before it awaits)."""
        deadline = time.monotonic() + 5
        while client._conn is None or len(client._conn.pending) != count:
            self.assertLess(time.monotonic(), deadline)
            await asyncio.sleep(0.01)


class MethodTest(AsyncCase):
    # Verifies acquire spends from the key's bucket and reports what remains.
    async def test_acquire_spends_the_cost_and_reports_what_remains(self):
        first = await self.client.acquire("wide", "k", 5)
        self.assertEqual((first.allowed, first.mode, first.remaining, first.limit),
                         (True, "local", WIDE - 5, WIDE))
        self.assertEqual((await self.client.acquire("wide", b"k")).remaining, WIDE - 6)

    # Verifies the fourth acquire of three a minute is denied with a retry time.
    async def test_acquire_beyond_the_limit_is_denied_with_retry_after(self):
        for _ in range(SMALL):
            self.assertTrue((await self.client.acquire("small", "k")).allowed)
        denied = await self.client.acquire("small", "k")
        self.assertFalse(denied.allowed)
        self.assertGreater(denied.retry_after_ms, 0)

    # Verifies an acquire with max_wait_ms is held until its unit is due.
    async def test_acquire_with_max_wait_is_answered_once_the_unit_is_due(self):
        self.assertTrue((await self.client.acquire("held", "k", max_wait_ms=0)).allowed)
        waited = await self.client.acquire("held", "k", max_wait_ms=1000)
        self.assertTrue(waited.allowed)
        self.assertGreater(waited.waited_ms, 0)

    # Verifies peek, release, acquire_all, reset and health.
    async def test_peek_release_acquire_all_reset_and_health(self):
        await self.client.acquire("wide", "k", 7)
        self.assertEqual((await self.client.peek("wide", "k")).remaining, WIDE - 7)
        for _ in range(CONC):
            await self.client.acquire("conc", "k")
        self.assertFalse((await self.client.acquire("conc", "k")).allowed)
        self.assertEqual((await self.client.release("conc", "k")).remaining, 1)
        self.assertTrue((await self.client.acquire("conc", "k")).allowed)
        neither = await self.client.acquire_all([("wide", "a", 2), ("small", "b", SMALL + 1)])
        self.assertFalse(neither.allowed)
        self.assertEqual((await self.client.peek("wide", "a")).remaining, WIDE)
        both = await self.client.acquire_all([("wide", "a", 2), ("small", "b", SMALL)])
        self.assertTrue(both.allowed)
        self.assertEqual((await self.client.reset("small", "b")).remaining, SMALL)
        self.assertEqual((await self.client.health()).status, "ok")

    # Verifies the daemon's errors arrive as ServerError carrying its code.
    async def test_daemon_errors_carry_the_daemons_code(self):
        with self.assertRaises(sluice.ServerError) as caught:
            await self.client.acquire("no-such-rule", "k")
        self.assertEqual(caught.exception.code, "UNKNOWN_RULE")
        results = await self.client.acquire_many([("wide", "k"), ("nope", "k")],
                                                 return_exceptions=True)
        self.assertTrue(results[0].allowed)
        self.assertEqual(results[1].code, "UNKNOWN_RULE")


class ReservationTest(AsyncCase):
    # Verifies settling below the estimate refunds (peek and acquire see the
    # units back) and settling above it leaves debt (a negative remaining).
    async def test_settle_refunds_below_the_estimate_and_charges_debt_above_it(self):
        reserved = await self.client.reserve("budget", "k", 8)
        self.assertIsInstance(reserved, sluice.Reservation)
        self.assertEqual((reserved.allowed, reserved.remaining), (True, BUDGET - 8))
        settled = await self.client.settle(reserved.id, 3)
        self.assertEqual((settled.id, settled.refunded, settled.debt, settled.remaining),
                         (reserved.id, 5, 0, BUDGET - 3))
        self.assertEqual((await self.client.peek("budget", "k")).remaining, BUDGET - 3)
        self.assertTrue((await self.client.acquire("budget", "k", BUDGET - 3)).allowed)
        over = await self.client.reserve("budget", "over", BUDGET)
        charged = await self.client.settle(over.id, BUDGET + 4)
        self.assertEqual((charged.refunded, charged.debt, charged.remaining, charged.allowed),
                         (0, 4, -4, False))
        self.assertEqual((await self.client.peek("budget", "over")).remaining, -4)
        self.assertEqual(charged.unpaid, 0)
        capped = await self.client.reserve("capped", "over", BUDGET)
        past = await self.client.settle(capped.id, BUDGET + 5)
        self.assertEqual((past.debt, past.unpaid, past.remaining),
                         (CAPPED_DEBT, 5 - CAPPED_DEBT, -CAPPED_DEBT))

    # Verifies cancel refunds all, an id not open raises UnknownReservation,
    # and a reserve the key cannot afford is denied without an id.
    async def test_cancel_unknown_ids_and_denials(self):
        reserved = await self.client.reserve("budget", "k", 6, 5000)
        cancelled = await self.client.cancel(reserved.id)
        self.assertEqual((cancelled.refunded, cancelled.remaining), (6, BUDGET))
        for settle in (self.client.settle(reserved.id, 1), self.client.cancel(reserved.id)):
            with self.assertRaises(sluice.UnknownReservation) as caught:
                await settle
            self.assertEqual(caught.exception.code, "UNKNOWN_RESERVATION")
        await self.client.reserve("budget", "k", BUDGET)
        denied = await self.client.reserve("budget", "k", 1)
        self.assertEqual((denied.allowed, denied.id, denied.remaining), (False, None, 0))
        self.assertGreater(denied.retry_after_ms, 0)
        self.assertEqual((await self.client.cancel(denied.id)).refunded, 0)
        self.assertEqual((await self.client.peek("budget", "k")).remaining, 0)


class LoopTest(unittest.TestCase):
    # Verifies a client used from a second event loop says so.
    def test_a_second_event_loop_is_refused(self):
        daemon = support.start_daemon(self)
        client = sluice.AsyncClient(daemon.socket, on_unreachable="raise")

        async def first():
            self.assertTrue((await client.acquire("wide", "k")).allowed)
            await client.close()

        async def second():
            with self.assertRaises(RuntimeError):
                await client.acquire("wide", "k")

        asyncio.run(first())
        asyncio.run(second())


class PipelineTest(AsyncCase):
    # Verifies 10,000 pipelined acquires get their own answers although the
    # daemon holds some (the second on each `held` key waits ~100 ms).
    async def test_ten_thousand_pipelined_calls_match_answers_answered_out_of_order(self):
        items, held = [], set()
        for i in range(10000):
            if i % 500 < 2:
                # Two in a row on one key: the second waits ~100 ms.
                items.append(("held", "h%d" % (i // 500), 1))
                held.add(i)
            else:
                items.append(("wide", "w%d" % i, i % 1000 + 1))
        await self.client.connect()
        recorder = support.record_arrivals(self.client)
        results = await self.client.acquire_many(items, timeout_ms=10000)
        arrived = recorder.arrived
        for i, decision in enumerate(results):
            self.assertTrue(decision.allowed, (i, decision))
            if i in held:
                self.assertEqual(decision.waited_ms > 0, i % 500 == 1, (i, decision))
            else:
                self.assertEqual(decision.remaining, WIDE - (i % 1000 + 1), i)
        self.assertEqual(len(arrived), 10000)
        self.assertNotEqual(arrived, sorted(arrived), "the daemon answered in order")

    # Verifies 2,000 concurrent awaiters on one connection get their own answers.
    async def test_concurrent_awaiters_get_their_own_answers(self):
        async def one(i):
            return await self.client.acquire("wide", "c%d" % i, i + 1, timeout_ms=30000)
        results = await asyncio.gather(*(one(i) for i in range(2000)))
        self.assertEqual([d.remaining for d in results], [WIDE - (i + 1) for i in range(2000)])

    # Verifies msgids wrap from 2^32 - 1 to 0 and the answers still match.
    async def test_msgids_wrap_at_two_to_the_32_and_answers_still_match(self):
        client = self.make_client(first_msgid=(1 << 32) - 5)
        results = await client.acquire_many([("wide", "m%d" % i, i + 1) for i in range(10)])
        self.assertEqual([d.remaining for d in results], [WIDE - (i + 1) for i in range(10)])
        self.assertEqual(client._msgids.next, 5)
        self.assertEqual((await client.acquire("wide", "m0")).remaining, WIDE - 2)


class TimeoutTest(AsyncCase):
    # Verifies a call to a stopped daemon times out on time while other calls
    # wait, and the late answer is not taken for a later call's.
    async def test_stopped_daemon_times_out_and_late_answers_are_discarded(self):
        client = self.make_client(timeout_ms=TIMEOUT_MS)
        await client.health()
        with support.stopped(self.daemon):
            started = time.monotonic()
            outcomes = await asyncio.gather(client.acquire("wide", "k"), client.peek("wide", "k"),
                                            return_exceptions=True)
            elapsed = time.monotonic() - started
        self.assertEqual([type(o) for o in outcomes], [sluice.CallTimeout] * 2)
        self.assertGreaterEqual(elapsed, TIMEOUT_MS / 1000)
        self.assertLess(elapsed, TIMEOUT_MS / 1000 + TIMEOUT_SLACK_S)
        self.assertEqual((await client.acquire("wide", "k", 2, timeout_ms=5000)).remaining,
                         WIDE - 3)


class ReconnectTest(AsyncCase):
    # Verifies the first call after a restart reconnects and is sent once.
    async def test_call_after_a_restart_reconnects_and_is_sent_once(self):
        self.assertEqual((await self.client.acquire("wide", "k")).remaining, WIDE - 1)
        support.restart_daemon(self.daemon)  # blocks the loop: the EOF is not read yet
        self.assertEqual((await self.client.acquire("wide", "k", 2)).remaining, WIDE - 2)
        self.assertEqual((await self.client.peek("wide", "k")).remaining, WIDE - 2)

    # Verifies requests written before the daemon died fail and are not sent
    # to the daemon that replaced it.
    async def test_written_requests_fail_when_the_daemon_dies_and_are_never_resent(self):
        client = self.make_client(timeout_ms=10000)
        await client.health()
        support.stop(self.daemon.proc.pid)  # the restart ends it
        calls = [asyncio.ensure_future(client.acquire("wide", "k", 5)) for _ in range(3)]
        await self.wait_written(client, 3)
        support.restart_daemon(self.daemon)
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        self.assertEqual([type(o) for o in outcomes], [sluice.ConnectionClosed] * 3)
        self.assertEqual((await client.acquire("wide", "k", 1)).remaining, WIDE - 1)


class ProtocolTest(unittest.IsolatedAsyncioTestCase):
    # Verifies notifications and answers to unknown msgids are skipped, a
    # malformed decision fails its call only, and a frame that is no
    # response drops the connection, which the next call replaces.
    async def test_odd_frames_are_skipped_or_drop_the_connection(self):
        fake = support.FakeDaemon(self, support.odd_answers)
        client = sluice.AsyncClient(fake.socket, on_unreachable="raise")
        self.addAsyncCleanup(client.close)
        decision = await client.peek("r", "k")
        self.assertEqual((decision.allowed, decision.remaining, decision.limit), (True, 7, 9))
        with self.assertRaises(sluice.ProtocolError):
            await client.peek("r", "bad-decision")
        with self.assertRaises(sluice.ProtocolError):
            await client.peek("r", "garbage")
        self.assertEqual((await client.peek("r", "k")).remaining, 7)
        self.assertEqual(fake.connections, 2)


class UnreachableTest(AsyncCase):
    # Verifies fail_open (the default) allows and fail_closed denies, counted.
    async def test_policies_decide_and_count(self):
        absent = os.path.join(self.daemon.dir, "absent.sock")
        opened = self.make_client(absent, on_unreachable="fail_open")
        decision = await opened.acquire("wide", "k")
        self.assertTrue(decision.allowed)
        self.assertEqual(decision.mode, sluice.MODE_UNREACHABLE)
        self.assertIsInstance(decision.error, sluice.ConnectError)
        self.assertTrue((await opened.acquire_all([("wide", "a")])).allowed)
        self.assertEqual(opened.unreachable_decisions, 2)
        closed = self.make_client(absent, on_unreachable="fail_closed")
        self.assertEqual([d.allowed for d in await closed.acquire_many([("wide", "k")] * 2)],
                         [False, False])
        self.assertEqual(closed.unreachable_decisions, 2)
        with self.assertRaises(sluice.ConnectError):
            await closed.peek("wide", "k")
        with self.assertRaises(sluice.ConnectError):
            await self.make_client(absent).acquire("wide", "k")
        self.assertEqual(sluice.AsyncClient(absent).on_unreachable, "fail_open")

    # Verifies reserve follows the policy with no id, and settling that asks nothing.
    async def test_reserve_follows_the_policy_and_its_settle_is_a_no_op(self):
        absent = os.path.join(self.daemon.dir, "absent.sock")
        opened = self.make_client(absent, on_unreachable="fail_open")
        reserved = await opened.reserve("budget", "k", 5)
        self.assertEqual((reserved.allowed, reserved.id, reserved.mode),
                         (True, None, sluice.MODE_UNREACHABLE))
        self.assertEqual((await opened.settle(reserved.id, 9)).debt, 0)
        self.assertEqual(opened.unreachable_decisions, 1)
        with self.assertRaises(sluice.ConnectError):
            await opened.cancel(42)
        closed = self.make_client(absent, on_unreachable="fail_closed")
        self.assertEqual(((await closed.reserve("budget", "k", 5)).allowed), False)

    # Verifies a stopped daemon under fail_closed denies once the call times out.
    async def test_stopped_daemon_under_fail_closed_denies(self):
        client = self.make_client(timeout_ms=TIMEOUT_MS, on_unreachable="fail_closed")
        await client.health()
        with support.stopped(self.daemon):
            decision = await client.acquire("wide", "k")
        self.assertFalse(decision.allowed)
        self.assertIsInstance(decision.error, sluice.CallTimeout)
        self.assertEqual(client.unreachable_decisions, 1)


def tearDownModule():
    support.tear_down_module()


if __name__ == "__main__":
    unittest.main()
