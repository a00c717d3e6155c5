package sluice

import (
	"context"
	"time"
)

// Acquire asks whether key may spend cost units of rule now, and spends them
// when it may. A denial is not an error: it is Decision.Allowed == false.
func (c *Client) Acquire(ctx context.Context, rule, key string, cost uint32) (Decision, error) {
	k, err := c.do(ctx, kindDecision, &request{method: "acquire", rule: rule, key: key,
		withCost: true, cost: cost, maxWaitMs: -1})
	if err != nil {
		return Decision{}, err
	}
	return k.decision, nil
}

// AcquireWait is Acquire where the daemon, when the units will be there
// within maxWait (token_bucket and gcra rules), holds the answer until they
// are and then allows, instead of denying; Decision.WaitedMs is how long it
// held it. ctx must allow for maxWait. maxWait is sent in whole
// milliseconds, rounded up.
func (c *Client) AcquireWait(ctx context.Context, rule, key string, cost uint32,
	maxWait time.Duration) (Decision, error) {
	if maxWait < 0 {
		return Decision{}, &Error{Code: CodeInvalid, Message: "a negative maxWait"}
	}
	maxWaitMs := int64((maxWait + time.Millisecond - 1) / time.Millisecond)
	k, err := c.do(ctx, kindDecision, &request{method: "acquire", rule: rule, key: key,
		withCost: true, cost: cost, maxWaitMs: maxWaitMs})
	if err != nil {
		return Decision{}, err
	}
	return k.decision, nil
}

// Peek reports key's state under rule, as Acquire with cost 0 would, and
// spends nothing.
func (c *Client) Peek(ctx context.Context, rule, key string) (Decision, error) {
	k, err := c.do(ctx, kindDecision, &request{method: "peek", rule: rule, key: key})
	if err != nil {
		return Decision{}, err
	}
	return k.decision, nil
}

// Release gives cost units of a concurrency rule back. When the daemon's
// result is not a decision, the Decision is {Allowed: true}.
func (c *Client) Release(ctx context.Context, rule, key string, cost uint32) (Decision, error) {
	k, err := c.do(ctx, kindRelease, &request{method: "release", rule: rule, key: key,
		withCost: true, cost: cost, maxWaitMs: -1})
	if err != nil {
		return Decision{}, err
	}
	return k.decision, nil
}

// Reset forgets key's state under a local rule, so that its next request is
// a fresh key's, and returns that fresh state. Admin only: other callers get
// ErrForbidden.
func (c *Client) Reset(ctx context.Context, rule, key string) (Decision, error) {
	k, err := c.do(ctx, kindDecision, &request{method: "reset", rule: rule, key: key})
	if err != nil {
		return Decision{}, err
	}
	return k.decision, nil
}

// AcquireAll is all-or-nothing over items: AllDecision.Allowed only when
// every item passed, and then each was spent.
func (c *Client) AcquireAll(ctx context.Context, items []Item) (AllDecision, error) {
	if len(items) == 0 {
		return AllDecision{}, &Error{Code: CodeInvalid, Message: "no items"}
	}
	k, err := c.do(ctx, kindAll, &request{method: "acquire_all", items: items})
	if err != nil {
		return AllDecision{}, err
	}
	if len(k.all.Results) != len(items) {
		return AllDecision{}, &Error{Code: CodeProto, Message: "results do not match the items"}
	}
	return *k.all, nil
}

// Health returns the daemon's health.
func (c *Client) Health(ctx context.Context) (Health, error) {
	k, err := c.do(ctx, kindHealth, &request{method: "health", noParams: true})
	if err != nil {
		return Health{}, err
	}
	return *k.health, nil
}

// Reserve decides like Acquire of estimate (at least 1; it never waits) and,
// when allowed, opens a reservation: Reservation.ID names it for Settle or
// Cancel. Unsettled after ttl (0: DefaultTTL; sent in whole milliseconds,
// rounded up) it settles at its estimate. Like Allow, it follows the
// Client's Policy when the daemon cannot be asked: a nil error and a
// Reservation of ID 0 and Mode ModeUnreachable, counted in Stats. Rules
// that cannot reserve return ErrBadRequest; a full table ErrOverloaded.
func (c *Client) Reserve(ctx context.Context, rule, key string, estimate uint32,
	ttl time.Duration) (Reservation, error) {
	if estimate == 0 || ttl < 0 {
		return Reservation{}, &Error{Code: CodeInvalid, Message: "an estimate of 0 or a negative ttl"}
	}
	if ttl == 0 {
		ttl = DefaultTTL
	}
	ttlMs := int64((ttl + time.Millisecond - 1) / time.Millisecond)
	if ttlMs > 0xFFFFFFFF {
		return Reservation{}, &Error{Code: CodeInvalid, Message: "a ttl beyond 2^32 ms"}
	}
	k, err := c.do(ctx, kindReserve, &request{method: "reserve", rule: rule, key: key,
		withCost: true, cost: estimate, maxWaitMs: ttlMs})
	if err != nil {
		if !unreachable(err) {
			return Reservation{}, err
		}
		return Reservation{Decision: c.policyDecision()}, nil
	}
	r := Reservation{Decision: k.decision}
	if r.Allowed {
		r.ID = k.extras.id
	}
	return r, nil
}

// Settle settles reservation id at actual units: the daemon gives back
// estimate - actual (Refunded), or charges the excess past the limit (Debt;
// the key's Remaining goes below 0 and it admits nothing until the debt is
// paid back; Unpaid: the part past the rule's max_debt, charged to nobody). An id that is not open returns ErrUnknownReservation. id 0 (a
// denied or Policy-made Reservation) returns at once without asking the
// daemon. When the daemon cannot be asked the error is returned: the daemon
// settles the reservation at its estimate after its TTL.
func (c *Client) Settle(ctx context.Context, id uint64, actual uint32) (Settlement, error) {
	return c.settle(ctx, &request{method: "settle", settleID: id, withActual: true, actual: actual})
}

// Cancel gives reservation id back whole: Settle at 0.
func (c *Client) Cancel(ctx context.Context, id uint64) (Settlement, error) {
	return c.settle(ctx, &request{method: "cancel", settleID: id})
}

func (c *Client) settle(ctx context.Context, r *request) (Settlement, error) {
	if r.settleID == 0 {
		return Settlement{Decision: Decision{Allowed: true}}, nil
	}
	k, err := c.do(ctx, kindSettle, r)
	if err != nil {
		return Settlement{}, err
	}
	return Settlement{Decision: k.decision, ID: k.extras.id, Refunded: k.extras.refunded,
		Debt: k.extras.debt, Unpaid: k.extras.unpaid}, nil
}

// Allow is Acquire with the Client's Policy: when the daemon cannot be asked
// (not running, connection lost, timed out, a broken answer) it returns the
// Policy's decision, with Mode ModeUnreachable and a nil error, and counts it
// in Stats. The daemon's own errors (an unknown rule, a bad request) and
// invalid arguments are still returned.
func (c *Client) Allow(ctx context.Context, rule, key string, cost uint32) (Decision, error) {
	d, err := c.Acquire(ctx, rule, key, cost)
	if err == nil || !unreachable(err) {
		return d, err
	}
	return c.policyDecision(), nil
}

// policyDecision is the Policy's decision for a call the daemon could not
// answer, counted.
func (c *Client) policyDecision() Decision {
	if c.opts.OnUnreachable == FailClosed {
		c.denied.Add(1)
		return Decision{Mode: ModeUnreachable}
	}
	c.allowed.Add(1)
	return Decision{Allowed: true, Mode: ModeUnreachable}
}

// Future is an acquire sent without waiting for its answer, so that one
// goroutine can keep many requests in flight.
type Future struct {
	c   *Client
	k   call
	err error
}

// AcquireAsync sends an acquire and returns at once; Wait gives its answer.
// It never blocks on the socket: the request is written by the Client's
// writer together with whatever else is queued.
func (c *Client) AcquireAsync(rule, key string, cost uint32) *Future {
	f := &Future{c: c}
	_, f.err = c.start(context.Background(), &f.k, kindDecision, &request{method: "acquire",
		rule: rule, key: key, withCost: true, cost: cost, maxWaitMs: -1})
	return f
}

// Wait returns the answer, waiting as long as ctx (or Options.Timeout)
// allows. Call it once.
func (f *Future) Wait(ctx context.Context) (Decision, error) {
	if f.err != nil {
		return Decision{}, f.err
	}
	if err := f.c.wait(ctx, &f.k); err != nil {
		return Decision{}, err
	}
	return f.k.decision, nil
}
