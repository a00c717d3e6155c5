package sluice

import (
	"strconv"
	"strings"
)

// Headers are the HTTP header values for a decision, byte for byte what
// libsluice's sluice_format_headers writes: the structured-field form of
// draft-ietf-httpapi-ratelimit-headers-10 and RFC 9110's Retry-After.
type Headers struct {
	RateLimit       string // "api";r=20;t=30  (r remaining, t seconds to reset)
	RateLimitPolicy string // "api";q=100;w=60 (q limit, w window in seconds)
	RetryAfter      string // "3" when denied, "" when allowed
}

// maxPolicyNameBytes is the longest policy name accepted, before escaping.
const maxPolicyNameBytes = 64

// sfIntegerMax is the largest RFC 8941 sf-integer (15 digits).
const sfIntegerMax = 999999999999999

func sfClamp(v int64) int64 {
	if v < 0 {
		return 0
	}
	if v > sfIntegerMax {
		return sfIntegerMax
	}
	return v
}

// ceilSeconds rounds up, so that a client told to wait never comes back early.
func ceilSeconds(ms int64) int64 {
	if ms <= 0 {
		return 0
	}
	s := ms / 1000
	if ms%1000 != 0 {
		s++
	}
	return s
}

// FormatHeaders formats the headers of decision d under policy (usually the
// rule's name: printable ASCII, 1 to 64 bytes; '"' and '\' are escaped).
// windowS is the policy's window in seconds, left out when 0 or less. Times
// round up to whole seconds; a denial says to retry after at least 1 s.
// Another policy name fails with ErrInvalid.
func FormatHeaders(d Decision, policy string, windowS int64) (Headers, error) {
	if len(policy) == 0 || len(policy) > maxPolicyNameBytes {
		return Headers{}, &Error{Code: CodeInvalid, Message: "a policy name of 1 to 64 bytes"}
	}
	var b strings.Builder
	b.Grow(len(policy) + 48)
	b.WriteByte('"')
	for i := 0; i < len(policy); i++ {
		ch := policy[i]
		if ch < 0x20 || ch > 0x7e {
			return Headers{}, &Error{Code: CodeInvalid, Message: "a policy name of printable ASCII"}
		}
		if ch == '"' || ch == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(ch)
	}
	b.WriteByte('"')
	quoted := b.String()

	h := Headers{
		RateLimit: quoted + ";r=" + strconv.FormatInt(sfClamp(d.Remaining), 10) +
			";t=" + strconv.FormatInt(sfClamp(ceilSeconds(d.ResetAfterMs)), 10),
		RateLimitPolicy: quoted + ";q=" + strconv.FormatInt(sfClamp(d.Limit), 10),
	}
	if windowS > 0 {
		h.RateLimitPolicy += ";w=" + strconv.FormatInt(sfClamp(windowS), 10)
	}
	if !d.Allowed {
		s := ceilSeconds(d.RetryAfterMs)
		if s < 1 {
			s = 1 // "0" would invite a hot loop
		}
		h.RetryAfter = strconv.FormatInt(sfClamp(s), 10)
	}
	return h, nil
}
