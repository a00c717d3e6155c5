package sluice

// The sluiced the tests talk to: a real daemon (SLUICED names the binary) in
// a temp dir of its own under /tmp, with its config, socket and log there.

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// daemonStartTimeout bounds how long a daemon may take to accept.
const daemonStartTimeout = 10 * time.Second

type daemon struct {
	t      *testing.T
	dir    string
	socket string
	config string
	log    string
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd is reaped
}

// startDaemon writes config (with {socket} replaced by the socket's path)
// and starts sluiced on it; the test's cleanup kills it and removes the dir.
func startDaemon(t *testing.T, config string) *daemon {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "sgo.")
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, dir: dir, socket: filepath.Join(dir, "s.sock"),
		config: filepath.Join(dir, "sluice.toml"), log: filepath.Join(dir, "log")}
	t.Cleanup(func() {
		d.kill()
		if t.Failed() {
			t.Logf("sluiced log:\n%s", d.logs())
		}
		os.RemoveAll(dir)
	})
	text := strings.ReplaceAll(config, "{socket}", d.socket)
	if err := os.WriteFile(d.config, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	d.start()
	return d
}

// start runs sluiced and returns once its socket accepts connections.
func (d *daemon) start() {
	d.t.Helper()
	binary := os.Getenv("SLUICED")
	if binary == "" {
		d.t.Fatal("SLUICED (the sluiced binary to test against) is not set")
	}
	log, err := os.OpenFile(d.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		d.t.Fatal(err)
	}
	defer log.Close()
	d.cmd = exec.Command(binary, "--config", d.config)
	d.cmd.Stdout = log
	d.cmd.Stderr = log
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	exited := make(chan struct{})
	d.exited = exited
	go func(cmd *exec.Cmd) { _ = cmd.Wait(); close(exited) }(d.cmd)
	deadline := time.Now().Add(daemonStartTimeout)
	for {
		// The socket file appears at bind(), a moment before listen().
		conn, err := net.Dial("unix", d.socket)
		if err == nil {
			conn.Close()
			return
		}
		select {
		case <-exited:
			d.t.Fatalf("sluiced exited at start:\n%s", d.logs())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("sluiced did not accept within %v:\n%s", daemonStartTimeout, d.logs())
		}
	}
}

// kill ends the daemon with SIGKILL (which ends a stopped one too) and
// waits until it is reaped.
func (d *daemon) kill() {
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Kill()
	<-d.exited
	d.cmd = nil
}

func (d *daemon) signal(sig syscall.Signal) {
	d.t.Helper()
	if err := d.cmd.Process.Signal(sig); err != nil {
		d.t.Fatal(err)
	}
}

func (d *daemon) logs() string {
	b, _ := os.ReadFile(d.log)
	return string(b)
}

// client connects a Client to the daemon; the test's cleanup closes it.
func (d *daemon) client(opts *Options) *Client {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Connect(ctx, d.socket, opts)
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { c.Close() })
	return c
}

// within is a context for one call that should answer promptly.
func within(t *testing.T, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}
