#!/usr/bin/python3
"""Access control of the real sluiced: who may use the socket ([access] users
and groups), who may reload (admin_group), the per-user connection cap, and
how refusals are answered and counted.

The test connects as other users by switching its own effective uid, gid and
supplementary groups around connect(): the kernel records a socket's peer
credentials at that moment (SO_PEERCRED, SO_PEERGROUPS). That needs root.
Needs SLUICED (the daemon binary) in the environment; run with /usr/bin/python3
(python3-msgpack).
"""

import contextlib
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SLUICED, Client, Daemon, tear_down_module, wait_for  # noqa: E402

# Users and groups every Debian system has.
NOBODY = 65534
NOGROUP = 65534
USERS_GID = 100  # "users"
STAFF_GID = 50   # "staff"
APP_UID = 1234   # listed by number; no such user need exist

CONFIG = """
[daemon]
socket = "{socket}"
socket_mode = "0666"
workers = 2

[access]
{access}

[[rule]]
name = "five"
limit = 5
period = "1h"
"""

LISTS = """
users = [{app}]
groups = ["users"]
admin_group = "staff"
""".format(app=APP_UID)


@contextlib.contextmanager
def acting_as(uid, gid, groups=()):
    """Runs the body with this process's effective uid, gid and supplementary
    groups set to these; root's come back afterwards."""
    saved = os.getgroups()
    os.setgroups(list(groups))
    os.setegid(gid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(saved)


@unittest.skipUnless(os.geteuid() == 0, "connecting as other users needs root")
class AccessTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon(dir_prefix="ac.")
        os.chmod(self.daemon.dir, 0o755)  # other users reach the socket through it
        self.addCleanup(self.daemon.stop)

    def start(self, access):
        self.daemon.start(CONFIG.format(socket=self.daemon.socket, access=access))

    def connect_as(self, uid, gid, groups=()):
        with acting_as(uid, gid, groups):
            return Client(self.daemon.socket)

    # Verifies that a peer in neither list gets FORBIDDEN, naming its uid, for
    # every method, that its notifications spend nothing, that the daemon
    # logs it, and that stats count the connection and each refusal.
    def test_peer_outside_the_lists_is_forbidden(self):
        self.start(LISTS)
        stranger = self.connect_as(NOBODY, NOGROUP)
        for method, params in (("acquire", ("five", "k")), ("health", ()), ("stats", ()),
                               ("reload", ())):
            error, result = stranger.call(method, *params)
            self.assertIsNone(result)
            self.assertEqual(error["code"], "FORBIDDEN", method)
            self.assertIn("uid %d" % NOBODY, error["message"])
        stranger.send([2, "acquire", ["five", "k", 5]])  # a notification: no answer
        error, _ = stranger.call("peek", "five", "k")
        self.assertEqual(error["code"], "FORBIDDEN")  # the connection still answers
        stranger.close()

        root = Client(self.daemon.socket)
        self.assertEqual(root.result("peek", "five", "k")["remaining"], 5)  # nothing spent
        root.close()
        stats = self.daemon.ask("stats")
        self.assertEqual(stats["connections"]["forbidden"], 1)
        self.assertEqual(stats["errors"]["FORBIDDEN"], 6)  # five answered, one notification
        self.assertIn("uid %d" % NOBODY, self.daemon.logs())

    # Verifies who the lists let in: a listed uid, members of a listed group
    # by primary or supplementary group, and root; and that of those only
    # admin_group's members and root may reload and reset.
    def test_listed_users_and_groups_are_allowed_and_only_admins_reload(self):
        self.start(LISTS)
        peers = {
            "listed uid": self.connect_as(APP_UID, NOGROUP),
            "supplementary group": self.connect_as(NOBODY, NOGROUP, [USERS_GID]),
            "primary group": self.connect_as(NOBODY, USERS_GID),
            "admin group": self.connect_as(NOBODY, NOGROUP, [STAFF_GID]),
            "root": Client(self.daemon.socket),
        }
        for name, client in peers.items():
            result = client.result("acquire", "five", name)
            self.assertTrue(result["allowed"], name)
        for name in ("listed uid", "supplementary group", "primary group"):
            for call in (("reload",), ("reset", "five", name)):
                error, _ = peers[name].call(*call)
                self.assertEqual(error["code"], "FORBIDDEN", (name, call))
                self.assertIn("admin_group", error["message"])
        for name in ("admin group", "root"):
            self.assertEqual(peers[name].result("reload"), {"reloaded": True}, name)
            self.assertEqual(peers[name].result("reset", "five", name)["remaining"], 5, name)
        for client in peers.values():
            client.close()
        self.assertEqual(self.daemon.ask("stats")["connections"]["forbidden"], 0)

    # Verifies that without lists anyone who can open the socket may decide,
    # but reloading still takes root (or admin_group).
    def test_without_lists_everyone_decides_and_only_root_reloads(self):
        self.start("")
        stranger = self.connect_as(NOBODY, NOGROUP)
        self.assertTrue(stranger.result("acquire", "five", "k")["allowed"])
        error, _ = stranger.call("reload")
        self.assertEqual(error["code"], "FORBIDDEN")
        stranger.close()

    # Verifies that one more connection than max_connections_per_user is
    # told why (an error notification naming the cap) and closed at once,
    # and counted, that other users are unaffected, and that closing one
    # makes room again.
    def test_connections_per_user_are_capped(self):
        self.start("max_connections_per_user = 3")
        held = [self.connect_as(APP_UID, NOGROUP) for _ in range(3)]
        for client in held:
            self.assertEqual(client.result("health")["status"], "ok")
        extra = self.connect_as(APP_UID, NOGROUP)
        extra.sock.settimeout(2)
        note = extra.recv()
        self.assertEqual(note[:2], [2, "error"])
        self.assertEqual(note[2][0]["code"], "OVERLOADED")
        self.assertIn(f"uid {APP_UID} holds its [access] max_connections_per_user = 3",
                      note[2][0]["message"])
        self.assertTrue(extra.closed_by_peer(timeout=2))
        extra.close()
        other = self.connect_as(NOBODY, NOGROUP)
        self.assertEqual(other.result("health")["status"], "ok")
        other.close()

        held.pop().close()

        def reconnects():
            client = self.connect_as(APP_UID, NOGROUP)
            try:
                client.result("health")
                held.append(client)
                return True
            except (ConnectionError, OSError):
                client.close()
                return False
        self.assertTrue(wait_for(reconnects, timeout=5))
        stats = self.daemon.ask("stats")
        self.assertGreaterEqual(stats["connections"]["refused_per_user"], 1)
        self.assertEqual(stats["connections"]["refused"], 0)
        for client in held:
            client.close()

    # Verifies that an unknown user name is refused by --check-config with the
    # file, line and the fix.
    def test_unknown_user_is_refused_with_file_and_line(self):
        config = os.path.join(self.daemon.dir, "bad.toml")
        with open(config, "w") as f:
            f.write('[access]\nusers = ["no-such-user-x"]\n')
        result = subprocess.run([SLUICED, "--check-config", config],
                                capture_output=True, text=True)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn(config + ":2:10: [access] users: there is no user \"no-such-user-x\"",
                      result.stderr)


def tearDownModule():
    tear_down_module()


if __name__ == "__main__":
    unittest.main()
