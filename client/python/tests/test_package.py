#!/usr/bin/python3
"""`pip install ./client/python` works offline with Debian's pip and
setuptools (no build isolation, no index), and the installed package is
importable and works from anywhere."""

import os
import shutil
import subprocess
import sys
import unittest

import support
from support import WIDE

PYTHON = "/usr/bin/python3"


class PackageTest(unittest.TestCase):
    # Verifies pip builds and installs the package offline, and the installed
    # copy (not the source tree's) acquires from a real daemon.
    def test_pip_installs_offline_and_the_installed_package_works(self):
        target = support.harness.make_dir("slpy-pip.")
        self.addCleanup(shutil.rmtree, target, True)
        build = support.harness.make_dir("slpy-build.")
        self.addCleanup(shutil.rmtree, build, True)
        # pip builds in a copy, so the source tree gets no build/ or egg-info.
        source = os.path.join(build, "python")
        shutil.copytree(support.PACKAGE_DIR, source,
                        ignore=shutil.ignore_patterns("__pycache__", "tests"))
        env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        pip = subprocess.run(
            [PYTHON, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
             "--target", target, source],
            capture_output=True, text=True, timeout=60, env=env, cwd=build)
        self.assertEqual(pip.returncode, 0, pip.stdout + pip.stderr)

        daemon = support.start_daemon(self)
        script = ("import sluice; print(sluice.__file__); "
                  "print(sluice.Client(%r).acquire('wide', 'k', 2).remaining)" % daemon.socket)
        run = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=30,
                             cwd=target, env=dict(os.environ, PYTHONPATH=target))
        self.assertEqual(run.returncode, 0, run.stderr)
        path, remaining = run.stdout.split()
        self.assertTrue(path.startswith(target), path)
        self.assertEqual(int(remaining), WIDE - 2)


def tearDownModule():
    support.tear_down_module()


if __name__ == "__main__":
    unittest.main(argv=sys.argv)
