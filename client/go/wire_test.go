package sluice

// Answers sluiced never gives, from a fake daemon on a Unix socket: the
// client must skip notifications and answers to no call, fail only the call
// whose result is malformed, and close a connection whose frame is too large.

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// fakeDaemon accepts connections on a socket of its own and hands each
// request ([0, msgid, method, params]) with the connection to answer.
type fakeDaemon struct {
	socket      string
	connections chan struct{} // one value per connection accepted
}

func startFake(t *testing.T, answer func(conn net.Conn, msgid uint32, method string)) *fakeDaemon {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "sgo.")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeDaemon{socket: filepath.Join(dir, "s.sock"), connections: make(chan struct{}, 16)}
	ln, err := net.Listen("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close(); os.RemoveAll(dir) })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			f.connections <- struct{}{}
			go func() {
				defer conn.Close()
				dec := msgpack.NewDecoder(conn)
				for {
					var req []interface{}
					if err := dec.Decode(&req); err != nil || len(req) != 4 {
						return
					}
					id := toMsgid(req[1])
					method, _ := req[2].(string)
					answer(conn, id, method)
				}
			}()
		}
	}()
	return f
}

// toMsgid takes a msgid as msgpack decoded it: the smallest int type.
func toMsgid(v interface{}) uint32 {
	switch n := v.(type) {
	case int8:
		return uint32(n)
	case int16:
		return uint32(n)
	case int32:
		return uint32(n)
	case int64:
		return uint32(n)
	case uint8:
		return uint32(n)
	case uint16:
		return uint32(n)
	case uint32:
		return n
	case uint64:
		return uint32(n)
	}
	return 0
}

// pack encodes values of the kinds msgpack encodes without fail.
func pack(v ...interface{}) []byte {
	var b bytes.Buffer
	enc := msgpack.NewEncoder(&b)
	for _, x := range v {
		if err := enc.Encode(x); err != nil {
			panic(err)
		}
	}
	return b.Bytes()
}

var okDecision = map[string]interface{}{"allowed": true, "remaining": 7, "limit": 9, "mode": "local"}

func TestNotificationsAndAnswersToNoCallAreSkipped(t *testing.T) {
	f := startFake(t, func(conn net.Conn, id uint32, method string) {
		_, _ = conn.Write(pack(
			[]interface{}{2, "event", []interface{}{}},
			[]interface{}{1, id + 1000, nil, okDecision},
			[]interface{}{1, id, nil, okDecision}))
	})
	c := New(f.socket, nil)
	defer c.Close()
	for i := 0; i < 3; i++ {
		d, err := c.Acquire(within(t, callTimeout), "r", "k", 1)
		if err != nil || d.Remaining != 7 || d.Limit != 9 || d.Mode != ModeLocal {
			t.Fatalf("acquire %d: %+v, %v", i, d, err)
		}
	}
}

func TestAResultOfTheWrongShapeFailsOnlyItsCall(t *testing.T) {
	f := startFake(t, func(conn net.Conn, id uint32, method string) {
		switch method {
		case "peek": // a decision map whose remaining is a string
			_, _ = conn.Write(pack([]interface{}{1, id, nil,
				map[string]interface{}{"allowed": true, "remaining": "many"}}))
		case "health": // not a map
			_, _ = conn.Write(pack([]interface{}{1, id, nil, []interface{}{1, 2}}))
		case "release": // anything but a decision means released
			_, _ = conn.Write(pack([]interface{}{1, id, nil, true}))
		case "reset": // an error as a bare string
			_, _ = conn.Write(pack([]interface{}{1, id, "boom", nil}))
		default:
			_, _ = conn.Write(pack([]interface{}{1, id, nil, okDecision}))
		}
	})
	c := New(f.socket, nil)
	defer c.Close()
	if _, err := c.Peek(within(t, callTimeout), "r", "k"); !errors.Is(err, ErrProto) {
		t.Fatalf("peek with a string remaining: %v, want ErrProto", err)
	}
	if _, err := c.Health(within(t, callTimeout)); !errors.Is(err, ErrProto) {
		t.Fatalf("health answered with an array: %v, want ErrProto", err)
	}
	if d, err := c.Release(within(t, callTimeout), "r", "k", 1); err != nil || !d.Allowed {
		t.Fatalf("release answered true: %+v, %v, want allowed", d, err)
	}
	var e *Error
	if _, err := c.Reset(within(t, callTimeout), "r", "k"); !errors.As(err, &e) ||
		e.Code != CodeServer || e.Message != "boom" {
		t.Fatalf("reset answered with a string error: %v, want ErrServer \"boom\"", err)
	}
	if d, err := c.Acquire(within(t, callTimeout), "r", "k", 1); err != nil || d.Remaining != 7 {
		t.Fatalf("acquire after the odd answers: %+v, %v", d, err)
	}
	if n := len(f.connections); n != 1 {
		t.Fatalf("%d connections, want the first kept through the odd answers", n)
	}
}

func TestAFrameOverMaxResponseBytesFailsWithErrTooLargeAndCloses(t *testing.T) {
	f := startFake(t, func(conn net.Conn, id uint32, method string) {
		if method == "health" {
			_, _ = conn.Write(pack([]interface{}{1, id, nil,
				map[string]interface{}{"status": "ok", "redis": "none"}}))
			return
		}
		// [1, id, nil, <a str of 5 MiB>], sent in full.
		head := pack(1, id, nil)
		frame := append([]byte{0x94}, head...)
		frame = append(frame, 0xdb, 0x00, 0x50, 0x00, 0x00)
		frame = append(frame, bytes.Repeat([]byte{'x'}, 5<<20)...)
		_, _ = conn.Write(frame)
	})
	c := New(f.socket, nil)
	defer c.Close()
	if _, err := c.Acquire(within(t, callTimeout), "r", "k", 1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a 5 MiB answer: %v, want ErrTooLarge", err)
	}
	if h, err := c.Health(within(t, callTimeout)); err != nil || h.Status != "ok" {
		t.Fatalf("health after: %+v, %v", h, err)
	}
	if n := len(f.connections); n != 2 {
		t.Fatalf("%d connections, want a new one after the frame too large", n)
	}
}
