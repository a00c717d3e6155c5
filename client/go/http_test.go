package sluice

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// headerCase is one line of FORMAT_HEADERS's input: the decision, the
// window and the policy name.
type headerCase struct {
	allowed                                int
	remaining, limit, resetMs, retryMs, ws int64
	policy                                 string
}

var headerCases = []headerCase{
	{1, 20, 100, 30000, 0, 60, "api"},
	{0, 0, 100, 30000, 2500, 60, "api"},
	{0, 0, 100, 30000, 0, 60, "api"}, // a denial without a retry time says 1 s
	{0, 0, 10, 1, 1, 0, "login"},     // 1 ms rounds up to a second; no window
	{1, 5, 10, 999, 0, -5, "x"},      // a negative window is left out
	{1, 5, 10, 1000, 0, 1, "x"},      // exactly a second
	{0, 5, 10, 1001, 1001, 1, "x"},   // just over a second
	{1, 0, 0, 0, 0, 0, "zero"},
	{1, -3, -7, -1000, -1000, 0, "negative"}, // clamped to 0
	{0, 1e16, 1e16, 1e18, 1e18, 1e16, "huge"},
	{1, 999999999999999, 999999999999999, 999999999999999000, 0, 999999999999999, "max"},
	{1, 1, 2, 3, 4, 5, `quote"and\backslash`},
	{1, 1, 2, 3, 4, 5, "spaces and ~!@#$%^&*()"},
	{1, 1, 2, 3, 4, 5, strings.Repeat("p", 64)},
	{1, 1, 2, 3, 4, 5, strings.Repeat("p", 65)}, // too long
	{1, 1, 2, 3, 4, 5, ""},                      // empty
	{1, 1, 2, 3, 4, 5, "ctl\x01"},               // a control character
	{1, 1, 2, 3, 4, 5, "del\x7f"},
	{1, 1, 2, 3, 4, 5, "caf\xc3\xa9"}, // not ASCII
}

func TestHeadersMatchLibsluiceByteForByte(t *testing.T) {
	filter := os.Getenv("FORMAT_HEADERS")
	if filter == "" {
		t.Fatal("FORMAT_HEADERS (libsluice's header formatter as a filter) is not set")
	}
	var input bytes.Buffer
	for _, c := range headerCases {
		fmt.Fprintf(&input, "%d\t%d\t%d\t%d\t%d\t%d\t%s\n",
			c.allowed, c.remaining, c.limit, c.resetMs, c.retryMs, c.ws, c.policy)
	}
	cmd := exec.Command(filter)
	cmd.Stdin = &input
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", filter, err)
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != len(headerCases) {
		t.Fatalf("%d lines from %s for %d cases", len(lines), filter, len(headerCases))
	}
	for i, c := range headerCases {
		d := Decision{Allowed: c.allowed != 0, Remaining: c.remaining, Limit: c.limit,
			ResetAfterMs: c.resetMs, RetryAfterMs: c.retryMs}
		var got string
		h, err := FormatHeaders(d, c.policy, c.ws)
		var e *Error
		switch {
		case err == nil:
			got = h.RateLimit + "\t" + h.RateLimitPolicy + "\t" + h.RetryAfter
		case errors.As(err, &e):
			got = fmt.Sprintf("error %d", e.Code)
		default:
			t.Fatalf("case %d: %v", i, err)
		}
		if got != lines[i] {
			t.Errorf("case %d %+v:\n got %q\nwant %q (libsluice)", i, c, got, lines[i])
		}
	}
}

// get requests path from the server with the API key header.
func get(t *testing.T, url, apiKey string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Api-Key", apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// served counts the requests that reached the wrapped handler.
type served struct{ n int }

func (s *served) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.n++
	_, _ = io.WriteString(w, "hello\n")
}

func TestMiddlewareAnswers200UntilTheLimitThen429WithHeaders(t *testing.T) {
	c := startDaemon(t, testRules).client(nil)
	handler := &served{}
	server := httptest.NewServer(Limit{Client: c, Rule: "api", KeyFunc: KeyByHeader("X-Api-Key"),
		WindowS: 3600}.Wrap(handler))
	defer server.Close()

	// "api" is 3 an hour: one token back every 20 minutes.
	for want := 2; want >= 0; want-- {
		resp, body := get(t, server.URL, "alice")
		if resp.StatusCode != 200 || string(body) != "hello\n" {
			t.Fatalf("request %d: %d %q, want 200 from the handler", 3-want, resp.StatusCode, body)
		}
		pattern := fmt.Sprintf(`^"api";r=%d;t=(\d+)$`, want)
		if !regexp.MustCompile(pattern).MatchString(resp.Header.Get("RateLimit")) {
			t.Fatalf("RateLimit %q, want %s", resp.Header.Get("RateLimit"), pattern)
		}
		if got := resp.Header.Get("RateLimit-Policy"); got != `"api";q=3;w=3600` {
			t.Fatalf("RateLimit-Policy %q", got)
		}
		if resp.Header.Get("Retry-After") != "" {
			t.Fatalf("Retry-After on an allowed request: %q", resp.Header.Get("Retry-After"))
		}
	}

	resp, body := get(t, server.URL, "alice")
	if resp.StatusCode != http.StatusTooManyRequests || handler.n != 3 {
		t.Fatalf("fourth request: %d (handler ran %d times), want 429 without the handler",
			resp.StatusCode, handler.n)
	}
	if resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("429 Content-Type %q", resp.Header.Get("Content-Type"))
	}
	var denied struct {
		Error        string `json:"error"`
		Rule         string `json:"rule"`
		RetryAfterMs int64  `json:"retry_after_ms"`
	}
	if err := json.Unmarshal(body, &denied); err != nil {
		t.Fatalf("429 body %q: %v", body, err)
	}
	if denied.Error != "rate limited" || denied.Rule != "api" || denied.RetryAfterMs <= 0 ||
		denied.RetryAfterMs > 1200000 {
		t.Fatalf("429 body %+v", denied)
	}
	want, err := FormatHeaders(Decision{Remaining: 0, RetryAfterMs: denied.RetryAfterMs}, "api", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Header.Get("Retry-After"); got != want.RetryAfter {
		t.Fatalf("Retry-After %q, want %q (the body's retry_after_ms in seconds)", got, want.RetryAfter)
	}
	if !regexp.MustCompile(`^"api";r=0;t=\d+$`).MatchString(resp.Header.Get("RateLimit")) ||
		resp.Header.Get("RateLimit-Policy") != `"api";q=3;w=3600` {
		t.Fatalf("429 headers %v", resp.Header)
	}

	// Another key has its own limit.
	if resp, _ := get(t, server.URL, "bob"); resp.StatusCode != 200 {
		t.Fatalf("another key: %d, want 200", resp.StatusCode)
	}
}

func TestMiddlewareFollowsThePolicyWhenTheDaemonIsUnreachable(t *testing.T) {
	nowhere := filepath.Join(t.TempDir(), "no.sock")
	for _, policy := range []Policy{FailOpen, FailClosed} {
		c := New(nowhere, &Options{OnUnreachable: policy})
		defer c.Close()
		server := httptest.NewServer(Middleware(c, "api", KeyByRemoteIP)(&served{}))
		defer server.Close()
		resp, _ := get(t, server.URL, "")
		want := map[Policy]int{FailOpen: 200, FailClosed: 429}[policy]
		if resp.StatusCode != want || resp.Header.Get("RateLimit") != "" {
			t.Fatalf("%v: %d with RateLimit %q, want %d without", policy, resp.StatusCode,
				resp.Header.Get("RateLimit"), want)
		}
		if policy == FailClosed && resp.Header.Get("Retry-After") != "1" {
			t.Fatalf("fail_closed Retry-After %q, want 1", resp.Header.Get("Retry-After"))
		}
		if s := c.Stats(); s.UnreachableAllowed+s.UnreachableDenied != 1 {
			t.Fatalf("%v: stats %+v, want the request counted", policy, s)
		}
	}
}

func TestMiddlewareAnswers500ForAnErrorThePolicyDoesNotCover(t *testing.T) {
	c := startDaemon(t, testRules).client(nil)
	server := httptest.NewServer(Middleware(c, "no-such-rule", KeyByRemoteIP)(&served{}))
	defer server.Close()
	resp, body := get(t, server.URL, "")
	if resp.StatusCode != 500 || !strings.Contains(string(body), `"code":"UNKNOWN_RULE"`) {
		t.Fatalf("an unknown rule: %d %s, want 500 naming UNKNOWN_RULE", resp.StatusCode, body)
	}
}
