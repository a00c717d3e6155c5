#!/usr/bin/python3
"""acquire.py: one acquire against sluiced, answered the way an HTTP server
would answer the request it guards: 200 with the rate-limit headers when
allowed, 429 with Retry-After when denied.

It speaks the wire protocol itself, MessagePack-RPC over the Unix socket,
with Debian's python3-msgpack (apt-get install python3-msgpack), and formats
the headers as libsluice's sluice_format_headers does (client/include/sluice.h).

    usage: acquire.py [SOCKET [RULE [KEY]]]

SOCKET defaults to $SLUICE_SOCKET, else /run/sluice/sluice.sock; RULE to
"api"; KEY to "user:42". Exit status as sluicectl's: 0 allowed, 1 denied,
2 usage error, 3 connection or server error.
"""

import os
import socket
import sys

import msgpack

DEFAULT_SOCKET = "/run/sluice/sluice.sock"
CALL_TIMEOUT_S = 1.0  # bounds connecting, and then each read and write
EXIT_ALLOWED, EXIT_DENIED, EXIT_USAGE, EXIT_FAILED = 0, 1, 2, 3

POLICY_NAME_MAX_BYTES = 64
SF_INTEGER_MAX = 999_999_999_999_999  # RFC 8941: at most 15 digits


class ServerError(Exception):
    """The daemon answered with an error map {"code", "message"}."""


def acquire(path, rule, key, cost=1):
    """Sends [0, msgid, "acquire", [rule, key, cost]] and returns the result
    of its response [1, msgid, error, result]: the decision map."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(CALL_TIMEOUT_S)
        sock.connect(path)
        msgid = 1
        sock.sendall(msgpack.packb([0, msgid, "acquire", [rule, key, cost]]))
        unpacker = msgpack.Unpacker(raw=False)
        while True:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("sluiced closed the connection without answering")
            unpacker.feed(data)
            for message in unpacker:
                # Notifications ([2, method, params]) are not answers.
                if message[0] == 1 and message[1] == msgid:
                    error, result = message[2], message[3]
                    if error is not None:
                        raise ServerError("%s: %s" % (error.get("code"), error.get("message")))
                    return result


def ceil_seconds(ms):
    """Whole seconds, rounded up, so a client told to wait never comes back early."""
    return 0 if ms <= 0 else -(-ms // 1000)


def sf_integer(value):
    return max(0, min(value, SF_INTEGER_MAX))


def rate_limit_headers(decision, policy, window_s=0):
    """The header values of draft-ietf-httpapi-ratelimit-headers-10 for a
    decision, as (name, value) pairs: Retry-After (denials only), RateLimit
    and RateLimit-Policy (without w when window_s is 0)."""
    if not 1 <= len(policy) <= POLICY_NAME_MAX_BYTES or not all(" " <= c <= "~" for c in policy):
        raise ValueError("rule name %r cannot name a policy (printable ASCII, 1 to 64 bytes)"
                         % policy)
    quoted = '"%s"' % policy.replace("\\", "\\\\").replace('"', '\\"')
    headers = []
    if not decision["allowed"]:
        # A denial always says to wait at least a second: "0" invites a hot loop.
        seconds = max(1, ceil_seconds(decision["retry_after_ms"]))
        headers.append(("Retry-After", str(sf_integer(seconds))))
    headers.append(("RateLimit", "%s;r=%d;t=%d" % (
        quoted, sf_integer(decision["remaining"]),
        sf_integer(ceil_seconds(decision["reset_after_ms"])))))
    policy_value = "%s;q=%d" % (quoted, sf_integer(decision["limit"]))
    if window_s > 0:
        policy_value += ";w=%d" % sf_integer(window_s)
    headers.append(("RateLimit-Policy", policy_value))
    return headers


def main(argv):
    if len(argv) > 4 or (len(argv) > 1 and argv[1].startswith("-")):
        print("usage: acquire.py [SOCKET [RULE [KEY]]]", file=sys.stderr)
        return EXIT_USAGE
    path = argv[1] if len(argv) > 1 else os.environ.get("SLUICE_SOCKET") or DEFAULT_SOCKET
    rule = argv[2] if len(argv) > 2 else "api"
    key = argv[3] if len(argv) > 3 else "user:42"

    try:
        decision = acquire(path, rule, key)
    except ServerError as e:
        print("acquire.py: sluiced answered %s" % e, file=sys.stderr)
        return EXIT_FAILED
    except OSError as e:
        print("acquire.py: cannot reach sluiced at %s: %s" % (path, e), file=sys.stderr)
        return EXIT_FAILED

    print("decision: allowed=%s remaining=%d limit=%d reset_after_ms=%d retry_after_ms=%d mode=%s"
          % ("true" if decision["allowed"] else "false", decision["remaining"],
             decision["limit"], decision["reset_after_ms"], decision["retry_after_ms"],
             decision["mode"]))
    # The decision does not carry the rule's period, so RateLimit-Policy goes
    # without a window.
    try:
        headers = rate_limit_headers(decision, rule)
    except ValueError as e:
        print("acquire.py: %s" % e, file=sys.stderr)
        return EXIT_USAGE
    print("HTTP/1.1 200 OK" if decision["allowed"] else "HTTP/1.1 429 Too Many Requests")
    for name, value in headers:
        print("%s: %s" % (name, value))
    print()
    return EXIT_ALLOWED if decision["allowed"] else EXIT_DENIED


if __name__ == "__main__":
    sys.exit(main(sys.argv))
