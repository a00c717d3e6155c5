#!/usr/bin/python3
"""Reserve, settle and cancel (issue 22) against the real sluiced, over its
Unix socket from Python's msgpack: the wire shapes of docs/protocol.md
("Reservations"), refunds, debt, cancel, expiry at the estimate and the
clear errors.

Run by ctest; SLUICED names the daemon binary.
"""

import json
import os
import socket
import subprocess
import unittest

import http.client

from harness import (Client, Daemon, Redis, free_port, redis_key, redis_section,
                     tear_down_module, wait_for)

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

[[rule]]
name = "capped"
algorithm = "fixed_window"
limit = 1000
period = "1h"
max_debt = 100
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

    def test_a_debt_past_the_keys_bound_is_charged_up_to_it_and_the_rest_unpaid(self):
        reserved = self.client.result("reserve", "capped", "runaway", 1000)
        settled = self.client.result("settle", reserved["id"], 1500)
        self.assertEqual(settled["debt"], 100)
        self.assertEqual(settled["unpaid"], 400)
        self.assertEqual(settled["remaining"], -100)
        self.assertEqual(self.client.result("peek", "capped", "runaway")["remaining"], -100)
        counted = self.reservations()
        self.assertEqual(counted["debt_units"], 100)
        self.assertEqual(counted["unpaid_units"], 400)
        self.assertEqual(counted["unpaid"], 1)
        within = self.client.result("reserve", "tokens", "fine", 10)
        self.assertEqual(self.client.result("settle", within["id"], 15)["unpaid"], 0)

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

    def sluicectl(self, *args):
        return subprocess.run([os.environ["SLUICECTL"], "--socket", self.daemon.socket, "--json",
                               *args], capture_output=True, text=True, timeout=10)

    @unittest.skipUnless(os.environ.get("SLUICECTL"), "SLUICECTL names the sluicectl binary")
    def test_sluicectl_reserves_settles_and_cancels(self):
        reserved = self.sluicectl("reserve", "tokens", "cli", "900", "30000")
        self.assertEqual(reserved.returncode, 0, reserved.stderr)
        rid = json.loads(reserved.stdout)["id"]
        settled = self.sluicectl("settle", str(rid), "1000")
        self.assertEqual(settled.returncode, 0, settled.stderr)
        self.assertEqual(json.loads(settled.stdout)["debt"], 100)
        again = self.sluicectl("cancel", str(rid))
        self.assertEqual(again.returncode, 3)
        self.assertIn("UNKNOWN_RESERVATION", again.stderr)
        bad = self.sluicectl("settle", "x", "1")
        self.assertEqual(bad.returncode, 2)

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


class RoutedSettles(unittest.TestCase):
    """A settle on any connection finds its reservation: one that reaches
    another worker than the one that holds it is routed there."""

    def setUp(self):
        self.daemon = Daemon("budget-routed")
        config = CONFIG.format(socket=self.daemon.socket).replace("workers = 1", "workers = 3")
        self.daemon.start(config)

    def tearDown(self):
        self.daemon.stop()

    def test_a_settle_on_another_connection_finds_its_reservation(self):
        # Open at once, the connections go to the workers with the fewest
        # (one each, then a second each): a settle on the next connection
        # reaches another worker than its reserve's.
        clients = [Client(self.daemon.socket) for _ in range(6)]
        try:
            workers = set()
            for i, client in enumerate(clients):
                reserved = client.result("reserve", "tokens", "r", 1000, 30000)
                workers.add(reserved["id"] >> 48)
                other = clients[(i + 1) % len(clients)]
                settled = other.result("settle", reserved["id"], 100 + i)
                self.assertEqual(settled["refunded"], 900 - i)
        finally:
            for client in clients:
                client.close()
        self.assertEqual(len(workers), 3)
        self.assertEqual(self.daemon.ask("stats")["reservations"]["open"], 0)


class HttpReservations(unittest.TestCase):
    """/v1/reserve and /v1/settle: a settle reaches the worker that holds its
    reservation, whichever worker took the reserve."""

    def setUp(self):
        self.port = free_port()
        self.daemon = Daemon("budget-http")
        config = CONFIG.format(socket=self.daemon.socket).replace("workers = 1", "workers = 3")
        self.daemon.start(config + '\n[http]\nlisten = "127.0.0.1:%d"\n' % self.port)
        # The daemon accepts on its socket before its HTTP front listens.
        self.assertTrue(wait_for(lambda: self.accepts_http(), 10), self.daemon.logs())

    def accepts_http(self):
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def tearDown(self):
        self.daemon.stop()

    def post(self, path):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            connection.request("POST", path)
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), json.loads(response.read())
        finally:
            connection.close()

    def test_every_settle_finds_its_reservation(self):
        for i in range(12):
            status, headers, body = self.post(
                "/v1/reserve?rule=tokens&key=h&estimate=1000&ttl_ms=30000")
            self.assertEqual(status, 200, body)
            self.assertEqual(headers["Sluice-Reservation"], str(body["id"]))
            status, _, settled = self.post("/v1/settle?id=%d&actual=%d" % (body["id"], 400 + i))
            self.assertEqual(status, 200, settled)
            self.assertEqual(settled["refunded"], 600 - i)
        status, _, problem = self.post("/v1/settle?id=%d&actual=0" % body["id"])
        self.assertEqual(status, 404)
        self.assertIn("no open reservation", problem["detail"])

    def test_a_settle_past_the_keys_debt_bound_answers_what_it_left_unpaid(self):
        status, _, body = self.post("/v1/reserve?rule=capped&key=h&estimate=1000")
        self.assertEqual(status, 200, body)
        status, _, settled = self.post("/v1/settle?id=%d&actual=1500" % body["id"])
        self.assertEqual(status, 200, settled)
        self.assertEqual((settled["debt"], settled["unpaid"], settled["remaining"]),
                         (100, 400, -100))
        status, _, body = self.post("/v1/reserve?rule=tokens&key=h2&estimate=10")
        status, _, settled = self.post("/v1/settle?id=%d&actual=15" % body["id"])
        self.assertEqual((settled["debt"], settled["unpaid"]), (5, 0))


GLOBAL_CONFIG = """
[daemon]
socket = "{socket}"
workers = 1
log_level = "warn"

[[rule]]
name = "tokens"
algorithm = "fixed_window"
limit = 1000000
period = "1h"
scope = "global"
on_redis_down = "local"

[[rule]]
name = "capped"
algorithm = "fixed_window"
limit = 1000000
period = "1h"
scope = "global"
max_debt = 50000
"""


class GlobalReservations(unittest.TestCase):
    """A global rule's refunds and debts flow through the key's slice: a hot
    tenant costs Redis no call per reserve or settle."""

    def setUp(self):
        self.redis = Redis()
        self.daemon = Daemon("budget-global")
        self.daemon.start(GLOBAL_CONFIG.format(socket=self.daemon.socket) +
                          redis_section(self.redis.port), connect=True)
        self.client = self.daemon.client
        self.assertTrue(wait_for(lambda: self.client.result("health")["redis"] == "up", 10))

    def tearDown(self):
        self.daemon.stop()
        self.redis.stop()

    def warm(self, key, rule="tokens"):
        # A cold key's first request may be decided on the share while its
        # first lease is on the way.
        self.assertTrue(wait_for(
            lambda: self.client.result("acquire", rule, key, 1)["mode"] == "normal", 10))

    def test_reserve_and_settle_on_the_slice(self):
        self.warm("hot")
        reserved = self.client.result("reserve", "tokens", "hot", 4096, 30000)
        self.assertTrue(reserved["allowed"])
        self.assertEqual(reserved["mode"], "normal")
        settled = self.client.result("settle", reserved["id"], 1000)
        self.assertEqual(settled["refunded"], 3096)
        self.assertEqual(settled["mode"], "normal")
        self.assertGreaterEqual(settled["remaining"], 3096)

    def test_a_hot_tenant_costs_redis_no_call_per_reserve_or_settle(self):
        # Warm the key: its first leases size the batch.
        for _ in range(50):
            reserved = self.client.result("reserve", "tokens", "hot", 100)
            self.client.result("settle", reserved["id"], 60)
        before = self.redis.script_calls()
        pairs = 500
        for _ in range(pairs):
            reserved = self.client.result("reserve", "tokens", "hot", 100)
            self.assertTrue(reserved["allowed"])
            self.client.result("settle", reserved["id"], 60)
        calls = self.redis.script_calls() - before
        print("\nmeasured: %d Redis script calls for %d reserve+settle pairs (%.4f per pair)"
              % (calls, pairs, calls / pairs))
        self.assertLessEqual(calls / pairs, 0.05)

    def test_the_next_lease_pays_a_debt_the_slice_carries(self):
        self.warm("d")
        granted = self.client.result("stats")["leases"]["granted_units"]
        reserved = self.client.result("reserve", "tokens", "d", 10)
        settled = self.client.result("settle", reserved["id"], 20010)
        self.assertEqual(settled["debt"], 20000)
        self.assertLess(settled["remaining"], 0)  # the slice held less
        # The next request leases the debt and its own cost together.
        self.assertTrue(self.client.result("acquire", "tokens", "d", 1)["allowed"])
        stats = self.client.result("stats")
        self.assertEqual(stats["reservations"]["debt_units"], 20000)
        self.assertGreaterEqual(stats["leases"]["granted_units"] - granted, 20000)

    def test_open_reservations_and_debt_are_in_the_overshoot_bound(self):
        self.warm("o", "capped")
        bound = lambda: self.client.result("stats")["overshoot_bound"]["capped"]
        self.assertEqual(bound(), 0)
        reserved = self.client.result("reserve", "capped", "o", 10)
        self.assertEqual(bound(), 50000)  # it may settle up to max_debt past
        settled = self.client.result("settle", reserved["id"], 10 + 10000000)
        self.assertGreater(settled["unpaid"], 0)
        self.assertEqual(settled["remaining"], -50000)
        self.assertEqual(bound(), 50000)  # none open: what the slice owes
        # The next lease pays the debt, and Redis has counted every unit.
        self.assertTrue(self.client.result("acquire", "capped", "o", 1)["allowed"])
        self.assertEqual(bound(), 0)

    def test_a_killed_daemons_open_reservations_stay_spent_in_redis(self):
        self.warm("k")
        for _ in range(5):
            self.assertTrue(self.client.result("reserve", "tokens", "k", 1000, 60000)["allowed"])
        self.daemon.proc.kill()
        self.daemon.proc.wait(10)
        # The estimates came out of leased units, which Redis counted when it
        # granted them: a node that dies never gives them back, so its open
        # reservations end settled at their estimates for the whole fleet.
        counted = int(self.redis.command("HGET", redis_key("q", "tokens", "k"), "n"))
        self.assertGreaterEqual(counted, 5 * 1000)

    def test_a_killed_daemons_open_reservations_stay_spent_for_the_fleet(self):
        # Two more daemons on the same Redis share a 10,000-unit key.
        config = (GLOBAL_CONFIG.replace("limit = 1000000", "limit = 10000", 1) +
                  redis_section(self.redis.port).replace("expected_nodes = 1", "expected_nodes = 3"))
        dying, other = Daemon("budget-dying"), Daemon("budget-other")
        for daemon in (dying, other):
            self.addCleanup(daemon.stop)
            daemon.start(config.format(socket=daemon.socket), connect=True)
        for daemon in (dying, other):
            self.assertTrue(wait_for(lambda: daemon.client.result(
                "acquire", "tokens", "fleet", 1)["mode"] == "normal", 10))
        # Units spent from leases (mode normal), which Redis counted when it
        # granted them; under load a lease may come late and the share
        # decide instead: those are cancelled, or not counted.
        warmed = dying.client.result("stats")["allowed"]["normal"]
        reserved = 0
        for _ in range(50):
            answer = dying.client.result("reserve", "tokens", "fleet", 1000, 60000)
            self.assertTrue(answer["allowed"])
            if answer["mode"] != "normal":
                dying.client.result("cancel", answer["id"])
                continue
            reserved += 1
            if reserved == 5:
                break
        self.assertEqual(reserved, 5)
        dying.proc.kill()
        dying.proc.wait(10)
        # The other daemon spends what the fleet has left, at once: the dead
        # node's open estimates stay spent (they settle at their estimates),
        # so it admits no more than the limit less them.
        spent = other.client.result("stats")["allowed"]["normal"]
        for _ in range(400):
            answer = other.client.result("acquire", "tokens", "fleet", 100)
            if answer["mode"] == "normal":
                if not answer["allowed"]:
                    break
                spent += 100
        self.assertGreater(spent, 0)
        self.assertLessEqual(spent + 5 * 1000 + warmed, 10000)
        counted = int(self.redis.command("HGET", redis_key("q", "tokens", "fleet"), "n"))
        self.assertGreaterEqual(counted, spent + 5 * 1000 + warmed)
        self.assertLessEqual(counted, 10000)

    def test_a_debt_past_the_slice_denies_until_a_lease_pays_it(self):
        self.warm("over")
        reserved = self.client.result("reserve", "tokens", "over", 10)
        # More than the whole window: the slice carries the debt, and Redis
        # has nothing to pay it with until the window ends.
        settled = self.client.result("settle", reserved["id"], 2000000)
        self.assertLess(settled["remaining"], 0)
        self.assertFalse(settled["allowed"])
        self.assertFalse(self.client.result("acquire", "tokens", "over", 1)["allowed"])
        self.assertFalse(self.client.result("reserve", "tokens", "over", 1)["allowed"])


if __name__ == "__main__":
    unittest.main()
