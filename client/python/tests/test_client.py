#!/usr/bin/python3
"""The synchronous sluice.Client against a real sluiced: every method, a
pipeline of 10,000 calls answered out of order, threads sharing one
connection, timeouts against a stopped daemon, reconnection after a restart
without sending a request again, msgids wrapping at 2^32, and the
on_unreachable policy; reserve, settle and cancel."""

import io
import os
import threading
import time
import unittest

import msgpack

import support
from support import BUDGET, CAPPED_DEBT, CONC, HELD_INTERVAL_MS, SMALL, WIDE, harness

import sluice
from sluice import _wire

# A call against a stopped daemon must give up after its timeout, and not
# much later (a loaded 2-core machine delays a wake-up by a few 100 ms).
TIMEOUT_MS = 300
TIMEOUT_SLACK_S = 1.5


class ClientCase(unittest.TestCase):
    def setUp(self):
        self.daemon = support.start_daemon(self)
        self.client = self.make_client()

    def make_client(self, **options):
        options.setdefault("on_unreachable", "raise")
        client = sluice.Client(self.daemon.socket, **options)
        self.addCleanup(client.close)
        return client

    def wait_written(self, client, count):
        """Waits until `count` requests are written and their caller reads
        for its answer (a caller reads only once its frames are written)."""
        self.assertTrue(harness.wait_for(
            lambda: client._conn is not None and len(client._conn.pending) == count and
            client._conn.reading, 5))


class MethodTest(ClientCase):
    # Verifies acquire spends from the key's bucket and says so in its decision.
    def test_acquire_spends_the_cost_and_reports_what_remains(self):
        first = self.client.acquire("wide", "k", 5)
        self.assertEqual((first.allowed, first.mode, first.remaining, first.limit),
                         (True, "local", WIDE - 5, WIDE))
        self.assertEqual(first.retry_after_ms, 0)
        self.assertEqual(self.client.acquire("wide", "k").remaining, WIDE - 6)

    # Verifies the fourth acquire of three a minute is denied with a retry time.
    def test_acquire_beyond_the_limit_is_denied_with_retry_after(self):
        for i in range(SMALL):
            self.assertTrue(self.client.acquire("small", "k").allowed)
        denied = self.client.acquire("small", "k")
        self.assertFalse(denied.allowed)
        self.assertEqual(denied.remaining, 0)
        self.assertGreater(denied.retry_after_ms, 0)
        self.assertLessEqual(denied.retry_after_ms, 60000 // SMALL)

    # Verifies bytes keys (not UTF-8, with NUL) are keys of their own.
    def test_bytes_keys_are_any_bytes(self):
        self.assertEqual(self.client.acquire("wide", b"\xff\x00k", 2).remaining, WIDE - 2)
        self.assertEqual(self.client.acquire("wide", b"\xff\x00k", 3).remaining, WIDE - 5)
        self.assertEqual(self.client.acquire("wide", "\xff\x00k", 1).remaining, WIDE - 1)

    # Verifies an acquire with max_wait_ms is held until its unit is due.
    def test_acquire_with_max_wait_is_answered_once_the_unit_is_due(self):
        self.assertTrue(self.client.acquire("held", "k", max_wait_ms=0).allowed)
        self.assertFalse(self.client.acquire("held", "k", max_wait_ms=0).allowed)
        waited = self.client.acquire("held", "k", max_wait_ms=1000)
        self.assertTrue(waited.allowed)
        self.assertGreater(waited.waited_ms, 0)
        self.assertLessEqual(waited.waited_ms, HELD_INTERVAL_MS)

    # Verifies peek reports the state and spends nothing.
    def test_peek_spends_nothing(self):
        self.client.acquire("wide", "k", 7)
        self.assertEqual(self.client.peek("wide", "k").remaining, WIDE - 7)
        self.assertEqual(self.client.peek("wide", "k").remaining, WIDE - 7)

    # Verifies release gives a concurrency unit back to the next acquire.
    def test_release_gives_a_concurrency_unit_back(self):
        for _ in range(CONC):
            self.assertTrue(self.client.acquire("conc", "k").allowed)
        self.assertFalse(self.client.acquire("conc", "k").allowed)
        released = self.client.release("conc", "k")
        self.assertEqual(released.remaining, 1)
        self.assertTrue(self.client.acquire("conc", "k").allowed)

    # Verifies acquire_all spends every item or none.
    def test_acquire_all_spends_all_or_nothing(self):
        both = self.client.acquire_all([("wide", "a", 2), ("small", "b", SMALL)])
        self.assertTrue(both.allowed)
        self.assertEqual([d.remaining for d in both.results], [WIDE - 2, 0])
        neither = self.client.acquire_all([("wide", "a", 2), ("small", "b")])
        self.assertFalse(neither.allowed)
        self.assertFalse(neither.results[1].allowed)
        self.assertEqual(self.client.peek("wide", "a").remaining, WIDE - 2)

    # Verifies reset (the test runs as the daemon's user, an admin) forgets a key.
    def test_reset_forgets_the_keys_state(self):
        for _ in range(SMALL):
            self.client.acquire("small", "k")
        fresh = self.client.reset("small", "k")
        self.assertEqual(fresh.remaining, SMALL)
        self.assertTrue(self.client.acquire("small", "k").allowed)

    # Verifies health reports the daemon's status and every field it sent.
    def test_health_reports_status_and_fields(self):
        health = self.client.health()
        self.assertEqual((health.status, health.redis), ("ok", "none"))
        self.assertIn("uptime_ms", health.fields)

    # Verifies any other method is callable and gives its decoded result.
    def test_call_returns_any_methods_result(self):
        names = [rule["name"] for rule in self.client.call("rules")]
        self.assertEqual(sorted(names), ["budget", "capped", "conc", "held", "small", "wide"])

    # Verifies the daemon's errors arrive as ServerError carrying its code,
    # and the connection serves the next call.
    def test_daemon_errors_carry_the_daemons_code(self):
        with self.assertRaises(sluice.ServerError) as caught:
            self.client.acquire("no-such-rule", "k")
        self.assertEqual(caught.exception.code, "UNKNOWN_RULE")
        with self.assertRaises(sluice.ServerError) as caught:
            self.client.acquire("conc", "k", max_wait_ms=10)
        self.assertEqual(caught.exception.code, "BAD_REQUEST")
        with self.assertRaises(sluice.ServerError) as caught:
            self.client.call("no_such_method")
        self.assertEqual(caught.exception.code, "UNKNOWN_METHOD")
        self.assertTrue(self.client.acquire("wide", "k").allowed)

    # Verifies bad arguments are refused before anything is sent.
    def test_bad_arguments_raise_before_sending(self):
        for args in [("wide", "k", -1), ("wide", "k", 1 << 32), ("wide", "k", 1.5)]:
            with self.assertRaises(ValueError):
                self.client.acquire(*args)
        for args in [("wide", 42), ("", "k"), (None, "k")]:
            with self.assertRaises(TypeError):
                self.client.acquire(*args)
        with self.assertRaises(ValueError):
            self.client.acquire_all([])
        with self.assertRaises(ValueError):
            sluice.Client(on_unreachable="maybe")
        self.assertIsNone(self.client._conn)


class ReservationTest(ClientCase):
    # Verifies settling below the estimate gives the difference back: the
    # next peek and acquire see the units.
    def test_settle_below_the_estimate_refunds_the_difference(self):
        reserved = self.client.reserve("budget", "k", 8)
        self.assertIsInstance(reserved, sluice.Reservation)
        self.assertEqual((reserved.allowed, reserved.mode, reserved.remaining),
                         (True, "local", BUDGET - 8))
        self.assertIsInstance(reserved.id, int)
        settled = self.client.settle(reserved.id, 3)
        self.assertIsInstance(settled, sluice.Settlement)
        self.assertEqual((settled.id, settled.refunded, settled.debt, settled.remaining),
                         (reserved.id, 5, 0, BUDGET - 3))
        self.assertEqual(self.client.peek("budget", "k").remaining, BUDGET - 3)
        self.assertTrue(self.client.acquire("budget", "k", BUDGET - 3).allowed)

    # Verifies settling above the estimate charges the excess past the limit:
    # the key answers a negative remaining and admits nothing.
    def test_settle_above_the_estimate_leaves_debt(self):
        reserved = self.client.reserve("budget", "k", BUDGET)
        settled = self.client.settle(reserved.id, BUDGET + 4)
        self.assertEqual((settled.refunded, settled.debt, settled.remaining, settled.allowed),
                         (0, 4, -4, False))
        self.assertEqual(self.client.peek("budget", "k").remaining, -4)
        self.assertFalse(self.client.acquire("budget", "k").allowed)
        self.assertEqual(settled.unpaid, 0)

    # Verifies a settle past the key's debt bound (max_debt) charges up to it
    # and reports the rest as unpaid.
    def test_settle_past_the_debt_bound_reports_what_it_left_unpaid(self):
        reserved = self.client.reserve("capped", "k", BUDGET)
        settled = self.client.settle(reserved.id, BUDGET + 5)
        self.assertEqual((settled.debt, settled.unpaid, settled.remaining),
                         (CAPPED_DEBT, 5 - CAPPED_DEBT, -CAPPED_DEBT))
        self.assertIn("unpaid=3", repr(settled))

    # Verifies cancel gives the whole estimate back.
    def test_cancel_refunds_the_whole_estimate(self):
        reserved = self.client.reserve("budget", "k", 6, ttl_ms=5000)
        cancelled = self.client.cancel(reserved.id)
        self.assertEqual((cancelled.id, cancelled.refunded, cancelled.debt, cancelled.remaining),
                         (reserved.id, 6, 0, BUDGET))
        self.assertEqual(self.client.peek("budget", "k").remaining, BUDGET)

    # Verifies an id that is not open (settled already, or never opened)
    # raises UnknownReservation, a ServerError with the daemon's code.
    def test_settle_of_an_id_not_open_raises_unknown_reservation(self):
        reserved = self.client.reserve("budget", "k", 2)
        self.client.settle(reserved.id, 2)
        for call in (lambda: self.client.settle(reserved.id, 1),
                     lambda: self.client.cancel(reserved.id),
                     lambda: self.client.settle(reserved.id + 1000, 1)):
            with self.assertRaises(sluice.UnknownReservation) as caught:
                call()
            self.assertIsInstance(caught.exception, sluice.ServerError)
            self.assertEqual(caught.exception.code, "UNKNOWN_RESERVATION")
        with self.assertRaises(sluice.ServerError) as caught:
            self.client.reserve("conc", "k", 1)
        self.assertNotIsInstance(caught.exception, sluice.UnknownReservation)
        self.assertEqual(caught.exception.code, "BAD_REQUEST")

    # Verifies a reserve the key cannot afford is denied and opens nothing;
    # settling its missing id asks the daemon nothing.
    def test_reserve_on_a_denied_key_is_denied_without_an_id(self):
        self.client.reserve("budget", "k", BUDGET - 1)
        denied = self.client.reserve("budget", "k", 2)
        self.assertEqual((denied.allowed, denied.id, denied.remaining), (False, None, 1))
        self.assertGreater(denied.retry_after_ms, 0)
        self.assertNotIn("id", denied.fields)
        nothing = self.client.settle(denied.id, 2)
        self.assertEqual((nothing.allowed, nothing.id, nothing.refunded, nothing.debt),
                         (True, None, 0, 0))
        self.assertEqual(self.client.peek("budget", "k").remaining, 1)

    # Verifies bad arguments are refused before anything is sent.
    def test_bad_reservation_arguments_raise_before_sending(self):
        client = self.make_client()
        for args in [("budget", "k", 0), ("budget", "k", 1, 0), ("budget", "k", 1 << 32)]:
            with self.assertRaises(ValueError):
                client.reserve(*args)
        for args in [("1", 2), (-1, 2), (7, -1)]:
            with self.assertRaises(ValueError):
                client.settle(*args)
        self.assertIsNone(client._conn)


class PipelineTest(ClientCase):
    # Verifies 10,000 pipelined acquires get their own answers although the
    # daemon holds some (the second on each `held` key waits ~100 ms) and
    # answers the later ones first.
    def test_ten_thousand_pipelined_calls_match_answers_answered_out_of_order(self):
        items, held = [], set()
        for i in range(10000):
            if i % 500 < 2:
                # Two in a row on one key: the second waits ~100 ms.
                items.append(("held", "h%d" % (i // 500), 1))
                held.add(i)
            else:
                items.append(("wide", "w%d" % i, i % 1000 + 1))
        self.client.connect()
        recorder = support.record_arrivals(self.client)
        results = self.client.acquire_many(items, timeout_ms=10000)
        arrived = recorder.arrived
        self.assertEqual(len(results), 10000)
        for i, decision in enumerate(results):
            self.assertTrue(decision.allowed, (i, decision))
            if i in held:
                self.assertEqual(decision.limit, 10)
                self.assertEqual(decision.waited_ms > 0, i % 500 == 1, (i, decision))
            else:
                self.assertEqual(decision.remaining, WIDE - (i % 1000 + 1), i)
        self.assertEqual(len(arrived), 10000)
        self.assertNotEqual(arrived, sorted(arrived), "the daemon answered in order")
        self.assertEqual(len(self.client._conn.pending), 0)

    # Verifies threads share one connection: each thread's answers are its own.
    def test_threads_share_one_connection_and_get_their_own_answers(self):
        errors = []

        def worker(n):
            try:
                for i in range(300):
                    decision = self.client.acquire("wide", "t%d" % n, n + 1)
                    if decision.remaining != WIDE - (i + 1) * (n + 1):
                        errors.append((n, i, decision))
            except Exception as exc:  # reported below
                errors.append((n, exc))

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertEqual(errors, [])
        self.assertEqual(self.client.peek("wide", "t7").remaining, WIDE - 300 * 8)

    # Verifies msgids wrap from 2^32 - 1 to 0 and the answers still match.
    def test_msgids_wrap_at_two_to_the_32_and_answers_still_match(self):
        client = self.make_client(first_msgid=(1 << 32) - 5)
        results = client.acquire_many([("wide", "m%d" % i, i + 1) for i in range(10)])
        self.assertEqual([d.remaining for d in results], [WIDE - (i + 1) for i in range(10)])
        self.assertEqual(client._msgids.next, 5)
        self.assertEqual(client.acquire("wide", "m0").remaining, WIDE - 2)

    # Verifies a msgid still in flight is skipped when the counter comes round.
    def test_msgid_counter_skips_ids_in_flight(self):
        counter = _wire.MsgidCounter((1 << 32) - 1)
        pending = {(1 << 32) - 1: None, 0: None, 2: None}
        batch = sluice.client._Batch(2, None)
        data = counter.frames(pending, batch, "peek", [["r", "a"], ["r", "b"]], 0, 2,
                              msgpack.Packer(use_bin_type=True, autoreset=False))
        self.assertEqual(list(msgpack.Unpacker(io.BytesIO(data), raw=False)),
                         [[0, 1, "peek", ["r", "a"]], [0, 3, "peek", ["r", "b"]]])
        self.assertEqual((pending[1], pending[3]), ((batch, 0), (batch, 1)))
        self.assertEqual((batch.first_msgid, batch.end_msgid, counter.next), ((1 << 32) - 1, 4, 4))
        # Forgetting the batch (its call timed out) drops its ids, not the others'.
        _wire.forget(pending, batch)
        self.assertEqual(sorted(pending), [0, 2, (1 << 32) - 1])


class TimeoutTest(ClientCase):
    # Verifies a call to a stopped daemon times out on time, and once the
    # daemon runs again the late answer is not taken for the next call's.
    def test_stopped_daemon_times_out_and_late_answers_are_discarded(self):
        client = self.make_client(timeout_ms=TIMEOUT_MS)
        client.health()
        with support.stopped(self.daemon):
            started = time.monotonic()
            with self.assertRaises(sluice.CallTimeout):
                client.acquire("wide", "k", 1)
            elapsed = time.monotonic() - started
        self.assertGreaterEqual(elapsed, TIMEOUT_MS / 1000)
        self.assertLess(elapsed, TIMEOUT_MS / 1000 + TIMEOUT_SLACK_S)
        # The daemon spent 1 for the call that timed out: its late answer
        # says WIDE - 1; this call's, WIDE - 3.
        self.assertEqual(client.acquire("wide", "k", 2, timeout_ms=5000).remaining, WIDE - 3)

    # Verifies each of several threads waiting on a stopped daemon times out.
    def test_every_waiting_thread_times_out(self):
        client = self.make_client(timeout_ms=TIMEOUT_MS)
        client.health()
        outcomes = []
        with support.stopped(self.daemon):
            def worker():
                try:
                    client.peek("wide", "k")
                    outcomes.append("answered")
                except sluice.CallTimeout:
                    outcomes.append("timeout")
            threads = [threading.Thread(target=worker) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(TIMEOUT_MS / 1000 + TIMEOUT_SLACK_S)
        self.assertEqual(outcomes, ["timeout"] * 4)
        self.assertEqual(client.health(timeout_ms=5000).status, "ok")


class ReconnectTest(ClientCase):
    # Verifies the first call after a restart reconnects and is sent once.
    def test_call_after_a_restart_reconnects_and_is_sent_once(self):
        self.assertEqual(self.client.acquire("wide", "k").remaining, WIDE - 1)
        support.restart_daemon(self.daemon)
        self.assertEqual(self.client.acquire("wide", "k", 2).remaining, WIDE - 2)
        self.assertEqual(self.client.peek("wide", "k").remaining, WIDE - 2)

    # Verifies a request written before the daemon died fails and is not
    # sent to the daemon that replaced it.
    def test_written_request_fails_when_the_daemon_dies_and_is_never_resent(self):
        client = self.make_client(timeout_ms=10000)
        client.health()
        outcome = []
        support.stop(self.daemon.proc.pid)  # the restart ends it
        thread = threading.Thread(target=lambda: outcome.append(
            self.call_outcome(lambda: client.acquire("wide", "k", 5))))
        thread.start()
        self.wait_written(client, 1)
        support.restart_daemon(self.daemon)
        thread.join(10)
        self.assertEqual(outcome, ["ConnectionClosed"])
        self.assertEqual(client.acquire("wide", "k", 1).remaining, WIDE - 1)

    # Verifies threads calling through daemon restarts each get a decision or
    # a connection error, never a hang or another thread's answer, and the
    # client serves them all once the daemon is back.
    def test_threads_calling_through_restarts_get_decisions_or_connection_errors(self):
        client = self.make_client(timeout_ms=5000)
        stop = threading.Event()
        outcomes, wrong = [], []

        def worker(n):
            while not stop.is_set():
                try:
                    decision = client.acquire("wide", "r%d" % n, n + 1)
                except (sluice.ConnectionClosed, sluice.ConnectError) as exc:
                    outcomes.append(type(exc).__name__)
                    continue
                except Exception as exc:  # reported below
                    wrong.append(exc)
                    return
                # Whichever daemon answered, this thread's key has spent a
                # multiple of this thread's cost (another's answer would not).
                if (WIDE - decision.remaining) % (n + 1) != 0:
                    wrong.append(decision)
                outcomes.append("decision")

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        try:
            for _ in range(3):
                decided = outcomes.count("decision")
                self.assertTrue(harness.wait_for(
                    lambda: outcomes.count("decision") >= decided + 50, 10))
                support.restart_daemon(self.daemon)
        finally:
            stop.set()
            for t in threads:
                t.join(10)
        self.assertFalse(any(t.is_alive() for t in threads), "a thread hung")
        self.assertEqual(wrong, [])
        self.assertIn("decision", outcomes)
        self.assertEqual([client.acquire("wide", "r%d" % n, 1).allowed for n in range(6)],
                         [True] * 6)
        self.assertEqual(len(client._conn.pending), 0)

    @staticmethod
    def call_outcome(call):
        try:
            call()
            return "answered"
        except sluice.SluiceError as exc:
            return type(exc).__name__


class ProtocolTest(unittest.TestCase):
    # Verifies notifications and answers to unknown msgids are skipped, a
    # malformed decision fails its call only, and a frame that is no
    # response drops the connection, which the next call replaces.
    def test_odd_frames_are_skipped_or_drop_the_connection(self):
        fake = support.FakeDaemon(self, support.odd_answers)
        client = sluice.Client(fake.socket, on_unreachable="raise")
        self.addCleanup(client.close)
        decision = client.peek("r", "k")
        self.assertEqual((decision.allowed, decision.remaining, decision.limit), (True, 7, 9))
        self.assertEqual(decision.fields["future_field"], [1, 2])
        with self.assertRaises(sluice.ProtocolError):
            client.peek("r", "bad-decision")
        self.assertEqual(fake.connections, 1)
        with self.assertRaises(sluice.ProtocolError):
            client.peek("r", "garbage")
        self.assertEqual(client.peek("r", "k").remaining, 7)
        self.assertEqual(fake.connections, 2)


class UnreachableTest(ClientCase):
    def _absent(self, **options):
        client = sluice.Client(os.path.join(self.daemon.dir, "absent.sock"), **options)
        self.addCleanup(client.close)
        return client

    # Verifies the default policy allows, says why, and counts.
    def test_fail_open_is_the_default_and_is_counted(self):
        client = self._absent()
        decision = client.acquire("wide", "k")
        self.assertTrue(decision.allowed)
        self.assertEqual(decision.mode, sluice.MODE_UNREACHABLE)
        self.assertIsInstance(decision.error, sluice.ConnectError)
        self.assertTrue(client.acquire_all([("wide", "a"), ("wide", "b")]).allowed)
        self.assertEqual([d.allowed for d in client.acquire_many([("wide", "a")] * 3)], [True] * 3)
        self.assertEqual(client.unreachable_decisions, 5)

    # Verifies fail_closed denies, with a retry time, and counts.
    def test_fail_closed_denies_and_is_counted(self):
        client = self._absent(on_unreachable="fail_closed")
        decision = client.acquire("wide", "k")
        self.assertFalse(decision.allowed)
        self.assertEqual(decision.retry_after_ms, _wire.UNREACHABLE_RETRY_AFTER_MS)
        self.assertFalse(client.acquire_all([("wide", "a")]).allowed)
        self.assertEqual(client.unreachable_decisions, 2)

    # Verifies "raise" raises, and calls that decide nothing always raise.
    def test_raise_and_non_decisions_raise_connect_error(self):
        with self.assertRaises(sluice.ConnectError):
            self._absent(on_unreachable="raise").acquire("wide", "k")
        client = self._absent()
        for call in (lambda: client.peek("wide", "k"), client.health,
                     lambda: client.release("conc", "k")):
            with self.assertRaises(sluice.ConnectError):
                call()
        self.assertEqual(client.unreachable_decisions, 0)

    # Verifies reserve follows the policy with a Reservation of no id, whose
    # settle and cancel ask nothing; a real id's settle raises.
    def test_reserve_follows_the_policy_and_its_settle_is_a_no_op(self):
        client = self._absent()
        opened = client.reserve("budget", "k", 5)
        self.assertEqual((opened.allowed, opened.id, opened.mode),
                         (True, None, sluice.MODE_UNREACHABLE))
        self.assertIsInstance(opened.error, sluice.ConnectError)
        self.assertEqual(client.settle(opened.id, 9).refunded, 0)
        self.assertEqual(client.cancel(opened.id).refunded, 0)
        self.assertEqual(client.unreachable_decisions, 1)
        with self.assertRaises(sluice.ConnectError):
            client.settle(42, 1)
        closed = self._absent(on_unreachable="fail_closed").reserve("budget", "k", 5)
        self.assertEqual((closed.allowed, closed.id, closed.retry_after_ms),
                         (False, None, _wire.UNREACHABLE_RETRY_AFTER_MS))
        with self.assertRaises(sluice.ConnectError):
            self._absent(on_unreachable="raise").reserve("budget", "k", 5)

    # Verifies a stopped daemon under fail_closed denies once the call times out.
    def test_stopped_daemon_under_fail_closed_denies(self):
        client = self.make_client(timeout_ms=TIMEOUT_MS, on_unreachable="fail_closed")
        client.health()
        with support.stopped(self.daemon):
            decision = client.acquire("wide", "k")
        self.assertFalse(decision.allowed)
        self.assertIsInstance(decision.error, sluice.CallTimeout)
        self.assertEqual(client.unreachable_decisions, 1)


def tearDownModule():
    support.tear_down_module()


if __name__ == "__main__":
    unittest.main()
