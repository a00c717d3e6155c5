#!/usr/bin/python3
"""Calendar windows on the real sluiced: a fixed_window rule with
window = "day" / "month" and a time_zone admits its limit per local day or
month, reset_after_ms points at the zone's next local midnight (or 1st),
`rules` shows the window and zone, and a zone the system does not know is
refused at its line; a global one is shared by two daemons on one Redis.

The expected boundaries come from Python's zoneinfo on the same tzdata, an
implementation independent of the daemon's (Howard Hinnant's date/tz).

Needs SLUICED (the daemon binary) in the environment; run with /usr/bin/python3
(python3-msgpack).
"""

import datetime
import os
import subprocess
import sys
import unittest
import zoneinfo

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SLUICED, Daemon, DaemonPairCase, tear_down_module  # noqa: E402

CONFIG = """
[daemon]
socket = "{socket}"
workers = 2

[[rule]]
name = "daily"
algorithm = "fixed_window"
limit = 3
window = "day"
time_zone = "Pacific/Auckland"

[[rule]]
name = "tokens"
algorithm = "fixed_window"
limits = [{{ limit = 1000, window = "day" }}, {{ limit = 20000, window = "month" }}]
time_zone = "America/New_York"
"""


def ms_until(boundary, now):
    return (boundary - now).total_seconds() * 1000


def next_midnight(zone, now):
    local = now.astimezone(zone)
    tomorrow = (local + datetime.timedelta(days=1)).date()
    return datetime.datetime.combine(tomorrow, datetime.time(), tzinfo=zone)


def next_first(zone, now):
    local = now.astimezone(zone)
    year, month = (local.year + 1, 1) if local.month == 12 else (local.year, local.month + 1)
    return datetime.datetime(year, month, 1, tzinfo=zone)


class CalendarTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon(dir_prefix="cal.")
        self.addCleanup(self.daemon.stop)
        self.daemon.start(CONFIG.format(socket=self.daemon.socket), connect=True)
        self.client = self.daemon.client

    def assert_resets_at(self, reset_after_ms, boundary, before, after):
        # The daemon answered between `before` and `after`; it rounds up.
        self.assertGreaterEqual(reset_after_ms, ms_until(boundary, after) - 1)
        self.assertLessEqual(reset_after_ms, ms_until(boundary, before) + 1)

    # Verifies that a daily limit in Auckland admits 3 and then denies until
    # Auckland's next midnight, which reset_after_ms and retry_after_ms name.
    def test_a_daily_limit_resets_at_the_zones_next_midnight(self):
        auckland = zoneinfo.ZoneInfo("Pacific/Auckland")
        before = datetime.datetime.now(datetime.timezone.utc)
        results = [self.client.result("acquire", "daily", "k", 1) for _ in range(4)]
        after = datetime.datetime.now(datetime.timezone.utc)
        if next_midnight(auckland, before) != next_midnight(auckland, after):
            self.skipTest("Auckland's midnight passed during the test")
        self.assertEqual([r["allowed"] for r in results], [True, True, True, False])
        self.assertEqual(results[2]["remaining"], 0)
        boundary = next_midnight(auckland, before)
        self.assert_resets_at(results[3]["reset_after_ms"], boundary, before, after)
        self.assert_resets_at(results[3]["retry_after_ms"], boundary, before, after)

    # Verifies that a rule with a daily and a monthly limit in New York
    # reports the day's, which has the fewest units left after a spend of
    # 990, and denies past it until New York's next midnight.
    def test_a_day_within_a_month_in_new_york_denies_until_local_midnight(self):
        new_york = zoneinfo.ZoneInfo("America/New_York")
        before = datetime.datetime.now(datetime.timezone.utc)
        spent = self.client.result("acquire", "tokens", "tenant", 990)
        over = self.client.result("acquire", "tokens", "tenant", 11)
        after = datetime.datetime.now(datetime.timezone.utc)
        if next_midnight(new_york, before) != next_midnight(new_york, after):
            self.skipTest("New York's midnight passed during the test")
        self.assertTrue(spent["allowed"])
        self.assertEqual(spent["remaining"], 10)
        self.assertFalse(over["allowed"])
        self.assert_resets_at(over["retry_after_ms"], next_midnight(new_york, before), before,
                              after)
        peek = self.client.result("peek", "tokens", "tenant")
        self.assertEqual(peek["remaining"], 10)

    # Verifies that `rules` shows each calendar limit's window and zone.
    def test_rules_show_the_window_and_the_time_zone(self):
        rules = {r["name"]: r for r in self.client.result("rules")}
        limits = rules["tokens"]["limits"]
        self.assertEqual([l["window"] for l in limits], ["day", "month"])
        self.assertEqual({l["time_zone"] for l in limits}, {"America/New_York"})
        self.assertEqual(rules["daily"]["limits"][0]["window"], "day")
        self.assertEqual(rules["daily"]["limits"][0]["time_zone"], "Pacific/Auckland")

    # Verifies that --check-config refuses an unknown zone at its line with
    # the fix.
    def test_an_unknown_time_zone_is_refused_at_its_line(self):
        path = os.path.join(self.daemon.dir, "bad.toml")
        with open(path, "w") as f:
            f.write('[[rule]]\nname = "b"\nalgorithm = "fixed_window"\nlimit = 5\n'
                    'window = "month"\ntime_zone = "Europe/Berln"\n')
        run = subprocess.run([SLUICED, "--check-config", path],
                             capture_output=True, text=True, timeout=30)
        self.assertNotEqual(run.returncode, 0)
        output = run.stdout + run.stderr
        self.assertIn("bad.toml:6:", output)
        self.assertIn('time_zone "Europe/Berln" is not a zone', output)
        self.assertIn('"Europe/Berlin"', output)


FLEET_CONFIG = """
[daemon]
socket = "{socket}"
workers = 2

[redis]
url = "redis://127.0.0.1:{port}"
node_id = "cal-{index}"
expected_nodes = 2
heartbeat_interval = "100ms"

[[rule]]
name = "monthly"
algorithm = "fixed_window"
limit = 40
window = "month"
time_zone = "Asia/Tokyo"
scope = "global"
"""


class CalendarFleetTest(DaemonPairCase):
    config = FLEET_CONFIG
    name = "cal"

    # Verifies that a global monthly budget in Tokyo is the fleet's: one
    # daemon alone may spend all 40 (its share would be 20), the other then
    # gets nothing, and the denial waits for Tokyo's next 1st.
    def test_a_global_monthly_budget_is_shared_by_the_fleet(self):
        tokyo = zoneinfo.ZoneInfo("Asia/Tokyo")
        before = datetime.datetime.now(datetime.timezone.utc)
        first = [self.daemons[0].acquire("monthly", "tenant") for _ in range(60)]
        second = [self.daemons[1].acquire("monthly", "tenant") for _ in range(20)]
        after = datetime.datetime.now(datetime.timezone.utc)
        if next_first(tokyo, before) != next_first(tokyo, after):
            self.skipTest("Tokyo's month ended during the test")
        self.assertEqual(sum(d["allowed"] for d in first), 40)
        self.assertEqual(sum(d["allowed"] for d in second), 0)
        denial = second[-1]
        boundary = next_first(tokyo, before)
        # The daemon answers from its slice, whose deny-until came from Redis's
        # clock: allow a second of slack on top of the rounding.
        self.assertGreaterEqual(denial["retry_after_ms"], ms_until(boundary, after) - 1000)
        self.assertLessEqual(denial["retry_after_ms"], ms_until(boundary, before) + 1000)


def tearDownModule():
    tear_down_module()


if __name__ == "__main__":
    unittest.main()
