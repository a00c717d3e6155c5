#!/usr/bin/python3
"""Bounded waiting (shaping) on the real sluiced: an acquire that may wait
for its units is answered "allowed" once they are due, in arrival order, with
waited_ms; beyond its max_wait it is denied at once; a paced rule lets one
unit through per interval; waiting never stalls other clients; a stopping
daemon answers every waiter at once.

Needs SLUICED (the daemon binary) in the environment; run with /usr/bin/python3
(python3-msgpack).
"""

import os
import signal
import socket
import statistics
import sys
import time
import unittest

import msgpack

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Client, Daemon, tear_down_module  # noqa: E402

CONFIG = """
[daemon]
socket = "{socket}"
workers = 2

[[rule]]
name = "paced"
algorithm = "gcra"
limit = 10
period = "1s"
pace = true
max_wait = "15s"

[[rule]]
name = "bucket"
algorithm = "token_bucket"
limit = 10
period = "1s"
burst = 2

[[rule]]
name = "window"
algorithm = "fixed_window"
limit = 1000
period = "1s"
"""

WAITERS = 100
INTERVAL_S = 0.1  # 10 per second, paced
# How far a release may stray from its ideal time (timers fire on whole
# milliseconds), and the share of releases that must be that close: on a
# shared 2-CPU machine a moment without CPU delays a few, which then catch up
# (due times are absolute).
RELEASE_TOLERANCE_S = 0.05
RELEASES_ON_TIME = 0.9
MEAN_DEVIATION_MAX_S = 0.02
# The same under ThreadSanitizer, whose daemon fires its timers late on a
# slow host (a mean of 24 ms measured there).
TSAN_MEAN_DEVIATION_MAX_S = 0.04
# Another client's answers while the waiters are held: a loop that waiters
# stalled would delay them all; a moment without CPU on a shared machine
# delays one or two.
OTHER_CLIENT_P95_S = 0.05
OTHER_CLIENT_MAX_S = 0.5


class ShapingTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon(dir_prefix="sh.")
        self.addCleanup(self.daemon.stop)
        self.daemon.start(CONFIG.format(socket=self.daemon.socket), connect=True)
        self.socket = self.daemon.socket
        self.client = self.daemon.client
        self.proc = self.daemon.proc
        self.logs = self.daemon.logs

    # Verifies the pacing case: 100 waiters on a 10/s paced rule are
    # released about 100 ms apart in arrival order, each told how long it
    # waited, while another client's requests are answered at once.
    def test_paced_waiters_leave_one_interval_apart_in_arrival_order(self):
        frames = b"".join(msgpack.packb([0, i, "acquire", ["paced", "payments", 1]])
                          for i in range(WAITERS))
        sent = time.monotonic()
        self.client.sock.sendall(frames)
        other = Client(self.socket)
        other.sock.setblocking(True)
        released = []  # (msgid, seconds since sent, result)
        other_times = []
        self.client.sock.settimeout(0.02)
        deadline = sent + WAITERS * INTERVAL_S + 5
        while len(released) < WAITERS and time.monotonic() < deadline:
            try:
                response = self.client.recv()
                released.append((response[1], time.monotonic() - sent, response[3]))
            except TimeoutError:
                pass
            started = time.monotonic()
            other.result("acquire", "window", "other")
            other_times.append(time.monotonic() - started)
        other.close()

        self.assertEqual(len(released), WAITERS, "not every waiter was answered")
        self.assertEqual([msgid for msgid, _, _ in released], list(range(WAITERS)))
        self.assertTrue(all(result["allowed"] for _, _, result in released))
        # Judged from the first release (answered at once): the daemon paces
        # from the requests' arrival, which a busy host delays for all of
        # them alike.
        first_at = released[0][1]
        deviations = [abs(at - first_at - i * INTERVAL_S) for i, (_, at, _) in enumerate(released)]
        waited_error = max(abs(result["waited_ms"] - i * INTERVAL_S * 1000)
                           for i, (_, _, result) in enumerate(released))
        other_times.sort()
        other_p95 = other_times[int(len(other_times) * 0.95)]
        print("\nmeasured: %d paced releases at 10/s: the first after %.1f ms, the others' "
              "deviation from one interval apart mean %.1f ms, worst %.1f ms; waited_ms off by "
              "at most %d ms; other client's answers p95 %.1f ms, slowest %.1f ms"
              % (WAITERS, first_at * 1000, statistics.mean(deviations) * 1000,
                 max(deviations) * 1000, waited_error, other_p95 * 1000, other_times[-1] * 1000))
        self.assertLessEqual(first_at, OTHER_CLIENT_MAX_S)
        on_time = sum(d <= RELEASE_TOLERANCE_S for d in deviations) / WAITERS
        self.assertGreaterEqual(on_time, RELEASES_ON_TIME, deviations)
        tsan = self.daemon.maps_library("libtsan")
        self.assertLessEqual(statistics.mean(deviations),
                             TSAN_MEAN_DEVIATION_MAX_S if tsan else MEAN_DEVIATION_MAX_S)
        self.assertLessEqual(waited_error, 2)
        self.assertLessEqual(other_p95, OTHER_CLIENT_P95_S)
        self.assertLessEqual(other_times[-1], OTHER_CLIENT_MAX_S)

    # Verifies waiting on a token bucket: the burst passes at once, the next
    # unit is answered when refilled (waited_ms about 100), and a request
    # whose units would come after its max_wait_ms is denied at once.
    def test_request_waits_within_its_max_wait_and_is_denied_beyond(self):
        first = time.monotonic()
        for _ in range(2):
            self.assertEqual(self.client.result("acquire", "bucket", "k", 1, 500)["waited_ms"], 0)
        started = time.monotonic()
        waited = self.client.result("acquire", "bucket", "k", 1, 500)
        took = time.monotonic() - started
        self.assertTrue(waited["allowed"])
        # The next unit refills 100 ms after the first acquire: what passed
        # since then (a few ms on a busy machine) is not waited.
        since_first_ms = (started - first) * 1000
        self.assertLessEqual(waited["waited_ms"], 102)
        self.assertGreaterEqual(waited["waited_ms"], 100 - since_first_ms - 2)
        self.assertGreaterEqual(took, 0.095 - since_first_ms / 1000)
        # Two units are 200 ms of refill away (less what passes before the
        # request arrives, a few ms, or tens under ThreadSanitizer on a busy
        # machine): beyond a wait of 50 ms.
        started = time.monotonic()
        denied = self.client.result("acquire", {"rule": "bucket", "key": "k", "cost": 2,
                                                "max_wait_ms": 50})
        self.assertLess(time.monotonic() - started, 0.05)
        self.assertFalse(denied["allowed"])
        self.assertGreater(denied["retry_after_ms"], 50)
        self.assertNotIn("waited_ms", self.client.result("acquire", "bucket", "other"))

    # Verifies a rule's max_wait applies when the request does not say, and
    # max_wait_ms = 0 asks for an answer at once; `rules` shows both options.
    def test_rule_max_wait_is_the_default(self):
        paced = next(r for r in self.client.result("rules") if r["name"] == "paced")
        self.assertEqual((paced["max_wait_ms"], paced["pace"], paced["limits"][0]["burst"]),
                         (15000, True, 1))
        self.client.result("acquire", "paced", "d")
        now = self.client.result("acquire", "paced", "d", 1, 0)
        self.assertFalse(now["allowed"])
        self.assertNotIn("waited_ms", now)  # it could not wait
        later = self.client.result("acquire", "paced", "d")
        self.assertTrue(later["allowed"])
        self.assertGreaterEqual(later["waited_ms"], 90)

    # Verifies max_wait_ms on a rule that cannot wait is refused, naming the
    # rule, and 0 is accepted anywhere.
    def test_max_wait_on_a_window_rule_is_refused(self):
        error, _ = self.client.call("acquire", "window", "k", 1, 100)
        self.assertEqual(error["code"], "BAD_REQUEST")
        self.assertIn('rule "window" is local fixed_window', error["message"])
        self.assertTrue(self.client.result("acquire", "window", "k", 1, 0)["allowed"])

    # Verifies a client that hangs up while waiting leaves nothing behind
    # but its reserved units: the next waiter on the key is served as usual,
    # at its time behind the two abandoned (due 100 and 200 ms after the
    # first). Judged by the clock from before the first was sent, not by
    # waited_ms: a moment without CPU between the hang-up and the next
    # request shortens its wait, not its due time. The three go in one
    # write, so the daemon reads them together and has decided all three
    # when the first's answer comes; sent apart, the first could be read
    # alone, and the next waiter, on another connection (and worker), be
    # decided before the other two were read.
    def test_waiter_that_hangs_up_is_forgotten(self):
        leaver = Client(self.socket)
        started = time.monotonic()
        leaver.sock.sendall(b"".join(msgpack.packb([0, i, "acquire", ["paced", "gone", 1]])
                                     for i in range(3)))
        leaver.recv()  # the first is due at once
        leaver.close()
        later = self.client.result("acquire", "paced", "gone", 1, 2000)
        answered_after = time.monotonic() - started
        self.assertTrue(later["allowed"])
        # Timers fire on whole milliseconds: a due time may come 1 ms early.
        self.assertGreaterEqual(answered_after, 3 * INTERVAL_S - 0.002)
        self.assertEqual(self.proc.poll(), None)

    # Verifies a client that only shuts its sending side down still gets the
    # answers to what it sent, a waiting one's included, and then the daemon
    # closes (a client that closes its socket has its waiters dropped).
    def test_half_closed_client_gets_its_waited_answers(self):
        client = Client(self.socket)
        for i in range(2):
            client.send([0, i, "acquire", ["paced", "half", 1]])
        client.sock.shutdown(socket.SHUT_WR)
        client.sock.settimeout(5)
        answers = [client.recv() for _ in range(2)]
        self.assertEqual([a[1] for a in answers], [0, 1])
        self.assertTrue(all(a[3]["allowed"] for a in answers), answers)
        self.assertGreaterEqual(answers[1][3]["waited_ms"], 80)
        self.assertEqual(client.sock.recv(1), b"")
        client.close()

    # Verifies SIGTERM answers every waiter at once with the normal denial
    # (retry_after_ms: until its units would have been due), then exits 0.
    def test_stop_answers_waiters_with_a_denial(self):
        for i in range(5):
            self.client.send([0, i, "acquire", ["paced", "stop", 1]])
        first = self.client.recv()
        self.assertTrue(first[3]["allowed"])
        time.sleep(0.05)  # the other four are held
        self.proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        answers = [self.client.recv() for _ in range(4)]
        self.assertLess(time.monotonic() - started, 1.0)
        self.assertEqual(sorted(a[1] for a in answers), [1, 2, 3, 4])
        for answer in answers:
            self.assertFalse(answer[3]["allowed"], answer)
            self.assertGreater(answer[3]["retry_after_ms"], 0)
        self.assertEqual(self.proc.wait(timeout=10), 0, self.logs())


def tearDownModule():
    tear_down_module()


if __name__ == "__main__":
    unittest.main()
