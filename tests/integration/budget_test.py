#!/usr/bin/python3
"""Reserve, settle and cancel (issue 22) against the real sluiced, over its
Unix socket from Python's msgpack: the wire shapes of docs/protocol.md
("Reservations"), refunds, debt, cancel, expiry at the estimate and the
clear errors.

Run by ctest; SLUICED names the daemon binary.
"""

import unittest

from harness import Daemon, tear_down_module, wait_for

CONFIG = """
[daemon]
socket = "{socket}"
workers = 1
log_level = "warn"

[[rule]]
name = "tokens"
algorithm = "fixed_window"
limit = 100000
period = "1h"

[[rule]]
name = "bucket"
algorithm = "token_bucket"
limit = 1000
period = "1h"
burst = 1000

[[rule]]
name = "uploads"
algorithm = "concurrency"
limit = 2
period = "1m"
"""


def tearDownModule():
    tear_down_module()


class LocalReservations(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon("budget")
        self.daemon.start(CONFIG.format(socket=self.daemon.socket), connect=True)
        self.client = self.daemon.client

    def tearDown(self):
        self.daemon.stop()

    def test_a_settle_below_the_estimate_refunds_the_rest(self):
        reserved = self.client.result("reserve", "tokens", "tenant", 4096, 30000)
        self.assertTrue(reserved["allowed"])
        self.assertEqual(reserved["remaining"], 100000 - 4096)
        self.assertIsInstance(reserved["id"], int)
        settled = self.client.result("settle", reserved["id"], 1000)
        self.assertEqual(settled["id"], reserved["id"])
        self.assertEqual(settled["refunded"], 3096)
        self.assertEqual(settled["debt"], 0)
        self.assertEqual(settled["remaining"], 99000)
        self.assertEqual(self.client.result("peek", "tokens", "tenant")["remaining"], 99000)

    def test_the_map_forms_are_the_same_requests(self):
        reserved = self.client.result(
            "reserve", {"rule": "bucket", "key": "k", "estimate": 600, "ttl_ms": 5000})
        settled = self.client.result("settle", {"id": reserved["id"], "actual": 650})
        self.assertEqual(settled["debt"], 50)
        self.assertEqual(settled["refunded"], 0)

    def test_a_settle_above_the_estimate_is_debt_paid_before_anything_new(self):
        reserved = self.client.result("reserve", "tokens", "t", 100000)
        settled = self.client.result("settle", reserved["id"], 100500)
        self.assertEqual(settled["debt"], 500)
        self.assertEqual(self.reservations()["debt_units"], 500)
        self.assertEqual(settled["remaining"], -500)
        self.assertFalse(settled["allowed"])
        self.assertFalse(self.client.result("acquire", "tokens", "t", 1)["allowed"])
        denied = self.client.result("reserve", "tokens", "t", 1)
        self.assertFalse(denied["allowed"])
        self.assertNotIn("id", denied)

    def test_a_bucket_in_debt_reports_what_it_owes(self):
        reserved = self.client.result("reserve", "bucket", "t", 1000)
        settled = self.client.result("settle", reserved["id"], 1300)
        self.assertEqual(settled["remaining"], -300)

    def test_cancel_gives_everything_back(self):
        reserved = self.client.result("reserve", "bucket", "c", 1000)
        self.assertFalse(self.client.result("acquire", "bucket", "c", 1)["allowed"])
        cancelled = self.client.result("cancel", reserved["id"])
        self.assertEqual(cancelled["refunded"], 1000)
        self.assertTrue(self.client.result("acquire", "bucket", "c", 1)["allowed"])

    def reservations(self):
        return self.client.result("stats")["reservations"]

    def test_an_unsettled_reservation_expires_at_its_estimate(self):
        reserved = self.client.result("reserve", "tokens", "e", 700, 200)
        self.assertEqual(self.reservations()["open"], 1)
        # The worker's sweep closes it within a second of its TTL.
        self.assertTrue(wait_for(lambda: self.reservations()["expired"] == 1, 5))
        self.assertEqual(self.reservations()["open"], 0)
        error, _ = self.client.call("cancel", reserved["id"])
        self.assertEqual(error["code"], "UNKNOWN_RESERVATION")
        # Only the expired estimate stays spent.
        self.assertEqual(self.client.result("peek", "tokens", "e")["remaining"], 100000 - 700)

    def test_a_reservation_outlives_the_connection_that_opened_it(self):
        other = self.daemon.connect()
        reserved = other.result("reserve", "tokens", "gone", 500, 60000)
        other.close()
        settled = self.client.result("settle", reserved["id"], 100)
        self.assertEqual(settled["refunded"], 400)

    def test_errors_name_what_is_wrong(self):
        error, _ = self.client.call("settle", 12345, 1)
        self.assertEqual(error["code"], "UNKNOWN_RESERVATION")
        error, _ = self.client.call("reserve", "uploads", "k", 1)
        self.assertEqual(error["code"], "BAD_REQUEST")
        self.assertIn("concurrency", error["message"])
        error, _ = self.client.call("reserve", "tokens", "k", 0)
        self.assertEqual(error["code"], "BAD_REQUEST")
        self.assertIn("estimate", error["message"])
        error, _ = self.client.call("settle", -1, 1)
        self.assertEqual(error["code"], "BAD_REQUEST")
        error, _ = self.client.call("reserve", "nope", "k", 1)
        self.assertEqual(error["code"], "UNKNOWN_RULE")


if __name__ == "__main__":
    unittest.main()
