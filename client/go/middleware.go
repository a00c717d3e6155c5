package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"
)

// Limit is a net/http middleware: every request spends Cost units of Rule
// under the key KeyFunc gives it. An allowed request goes on to the wrapped
// handler with the RateLimit and RateLimit-Policy headers set; a denied one
// is answered 429 with those headers, Retry-After and a small JSON body.
// When the daemon cannot be asked, the Client's Policy decides (see
// Client.Allow) and no RateLimit headers are sent.
type Limit struct {
	Client *Client
	Rule   string
	// KeyFunc gives a request's key: KeyByRemoteIP (when nil),
	// KeyByHeader("X-Api-Key"), a user id from the request's context, ...
	KeyFunc func(*http.Request) string
	// Cost is the units one request spends; 0 is 1.
	Cost uint32
	// Policy names the policy in the headers; "" is Rule.
	Policy string
	// WindowS is the rule's period in seconds for RateLimit-Policy's w;
	// 0 leaves w out.
	WindowS int64
	// Timeout bounds the call to the daemon beyond the request's own
	// context; 0 is 100 ms. Past it the Policy decides.
	Timeout time.Duration
	// OnError answers a request whose decision failed with an error the
	// Policy does not cover (an unknown rule, a bad key); nil answers 500
	// with a JSON body naming the error.
	OnError func(w http.ResponseWriter, r *http.Request, err error)
}

const defaultMiddlewareTimeout = 100 * time.Millisecond

// Middleware is Limit{Client: c, Rule: rule, KeyFunc: key}.Wrap, for
// routers that take a func(http.Handler) http.Handler.
func Middleware(c *Client, rule string, key func(*http.Request) string) func(http.Handler) http.Handler {
	l := Limit{Client: c, Rule: rule, KeyFunc: key}
	return l.Wrap
}

// KeyByRemoteIP keys a request by the IP address of its peer (without the
// port). Behind a proxy, key by the header the proxy sets instead.
func KeyByRemoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// KeyByHeader keys a request by the value of one of its headers (an API key).
func KeyByHeader(name string) func(*http.Request) string {
	return func(r *http.Request) string { return r.Header.Get(name) }
}

type deniedBody struct {
	Error        string `json:"error"`
	Rule         string `json:"rule"`
	RetryAfterMs int64  `json:"retry_after_ms"`
}

type errorBody struct {
	Error string `json:"error"`
	Code  string `json:"code,omitempty"`
}

// Wrap returns next behind the limit.
func (l Limit) Wrap(next http.Handler) http.Handler {
	cost := l.Cost
	if cost == 0 {
		cost = 1
	}
	policy := l.Policy
	if policy == "" {
		policy = l.Rule
	}
	timeout := l.Timeout
	if timeout <= 0 {
		timeout = defaultMiddlewareTimeout
	}
	keyOf := l.KeyFunc
	if keyOf == nil {
		keyOf = KeyByRemoteIP
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		d, err := l.Client.Allow(ctx, l.Rule, keyOf(r), cost)
		cancel()
		if err != nil {
			l.fail(w, r, err)
			return
		}
		var h Headers
		if d.Mode != ModeUnreachable {
			if h, err = FormatHeaders(d, policy, l.WindowS); err != nil {
				l.fail(w, r, err)
				return
			}
			w.Header().Set("RateLimit", h.RateLimit)
			w.Header().Set("RateLimit-Policy", h.RateLimitPolicy)
		}
		if d.Allowed {
			next.ServeHTTP(w, r)
			return
		}
		retryAfter := h.RetryAfter
		if retryAfter == "" { // the Policy's denial: the daemon gave no time
			retryAfter = "1"
			d.RetryAfterMs = 1000
		}
		w.Header().Set("Retry-After", retryAfter)
		writeJSON(w, http.StatusTooManyRequests,
			deniedBody{Error: "rate limited", Rule: l.Rule, RetryAfterMs: d.RetryAfterMs})
	})
}

func (l Limit) fail(w http.ResponseWriter, r *http.Request, err error) {
	if l.OnError != nil {
		l.OnError(w, r, err)
		return
	}
	body := errorBody{Error: err.Error()}
	var e *Error
	if errors.As(err, &e) {
		body.Code = e.ServerCode
	}
	writeJSON(w, http.StatusInternalServerError, body)
}

func writeJSON(w http.ResponseWriter, status int, v interface{}) {
	body, _ := json.Marshal(v) // plain structs of strings and ints always marshal
	body = append(body, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
