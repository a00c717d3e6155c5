"""results.py: what the daemon's answers become: Decision (one acquire,
peek, release or reset), AllDecision (acquire_all), Reservation (reserve),
Settlement (settle, cancel) and Health. Plain values,
immutable by convention, safe to share between threads.

A field the daemon did not send is 0 (or None for `reason`), as libsluice's
sluice_decision has it; a decision without a boolean `allowed` is a
ProtocolError.
"""

from .errors import ProtocolError

# The `mode` of a decision that the client's on_unreachable policy made
# because the daemon could not be asked; the daemon never sends it.
MODE_UNREACHABLE = "unreachable"


def _field(name, default):
    """A read-only attribute: the decision map's `name`, else `default`."""
    return property(lambda self: self.fields.get(name, default), doc="the map's %r" % name)


class Decision:
    """One decision. `allowed` is a bool; `mode` the daemon's wire name
    ("local", "normal", "fallback", "open", "closed", "shadow", "blocked"),
    or MODE_UNREACHABLE for a decision of the on_unreachable policy, whose
    `error` is the exception that made it (None otherwise); `remaining`,
    `limit`, `reset_after_ms`, `retry_after_ms` as the daemon sent them;
    `waited_ms` how long the daemon held an acquire that may wait; `reason`
    its text when the cost can never pass; `fields` the whole decision map.

    The fields are read from the map when asked for: a pipeline of many
    decisions then costs one small object each."""

    __slots__ = ("allowed", "error", "fields")

    def __init__(self, allowed, mode="", remaining=0, limit=0, reset_after_ms=0,
                 retry_after_ms=0, waited_ms=0, reason=None, error=None):
        self.allowed = allowed
        self.error = error
        self.fields = {"allowed": allowed, "mode": mode, "remaining": remaining, "limit": limit,
                       "reset_after_ms": reset_after_ms, "retry_after_ms": retry_after_ms,
                       "waited_ms": waited_ms, "reason": reason}

    @classmethod
    def from_map(cls, m, _new=object.__new__):
        """The Decision of a decision map off the wire."""
        try:
            allowed = m["allowed"]
        except (KeyError, TypeError, IndexError):
            raise ProtocolError("not a decision map: %r" % (m,)) from None
        if allowed is not True and allowed is not False:
            raise ProtocolError("decision map's allowed is not a bool: %r" % (m,))
        decision = _new(cls)
        decision.allowed = allowed
        decision.error = None
        decision.fields = m
        return decision

    mode = _field("mode", "")
    remaining = _field("remaining", 0)
    limit = _field("limit", 0)
    reset_after_ms = _field("reset_after_ms", 0)
    retry_after_ms = _field("retry_after_ms", 0)
    waited_ms = _field("waited_ms", 0)
    reason = _field("reason", None)

    _SHOWN = ("allowed", "mode", "remaining", "limit", "reset_after_ms", "retry_after_ms",
              "waited_ms", "reason", "error")

    def __eq__(self, other):
        if not isinstance(other, Decision):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self._SHOWN)

    __hash__ = None

    def __repr__(self):
        return "Decision(%s)" % ", ".join(
            "%s=%r" % (f, getattr(self, f)) for f in self._SHOWN
            if getattr(self, f) not in (None, "") or f == "allowed")


class Reservation(Decision):
    """reserve's answer: a Decision of the estimate, and `id`, the
    reservation to settle or cancel: the daemon's id when allowed, None when
    denied or when the on_unreachable policy decided (nothing was reserved)."""

    __slots__ = ()

    @property
    def id(self):
        """The reservation's id (an int, opaque), or None when none was opened."""
        rid = self.fields.get("id")
        return rid if self.allowed and self.error is None and type(rid) is int else None

    def __repr__(self):
        return "Reservation(id=%r, %s)" % (self.id, Decision.__repr__(self)[len("Decision("):-1])


class Settlement(Decision):
    """settle's or cancel's answer: the key's state afterwards as a Decision
    (`allowed`: whether it could spend now; `remaining` below 0 while it is
    in debt), `id` the reservation settled, `refunded` the units given back
    (estimate - actual), `debt` those charged past the estimate and `unpaid`
    those of the excess past the key's debt bound (the rule's max_debt),
    charged to nobody. A settlement of no reservation (id None: a denial's
    or the on_unreachable policy's) asks nothing of the daemon: allowed,
    nothing refunded, no debt, nothing unpaid, mode ""."""

    __slots__ = ()

    id = _field("id", None)
    refunded = _field("refunded", 0)
    debt = _field("debt", 0)
    unpaid = _field("unpaid", 0)

    def __repr__(self):
        return "Settlement(id=%r, refunded=%r, debt=%r, unpaid=%r, %s)" % (
            self.id, self.refunded, self.debt, self.unpaid,
            Decision.__repr__(self)[len("Decision("):-1])


class AllDecision:
    """acquire_all's answer: `allowed` is True only when every item passed
    (and then each was spent); results[i] is the Decision of items[i]."""

    __slots__ = ("allowed", "results")

    def __init__(self, allowed, results):
        self.allowed = allowed
        self.results = results

    @classmethod
    def from_map(cls, m, count):
        try:
            allowed, results = m["allowed"], m["results"]
        except (KeyError, TypeError):
            raise ProtocolError("not an acquire_all result: %r" % (m,)) from None
        if (allowed is not True and allowed is not False) or not isinstance(results, list) \
                or len(results) != count:
            raise ProtocolError("not an acquire_all result of %d items: %r" % (count, m))
        return cls(allowed, [Decision.from_map(r) for r in results])

    def __repr__(self):
        return "AllDecision(allowed=%r, results=%r)" % (self.allowed, self.results)


class Health:
    """The `health` answer: `status` "ok" or "degraded", `redis` "up", "down"
    or "none", and every field the daemon sent in `fields`."""

    __slots__ = ("status", "redis", "fields")

    def __init__(self, fields):
        if not isinstance(fields, dict) or not isinstance(fields.get("status"), str):
            raise ProtocolError("not a health result: %r" % (fields,))
        self.status = fields["status"]
        self.redis = fields.get("redis")
        self.fields = fields

    def __repr__(self):
        return "Health(status=%r, redis=%r)" % (self.status, self.redis)
