/* acquire.c: one acquire against sluiced through libsluice, answered the way
 * an HTTP server would answer the request it guards: 200 with the rate-limit
 * headers when allowed, 429 with Retry-After when denied. The header values
 * come from sluice_format_headers; the Python and Node examples mirror it.
 *
 *   usage: acquire [SOCKET [RULE [KEY]]]
 *
 * SOCKET defaults to $SLUICE_SOCKET, else /run/sluice/sluice.sock; RULE to
 * "api"; KEY to "user:42". Exit status as sluicectl's: 0 allowed, 1 denied,
 * 2 usage error, 3 connection or server error.
 *
 * Outside this tree: cc acquire.c $(pkg-config --cflags --libs sluice) -o acquire
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sluice.h>

enum { EXIT_ALLOWED = 0, EXIT_DENIED = 1, EXIT_USAGE = 2, EXIT_FAILED = 3 };

/* Bounds connecting, and then the whole acquire call. */
#define CALL_TIMEOUT_MS 1000

int main(int argc, char** argv) {
  if (argc > 4 || (argc > 1 && argv[1][0] == '-')) {
    fprintf(stderr, "usage: acquire [SOCKET [RULE [KEY]]]\n");
    return EXIT_USAGE;
  }
  const char* socket_path = getenv("SLUICE_SOCKET");
  if (argc > 1) {
    socket_path = argv[1];
  } else if (socket_path == NULL || socket_path[0] == '\0') {
    socket_path = SLUICE_DEFAULT_SOCKET;
  }
  const char* rule = argc > 2 ? argv[2] : "api";
  const char* key = argc > 3 ? argv[3] : "user:42";

  sluice_client* client;
  int rc = sluice_connect(socket_path, CALL_TIMEOUT_MS, &client);
  if (rc != 0) {
    fprintf(stderr, "acquire: cannot reach sluiced at %s: %s\n", socket_path,
            sluice_strerror(rc));
    return EXIT_FAILED;
  }
  sluice_decision d;
  rc = sluice_acquire(client, rule, key, strlen(key), 1, CALL_TIMEOUT_MS, &d);
  if (rc == SLUICE_ESERVER) {
    fprintf(stderr, "acquire: sluiced answered %s: %s\n", sluice_server_error_code(client),
            sluice_server_error_message(client));
  } else if (rc != 0) {
    fprintf(stderr, "acquire: cannot reach sluiced at %s: %s\n", socket_path, sluice_strerror(rc));
  }
  sluice_destroy(client);
  if (rc != 0) {
    return EXIT_FAILED;
  }

  printf("decision: allowed=%s remaining=%" PRId64 " limit=%" PRId64 " reset_after_ms=%" PRId64
         " retry_after_ms=%" PRId64 " mode=%s\n",
         d.allowed ? "true" : "false", d.remaining, d.limit, d.reset_after_ms, d.retry_after_ms,
         sluice_mode_name(d.mode));

  /* The rule's name is the policy's name. The decision does not carry the
   * rule's period, so RateLimit-Policy goes without a window (window_s 0). */
  sluice_headers headers;
  if (sluice_format_headers(&d, rule, 0, &headers) != 0) {
    fprintf(stderr, "acquire: rule name %s cannot name a policy (printable ASCII, 1 to 64 bytes)\n",
            rule);
    return EXIT_USAGE;
  }
  if (d.allowed) {
    printf("HTTP/1.1 200 OK\n");
  } else {
    printf("HTTP/1.1 429 Too Many Requests\n");
    printf("Retry-After: %s\n", headers.retry_after);
  }
  printf("RateLimit: %s\n", headers.ratelimit);
  printf("RateLimit-Policy: %s\n\n", headers.ratelimit_policy);
  return d.allowed ? EXIT_ALLOWED : EXIT_DENIED;
}
