#!/usr/bin/python3
"""sluice.format_headers writes, byte for byte, what libsluice's
sluice_format_headers writes (FORMAT_HEADERS, tests/support/format_headers.c,
is it as a filter), over a table of cases, and refuses what it refuses."""

import os
import subprocess
import unittest

import support  # noqa: F401  (puts the package on sys.path)

import sluice

FORMAT_HEADERS = os.environ.get("FORMAT_HEADERS", "build/tests/sluice_format_headers")
INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)

# allowed, remaining, limit, reset_after_ms, retry_after_ms, window_s, policy
CASES = [
    (1, 19, 100, 600, 0, 0, "api"),
    (1, 19, 100, 600, 0, 60, "api"),
    (0, 0, 100, 12000, 600, 0, "api"),
    (0, 0, 100, 12000, 0, 60, "api"),          # a denial says at least 1 s
    (0, 0, 100, 12000, -5, 60, "api"),
    (0, 0, 3, 60000, 20000, 60, "login"),
    (0, 0, 3, 60001, 20001, 60, "login"),      # rounded up
    (1, 5, 10, 1, 0, 1, "x"),
    (1, 5, 10, 999, 0, 1, "x"),
    (1, 5, 10, 1000, 0, 1, "x"),
    (1, 5, 10, 1001, 0, 1, "x"),
    (1, 0, 0, 0, 0, 0, "zero"),
    (1, -3, -4, -5, -6, -7, "negatives"),
    (0, -3, -4, -5, -6, -7, "negatives"),
    (1, INT64_MAX, INT64_MAX, INT64_MAX, 0, INT64_MAX, "huge"),
    (0, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, "huge"),
    (0, INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN, "tiny"),
    (1, 999_999_999_999_999, 1_000_000_000_000_000, 999_999_999_999_999_000, 0, 0, "edge"),
    (1, 1, 2, 3, 0, 0, 'quote"d'),
    (1, 1, 2, 3, 0, 0, "back\\slash"),
    (1, 1, 2, 3, 0, 0, '"\\"'),
    (1, 1, 2, 3, 0, 0, "with space"),
    # (not starting with a space: the filter's scanf would skip it)
    (1, 1, 2, 3, 0, 0, "a ~!#$%&'()*+,-./:;<=>?@[]^_`{|}"),
    (1, 1, 2, 3, 0, 0, "p" * 64),
    (1, 1, 2, 3, 0, 0, "p" * 65),              # too long
    (1, 1, 2, 3, 0, 0, ""),                    # empty
    (1, 1, 2, 3, 0, 0, "del\x7f"),             # not printable
    (1, 1, 2, 3, 0, 0, "bell\x07"),
    (1, 1, 2, 3, 0, 0, "caf\u00e9"),           # not ASCII
]


class Fields:
    def __init__(self, allowed, remaining, limit, reset_after_ms, retry_after_ms):
        self.allowed = bool(allowed)
        self.remaining = remaining
        self.limit = limit
        self.reset_after_ms = reset_after_ms
        self.retry_after_ms = retry_after_ms


def libsluice_output(cases):
    """FORMAT_HEADERS' line for each case."""
    text = "".join("\t".join(str(f) for f in case) + "\n" for case in cases)
    run = subprocess.run([FORMAT_HEADERS], input=text.encode("utf-8"), capture_output=True,
                         timeout=30, check=True)
    lines = run.stdout.decode("utf-8").split("\n")
    assert lines[-1] == "" and len(lines) == len(cases) + 1, run.stdout
    return lines[:-1]


def python_output(case):
    """The same line from sluice.format_headers."""
    *numbers, window_s, policy = case
    try:
        headers = sluice.format_headers(Fields(*numbers), policy, window_s)
    except ValueError:
        return "error -1"  # SLUICE_EINVAL
    return "\t".join(headers)


class HeadersTest(unittest.TestCase):
    # Verifies every case of the table formats as libsluice formats it.
    def test_every_case_matches_libsluice_byte_for_byte(self):
        expected = libsluice_output(CASES)
        self.assertIn("error -1", expected)  # the table has refusals, and they refuse
        for case, line in zip(CASES, expected):
            self.assertEqual(python_output(case), line, case)

    # Verifies a real Decision formats the way its fields say.
    def test_a_denied_decision_gives_all_three_headers(self):
        decision = sluice.Decision(False, "local", 0, 100, 12000, 600)
        self.assertEqual(tuple(sluice.format_headers(decision, "api", 60)),
                         ('"api";r=0;t=12', '"api";q=100;w=60', "1"))
        self.assertEqual(sluice.header_pairs(decision, "api"), [
            ("Retry-After", "1"), ("RateLimit", '"api";r=0;t=12'),
            ("RateLimit-Policy", '"api";q=100')])

    # Verifies an allowed decision has no Retry-After.
    def test_an_allowed_decision_has_no_retry_after(self):
        decision = sluice.Decision(True, "local", 19, 100, 600, 0)
        self.assertEqual(sluice.format_headers(decision, "api").retry_after, "")
        self.assertEqual([n for n, _ in sluice.header_pairs(decision, "api")],
                         ["RateLimit", "RateLimit-Policy"])


if __name__ == "__main__":
    unittest.main()
