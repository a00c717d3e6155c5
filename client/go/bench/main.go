// Command bench measures the Go client's decisions per second against a
// running sluiced: SLUICE_SOCKET is its socket, which must have a rule
// `bench` (a token bucket with a huge limit); each mode runs BENCH_SECONDS
// (default 3). It prints one line per mode:
//
//	client=go mode=pipelined decisions_per_s=N      one Client, 1024 in flight
//	client=go mode=sequential decisions_per_s=N     one Client, one call at a time
//	client=go mode=raw_pipelined decisions_per_s=N  the reference: a tight loop
//	    over a raw socket with the same MessagePack library, 1024 in flight
//
// The modes take turns in three rounds; each line is its mode's decisions
// over its time in all rounds.
package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	sluice "sluice.dev/client"
)

const (
	rule        = "bench"
	keyCount    = 1024
	windowCalls = 1024
	rounds      = 3
	callTimeout = 5 * time.Second
)

var keys = func() []string {
	k := make([]string, keyCount)
	for i := range k {
		k[i] = "go-" + strconv.Itoa(i)
	}
	return k
}()

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	os.Exit(1)
}

// pipelined: one goroutine keeps windowCalls acquires in flight on one
// Client with AcquireAsync, as the raw loop does on its socket.
func pipelined(socket string, duration time.Duration) (int, time.Duration) {
	c, err := sluice.Connect(context.Background(), socket, &sluice.Options{Timeout: callTimeout})
	if err != nil {
		fail("%v", err)
	}
	defer c.Close()
	ring := make([]*sluice.Future, windowCalls)
	n := 0
	began := time.Now()
	deadline := began.Add(duration)
	for i := range ring {
		ring[i] = c.AcquireAsync(rule, keys[i%keyCount], 1)
	}
	for i := 0; ; i++ {
		slot := i % len(ring)
		if _, err := ring[slot].Wait(context.Background()); err != nil {
			fail("pipelined: %v", err)
		}
		n++
		if n%256 == 0 && time.Now().After(deadline) {
			break
		}
		ring[slot] = c.AcquireAsync(rule, keys[i%keyCount], 1)
	}
	took := time.Since(began)
	for i := 1; i < len(ring); i++ { // the rest of the window, not counted
		_, _ = ring[(n+i-1)%len(ring)].Wait(context.Background())
	}
	return n, took
}

func sequential(socket string, duration time.Duration) (int, time.Duration) {
	c, err := sluice.Connect(context.Background(), socket, &sluice.Options{Timeout: callTimeout})
	if err != nil {
		fail("%v", err)
	}
	defer c.Close()
	n := 0
	began := time.Now()
	for deadline := began.Add(duration); n%256 != 0 || time.Now().Before(deadline); n++ {
		if _, err := c.Acquire(context.Background(), rule, keys[n%keyCount], 1); err != nil {
			fail("sequential: %v", err)
		}
	}
	return n, time.Since(began)
}

// raw: one goroutine encodes requests into a buffered socket, windowCalls
// in flight at most; another decodes the answers (the decision map, field
// by field, as the client does). Once the time is up, the writer sends a
// health request with msgid lastMsgid: its answer, after all the others,
// tells the reader it has them all.
func raw(socket string, duration time.Duration) (int, time.Duration) {
	conn, err := net.Dial("unix", socket)
	if err != nil {
		fail("%v", err)
	}
	defer conn.Close()
	window := make(chan struct{}, windowCalls)
	var stop atomic.Bool
	time.AfterFunc(duration, func() { stop.Store(true) })
	began := time.Now()
	go func() {
		w := bufio.NewWriterSize(conn, 64<<10)
		enc := msgpack.NewEncoder(w)
		for n := uint32(0); !stop.Load(); n = (n + 1) % lastMsgid {
			select {
			case window <- struct{}{}:
			default:
				if err := w.Flush(); err != nil {
					fail("raw write: %v", err)
				}
				window <- struct{}{}
			}
			_ = enc.EncodeArrayLen(4)
			_ = enc.EncodeUint(0)
			_ = enc.EncodeUint(uint64(n))
			_ = enc.EncodeString("acquire")
			_ = enc.EncodeArrayLen(3)
			_ = enc.EncodeString(rule)
			_ = enc.EncodeString(keys[n%keyCount])
			_ = enc.EncodeUint(1)
		}
		_ = enc.EncodeArrayLen(4)
		_ = enc.EncodeUint(0)
		_ = enc.EncodeUint(lastMsgid)
		_ = enc.EncodeString("health")
		_ = enc.EncodeArrayLen(0)
		if err := w.Flush(); err != nil {
			fail("raw write: %v", err)
		}
	}()
	dec := msgpack.NewDecoder(bufio.NewReaderSize(conn, 64<<10))
	received := 0
	for {
		last, err := readDecision(dec)
		if err != nil {
			fail("raw read: %v", err)
		}
		if last {
			return received, time.Since(began)
		}
		received++
		<-window
	}
}

// lastMsgid marks the raw loop's last request.
const lastMsgid = 1<<32 - 1

// readDecision reads one answer: a decision, or (last) the answer to the
// request of msgid lastMsgid.
func readDecision(dec *msgpack.Decoder) (last bool, err error) {
	if _, err := dec.DecodeArrayLen(); err != nil {
		return false, err
	}
	if _, err := dec.DecodeInt64(); err != nil {
		return false, err
	}
	id, err := dec.DecodeUint32()
	if err != nil {
		return false, err
	}
	if err := dec.DecodeNil(); err != nil {
		return false, fmt.Errorf("an error answer: %v", err)
	}
	if id == lastMsgid {
		return true, dec.Skip()
	}
	n, err := dec.DecodeMapLen()
	if err != nil {
		return false, err
	}
	for i := 0; i < n; i++ {
		key, err := dec.DecodeString()
		if err != nil {
			return false, err
		}
		switch key {
		case "allowed":
			_, err = dec.DecodeBool()
		case "mode", "reason":
			_, err = dec.DecodeString()
		default:
			_, err = dec.DecodeInt64()
		}
		if err != nil {
			return false, err
		}
	}
	return false, nil
}

func main() {
	socket := os.Getenv("SLUICE_SOCKET")
	if socket == "" {
		fail("SLUICE_SOCKET (the daemon's socket) is not set")
	}
	seconds := 3.0
	if s := os.Getenv("BENCH_SECONDS"); s != "" {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v <= 0 {
			fail("BENCH_SECONDS=%q is not a positive number", s)
		}
		seconds = v
	}
	duration := time.Duration(seconds * float64(time.Second) / rounds)
	// The modes take turns, a third of the time each, so that a busy moment
	// of a shared machine weighs on all of them alike.
	modes := []struct {
		name string
		run  func(string, time.Duration) (int, time.Duration)
	}{{"pipelined", pipelined}, {"sequential", sequential}, {"raw_pipelined", raw}}
	decisions := make([]int, len(modes))
	took := make([]time.Duration, len(modes))
	for r := 0; r < rounds; r++ {
		for i, m := range modes {
			n, d := m.run(socket, duration)
			decisions[i] += n
			took[i] += d
		}
	}
	for i, m := range modes {
		fmt.Printf("client=go mode=%s decisions_per_s=%.0f\n", m.name,
			float64(decisions[i])/took[i].Seconds())
	}
}
