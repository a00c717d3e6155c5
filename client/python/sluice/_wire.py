"""_wire.py: what the sync and asyncio clients share: checking a call's
arguments into its params, the msgid counter, turning a response into a
result or an exception, and the on_unreachable policy. No I/O.

Wire contract (README "The protocol", daemon/rpc.h): request
[0, msgid, method, params], response [1, msgid, error, result],
notification [2, method, params] (never an answer: skipped). msgids are
unsigned 32-bit and wrap; an id still in flight is skipped when the counter
comes round to it.
"""

import time

from .errors import SERVER_ERRORS, UNREACHABLE, ProtocolError, ServerError
from .results import MODE_UNREACHABLE, AllDecision, Decision, Health, Reservation, Settlement

MSGID_LIMIT = 1 << 32
COST_MAX = MSGID_LIMIT - 1
# The largest response the clients accept (libsluice's
# SLUICE_MAX_RESPONSE_BYTES); a bigger one is a ProtocolError.
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
READ_CHUNK_BYTES = 256 * 1024
# Unpacker buffer: one partial response plus one read.
MAX_BUFFER_BYTES = MAX_RESPONSE_BYTES + READ_CHUNK_BYTES

DEFAULT_SOCKET = "/run/sluice/sluice.sock"
DEFAULT_TIMEOUT_MS = 1000
# The TTL of a reservation when the caller gives none (libsluice's
# SLUICE_DEFAULT_TTL_MS).
DEFAULT_TTL_MS = 60000
FAIL_OPEN, FAIL_CLOSED, RAISE = "fail_open", "fail_closed", "raise"
POLICIES = (FAIL_OPEN, FAIL_CLOSED, RAISE)
# Retry-After of a fail_closed denial: come back in a second.
UNREACHABLE_RETRY_AFTER_MS = 1000


def check_policy(policy):
    if policy not in POLICIES:
        raise ValueError("on_unreachable must be one of %s, not %r" % (", ".join(POLICIES), policy))
    return policy


def check_msgid(msgid):
    if not isinstance(msgid, int) or not 0 <= msgid < MSGID_LIMIT:
        raise ValueError("first_msgid must be in [0, 2^32), not %r" % (msgid,))
    return msgid


def _check_rule_key(rule, key):
    if not isinstance(rule, str) or not rule:
        raise TypeError("rule must be a non-empty str, not %r" % (rule,))
    if not isinstance(key, (str, bytes)):
        raise TypeError("key must be str or bytes, not %r" % (type(key).__name__,))


def _check_count(name, value):
    if type(value) is not int or not 0 <= value <= COST_MAX:
        raise ValueError("%s must be an int in [0, 2^32), not %r" % (name, value))


def item_params(rule, key, cost=1, max_wait_ms=None):
    """[rule, key, cost] or [rule, key, cost, max_wait_ms]."""
    _check_rule_key(rule, key)
    _check_count("cost", cost)
    if max_wait_ms is None:
        return [rule, key, cost]
    _check_count("max_wait_ms", max_wait_ms)
    return [rule, key, cost, max_wait_ms]


def reserve_params(rule, key, estimate, ttl_ms):
    """[rule, key, estimate, ttl_ms]; the daemon bounds both further."""
    _check_rule_key(rule, key)
    _check_count("estimate", estimate)
    _check_count("ttl_ms", ttl_ms)
    if estimate == 0 or ttl_ms == 0:
        raise ValueError("estimate and ttl_ms must be at least 1")
    return [rule, key, estimate, ttl_ms]


def settle_params(reservation_id, actual=None):
    """[id, actual], or [id] for cancel."""
    if type(reservation_id) is not int or not 0 < reservation_id < 1 << 64:
        raise ValueError("a reservation id is a positive int, not %r" % (reservation_id,))
    if actual is None:
        return [reservation_id]
    _check_count("actual", actual)
    return [reservation_id, actual]


def key_params(rule, key):
    _check_rule_key(rule, key)
    return [rule, key]


def item_of(item):
    """One acquire_all / acquire_many item: (rule, key) or (rule, key, cost)."""
    if not isinstance(item, (tuple, list)) or not 2 <= len(item) <= 3:
        raise TypeError("an item is (rule, key) or (rule, key, cost), not %r" % (item,))
    return item_params(*item) if len(item) == 3 else item_params(item[0], item[1])


_STR, _KEY_TYPES, _INT, _TUPLE, _THREE = {str}, {str, bytes}, {int}, {tuple}, {3}


def items_params(items):
    """The params of many items, with item_of's checks. The common case, a
    list of (str, str or bytes, int) tuples, is checked column by column
    in C loops (set(map(...)), min, max) and sent as it is: MessagePack
    packs a tuple as an array. That halves what checking costs a
    pipeline."""
    items = items if type(items) is list else list(items)
    if set(map(type, items)) == _TUPLE and set(map(len, items)) == _THREE:
        rules, keys, costs = zip(*items)
        if set(map(type, rules)) == _STR and all(rules) and set(map(type, keys)) <= _KEY_TYPES \
                and set(map(type, costs)) == _INT and min(costs) >= 0 and max(costs) <= COST_MAX:
            return items
    return [item_of(item) for item in items]


def call_timeout_ms(timeout_ms, default_ms, max_wait_ms=None):
    """The timeout of a call: the caller's, else the client's default plus
    any wait the daemon may hold the answer for."""
    if timeout_ms is not None:
        return timeout_ms
    if default_ms < 0:
        return default_ms
    return default_ms + (max_wait_ms or 0)


def deadline_of(timeout_ms):
    """Monotonic deadline in seconds, None for no bound (a negative timeout)."""
    return None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000.0


def seconds_left(deadline):
    """What remains of a deadline, None without one; never negative."""
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


class MsgidCounter:
    """Hands out msgids in order, wrapping at 2^32, skipping ids still in
    flight. Not thread-safe: its owner's lock guards it."""

    __slots__ = ("next",)

    def __init__(self, first):
        self.next = first

    def frames(self, pending, batch, method, params_list, start, end, packer):
        """The request frames of params_list[start:end], packed back to back
        (bytes), each under a new msgid registered in `pending` as (batch,
        its index). The batch's msgids lie in [batch.first_msgid,
        batch.end_msgid) (mod 2^32), among others' that were skipped or
        taken between its chunks. `packer` is a msgpack.Packer made with
        autoreset=False, empty, and left empty.

        Each frame is packed as soon as it is made, so that its list is
        freed at once: a thousand frame lists alive together would each
        count towards the garbage collector's next collection, which then
        visits them (a fifth of an asyncio pipeline's time)."""
        pack = packer.pack
        msgid = self.next
        if batch.first_msgid is None:
            batch.first_msgid = msgid
        try:
            for i, params in enumerate(params_list[start:end] if start or end < len(params_list)
                                       else params_list, start):
                while msgid in pending:
                    msgid = (msgid + 1) & 0xFFFFFFFF
                pending[msgid] = (batch, i)
                pack([0, msgid, method, params])
                msgid += 1
                if msgid == MSGID_LIMIT:
                    msgid = 0
            return packer.bytes()
        finally:
            # Empty again, even when a params would not pack: the next call
            # must not send this one's frames.
            packer.reset()
            self.next = batch.end_msgid = msgid


def response_of(message):
    """(msgid, error, result) of a decoded frame, or None for a notification.
    Raises ProtocolError for anything else."""
    if type(message) is list:
        if len(message) == 4 and message[0] == 1:
            msgid = message[1]
            if type(msgid) is int and 0 <= msgid < MSGID_LIMIT:
                return msgid, message[2], message[3]
        elif len(message) == 3 and message[0] == 2:
            return None
    raise ProtocolError("not a MessagePack-RPC response: %r" % (message,))


def server_error(error):
    """The ServerError of a response's error field."""
    if isinstance(error, dict):
        code, message = error.get("code"), error.get("message")
        code = code if isinstance(code, str) else "UNKNOWN"
        return SERVER_ERRORS.get(code, ServerError)(
            code, message if isinstance(message, str) else repr(error))
    return ServerError("UNKNOWN", error if isinstance(error, str) else repr(error))


# How each method's result becomes what the call returns: a function of
# the result that may raise ProtocolError.
as_decision = Decision.from_map
as_health = Health
as_reservation = Reservation.from_map
as_settlement = Settlement.from_map


def as_release(result):
    # The contract leaves release's result open: anything but a decision
    # map means done, as libsluice reads it.
    try:
        return Decision.from_map(result)
    except ProtocolError:
        return Decision(True)


def as_all(count):
    return lambda result: AllDecision.from_map(result, count)


def as_is(result):
    return result


def take_answers(pending, messages, _new=object.__new__):
    """Hands each decoded frame to the call waiting for it: stores its
    result, batch.convert(result) or the ServerError or ProtocolError it
    makes, as batch.results[index], and returns the batches it completed.
    Skips notifications and answers to nothing in flight (calls that timed
    out); raises ProtocolError at a frame that is no response, after
    handing out the frames before it.

    This loop runs once per answer: a well-formed decision map becomes its
    Decision here (what as_decision would make, without the call), and an
    answer costs no test that its own outcome does not need."""
    completed = []
    pop = pending.pop
    for message in messages:
        if type(message) is list and len(message) == 4 and message[0] == 1:
            try:
                entry = pop(message[1], None)
            except TypeError:  # an unhashable msgid: response_of says what is wrong
                entry = None
            if entry is not None:
                batch, index = entry
                result = message[3]
                if message[2] is not None:
                    batch.results[index] = server_error(message[2])
                elif batch.convert is as_decision and type(result) is dict \
                        and type(result.get("allowed")) is bool:
                    decision = _new(Decision)
                    decision.allowed = result["allowed"]
                    decision.error = None
                    decision.fields = result
                    batch.results[index] = decision
                else:
                    try:
                        batch.results[index] = batch.convert(result)
                    except ProtocolError as exc:
                        batch.results[index] = exc
                batch.left -= 1
                if not batch.left:
                    completed.append(batch)
                continue
        response_of(message)  # raises for anything but a response or a notification
    return completed


def forget(pending, batch):
    """Drops a batch's requests still in flight, so that their answers, if
    they come, are discarded (a call that timed out or failed)."""
    if batch.first_msgid is None:
        return
    msgid = batch.first_msgid
    while msgid != batch.end_msgid:
        entry = pending.get(msgid)
        if entry is not None and entry[0] is batch:
            del pending[msgid]
        msgid = (msgid + 1) & 0xFFFFFFFF


def policy_decision(policy, exc):
    """The decision of the on_unreachable policy for a call that failed with
    `exc`, or None when the policy is to raise."""
    if policy == RAISE:
        return None
    if policy == FAIL_OPEN:
        return Decision(True, MODE_UNREACHABLE, error=exc)
    return Decision(False, MODE_UNREACHABLE, retry_after_ms=UNREACHABLE_RETRY_AFTER_MS, error=exc)


def policy_reservation(policy, exc):
    """reserve's answer when the daemon cannot be asked: the policy's
    decision as a Reservation without an id, or None to raise."""
    decision = policy_decision(policy, exc)
    if decision is None:
        return None
    return Reservation(decision.allowed, MODE_UNREACHABLE,
                       retry_after_ms=decision.retry_after_ms, error=exc)


def no_settlement():
    """settle's or cancel's answer for a reservation that was never opened
    (id None or 0): the daemon is not asked."""
    return Settlement(True)


def settle_many(results, policy, count_policy, return_exceptions):
    """acquire_many's results, in place: a call the daemon could not answer
    (UNREACHABLE) becomes the `policy` decision, passed through
    `count_policy(decision, exc)` (the client counts it), unless the policy
    is to raise; then any exception left is raised, or kept in the list
    with `return_exceptions`."""
    for i, result in enumerate(results):
        if type(result) is Decision:
            continue
        if isinstance(result, UNREACHABLE):
            decision = policy_decision(policy, result)
            if decision is not None:
                results[i] = count_policy(decision, result)
                continue
        if isinstance(result, BaseException) and not return_exceptions:
            raise result
    return results


def policy_all(policy, exc, count):
    decision = policy_decision(policy, exc)
    if decision is None:
        return None
    return AllDecision(decision.allowed, [decision] * count)
