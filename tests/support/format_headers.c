/* format_headers: libsluice's sluice_format_headers as a filter, so that the
 * client libraries of other languages can check their header helpers against
 * it byte for byte.
 *
 * Input, one case per line, fields separated by one tab:
 *   allowed remaining limit reset_after_ms retry_after_ms window_s policy
 * Output, one line per case, fields separated by one tab:
 *   RateLimit RateLimit-Policy Retry-After
 * or "error <code>" when sluice_format_headers refuses the case (e.g. a
 * policy name with control characters). Exits 2 on a line it cannot read. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sluice.h"

int main(void) {
  char line[1024];
  while (fgets(line, sizeof line, stdin)) {
    size_t len = strlen(line);
    if (len > 0 && line[len - 1] == '\n') line[--len] = '\0';
    if (len == 0) continue;
    int allowed = 0;
    int64_t remaining = 0, limit = 0, reset_after_ms = 0, retry_after_ms = 0, window_s = 0;
    int policy_at = 0;
    if (sscanf(line, "%d\t%" SCNd64 "\t%" SCNd64 "\t%" SCNd64 "\t%" SCNd64 "\t%" SCNd64 "\t%n",
               &allowed, &remaining, &limit, &reset_after_ms, &retry_after_ms, &window_s,
               &policy_at) != 6 ||
        policy_at == 0) {
      fprintf(stderr, "format_headers: cannot read line: %s\n", line);
      return 2;
    }
    sluice_decision decision = {allowed, SLUICE_MODE_NORMAL, remaining, limit, reset_after_ms,
                                retry_after_ms};
    sluice_headers headers;
    int rc = sluice_format_headers(&decision, line + policy_at, window_s, &headers);
    if (rc != 0)
      printf("error %d\n", rc);
    else
      printf("%s\t%s\t%s\n", headers.ratelimit, headers.ratelimit_policy, headers.retry_after);
  }
  return 0;
}
