// Package sluice is the Go client of sluiced, the rate-limiting daemon: it
// speaks the daemon's MessagePack-RPC protocol over its Unix socket with the
// contract of libsluice (client/include/sluice.h), and adds the RateLimit
// header helper and a net/http middleware.
//
// One Client holds one connection, shared by every goroutine that calls it:
// calls are pipelined (many in flight, answers matched by msgid, msgids
// wrapping within 32 bits), so concurrent callers cost no extra connections.
// Every call takes a context whose deadline is the call's timeout.
//
// Reconnection follows libsluice: when the connection has died (the daemon
// restarted, or a read or write failed), the next call opens a new one before
// anything is written. A request is sent again on a new connection only when
// not one byte of it was written; calls of which any byte was written fail
// with ErrClosed (or the error that killed the connection), because the
// daemon may have acted on them. A call that times out leaves the connection
// open: its late answer is recognised by its msgid and dropped.
package sluice

import (
	"errors"
	"fmt"
	"time"
)

// Version is the version of this library, the same as libsluice's.
const Version = "0.1.0"

// MaxResponseBytes is the largest response frame the client accepts; a larger
// one fails with ErrTooLarge and closes the connection.
const MaxResponseBytes = 4 << 20

// Code says what kind of failure an Error is. The values are libsluice's
// SLUICE_E* codes, so logs read the same in every language.
type Code int

// The failures a call can return; see Error.
const (
	CodeInvalid  Code = -1  // invalid argument
	CodeConnect  Code = -3  // cannot connect to the daemon socket
	CodeTimedOut Code = -4  // the context's deadline passed (or it was cancelled)
	CodeClosed   Code = -5  // connection closed by the daemon, or the Client closed
	CodeIO       Code = -6  // socket I/O error
	CodeProto    Code = -7  // malformed response from the daemon
	CodeTooLarge Code = -8  // response larger than MaxResponseBytes
	CodeServer   Code = -9  // the daemon answered with an error; see Error.ServerCode
	CodeBusy     Code = -10 // too many requests queued that the daemon has not taken
)

var codeText = map[Code]string{
	CodeInvalid:  "invalid argument",
	CodeConnect:  "cannot connect to the daemon socket",
	CodeTimedOut: "timed out",
	CodeClosed:   "connection closed by the daemon",
	CodeIO:       "socket I/O error",
	CodeProto:    "malformed response from the daemon",
	CodeTooLarge: "response larger than MaxResponseBytes",
	CodeServer:   "the daemon answered with an error",
	CodeBusy:     "too many requests queued that the daemon has not taken",
}

// String is the code's text, as sluice_strerror gives it.
func (c Code) String() string {
	if text, ok := codeText[c]; ok {
		return text
	}
	return "unknown error"
}

// Error is every error a Client returns. errors.Is matches it against the
// Err* values by Code (and by ServerCode when the target has one), and
// Unwrap gives the cause (a context error, a socket error) when there is one.
type Error struct {
	Code Code
	// ServerCode and Message are the daemon's error map when Code is
	// CodeServer ("UNKNOWN_RULE", "BAD_REQUEST", "FORBIDDEN", ...).
	ServerCode string
	Message    string
	Err        error
}

func (e *Error) Error() string {
	switch {
	case e.Code == CodeServer:
		return fmt.Sprintf("sluice: %s: %s", e.ServerCode, e.Message)
	case e.Message != "":
		return "sluice: " + e.Code.String() + ": " + e.Message
	case e.Err != nil:
		return "sluice: " + e.Code.String() + ": " + e.Err.Error()
	}
	return "sluice: " + e.Code.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is an *Error of the same Code and, when target
// names a ServerCode, the same ServerCode.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && (t.ServerCode == "" || t.ServerCode == e.ServerCode)
}

// Values to compare errors with: errors.Is(err, sluice.ErrTimedOut).
var (
	ErrInvalid  = &Error{Code: CodeInvalid}
	ErrConnect  = &Error{Code: CodeConnect}
	ErrTimedOut = &Error{Code: CodeTimedOut}
	ErrClosed   = &Error{Code: CodeClosed}
	ErrIO       = &Error{Code: CodeIO}
	ErrProto    = &Error{Code: CodeProto}
	ErrTooLarge = &Error{Code: CodeTooLarge}
	ErrServer   = &Error{Code: CodeServer}
	ErrBusy     = &Error{Code: CodeBusy}
	// The daemon's codes most callers test for.
	ErrUnknownRule = &Error{Code: CodeServer, ServerCode: "UNKNOWN_RULE"}
	ErrBadRequest  = &Error{Code: CodeServer, ServerCode: "BAD_REQUEST"}
	ErrForbidden   = &Error{Code: CodeServer, ServerCode: "FORBIDDEN"}
	ErrOverloaded  = &Error{Code: CodeServer, ServerCode: "OVERLOADED"}
	// ErrUnknownReservation: Settle or Cancel of an id that is not open
	// (settled, cancelled, expired, never opened, or another daemon's).
	ErrUnknownReservation = &Error{Code: CodeServer, ServerCode: "UNKNOWN_RESERVATION"}
)

// unreachable tells the failures that mean the daemon could not be asked
// (the Policy applies) from those where it answered or the call was wrong.
func unreachable(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code {
	case CodeConnect, CodeTimedOut, CodeClosed, CodeIO, CodeProto, CodeTooLarge, CodeBusy:
		return true
	}
	return false
}

// Mode is how the daemon reached a decision, as the wire names it. Modes
// newer than this library come through as the daemon wrote them.
type Mode string

// The daemon's modes, and ModeUnreachable for a decision the Client's Policy
// made because the daemon could not be asked.
const (
	ModeNormal      Mode = "normal"   // global rule, Redis healthy
	ModeFallback    Mode = "fallback" // global rule on its local share, Redis down
	ModeOpen        Mode = "open"     // Redis down, rule fails open
	ModeClosed      Mode = "closed"   // Redis down, rule fails closed
	ModeShadow      Mode = "shadow"   // shadow rule: decided and counted, always allowed
	ModeLocal       Mode = "local"    // local-only rule
	ModeBlocked     Mode = "blocked"  // key blocked by its rule's penalty
	ModeUnreachable Mode = "unreachable"
)

// Decision is the daemon's answer for one (rule, key). Fields the daemon did
// not send are zero.
type Decision struct {
	Allowed      bool
	Mode         Mode
	Remaining    int64 // units left now
	Limit        int64 // the rule's limit
	ResetAfterMs int64 // until the key is back at its full limit
	RetryAfterMs int64 // until a retry may pass; 0 when allowed
	// WaitedMs is how long the daemon held an answer of AcquireWait.
	WaitedMs int64
	// Reason is the daemon's explanation when it gives one
	// ("cost exceeds limit").
	Reason string
}

// Reservation is the answer of Reserve: the decision of the estimate and ID,
// the reservation to Settle or Cancel; ID is 0 when none was opened (denied,
// or decided by the Policy with Mode ModeUnreachable).
type Reservation struct {
	Decision
	ID uint64
}

// Settlement is the answer of Settle and Cancel: the key's state afterwards
// (Remaining below 0 while it is in debt; Allowed whether it could spend
// now), ID the reservation settled, Refunded the units given back (estimate -
// actual), Debt those charged past the estimate and Unpaid those of the
// excess past the rule's max_debt that nobody was charged. Settling ID 0
// asks the daemon nothing: Allowed, ID 0, nothing refunded.
type Settlement struct {
	Decision
	ID       uint64
	Refunded int64
	Debt     int64
	Unpaid   int64
}

// DefaultTTL is the TTL Reserve sends for a ttl of 0 (libsluice's
// SLUICE_DEFAULT_TTL_MS).
const DefaultTTL = 60 * time.Second

// Item is one (rule, key, cost) of AcquireAll. A key is any bytes.
type Item struct {
	Rule string
	Key  string
	Cost uint32
}

// AllDecision is the answer of AcquireAll: Allowed only when every item
// passed (and then each was spent); Results[i] is the decision for items[i].
type AllDecision struct {
	Allowed bool
	Results []Decision
}

// Health is the daemon's `health` result: Status "ok" or "degraded", Redis
// "up", "down" or "none"; Fields holds the whole result map.
type Health struct {
	Status string
	Redis  string
	Fields map[string]interface{}
}

// Policy is what Allow decides when the daemon cannot be asked.
type Policy int

const (
	// FailOpen allows the request (the default: a dead limiter must not take
	// the service down with it).
	FailOpen Policy = iota
	// FailClosed denies it.
	FailClosed
)

// String is the policy's name: "fail_open" or "fail_closed".
func (p Policy) String() string {
	if p == FailClosed {
		return "fail_closed"
	}
	return "fail_open"
}

// Stats counts what a Client's Policy decided.
type Stats struct {
	// UnreachableAllowed and UnreachableDenied count the Allow and Reserve
	// calls that the Policy answered because the daemon could not be asked.
	UnreachableAllowed uint64
	UnreachableDenied  uint64
}
