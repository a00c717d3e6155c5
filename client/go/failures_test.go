package sluice

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// stopped SIGSTOPs the daemon until the test ends (or resume is called).
// It returns once every thread of the daemon has stopped: a signal reaches
// the threads of a process one by one, and a worker may answer once more.
func stopped(t *testing.T, d *daemon) (resume func()) {
	d.signal(syscall.SIGSTOP)
	deadline := time.Now().Add(callTimeout)
	for !allThreadsStopped(d.cmd.Process.Pid) {
		if time.Now().After(deadline) {
			t.Fatal("sluiced did not stop on SIGSTOP")
		}
		time.Sleep(time.Millisecond)
	}
	resumed := false
	resume = func() {
		if !resumed && d.cmd != nil {
			resumed = true
			d.signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	return resume
}

// allThreadsStopped reads each thread's state in /proc: "T" is stopped.
func allThreadsStopped(pid int) bool {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(task)
		if err != nil {
			return false
		}
		// The state follows the command name, which is in parentheses.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) == 0 || fields[0] != "T" {
			return false
		}
	}
	return true
}

// waitWritten returns once the socket has taken more than `before` bytes.
func waitWritten(t *testing.T, c *Client, before uint64) {
	t.Helper()
	deadline := time.Now().Add(callTimeout)
	for {
		c.mu.Lock()
		written := c.written
		c.mu.Unlock()
		if written > before {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the request was never written")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestACallTimesOutAgainstAStoppedDaemonAndLaterCallsGetTheirOwnAnswers(t *testing.T) {
	d := startDaemon(t, testRules)
	c := d.client(nil)
	if _, err := c.Health(within(t, callTimeout)); err != nil {
		t.Fatal(err)
	}
	resume := stopped(t, d)

	const timeout = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	began := time.Now()
	_, err := c.Acquire(ctx, "perkey", "late", 1)
	took := time.Since(began)
	if !errors.Is(err, ErrTimedOut) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire against a stopped daemon: %v, want ErrTimedOut (DeadlineExceeded)", err)
	}
	if took < timeout || took > timeout+time.Second {
		t.Fatalf("the call took %v, want about its timeout of %v", took, timeout)
	}

	// Options.Timeout bounds a call whose context has none.
	bounded := d.client(&Options{Timeout: timeout})
	began = time.Now()
	if _, err := bounded.Acquire(context.Background(), "perkey", "late2", 1); !errors.Is(err, ErrTimedOut) {
		t.Fatalf("acquire with Options.Timeout: %v, want ErrTimedOut", err)
	}
	if took := time.Since(began); took < timeout || took > timeout+time.Second {
		t.Fatalf("the call took %v, want about Options.Timeout %v", took, timeout)
	}

	// Resumed, the daemon answers the request that timed out too; that
	// answer (1 spent) must not be taken for the next call's (2 spent).
	resume()
	got, err := c.Acquire(within(t, callTimeout), "perkey", "late", 1)
	if err != nil || got.Remaining != perkeyLimit-2 {
		t.Fatalf("acquire after SIGCONT: %+v, %v, want %d remaining", got, err, perkeyLimit-2)
	}
}

func TestReconnectsOnceAtTheNextCallAfterTheDaemonRestarts(t *testing.T) {
	d := startDaemon(t, testRules)
	c := d.client(nil)
	if _, err := c.Acquire(within(t, callTimeout), "api", "r", 3); err != nil {
		t.Fatal(err)
	}
	d.kill()
	if _, err := c.Acquire(within(t, callTimeout), "api", "r", 1); !errors.Is(err, ErrConnect) {
		t.Fatalf("acquire while the daemon is down: %v, want ErrConnect", err)
	}
	d.start()
	got, err := c.Acquire(within(t, callTimeout), "api", "r", 1)
	if err != nil || !got.Allowed || got.Remaining != 2 {
		t.Fatalf("acquire after the restart: %+v, %v, want a fresh daemon's answer", got, err)
	}
	// Restarted again without a call in between: the next call reconnects.
	d.kill()
	d.start()
	if got, err := c.Acquire(within(t, callTimeout), "api", "r", 1); err != nil || got.Remaining != 2 {
		t.Fatalf("acquire after a second restart: %+v, %v", got, err)
	}
}

func TestARequestWrittenBeforeTheDaemonDiedIsNotSentAgain(t *testing.T) {
	d := startDaemon(t, testRules)
	c := d.client(nil)
	if _, err := c.Health(within(t, callTimeout)); err != nil {
		t.Fatal(err)
	}
	stopped(t, d)
	c.mu.Lock()
	before := c.written
	c.mu.Unlock()
	// "one" holds one unit at a time: were this acquire sent again to the
	// restarted daemon, it would hold the unit and deny the next acquire.
	lost := c.AcquireAsync("one", "k", 1)
	waitWritten(t, c, before)
	d.kill()
	if _, err := lost.Wait(within(t, callTimeout)); !errors.Is(err, ErrClosed) {
		t.Fatalf("a call in flight when the daemon died: %v, want ErrClosed", err)
	}
	d.start()
	got, err := c.Acquire(within(t, callTimeout), "one", "k", 1)
	if err != nil || !got.Allowed || got.Remaining != 0 {
		t.Fatalf("acquire on the restarted daemon: %+v, %v, want the unit free: "+
			"the lost request was sent again", got, err)
	}
}

func TestTheUnreachablePolicyDecidesAndIsCounted(t *testing.T) {
	nowhere := filepath.Join(t.TempDir(), "no.sock")
	open := New(nowhere, nil)
	defer open.Close()
	if _, err := open.Acquire(within(t, callTimeout), "api", "k", 1); !errors.Is(err, ErrConnect) {
		t.Fatalf("acquire with no daemon: %v, want ErrConnect", err)
	}
	for i := 0; i < 2; i++ {
		got, err := open.Allow(within(t, callTimeout), "api", "k", 1)
		if err != nil || !got.Allowed || got.Mode != ModeUnreachable {
			t.Fatalf("fail_open allow with no daemon: %+v, %v, want allowed, mode unreachable", got, err)
		}
	}
	if s := open.Stats(); s.UnreachableAllowed != 2 || s.UnreachableDenied != 0 {
		t.Fatalf("fail_open stats %+v, want 2 allowed", s)
	}

	closed := New(nowhere, &Options{OnUnreachable: FailClosed})
	defer closed.Close()
	got, err := closed.Allow(within(t, callTimeout), "api", "k", 1)
	if err != nil || got.Allowed || got.Mode != ModeUnreachable {
		t.Fatalf("fail_closed allow with no daemon: %+v, %v, want denied", got, err)
	}
	if s := closed.Stats(); s.UnreachableAllowed != 0 || s.UnreachableDenied != 1 {
		t.Fatalf("fail_closed stats %+v, want 1 denied", s)
	}

	// A stopped daemon is unreachable too once the call times out; its own
	// errors are not the policy's to decide.
	d := startDaemon(t, testRules)
	live := d.client(&Options{OnUnreachable: FailClosed})
	if _, err := live.Allow(within(t, callTimeout), "no-such-rule", "k", 1); !errors.Is(err, ErrUnknownRule) {
		t.Fatalf("allow of an unknown rule: %v, want UNKNOWN_RULE", err)
	}
	stopped(t, d)
	got, err = live.Allow(within(t, 200*time.Millisecond), "api", "k", 1)
	if err != nil || got.Allowed || got.Mode != ModeUnreachable {
		t.Fatalf("fail_closed allow against a stopped daemon: %+v, %v, want denied", got, err)
	}
	if s := live.Stats(); s.UnreachableDenied != 1 {
		t.Fatalf("stats %+v, want the one timeout counted", s)
	}
}

func TestTheClientFailsItsCallsOnceClosedAndLeavesNoGoroutines(t *testing.T) {
	d := startDaemon(t, testRules)
	before := runtime.NumGoroutine()
	c := d.client(nil)
	stopped(t, d)
	waiting := c.AcquireAsync("perkey", "k", 1)
	c.Close()
	if _, err := waiting.Wait(within(t, callTimeout)); !errors.Is(err, ErrClosed) {
		t.Fatalf("a call waiting at Close: %v, want ErrClosed", err)
	}
	if _, err := c.Acquire(within(t, callTimeout), "perkey", "k", 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("a call after Close: %v, want ErrClosed", err)
	}
	// The writer has ended when Close returns; the reader ends once its
	// read fails on the closed socket.
	deadline := time.Now().Add(callTimeout)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after Close, %d before the client", runtime.NumGoroutine(), before)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestTheUnreachablePolicyAnswersReserveWithNoID(t *testing.T) {
	nowhere := filepath.Join(t.TempDir(), "no.sock")
	open := New(nowhere, nil)
	defer open.Close()
	r, err := open.Reserve(within(t, callTimeout), "budget", "k", 5, 0)
	if err != nil || !r.Allowed || r.ID != 0 || r.Mode != ModeUnreachable {
		t.Fatalf("fail_open reserve with no daemon: %+v, %v, want allowed, no id, mode unreachable", r, err)
	}
	if s, err := open.Settle(within(t, callTimeout), r.ID, 9); err != nil || s.Debt != 0 {
		t.Fatalf("settle of the policy's reservation: %+v, %v, want a no-op", s, err)
	}
	if s, err := open.Cancel(within(t, callTimeout), r.ID); err != nil || s.Refunded != 0 {
		t.Fatalf("cancel of the policy's reservation: %+v, %v, want a no-op", s, err)
	}
	if _, err := open.Settle(within(t, callTimeout), 42, 1); !errors.Is(err, ErrConnect) {
		t.Fatalf("settle of a real id with no daemon: %v, want ErrConnect", err)
	}
	if s := open.Stats(); s.UnreachableAllowed != 1 {
		t.Fatalf("stats %+v, want the one reserve counted", s)
	}
	closed := New(nowhere, &Options{OnUnreachable: FailClosed})
	defer closed.Close()
	if r, err := closed.Reserve(within(t, callTimeout), "budget", "k", 5, 0); err != nil || r.Allowed || r.ID != 0 {
		t.Fatalf("fail_closed reserve with no daemon: %+v, %v, want denied, no id", r, err)
	}
}
