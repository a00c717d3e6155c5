#!/usr/bin/python3
"""acquire.py: one acquire against sluiced, answered the way an HTTP server
would answer the request it guards: 200 with the rate-limit headers when
allowed, 429 with Retry-After when denied.

It uses the sluice package (client/python: `pip install ./client/python`,
or PYTHONPATH=client/python), which needs Debian's python3-msgpack.

    usage: acquire.py [SOCKET [RULE [KEY]]]

SOCKET defaults to $SLUICE_SOCKET, else /run/sluice/sluice.sock; RULE to
"api"; KEY to "user:42". Exit status as sluicectl's: 0 allowed, 1 denied,
2 usage error, 3 connection or server error.
"""

import os
import sys

import sluice

CALL_TIMEOUT_MS = 1000
EXIT_ALLOWED, EXIT_DENIED, EXIT_USAGE, EXIT_FAILED = 0, 1, 2, 3


def main(argv):
    if len(argv) > 4 or (len(argv) > 1 and argv[1].startswith("-")):
        print("usage: acquire.py [SOCKET [RULE [KEY]]]", file=sys.stderr)
        return EXIT_USAGE
    path = argv[1] if len(argv) > 1 else os.environ.get("SLUICE_SOCKET") or sluice.DEFAULT_SOCKET
    rule = argv[2] if len(argv) > 2 else "api"
    key = argv[3] if len(argv) > 3 else "user:42"

    # "raise": this program reports an unreachable daemon instead of
    # deciding for it (a server would keep the default, fail_open).
    with sluice.Client(path, timeout_ms=CALL_TIMEOUT_MS, on_unreachable="raise") as client:
        try:
            decision = client.acquire(rule, key)
        except sluice.ServerError as e:
            print("acquire.py: sluiced answered %s" % e, file=sys.stderr)
            return EXIT_FAILED
        except sluice.SluiceError as e:
            print("acquire.py: cannot reach sluiced at %s: %s" % (path, e), file=sys.stderr)
            return EXIT_FAILED

    print("decision: allowed=%s remaining=%d limit=%d reset_after_ms=%d retry_after_ms=%d mode=%s"
          % ("true" if decision.allowed else "false", decision.remaining, decision.limit,
             decision.reset_after_ms, decision.retry_after_ms, decision.mode))
    # The decision does not carry the rule's period, so RateLimit-Policy goes
    # without a window.
    try:
        headers = sluice.header_pairs(decision, rule)
    except ValueError as e:
        print("acquire.py: %s" % e, file=sys.stderr)
        return EXIT_USAGE
    print("HTTP/1.1 200 OK" if decision.allowed else "HTTP/1.1 429 Too Many Requests")
    for name, value in headers:
        print("%s: %s" % (name, value))
    print()
    return EXIT_ALLOWED if decision.allowed else EXIT_DENIED


if __name__ == "__main__":
    sys.exit(main(sys.argv))
