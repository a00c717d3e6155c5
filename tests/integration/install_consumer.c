/* install_consumer.c: a program built by install_test.sh against the
 * installed sluice.h and libsluice, found through pkg-config. It needs no
 * daemon: it checks that the header and the library it loaded agree, and
 * that a few calls behave as sluice.h says. Prints "ok" and exits 0, or
 * names each mismatch and exits 1. */
#include <stdio.h>
#include <string.h>

#include <sluice.h>

#define STR_(x) #x
#define STR(x) STR_(x)

static int failures;

static void expect_str(const char* what, const char* got, const char* want) {
  if (strcmp(got, want) != 0) {
    printf("%s: got \"%s\", want \"%s\"\n", what, got, want);
    failures++;
  }
}

static void expect_int(const char* what, long long got, long long want) {
  if (got != want) {
    printf("%s: got %lld, want %lld\n", what, got, want);
    failures++;
  }
}

int main(void) {
  expect_str("sluice_version()", sluice_version(),
             STR(SLUICE_VERSION_MAJOR) "." STR(SLUICE_VERSION_MINOR) "." STR(SLUICE_VERSION_PATCH));
  expect_int("sluice_version_number()", sluice_version_number(), SLUICE_VERSION_NUMBER);
  expect_str("sluice_err_name(SLUICE_ECONNECT)", sluice_err_name(SLUICE_ECONNECT),
             "SLUICE_ECONNECT");

  /* No daemon listens here: connecting fails and sets the handle to NULL. */
  sluice_client* client = (sluice_client*)&failures;
  expect_int("sluice_connect(absent socket)",
             sluice_connect("/nonexistent/sluice-install-test.sock", 100, &client),
             SLUICE_ECONNECT);
  expect_int("handle after a failed connect", client == NULL, 1);
  sluice_destroy(NULL);

  sluice_decision denied = {0};
  denied.limit = 100;
  denied.reset_after_ms = 30500;
  denied.retry_after_ms = 2001;
  sluice_headers headers;
  expect_int("sluice_format_headers", sluice_format_headers(&denied, "api", 60, &headers), 0);
  expect_str("RateLimit", headers.ratelimit, "\"api\";r=0;t=31");
  expect_str("RateLimit-Policy", headers.ratelimit_policy, "\"api\";q=100;w=60");
  expect_str("Retry-After", headers.retry_after, "3");

  if (failures != 0) {
    return 1;
  }
  printf("ok: sluice %s\n", sluice_version());
  return 0;
}
