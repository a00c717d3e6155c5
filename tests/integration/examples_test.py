#!/usr/bin/python3
"""The client examples (client/examples/) against the real sluiced.

Each example makes one acquire per run. On a rule of 3 per minute the first
three runs must print a 200 and the fourth a 429 whose headers are the ones
sluice.h specifies for the decision the example printed: Retry-After in whole
seconds rounded up (at least 1), RateLimit and RateLimit-Policy. A socket
nobody listens on and an unknown rule must end in exit status 3 with a
message that says so.

Run by ctest, one class per example:
    examples_test.py CExampleTest | PythonExampleTest | NodeExampleTest
SLUICED names the daemon, EXAMPLE_C the built C example. The Node example
runs from a temporary copy of client/examples/node and client/node after
`npm ci`, so the source tree gets no node_modules.
"""

import os
import re
import shutil
import subprocess
import sys
import unittest

from harness import Daemon, make_dir, tear_down_module
EXAMPLE_C = os.environ.get("EXAMPLE_C", "build/client/examples/c/acquire")
EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            "..", "..", "client", "examples")

LIMIT = 3
CONFIG = """
[daemon]
socket = "{socket}"
workers = 1
log_level = "warn"

[[rule]]
name = "api"
algorithm = "token_bucket"
limit = {limit}
period = "1m"
burst = {limit}
"""

# A run of an example takes well under a second; this bounds a hung one.
RUN_TIMEOUT_S = 10

DECISION_LINE = re.compile(
    r"^decision: allowed=(true|false) remaining=(\d+) limit=(\d+) reset_after_ms=(\d+) "
    r"retry_after_ms=(\d+) mode=(\w+)$")


def ceil_seconds(ms):
    return -(-ms // 1000)


class ExampleTests:
    """The tests every example must pass; a subclass says how to run it."""

    command = None  # argv before the example's own arguments
    env = None  # the example's environment, when not this process's

    def setUp(self):
        """sluiced on a private socket with one rule, `api`, of LIMIT per minute."""
        self.daemon = Daemon(dir_prefix="sl")
        self.addCleanup(self.daemon.stop)
        self.daemon.start(CONFIG.format(socket=self.daemon.socket, limit=LIMIT))

    def run_example(self, *args):
        return subprocess.run([*self.command, *args], capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S, env=self.env)

    def response(self, run):
        """The decision the example printed and the HTTP response after it:
        (decision dict, status line, {header: value})."""
        lines = run.stdout.splitlines()
        match = DECISION_LINE.match(lines[0]) if lines else None
        self.assertIsNotNone(match, "no decision line in:\n" + run.stdout + run.stderr)
        allowed, remaining, limit, reset_after_ms, retry_after_ms, mode = match.groups()
        decision = {"allowed": allowed == "true", "remaining": int(remaining),
                    "limit": int(limit), "reset_after_ms": int(reset_after_ms),
                    "retry_after_ms": int(retry_after_ms), "mode": mode}
        self.assertEqual(lines[-1], "", "the response does not end with a blank line")
        headers = {}
        for line in lines[2:-1]:
            name, _, value = line.partition(": ")
            headers[name] = value
        return decision, lines[1], headers

    # Verifies three runs pass with 200 and the fourth is refused with a 429
    # whose Retry-After and rate-limit headers are built from its decision.
    def test_fourth_run_of_three_per_minute_answers_429_with_retry_after(self):
        runs = []
        while len(runs) <= LIMIT:
            run = self.run_example(self.daemon.socket, "api", "user:42")
            runs.append(run)
            if run.returncode != 0:
                break
        for i, run in enumerate(runs[:LIMIT]):
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            decision, status, headers = self.response(run)
            self.assertEqual(status, "HTTP/1.1 200 OK")
            self.assertTrue(decision["allowed"])
            self.assertEqual(decision["mode"], "local")
            self.assertNotIn("Retry-After", headers)
            self.assertEqual(headers["RateLimit"], '"api";r=%d;t=%d' % (
                LIMIT - 1 - i, ceil_seconds(decision["reset_after_ms"])))
            self.assertEqual(headers["RateLimit-Policy"], '"api";q=%d' % LIMIT)

        self.assertEqual(len(runs), LIMIT + 1, "no run was denied")
        denied = runs[LIMIT]
        self.assertEqual(denied.returncode, 1, denied.stdout + denied.stderr)
        decision, status, headers = self.response(denied)
        self.assertEqual(status, "HTTP/1.1 429 Too Many Requests")
        self.assertFalse(decision["allowed"])
        self.assertEqual(decision["remaining"], 0)
        self.assertEqual(decision["limit"], LIMIT)
        # One unit comes back every 20 s.
        self.assertGreater(decision["retry_after_ms"], 0)
        self.assertLessEqual(decision["retry_after_ms"], 20000)
        retry_after = int(headers["Retry-After"])
        self.assertGreaterEqual(retry_after, 1)
        self.assertEqual(retry_after, ceil_seconds(decision["retry_after_ms"]))
        self.assertEqual(headers["RateLimit"],
                         '"api";r=0;t=%d' % ceil_seconds(decision["reset_after_ms"]))
        self.assertEqual(headers["RateLimit-Policy"], '"api";q=%d' % LIMIT)
        self.assertEqual(set(headers), {"Retry-After", "RateLimit", "RateLimit-Policy"})

    # Verifies a socket nobody listens on ends in status 3 and names the socket.
    def test_missing_socket_exits_3_naming_the_socket(self):
        path = os.path.join(self.daemon.dir, "absent.sock")
        run = self.run_example(path, "api", "user:42")
        self.assertEqual(run.returncode, 3, run.stdout + run.stderr)
        self.assertIn("cannot reach sluiced at " + path, run.stderr)
        self.assertEqual(run.stdout, "")

    # Verifies the daemon's error for an unknown rule ends in status 3 with its code.
    def test_unknown_rule_exits_3_with_the_daemons_code(self):
        run = self.run_example(self.daemon.socket, "no-such-rule", "user:42")
        self.assertEqual(run.returncode, 3, run.stdout + run.stderr)
        self.assertIn("sluiced answered UNKNOWN_RULE", run.stderr)


class CExampleTest(ExampleTests, unittest.TestCase):
    command = [EXAMPLE_C]


class PythonExampleTest(ExampleTests, unittest.TestCase):
    command = ["/usr/bin/python3", os.path.join(EXAMPLES_DIR, "python", "acquire.py")]
    # The example imports the sluice package from the source tree.
    env = dict(os.environ, PYTHONPATH=os.path.join(EXAMPLES_DIR, "..", "python"),
               PYTHONDONTWRITEBYTECODE="1")


class NodeExampleTest(ExampleTests, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for tool in ("node", "npm"):
            if shutil.which(tool) is None:
                raise RuntimeError(tool + " is missing: `make deps` installs nodejs and npm")
        # A copy of the example's own files and of the library it depends on
        # (file:../../node), laid out as in the tree, so npm writes nothing
        # into the tree.
        cls.dir = make_dir("sl-node.")
        example_dir = os.path.join(cls.dir, "client", "examples", "node")
        os.makedirs(example_dir)
        for name in ("package.json", "package-lock.json", ".npmrc", "acquire.js"):
            shutil.copy(os.path.join(EXAMPLES_DIR, "node", name), example_dir)
        shutil.copytree(os.path.join(EXAMPLES_DIR, "..", "node"),
                        os.path.join(cls.dir, "client", "node"),
                        ignore=shutil.ignore_patterns("node_modules"))
        npm = subprocess.run(["npm", "ci", "--prefer-offline", "--no-audit", "--no-fund"],
                             cwd=example_dir, capture_output=True, text=True, timeout=45)
        if npm.returncode != 0:
            raise RuntimeError("npm ci failed:\n" + npm.stdout + npm.stderr)
        cls.command = ["node", os.path.join(example_dir, "acquire.js")]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)


def tearDownModule():
    tear_down_module()


if __name__ == "__main__":
    unittest.main(argv=sys.argv)
