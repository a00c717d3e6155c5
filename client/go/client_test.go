package sluice

import (
	"errors"
	"testing"
	"time"
)

// The rules every test daemon has. perkey's limit is large and its keys
// fresh, so an answer's remaining (limit - cost) tells which request it
// answers.
const testRules = `
[daemon]
socket = "{socket}"
workers = 2

[[rule]]
name = "api"
algorithm = "token_bucket"
limit = 3
period = "1h"

[[rule]]
name = "uploads"
algorithm = "concurrency"
limit = 2

[[rule]]
name = "one"
algorithm = "concurrency"
limit = 1

[[rule]]
name = "perkey"
algorithm = "token_bucket"
limit = 100000
period = "1h"

[[rule]]
name = "paced"
algorithm = "gcra"
limit = 2
period = "1s"
pace = true
max_wait = "5s"

[[rule]]
name = "held"
algorithm = "gcra"
limit = 10
period = "1s"
pace = true
max_wait = "5s"

# For Reserve and Settle: a window no test ends, so that a refund or a debt
# shows in the next answer's Remaining exactly.
[[rule]]
name = "budget"
algorithm = "fixed_window"
limit = 10
period = "366d"

# As budget, and a key owes at most cappedDebt: a settle's excess past it
# is unpaid.
[[rule]]
name = "capped"
algorithm = "fixed_window"
limit = 10
period = "366d"
max_debt = 2
`

const perkeyLimit = 100000

const callTimeout = 5 * time.Second

func TestAcquireSpendsUnitsUntilTheRuleDenies(t *testing.T) {
	c := startDaemon(t, testRules).client(nil)
	for want := int64(2); want >= 0; want-- {
		d, err := c.Acquire(within(t, callTimeout), "api", "user:1", 1)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || d.Remaining != want || d.Limit != 3 || d.Mode != ModeLocal {
			t.Fatalf("acquire: %+v, want allowed with %d remaining of 3, mode local", d, want)
		}
	}
	d, err := c.Acquire(within(t, callTimeout), "api", "user:1", 1)
	if err != nil {
		t.Fatal(err)
	}
	// One token comes back every 20 minutes.
	if d.Allowed || d.Remaining != 0 || d.RetryAfterMs <= 0 || d.RetryAfterMs > 1200000 {
		t.Fatalf("fourth acquire: %+v, want denied with a retry after of up to 20 min", d)
	}
}

func TestPeekReportsTheStateAndSpendsNothing(t *testing.T) {
	c := startDaemon(t, testRules).client(nil)
	if _, err := c.Acquire(within(t, callTimeout), "api", "user:2", 2); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		d, err := c.Peek(within(t, callTimeout), "api", "user:2")
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || d.Remaining != 1 || d.Limit != 3 {
			t.Fatalf("peek %d: %+v, want 1 remaining of 3", i, d)
		}
	}
}

func TestAcquireTakesKeysOfAnyBytes(t *testing.T) {
	c := startDaemon(t, testRules).client(nil)
	// Not UTF-8, so sent as bin; the NUL and the byte after it count.
	keys := []string{"\xff\xfe\x00a", "\xff\xfe\x00b", "caf\u00e9", ""}
	for i, key := range keys {
		if _, err := c.Acquire(within(t, callTimeout), "api", key, uint32(i+1)%3+1); err != nil {
			t.Fatalf("acquire of key %q: %v", key, err)
		}
	}
	for i, key := range keys {
		d, err := c.Peek(within(t, callTimeout), "api", key)
		if want := 3 - int64((i+1)%3+1); err != nil || d.Remaining != want {
			t.Fatalf("peek of key %q: %+v, %v, want %d remaining", key, d, err, want)
		}
	}
}

func TestAcquireAllSpendsEveryItemOrNone(t *testing.T) {
	c := startDaemon(t, testRules).client(nil)
	all, err := c.AcquireAll(within(t, callTimeout), []Item{
		{Rule: "api", Key: "a", Cost: 1}, {Rule: "api", Key: "b", Cost: 3}, {Rule: "api", Key: "c", Cost: 4}})
	if err != nil {
		t.Fatal(err)
	}
	if all.Allowed || len(all.Results) != 3 || !all.Results[0].Allowed || all.Results[2].Allowed {
		t.Fatalf("acquire_all with an item over its limit: %+v, want denied, item c denied", all)
	}
	for _, key := range []string{"a", "b"} {
		d, err := c.Peek(within(t, callTimeout), "api", key)
		if err != nil {
			t.Fatal(err)
		}
		if d.Remaining != 3 {
			t.Fatalf("key %s after a denied acquire_all: %+v, want nothing spent", key, d)
		}
	}
	all, err = c.AcquireAll(within(t, callTimeout), []Item{
		{Rule: "api", Key: "a", Cost: 1}, {Rule: "uploads", Key: "b", Cost: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if !all.Allowed || all.Results[0].Remaining != 2 || all.Results[1].Remaining != 0 {
		t.Fatalf("acquire_all within its limits: %+v, want allowed, 2 and 0 remaining", all)
	}
	if _, err := c.AcquireAll(within(t, callTimeout), nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("acquire_all of no items: %v, want ErrInvalid", err)
	}
}

func TestReleaseGivesConcurrencyUnitsBack(t *testing.T) {
	c := startDaemon(t, testRules).client(nil)
	for i := 0; i < 2; i++ {
		if d, err := c.Acquire(within(t, callTimeout), "uploads", "u", 1); err != nil || !d.Allowed {
			t.Fatalf("acquire %d: %+v, %v", i, d, err)
		}
	}
	if d, err := c.Acquire(within(t, callTimeout), "uploads", "u", 1); err != nil || d.Allowed {
		t.Fatalf("third acquire of a limit of 2 held: %+v, %v, want denied", d, err)
	}
	if _, err := c.Release(within(t, callTimeout), "uploads", "u", 1); err != nil {
		t.Fatal(err)
	}
	d, err := c.Acquire(within(t, callTimeout), "uploads", "u", 1)
	if err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("acquire after a release: %+v, %v, want allowed with 0 remaining", d, err)
	}
}

func TestResetForgetsTheKeysState(t *testing.T) {
	// The test runs as the daemon's own user, who may call admin methods.
	c := startDaemon(t, testRules).client(nil)
	if _, err := c.Acquire(within(t, callTimeout), "api", "r", 3); err != nil {
		t.Fatal(err)
	}
	d, err := c.Reset(within(t, callTimeout), "api", "r")
	if err != nil || d.Remaining != 3 {
		t.Fatalf("reset: %+v, %v, want a fresh key's 3 remaining", d, err)
	}
	if d, err := c.Acquire(within(t, callTimeout), "api", "r", 1); err != nil || !d.Allowed {
		t.Fatalf("acquire after reset: %+v, %v", d, err)
	}
}

func TestHealthSaysOkWithoutRedis(t *testing.T) {
	c := startDaemon(t, testRules).client(nil)
	h, err := c.Health(within(t, callTimeout))
	if err != nil {
		t.Fatal(err)
	}
	if h.Status != "ok" || h.Redis != "none" || h.Fields["status"] != "ok" {
		t.Fatalf("health: %+v, want status ok, redis none", h)
	}
}

func TestTheDaemonsErrorsCarryItsCode(t *testing.T) {
	c := startDaemon(t, testRules).client(nil)
	_, err := c.Acquire(within(t, callTimeout), "no-such-rule", "k", 1)
	var e *Error
	if !errors.Is(err, ErrUnknownRule) || !errors.As(err, &e) || e.Code != CodeServer ||
		e.ServerCode != "UNKNOWN_RULE" || e.Message == "" {
		t.Fatalf("acquire of an unknown rule: %#v, want UNKNOWN_RULE with a message", err)
	}
	if errors.Is(err, ErrBadRequest) || !errors.Is(err, ErrServer) {
		t.Fatalf("%v matches the wrong codes", err)
	}
	// Costs above 1,000,000,000 are refused.
	if _, err := c.Acquire(within(t, callTimeout), "api", "k", 2000000000); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("acquire of cost 2e9: %v, want BAD_REQUEST", err)
	}
	// Only token_bucket and gcra rules wait.
	_, err = c.AcquireWait(within(t, callTimeout), "uploads", "k", 1, time.Second)
	if !errors.Is(err, ErrBadRequest) {
		t.Fatalf("waiting acquire on a concurrency rule: %v, want BAD_REQUEST", err)
	}
	// The connection carries on after error answers.
	if d, err := c.Acquire(within(t, callTimeout), "api", "k", 1); err != nil || !d.Allowed {
		t.Fatalf("acquire after errors: %+v, %v", d, err)
	}
}

func TestAcquireWaitIsAnsweredOnceTheUnitsAreDue(t *testing.T) {
	c := startDaemon(t, testRules).client(nil)
	// "paced" lets one unit through every 500 ms, and waits up to 5 s
	// when a request does not say how long it may.
	first, err := c.AcquireWait(within(t, callTimeout), "paced", "w", 1, time.Second)
	if err != nil || !first.Allowed || first.WaitedMs != 0 {
		t.Fatalf("first acquire: %+v, %v, want allowed at once", first, err)
	}
	// The next unit is about 500 ms away: a 1 ms wait is denied (where the
	// rule's own 5 s would have waited for it).
	short, err := c.AcquireWait(within(t, callTimeout), "paced", "w", 1, time.Millisecond)
	if err != nil || short.Allowed || short.RetryAfterMs <= 0 {
		t.Fatalf("acquire that may wait 1 ms: %+v, %v, want denied", short, err)
	}
	long, err := c.AcquireWait(within(t, callTimeout), "paced", "w", 1, 2*time.Second)
	if err != nil || !long.Allowed || long.WaitedMs <= 0 || long.WaitedMs > 500 {
		t.Fatalf("acquire that may wait 2 s: %+v, %v, want allowed after waiting up to 500 ms",
			long, err)
	}
}

// Reserve, Settle and Cancel run on a daemon of two workers, so a settle may
// reach a worker other than the reserving one and be handed to it.

const budgetLimit = 10
const cappedDebt = 2

func TestReserveThenSettleBelowTheEstimateRefundsTheDifference(t *testing.T) {
	c := startDaemon(t, testRules).client(nil)
	r, err := c.Reserve(within(t, callTimeout), "budget", "refund", 8, 0)
	if err != nil || !r.Allowed || r.ID == 0 || r.Remaining != budgetLimit-8 || r.Mode != ModeLocal {
		t.Fatalf("reserve 8: %+v, %v, want allowed with an id and %d remaining", r, err, budgetLimit-8)
	}
	s, err := c.Settle(within(t, callTimeout), r.ID, 3)
	if err != nil || s.ID != r.ID || s.Refunded != 5 || s.Debt != 0 || s.Remaining != budgetLimit-3 {
		t.Fatalf("settle at 3: %+v, %v, want 5 refunded and %d remaining", s, err, budgetLimit-3)
	}
	if d, err := c.Peek(within(t, callTimeout), "budget", "refund"); err != nil || d.Remaining != budgetLimit-3 {
		t.Fatalf("peek after the refund: %+v, %v, want %d remaining", d, err, budgetLimit-3)
	}
	if d, err := c.Acquire(within(t, callTimeout), "budget", "refund", budgetLimit-3); err != nil || !d.Allowed {
		t.Fatalf("acquire of the refunded units: %+v, %v, want allowed", d, err)
	}
}

func TestSettleAboveTheEstimateLeavesDebt(t *testing.T) {
	c := startDaemon(t, testRules).client(nil)
	r, err := c.Reserve(within(t, callTimeout), "budget", "debt", budgetLimit, 5*time.Second)
	if err != nil || r.ID == 0 {
		t.Fatalf("reserve the whole limit: %+v, %v", r, err)
	}
	s, err := c.Settle(within(t, callTimeout), r.ID, budgetLimit+4)
	if err != nil || s.Refunded != 0 || s.Debt != 4 || s.Unpaid != 0 || s.Remaining != -4 || s.Allowed {
		t.Fatalf("settle 4 past the estimate: %+v, %v, want a debt of 4, none unpaid, remaining -4, not allowed", s, err)
	}
	if d, err := c.Acquire(within(t, callTimeout), "budget", "debt", 1); err != nil || d.Allowed || d.Remaining != -4 {
		t.Fatalf("acquire in debt: %+v, %v, want denied with remaining -4", d, err)
	}
}

func TestSettlePastTheDebtBoundReportsWhatItLeftUnpaid(t *testing.T) {
	c := startDaemon(t, testRules).client(nil)
	r, err := c.Reserve(within(t, callTimeout), "capped", "runaway", budgetLimit, 0)
	if err != nil || r.ID == 0 {
		t.Fatalf("reserve the whole limit: %+v, %v", r, err)
	}
	s, err := c.Settle(within(t, callTimeout), r.ID, budgetLimit+5)
	if err != nil || s.Debt != cappedDebt || s.Unpaid != 5-cappedDebt || s.Remaining != -cappedDebt {
		t.Fatalf("settle 5 past the estimate: %+v, %v, want a debt of %d and %d unpaid", s, err,
			cappedDebt, 5-cappedDebt)
	}
}

func TestCancelRefundsTheWholeEstimate(t *testing.T) {
	c := startDaemon(t, testRules).client(nil)
	r, err := c.Reserve(within(t, callTimeout), "budget", "cancel", 6, time.Minute)
	if err != nil || r.ID == 0 {
		t.Fatalf("reserve 6: %+v, %v", r, err)
	}
	s, err := c.Cancel(within(t, callTimeout), r.ID)
	if err != nil || s.ID != r.ID || s.Refunded != 6 || s.Debt != 0 || s.Remaining != budgetLimit {
		t.Fatalf("cancel: %+v, %v, want 6 refunded and the full limit back", s, err)
	}
}

func TestSettleOfAnIDNotOpenReturnsErrUnknownReservation(t *testing.T) {
	c := startDaemon(t, testRules).client(nil)
	r, err := c.Reserve(within(t, callTimeout), "budget", "unknown", 2, 0)
	if err != nil || r.ID == 0 {
		t.Fatalf("reserve 2: %+v, %v", r, err)
	}
	if _, err := c.Settle(within(t, callTimeout), r.ID, 2); err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() (Settlement, error){
		"settle again": func() (Settlement, error) { return c.Settle(within(t, callTimeout), r.ID, 1) },
		"cancel":       func() (Settlement, error) { return c.Cancel(within(t, callTimeout), r.ID) },
		"settle of an id never opened": func() (Settlement, error) {
			return c.Settle(within(t, callTimeout), r.ID+1000, 1)
		},
	} {
		_, err := call()
		var e *Error
		if !errors.Is(err, ErrUnknownReservation) || !errors.As(err, &e) || e.ServerCode != "UNKNOWN_RESERVATION" {
			t.Fatalf("%s: %v, want ErrUnknownReservation", name, err)
		}
	}
	_, err = c.Reserve(within(t, callTimeout), "uploads", "k", 1, 0)
	if !errors.Is(err, ErrBadRequest) || errors.Is(err, ErrUnknownReservation) {
		t.Fatalf("reserve on a concurrency rule: %v, want BAD_REQUEST only", err)
	}
}

func TestReserveOnADeniedKeyIsDeniedWithNoID(t *testing.T) {
	c := startDaemon(t, testRules).client(nil)
	if _, err := c.Reserve(within(t, callTimeout), "budget", "denied", budgetLimit-1, 0); err != nil {
		t.Fatal(err)
	}
	r, err := c.Reserve(within(t, callTimeout), "budget", "denied", 2, 0)
	if err != nil || r.Allowed || r.ID != 0 || r.Remaining != 1 || r.RetryAfterMs <= 0 {
		t.Fatalf("reserve past the limit: %+v, %v, want denied, no id, 1 remaining, a retry time", r, err)
	}
	// Settling no reservation asks the daemon nothing.
	s, err := c.Settle(within(t, callTimeout), r.ID, 2)
	if err != nil || !s.Allowed || s.Refunded != 0 || s.Debt != 0 {
		t.Fatalf("settle of id 0: %+v, %v, want a no-op", s, err)
	}
	if d, err := c.Peek(within(t, callTimeout), "budget", "denied"); err != nil || d.Remaining != 1 {
		t.Fatalf("peek: %+v, %v, want 1 remaining", d, err)
	}
	if _, err := c.Reserve(within(t, callTimeout), "budget", "denied", 0, 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("reserve of 0: %v, want ErrInvalid", err)
	}
}
