/* headers.c: HTTP header values for a decision: Retry-After and the
 * structured-field RateLimit / RateLimit-Policy of
 * draft-ietf-httpapi-ratelimit-headers-10 (see sluice.h). */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "sluice.h"

/* The longest policy name accepted, before escaping. */
#define SLUICE_POLICY_NAME_MAX_BYTES 64
/* RFC 8941 sf-integers have at most 15 digits. */
#define SF_INTEGER_MAX INT64_C(999999999999999)

static int64_t sf_clamp(int64_t value) {
  if (value < 0) {
    return 0;
  }
  return value > SF_INTEGER_MAX ? SF_INTEGER_MAX : value;
}

/* Whole seconds, rounded up, so a client told to wait never comes back early. */
static int64_t ceil_seconds(int64_t ms) {
  if (ms <= 0) {
    return 0;
  }
  return ms / 1000 + (ms % 1000 != 0);
}

int sluice_format_headers(const sluice_decision* d, const char* policy, int64_t window_s,
                          sluice_headers* out) {
  if (d == NULL || policy == NULL || out == NULL) {
    return SLUICE_EINVAL;
  }
  size_t len = strlen(policy);
  if (len == 0 || len > SLUICE_POLICY_NAME_MAX_BYTES) {
    return SLUICE_EINVAL;
  }
  /* An sf-string holds printable ASCII only, with '"' and '\' escaped. */
  char quoted[2 * SLUICE_POLICY_NAME_MAX_BYTES + 3];
  size_t q = 0;
  quoted[q++] = '"';
  for (size_t i = 0; i < len; i++) {
    char ch = policy[i];
    if (ch < 0x20 || ch > 0x7e) {
      return SLUICE_EINVAL;
    }
    if (ch == '"' || ch == '\\') {
      quoted[q++] = '\\';
    }
    quoted[q++] = ch;
  }
  quoted[q++] = '"';
  quoted[q] = '\0';

  snprintf(out->ratelimit, sizeof out->ratelimit, "%s;r=%" PRId64 ";t=%" PRId64, quoted,
           sf_clamp(d->remaining), sf_clamp(ceil_seconds(d->reset_after_ms)));
  if (window_s > 0) {
    snprintf(out->ratelimit_policy, sizeof out->ratelimit_policy, "%s;q=%" PRId64 ";w=%" PRId64,
             quoted, sf_clamp(d->limit), sf_clamp(window_s));
  } else {
    snprintf(out->ratelimit_policy, sizeof out->ratelimit_policy, "%s;q=%" PRId64, quoted,
             sf_clamp(d->limit));
  }
  if (d->allowed) {
    out->retry_after[0] = '\0';
  } else {
    /* A denial always says to wait at least a second: "0" invites a hot loop. */
    int64_t seconds = ceil_seconds(d->retry_after_ms);
    snprintf(out->retry_after, sizeof out->retry_after, "%" PRId64,
             sf_clamp(seconds < 1 ? 1 : seconds));
  }
  return 0;
}
