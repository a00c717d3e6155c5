#!/usr/bin/python3
"""Tests for bench/fleet.py's issue 21 pieces, on synthetic numbers: the
max-min shares the shifting-skew gate measures against, the plans of the new
shapes, and the gated columns' PASS/MISS at and beyond each target.
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import fleet  # noqa: E402


def row(shape, **fields):
    base = dict(nodes=8, shape=shape, burst=fleet.burst_of(shape), windows=0, fault=None,
                net_calls_per_decision=0.0)
    base.update(fields)
    return base


class MaxMinSharesTest(unittest.TestCase):
    # Verifies that nodes wanting less than an equal share get their demand
    # and the rest goes to the others, equally.
    def test_small_demands_are_met_and_the_rest_is_split(self):
        self.assertEqual(fleet.max_min_shares([100, 100, 5000, 5000], 2000),
                         [100, 100, 900, 900])

    # Verifies that the 90/10 skew gives the hot node the limit less the
    # cold nodes' demand, and that the shares never exceed the capacity.
    def test_the_hot_node_of_a_skew_gets_the_limit_less_the_cold_demand(self):
        rates = fleet.skew_rates(8, 3, 6000)
        self.assertAlmostEqual(sum(rates), 6000)
        shares = fleet.max_min_shares(rates, 2000)
        self.assertAlmostEqual(shares[3], 2000 - 600)
        self.assertAlmostEqual(sum(shares), 2000)

    # Verifies that demands under the capacity are all met.
    def test_demand_under_the_capacity_is_all_met(self):
        self.assertEqual(fleet.max_min_shares([10, 20, 30], 2000), [10, 20, 30])


class PlanTest(unittest.TestCase):
    # Verifies that the contended shape runs with a burst within issue 21's
    # 3 % of limit x W, and small enough that a saturated bucket's windows,
    # limit x W / (limit x W + burst), can reach the gate's lower bound.
    def test_contended_runs_with_a_burst_the_gate_can_be_met_at(self):
        burst = fleet.burst_of("contended")
        self.assertEqual(burst, 20)
        self.assertLessEqual(burst, 0.03 * fleet.LIMIT_PER_S * fleet.PERIOD_S)
        best = fleet.LIMIT_PER_S * fleet.PERIOD_S / (fleet.LIMIT_PER_S * fleet.PERIOD_S + burst)
        self.assertGreaterEqual(best, fleet.CONTENDED_LOW + 0.005)
        self.assertEqual(fleet.burst_of("steady"), fleet.BURST)

    # Verifies that contended-gcra is the contended shape on a gcra rule: the
    # same burst and load, and the other shapes' rule stays a token bucket.
    def test_contended_gcra_runs_the_contended_shape_on_a_gcra_rule(self):
        self.assertEqual(fleet.algorithm_of("contended-gcra"), "gcra")
        self.assertEqual(fleet.algorithm_of("contended"), "token_bucket")
        self.assertEqual(fleet.burst_of("contended-gcra"), fleet.burst_of("contended"))
        self.assertEqual(fleet.plan("contended-gcra", 8, 10, 14)[:3],
                         fleet.plan("contended", 8, 10, 14)[:3])
        self.assertIn("contended-gcra", fleet.MODES["full"][1])

    # Verifies that the shifting skew moves the hot spot every SHIFT_EVERY_S.
    def test_shifting_skew_moves_the_hot_node(self):
        seconds, loads, initial, events, fault = fleet.plan("shifting-skew", 3, 10, 14)
        self.assertEqual(seconds, fleet.SHIFTS * fleet.SHIFT_EVERY_S)
        self.assertIsNone(fault)
        self.assertEqual([t for t, _ in events], [10.0, 20.0])
        node = fleet.LoadNode(loads[1], "/nonexistent")
        self.assertLess(node.rate_at(5.0), node.rate_at(15.0))
        self.assertGreater(node.rate_at(15.0), node.rate_at(25.0))

    # Verifies that the outage lasts OUTAGE_S and the run goes on after it.
    def test_outage_under_skew_kills_redis_for_five_seconds(self):
        seconds, loads, _, events, fault = fleet.plan("outage-skew", 8, 10, 8)
        self.assertEqual(fault, ("redis-kill", "redis-restart"))
        (kill, _), (restart, _) = events
        self.assertEqual(restart - kill, fleet.OUTAGE_S)
        self.assertGreater(seconds, restart)
        self.assertAlmostEqual(loads[0]["rate"] / sum(l["rate"] for l in loads),
                               fleet.SHIFT_HOT_SHARE)


class FakeRun:
    def __init__(self, shape, nodes, net_redis_calls=0.0):
        self.shape, self.nodes, self.burst = shape, nodes, fleet.burst_of(shape)
        _, self.loads, _, _, _ = fleet.plan(shape, nodes, 10, 14)
        self.net_redis_calls = net_redis_calls


def admissions(from_s, to_s, per_s):
    """Answer times of `per_s` admissions a second from from_s to to_s."""
    count = int((to_s - from_s) * per_s)
    return [from_s + (i + 0.5) / per_s for i in range(count)]


class MeasureTest(unittest.TestCase):
    def shift_run(self, hot_from_s):
        # Node 1 is hot from 10 s: its max-min share is 2000 - 2 x 300 = 1400/s.
        run = FakeRun("shifting-skew", 3)
        records = [dict(answered=[], allowed=[]) for _ in range(3)]
        times = admissions(hot_from_s, 20.0, 1400)
        records[1] = dict(answered=times, allowed=[True] * len(times))
        row = dict(decisions=1000)
        fleet.analyse21(run, row, records, [], {})
        return row

    # Verifies the time to the hot node's share: admitting its full share
    # from 150 ms after the shift, its first 50 ms window at 0.9 of it ends
    # at 200 ms (PASS); from 160 ms, at 210 ms (MISS).
    def test_the_hot_node_reaches_its_share_when_its_first_full_window_ends(self):
        row = self.shift_run(10.15)
        self.assertEqual(row["shifts"][0]["hot"], 1)
        self.assertAlmostEqual(row["shifts"][0]["share_per_s"], 1400)
        self.assertAlmostEqual(row["shifts"][0]["reach_s"], 0.2)
        self.assertIsNone(row["shifts"][1]["reach_s"])  # node 2 never admits
        self.assertEqual(fleet.gates21(dict(row, shape="shifting-skew", fault=None,
                                            windows=0))["shift"][1], "MISS")
        row = self.shift_run(10.16)
        self.assertAlmostEqual(row["shifts"][0]["reach_s"], 0.21)

    # Verifies the outage ratio: admissions from the kill to the restart
    # over limit x outage, whatever came before or after.
    def test_the_outage_ratio_counts_only_the_outage(self):
        run = FakeRun("outage-skew", 8)
        admitted = sorted(admissions(0, 3, 2000) + admissions(3, 8, 860) + admissions(8, 11, 2000))
        row = dict(decisions=len(admitted))
        fleet.analyse21(run, row, [], admitted, {"redis-kill": 3.0, "redis-restart": 8.0})
        self.assertEqual(row["outage"]["admitted"], 4300)
        self.assertAlmostEqual(row["outage"]["ratio"], 0.43)

    # Verifies that the cost is the net calls over the decisions.
    def test_net_calls_per_decision(self):
        row = dict(decisions=6000)
        fleet.analyse21(FakeRun("contended", 8, net_redis_calls=60.0), row, [], [], {})
        self.assertAlmostEqual(row["net_calls_per_decision"], 0.01)
        self.assertEqual(row["burst"], 20)


class GatesTest(unittest.TestCase):
    # Verifies the contended accuracy band and cost limit, at and beyond.
    def test_contended_gates(self):
        ok = fleet.gates21(row("contended", windows=90, ratio_min=0.98, ratio_max=1.005,
                               net_calls_per_decision=0.01))
        self.assertEqual(ok["accuracy"][1], "PASS")
        self.assertEqual(ok["cost"][1], "PASS")
        bad = fleet.gates21(row("contended", windows=90, ratio_min=0.979, ratio_max=1.0,
                                net_calls_per_decision=0.12))
        self.assertEqual(bad["accuracy"][1], "MISS")
        self.assertEqual(bad["cost"][1], "MISS")
        self.assertNotIn("shift", ok)
        gcra = fleet.gates21(row("contended-gcra", windows=90, ratio_min=0.98, ratio_max=1.005,
                                 net_calls_per_decision=0.02))
        self.assertEqual((gcra["accuracy"][1], gcra["cost"][1]), ("PASS", "MISS"))

    # Verifies that every shift must be reached in time, and that one never
    # reached misses.
    def test_shift_gate_needs_every_shift_within_two_intervals(self):
        def shifts(*reach):
            return [dict(reach_s=r) for r in reach]
        self.assertEqual(fleet.gates21(row("shifting-skew", shifts=shifts(0.1, 0.2)))["shift"][1],
                         "PASS")
        self.assertEqual(fleet.gates21(row("shifting-skew", shifts=shifts(0.1, 0.21)))["shift"][1],
                         "MISS")
        self.assertEqual(fleet.gates21(row("shifting-skew", shifts=shifts(0.1, None)))["shift"][1],
                         "MISS")

    # Verifies the outage band and the overshoot column of a fault run.
    def test_outage_gate_and_overshoot(self):
        fault = dict(overshoot=10, overshoot_bound=20)
        gates = fleet.gates21(row("outage-skew", outage=dict(ratio=0.43), fault=fault))
        self.assertEqual(gates["outage"], ("0.430", "MISS"))
        self.assertEqual(gates["overshoot"][1], "PASS")
        gates = fleet.gates21(row("outage-skew", outage=dict(ratio=0.95),
                                  fault=dict(overshoot=30, overshoot_bound=20)))
        self.assertEqual(gates["outage"][1], "PASS")
        self.assertEqual(gates["overshoot"][1], "MISS")
        self.assertEqual(fleet.gates21(row("outage-skew", outage=dict(ratio=1.01),
                                           fault=fault))["outage"][1], "MISS")


if __name__ == "__main__":
    unittest.main()
