#!/usr/bin/python3
"""The Prometheus endpoint of the real sluiced: what a scrape shows after
known traffic, that promtool accepts it, that no key text leaks into it, and
how a bad address is refused.

Needs SLUICED (the daemon binary) in the environment; run with /usr/bin/python3
(python3-msgpack). promtool comes from Debian's prometheus package.
"""

import os
import re
import socket
import subprocess
import sys
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (SLUICED, Client, Daemon, Redis, free_port, redis_section,  # noqa: E402
                     tear_down_module, wait_for)

CONFIG = """
[daemon]
socket = "{socket}"
workers = 2
metrics = "{metrics}"

[[rule]]
name = "five"
algorithm = "token_bucket"
limit = 5
period = "1h"
"""

# A global rule; the test prepends redis_section(port).
REDIS_RULE = """
[[rule]]
name = "shared"
algorithm = "token_bucket"
limit = 1000
period = "1h"
scope = "global"
"""

SECRET = "secret-key-3f9a"


def sample(body, name, **labels):
    """The value of one sample of the exposition, or None."""
    for line in body.splitlines():
        if line.startswith("#"):
            continue
        match = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})? (\S+)", line)
        if match is None or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        if found == {k: str(v) for k, v in labels.items()}:
            return float(match.group(3))
    return None


class MetricsCase(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon(dir_prefix="mt.")
        self.addCleanup(self.daemon.stop)
        self.port = free_port()

    def start(self, extra="", metrics=None):
        return self.daemon.start(CONFIG.format(
            socket=self.daemon.socket, metrics=metrics or "127.0.0.1:%d" % self.port) + extra)

    def scrape(self, path="/metrics", method="GET"):
        request = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), method=method)
        with urllib.request.urlopen(request, timeout=5) as response:
            self.assertTrue(response.headers["Content-Type"].startswith("text/plain; version=0.0.4"))
            return response.read().decode()

    def check_with_promtool(self, body):
        result = subprocess.run(["promtool", "check", "metrics"], input=body,
                                capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(result.stdout + result.stderr, "")


class LocalMetricsTest(MetricsCase):
    # Verifies a scrape counts known decisions by rule, result and mode,
    # counts them in the latency histogram, shows connections and keys,
    # never shows key text, and passes `promtool check metrics` silently.
    def test_scrape_after_known_traffic(self):
        self.start()
        client = Client(self.daemon.socket)
        results = [client.result("acquire", "five", SECRET) for _ in range(7)]
        self.assertEqual(sum(r["allowed"] for r in results), 5)
        client.call("acquire", "nope", "k")  # UNKNOWN_RULE

        # The probe connection of wait_accepting closes on a worker's own time.
        def settled():
            body = self.scrape()
            return body if sample(body, "sluice_connections") == 1 else None
        body = wait_for(settled, timeout=5)
        self.assertIsNotNone(body, "a scrape never showed exactly this client's connection")
        self.assertEqual(sample(body, "sluice_decisions_total", rule="five", result="allowed",
                                mode="local"), 5)
        self.assertEqual(sample(body, "sluice_decisions_total", rule="five", result="denied",
                                mode="local"), 2)
        self.assertEqual(sample(body, "sluice_protocol_errors_total", code="UNKNOWN_RULE"), 1)
        self.assertGreaterEqual(sample(body, "sluice_decision_duration_seconds_count"), 8)
        self.assertEqual(sample(body, "sluice_decision_duration_seconds_bucket", le="+Inf"),
                         sample(body, "sluice_decision_duration_seconds_count"))
        self.assertEqual(sample(body, "sluice_connections_refused_total",
                                reason="max_connections_per_user"), 0)
        self.assertEqual(sample(body, "sluice_connections_forbidden_total"), 0)
        self.assertEqual(sample(body, "sluice_keys"), 1)
        # Every loop counts its own handles on a timer, so the gauge and
        # health's figure agree once the probe connection's are gone.
        agreed = wait_for(lambda: sample(self.scrape(), "sluice_uv_handles")
                          == client.result("health")["handles"], timeout=5)
        self.assertTrue(agreed)
        self.assertGreater(sample(body, "sluice_uv_handles"), 0)
        self.assertNotIn(SECRET, body)
        self.assertIsNone(sample(body, "sluice_redis_up"))  # local-only: no lease families
        self.check_with_promtool(body)
        client.close()

    # Verifies only GET (and HEAD) of /metrics is served.
    def test_other_paths_and_methods_are_refused(self):
        self.start()
        with self.assertRaises(urllib.error.HTTPError) as missing:
            self.scrape("/")
        self.assertEqual(missing.exception.code, 404)
        with self.assertRaises(urllib.error.HTTPError) as post:
            self.scrape(method="POST")
        self.assertEqual(post.exception.code, 405)

    # Verifies an address that is not one is refused by --check-config with
    # the file and line, and a port already taken stops the daemon at start.
    def test_bad_addresses_are_refused(self):
        self.daemon.write_config(CONFIG.format(socket=self.daemon.socket,
                                               metrics="localhost:9464"))
        result = subprocess.run([SLUICED, "--check-config", self.daemon.config],
                                capture_output=True, text=True)
        self.assertEqual(result.returncode, 1)
        self.assertIn("sluice.toml:5:", result.stderr)
        self.assertIn("127.0.0.1:9464", result.stderr)

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
            taken.bind(("127.0.0.1", self.port))
            taken.listen(1)
            proc = self.daemon.start(CONFIG.format(socket=self.daemon.socket,
                                                   metrics="127.0.0.1:%d" % self.port),
                                     wait=False)
            self.assertEqual(proc.wait(timeout=10), 1)
        self.assertIn("cannot serve metrics on 127.0.0.1:%d" % self.port, self.daemon.logs())
        self.assertFalse(os.path.exists(self.daemon.socket))


class RedisMetricsTest(MetricsCase):
    # Verifies the lease families: Redis up, breaker closed, leases granted
    # with their latency, live nodes; promtool accepts the scrape.
    def test_lease_metrics(self):
        redis = Redis()
        try:
            self.start(redis_section(redis.port) + REDIS_RULE)
            client = Client(self.daemon.socket)
            self.assertTrue(wait_for(lambda: client.result("health")["breaker"] == "closed", 5))
            results = [client.result("acquire", "shared", SECRET) for _ in range(20)]
            self.assertTrue(all(r["allowed"] for r in results))
            body = self.scrape()
            self.assertEqual(sample(body, "sluice_redis_up"), 1)
            self.assertEqual(sample(body, "sluice_breaker_state", state="closed"), 1)
            self.assertEqual(sample(body, "sluice_breaker_state", state="open"), 0)
            self.assertEqual(sample(body, "sluice_nodes"), 1)
            self.assertGreaterEqual(sample(body, "sluice_leases_total", outcome="granted"), 1)
            self.assertGreaterEqual(sample(body, "sluice_lease_duration_seconds_count"), 1)
            self.assertEqual(sample(body, "sluice_decisions_total", rule="shared",
                                    result="allowed", mode="normal"), 20)
            self.assertGreater(sample(body, "sluice_leased_units"), 0)
            self.assertNotIn(SECRET, body)
            self.check_with_promtool(body)
            client.close()
        finally:
            redis.stop()


def tearDownModule():
    tear_down_module()


if __name__ == "__main__":
    unittest.main(verbosity=2)
