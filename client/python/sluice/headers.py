"""headers.py: the HTTP header values a server returns with a decision,
byte for byte what libsluice's sluice_format_headers writes (sluice.h): the
structured fields of draft-ietf-httpapi-ratelimit-headers-10 and
Retry-After.

    RateLimit:        "api";r=20;t=30   (r remaining, t seconds to reset)
    RateLimit-Policy: "api";q=100;w=60  (q limit, w window in seconds,
                                         omitted when window_s <= 0)
    Retry-After:      3                 (delay-seconds, at least 1;
                                         "" when allowed)

Times are rounded up to whole seconds, so a client never retries early.
Pure functions: no I/O, any thread.
"""

from collections import namedtuple

# The longest policy name accepted, before escaping.
POLICY_NAME_MAX_BYTES = 64
# RFC 8941 sf-integers have at most 15 digits.
SF_INTEGER_MAX = 999_999_999_999_999

RateLimitHeaders = namedtuple("RateLimitHeaders", "ratelimit ratelimit_policy retry_after")
RateLimitHeaders.__doc__ = """The three header values; retry_after is "" when allowed."""


def _sf_clamp(value):
    return 0 if value < 0 else min(value, SF_INTEGER_MAX)


def _ceil_seconds(ms):
    return 0 if ms <= 0 else -(-ms // 1000)


def quote_policy(policy):
    """The sf-string of a policy name: printable ASCII, 1 to 64 bytes, with
    '"' and '\\' escaped. Raises ValueError for anything else."""
    if not isinstance(policy, str) or not 1 <= len(policy) <= POLICY_NAME_MAX_BYTES or \
            not all(" " <= ch <= "~" for ch in policy):
        raise ValueError("policy name %r is not 1 to %d bytes of printable ASCII"
                         % (policy, POLICY_NAME_MAX_BYTES))
    return '"%s"' % policy.replace("\\", "\\\\").replace('"', '\\"')


def format_headers(decision, policy, window_s=0):
    """RateLimitHeaders for a Decision (anything with allowed, remaining,
    limit, reset_after_ms and retry_after_ms) under the policy name `policy`
    (usually the rule's name); window_s is the rule's period in seconds, 0
    when unknown."""
    quoted = quote_policy(policy)
    ratelimit = "%s;r=%d;t=%d" % (quoted, _sf_clamp(decision.remaining),
                                  _sf_clamp(_ceil_seconds(decision.reset_after_ms)))
    if window_s > 0:
        ratelimit_policy = "%s;q=%d;w=%d" % (quoted, _sf_clamp(decision.limit),
                                             _sf_clamp(window_s))
    else:
        ratelimit_policy = "%s;q=%d" % (quoted, _sf_clamp(decision.limit))
    if decision.allowed:
        retry_after = ""
    else:
        # A denial always says to wait at least a second: "0" invites a hot loop.
        retry_after = str(_sf_clamp(max(1, _ceil_seconds(decision.retry_after_ms))))
    return RateLimitHeaders(ratelimit, ratelimit_policy, retry_after)


def header_pairs(decision, policy, window_s=0):
    """The headers as (name, value) pairs in the order a response sends them:
    Retry-After (denials only), RateLimit, RateLimit-Policy."""
    h = format_headers(decision, policy, window_s)
    pairs = [("RateLimit", h.ratelimit), ("RateLimit-Policy", h.ratelimit_policy)]
    if h.retry_after:
        pairs.insert(0, ("Retry-After", h.retry_after))
    return pairs
