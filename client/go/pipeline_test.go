package sluice

import (
	"context"
	"strconv"
	"sync"
	"testing"
)

const pipelinedCalls = 10000

// pipelined is one call of a pipelined run: what was sent and what came back.
type pipelined struct {
	held     bool // on the paced rule, whose answers the daemon holds
	key      string
	cost     uint32
	future   *Future
	decision Decision
	err      error
	order    uint64 // where its answer came on the wire, among all the answers
}

// sendPipelined sends pipelinedCalls acquires on one Client from one
// goroutine without waiting: every 500th on "held" (paced to one unit per
// 100 ms, so the daemon holds each answer 100 ms longer than the last), the
// rest on fresh keys of "perkey" with costs that tell their answers apart.
// Then it waits for every answer and notes where it came on the wire.
func sendPipelined(t *testing.T, c *Client) []*pipelined {
	calls := make([]*pipelined, pipelinedCalls)
	for i := range calls {
		p := &pipelined{held: i%500 == 0, key: "k" + strconv.Itoa(i), cost: uint32(i%97) + 1}
		if p.held {
			p.key, p.cost = "held-key", 1
			p.future = c.AcquireAsync("held", p.key, p.cost)
		} else {
			p.future = c.AcquireAsync("perkey", p.key, p.cost)
		}
		calls[i] = p
	}
	ctx := within(t, 2*callTimeout)
	for _, p := range calls {
		p.decision, p.err = p.future.Wait(ctx)
		p.order = p.future.k.answer
	}
	return calls
}

// checkPipelined asserts every answer is its own request's, and that the
// daemon's held answers came after answers to requests sent later.
func checkPipelined(t *testing.T, calls []*pipelined) {
	t.Helper()
	var lastHeld *pipelined
	for i, p := range calls {
		if p.err != nil {
			t.Fatalf("call %d: %v", i, p.err)
		}
		if p.held {
			// The daemon serves a key's waiters in arrival order.
			if !p.decision.Allowed || (lastHeld != nil && p.order < lastHeld.order) {
				t.Fatalf("held call %d: %+v, answered %d-th, want allowed after the held call "+
					"before it (%d-th)", i, p.decision, p.order, lastHeld.order)
			}
			lastHeld = p
			continue
		}
		want := int64(perkeyLimit) - int64(p.cost)
		if !p.decision.Allowed || p.decision.Remaining != want || p.decision.Limit != perkeyLimit {
			t.Fatalf("call %d (cost %d): %+v, want allowed with %d remaining: another call's answer",
				i, p.cost, p.decision, want)
		}
	}
	// Released 1.9 s after the first held call came, however long the
	// 10,000 took to send.
	if lastHeld.decision.WaitedMs <= 0 {
		t.Fatalf("the last held call waited %d ms, want the daemon to have held it",
			lastHeld.decision.WaitedMs)
	}
	last := calls[len(calls)-1]
	if lastHeld.order < last.order {
		t.Fatalf("the last held call (sent before call %d) answered %d-th, before that call (%d-th): "+
			"no answer came out of order", len(calls)-1, lastHeld.order, last.order)
	}
}

func TestPipelinedCallsAreMatchedToTheirAnswersOutOfOrder(t *testing.T) {
	c := startDaemon(t, testRules).client(nil)
	checkPipelined(t, sendPipelined(t, c))
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) != 0 {
		t.Fatalf("%d calls still pending after every answer came", len(c.pending))
	}
}

func TestPipelinedCallsFromManyGoroutinesShareOneConnection(t *testing.T) {
	c := startDaemon(t, testRules).client(nil)
	const goroutines, callsEach = 100, 100
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < callsEach; i++ {
				cost := uint32(g*callsEach+i)%89 + 1
				key := "g" + strconv.Itoa(g) + "." + strconv.Itoa(i)
				ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
				d, err := c.Acquire(ctx, "perkey", key, cost)
				cancel()
				if err == nil && d.Remaining != perkeyLimit-int64(cost) {
					err = &Error{Code: CodeProto, Message: "answer of another call: " + key}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != 1 {
		t.Fatalf("%d connections opened, want one shared", c.gen)
	}
}

func TestMsgidsWrapWithin32BitsAndAnswersStillMatch(t *testing.T) {
	const first = 1<<32 - pipelinedCalls/2
	c := startDaemon(t, testRules).client(&Options{FirstMsgID: first})
	calls := sendPipelined(t, c)
	checkPipelined(t, calls)
	if id := calls[0].future.k.id; id != first {
		t.Fatalf("first msgid %d, want %d", id, uint32(first))
	}
	if id := calls[len(calls)-1].future.k.id; id != pipelinedCalls/2-1 {
		t.Fatalf("last msgid %d, want %d: ids did not wrap to 0", id, pipelinedCalls/2-1)
	}
	// The held calls sent before the wrap were answered after ids had wrapped.
	if id := calls[500].future.k.id; id < first {
		t.Fatalf("held call 500 has msgid %d, want one from before the wrap", id)
	}
}
