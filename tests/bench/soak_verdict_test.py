#!/usr/bin/python3
"""Tests for bench/soak's verdict on RSS drift (drift_pct_per_hour, verdict):
synthetic hours of samples, one behaviour each. A leak must fail, smooth or
in steps; a single step away from the window's middle must not read as drift.
"""

import importlib.machinery
import importlib.util
import os
import random
import types
import unittest

SOAK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "soak")
_loader = importlib.machinery.SourceFileLoader("soak", SOAK)
soak = importlib.util.module_from_spec(importlib.util.spec_from_loader("soak", _loader))
_loader.exec_module(soak)

WARMUP_S = 360        # a 1-hour run's warm-up (SOAK_WARMUP_FRACTION 0.1)
END_S = 3600
SAMPLE_S = 7
BASE_KIB = 18_600     # the local daemon's RSS
TARGET = soak.DRIFT_TARGET_PCT_PER_H


def run(rss_kib_at, seed=1):
    """Samples of a run whose RSS is rss_kib_at(t_s), plus a few KiB of noise."""
    rng = random.Random(seed)
    return [{"t_s": t, "rss_kib": int(rss_kib_at(t)) + rng.choice([0, 0, 4, -4, 8]),
             "rss_anon_kib": 9000, "fds": 24, "threads": 3, "handles": 16, "redis": "none",
             "breaker": "", "redis_fault": "none"}
            for t in range(SAMPLE_S, END_S + 1, SAMPLE_S)]


def after_warmup(samples):
    return [s for s in samples if s["t_s"] >= WARMUP_S]


def leak(pct_per_h, every_s=SAMPLE_S, phase_s=0):
    """RSS growing pct_per_h in a step every every_s."""
    step_kib = BASE_KIB * pct_per_h / 100 * every_s / 3600
    return lambda t: BASE_KIB + step_kib * ((t + phase_s) // every_s)


def one_step(kib, at_fraction):
    """RSS flat but for one step at at_fraction of the window after warm-up."""
    at_s = WARMUP_S + at_fraction * (END_S - WARMUP_S)
    return lambda t: BASE_KIB + (kib if t >= at_s else 0)


def judge(samples):
    daemon = types.SimpleNamespace(name="local", samples=samples)
    return soak.verdict(daemon, WARMUP_S)


class DriftTest(unittest.TestCase):
    def test_flat_rss_with_noise_reads_no_drift(self):
        self.assertAlmostEqual(soak.drift_pct_per_hour(after_warmup(run(leak(0)))), 0, delta=0.05)

    def test_smooth_leak_reads_its_rate(self):
        for pct in (0.5, 2.0, 5.0):
            drift = soak.drift_pct_per_hour(after_warmup(run(leak(pct))))
            self.assertAlmostEqual(drift, pct, delta=0.03 * pct, msg="%s %%/hour" % pct)

    def test_leak_in_a_step_every_ten_minutes_reads_its_rate(self):
        for phase_s in range(0, 600, 100):
            drift = soak.drift_pct_per_hour(after_warmup(run(leak(2.0, 600, phase_s))))
            self.assertAlmostEqual(drift, 2.0, delta=0.1, msg="phase %d s" % phase_s)

    def test_leak_of_twice_the_target_in_a_step_every_half_hour_fails(self):
        for phase_s in range(0, 1800, 150):
            ok, lines = judge(run(leak(2 * TARGET, 1800, phase_s)))
            self.assertFalse(ok, "phase %d s: %s" % (phase_s, lines))

    def test_leak_of_half_the_target_passes(self):
        ok, lines = judge(run(leak(TARGET / 2)))
        self.assertTrue(ok, lines)

    def test_one_step_away_from_the_middle_reads_no_drift(self):
        # The local daemon's 0.65 MiB step, which least squares read as
        # 1.1 to 4.8 %/hour at these places.
        for at in (0.05, 0.1, 0.2, 0.3, 0.7, 0.8, 0.9, 0.95):
            samples = after_warmup(run(one_step(650, at)))
            self.assertLess(soak.drift_pct_per_hour(samples), 0.35, "step at %s" % at)
            self.assertGreater(soak.least_squares_pct_per_hour(samples), 1.0, "step at %s" % at)

    def test_one_step_in_the_middle_reads_as_spread_over_the_window(self):
        # Half the pairs straddle it: the median cannot tell it from a trend.
        drift = soak.drift_pct_per_hour(after_warmup(run(one_step(650, 0.5))))
        self.assertGreater(drift, TARGET)


class VerdictTest(unittest.TestCase):
    def test_flat_run_passes_and_names_its_largest_steps(self):
        ok, lines = judge(run(one_step(96, 0.2)))
        self.assertTrue(ok, lines)
        self.assertIn("local: largest RSS steps +", lines[2])
        self.assertIn("at 1008 s", lines[2])

    def test_a_changed_fd_count_fails_a_flat_run(self):
        samples = run(leak(0))
        samples[-1]["fds"] += 1
        ok, lines = judge(samples)
        self.assertFalse(ok, lines)

    def test_a_changed_handle_count_fails_a_flat_run(self):
        samples = run(leak(0))
        self.assertTrue(judge(samples)[0])
        samples[-1]["handles"] += 1
        ok, lines = judge(samples)
        self.assertFalse(ok, lines)
        self.assertIn("libuv handles [16, 17]", lines[-1])

    def test_handles_count_once_the_breaker_has_closed(self):
        samples = run(leak(0))
        for s in samples:
            s["redis"] = s["redis_fault"] = "up"
            s["breaker"] = "closed"
        samples[-2]["breaker"] = "half_open"  # the link just came back
        samples[-2]["handles"] -= 1
        self.assertTrue(judge(samples)[0])
        samples[-1]["handles"] -= 1  # the breaker is closed: a handle is gone
        self.assertFalse(judge(samples)[0])

    def test_samples_of_the_warm_up_do_not_count(self):
        samples = run(lambda t: BASE_KIB + (2000 if t >= WARMUP_S / 2 else 0))
        ok, lines = judge(samples)
        self.assertTrue(ok, lines)


if __name__ == "__main__":
    unittest.main()
