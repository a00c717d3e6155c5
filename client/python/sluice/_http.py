"""_http.py: what the WSGI and ASGI middleware share: the key functions,
the headers of a decision and the body of a 429. No I/O."""

import json

from .headers import header_pairs, quote_policy
from .results import MODE_UNREACHABLE

STATUS_TOO_MANY = "429 Too Many Requests"


def check_rule(rule):
    """A rule name that can also name the headers' policy."""
    quote_policy(rule)  # raises ValueError for a name no header can carry
    return rule


def decision_headers(decision, rule, window_s):
    """(name, value) pairs for a response: none for a decision the
    on_unreachable policy made (the daemon's numbers are unknown), apart
    from a denial's Retry-After."""
    if decision.mode == MODE_UNREACHABLE:
        if decision.allowed:
            return []
        return [("Retry-After", str(max(1, -(-decision.retry_after_ms // 1000))))]
    return header_pairs(decision, rule, window_s)


def denial_body(decision, rule):
    """The small JSON body of a 429."""
    return json.dumps({
        "error": "rate_limited",
        "rule": rule,
        "retry_after_ms": decision.retry_after_ms,
    }, separators=(",", ":")).encode()
