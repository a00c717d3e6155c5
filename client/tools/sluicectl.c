/* sluicectl: the command-line client of sluiced, built on libsluice.
 * One request per run; exit status 0 allowed/ok, 1 denied (or health not
 * "ok"; for acquire_all, any item denied), 2 usage error, 3 connection or
 * server error. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sluice.h"

enum { EXIT_OK = 0, EXIT_DENIED = 1, EXIT_USAGE = 2, EXIT_FAILED = 3 };

#define DEFAULT_TIMEOUT_MS 2000
/* The longest wait the daemon accepts, and how much longer than the wait the
 * call's timeout is at least. */
#define MAX_WAIT_MS 60000
#define WAIT_MARGIN_MS 1000
/* The largest cost the daemon accepts. */
#define MAX_COST 1000000000u

static const char usage_text[] =
    "usage: sluicectl [--socket PATH] [--json] [--timeout MS] COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  acquire RULE KEY [COST]  spend COST units (default 1) of RULE for KEY\n"
    "  acquire_all RULE KEY COST [RULE KEY COST ...]\n"
    "                           spend every item or none (all or nothing)\n"
    "  peek RULE KEY            show KEY's state under RULE without spending\n"
    "  release RULE KEY [COST]  give COST units (default 1) of a concurrency rule back\n"
    "  reserve RULE KEY ESTIMATE [TTL_MS]\n"
    "                           spend ESTIMATE now and print the reservation's id\n"
    "  settle ID ACTUAL         settle reservation ID at its ACTUAL cost\n"
    "  cancel ID                give reservation ID back whole\n"
    "  reset RULE KEY           forget KEY's state under RULE, in Redis too for a\n"
    "                           global rule (admins only)\n"
    "  health                   the daemon's health\n"
    "  stats                    the daemon's counters\n"
    "  rules                    the rules the daemon enforces\n"
    "  reload                   make the daemon re-read its config (admins only)\n"
    "\n"
    "options:\n"
    "  --socket PATH  daemon socket (default: $SLUICE_SOCKET, else " SLUICE_DEFAULT_SOCKET ")\n"
    "  --json         print one JSON object instead of text\n"
    "  --timeout MS   give up after MS milliseconds (default 2000, and at least\n"
    "                 1000 more than --wait)\n"
    "  --wait MS      acquire: wait up to MS milliseconds for the units instead\n"
    "                 of being denied (token_bucket and gcra rules)\n"
    "  --help         print this help and exit\n"
    "  --version      print the version and exit\n"
    "\n"
    "exit status:\n"
    "  0  allowed, or the command succeeded\n"
    "  1  denied (acquire, acquire_all, peek), or health status is not \"ok\"\n"
    "  2  usage error\n"
    "  3  connection error, or the daemon answered with an error\n";

/* A usage error: what was wrong, the command's own synopsis when there is
 * one, and where the whole help is; not the whole help. */
static int usage_error(const char* message) {
  fprintf(stderr, "sluicectl: %s\nTry 'sluicectl --help' for the commands and options.\n",
          message);
  return EXIT_USAGE;
}

static int command_usage_error(const char* command, const char* message, const char* synopsis) {
  fprintf(stderr,
          "sluicectl: %s: %s\nusage: sluicectl [OPTIONS] %s%s%s\n"
          "Try 'sluicectl --help' for the commands and options.\n",
          command, message, command, synopsis[0] != '\0' ? " " : "", synopsis);
  return EXIT_USAGE;
}

static int parse_u32(const char* text, uint32_t* out) {
  char* end;
  if (text[0] < '0' || text[0] > '9') {
    return -1;
  }
  errno = 0;
  unsigned long long value = strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || value > UINT32_MAX) {
    return -1;
  }
  *out = (uint32_t)value;
  return 0;
}

/* Reads a COST argument: 0 and a message when it is not a whole number from
 * 0 to MAX_COST. */
static const char* parse_cost(const char* text, uint32_t* cost) {
  const char* p = text;
  if (*p == '\0') {
    return "COST must be a whole number, e.g. 1";
  }
  for (; *p != '\0'; p++) {
    if (*p < '0' || *p > '9') {
      return "COST must be a whole number, e.g. 1";
    }
  }
  if (parse_u32(text, cost) != 0 || *cost > MAX_COST) {
    return "COST must be at most 1000000000";
  }
  return NULL;
}

static int fail(sluice_client* client, int rc) {
  if (rc == SLUICE_ESERVER) {
    fprintf(stderr, "sluicectl: %s: %s\n", sluice_server_error_code(client),
            sluice_server_error_message(client));
  } else {
    fprintf(stderr, "sluicectl: %s\n", sluice_strerror(rc));
  }
  return EXIT_FAILED;
}

/* waited_ms < 0: the request could not wait, and nothing is printed of it. */
static void print_decision(const sluice_decision* d, int64_t waited_ms, int json) {
  if (json) {
    printf("{\"allowed\":%s,\"remaining\":%" PRId64 ",\"limit\":%" PRId64
           ",\"reset_after_ms\":%" PRId64 ",\"retry_after_ms\":%" PRId64 ",\"mode\":\"%s\"",
           d->allowed ? "true" : "false", d->remaining, d->limit, d->reset_after_ms,
           d->retry_after_ms, sluice_mode_name(d->mode));
    if (waited_ms >= 0) {
      printf(",\"waited_ms\":%" PRId64, waited_ms);
    }
    puts("}");
  } else {
    printf("%-8s remaining=%" PRId64 " limit=%" PRId64 " reset_after_ms=%" PRId64
           " retry_after_ms=%" PRId64 " mode=%s",
           d->allowed ? "allowed" : "denied", d->remaining, d->limit, d->reset_after_ms,
           d->retry_after_ms, sluice_mode_name(d->mode));
    if (waited_ms >= 0) {
      printf(" waited_ms=%" PRId64, waited_ms);
    }
    putchar('\n');
  }
}

static void print_decisions(const sluice_decision* results, size_t count, int all_allowed,
                            int json) {
  if (json) {
    printf("{\"allowed\":%s,\"results\":[", all_allowed ? "true" : "false");
    for (size_t i = 0; i < count; i++) {
      const sluice_decision* d = &results[i];
      printf("%s{\"allowed\":%s,\"remaining\":%" PRId64 ",\"limit\":%" PRId64
             ",\"reset_after_ms\":%" PRId64 ",\"retry_after_ms\":%" PRId64 ",\"mode\":\"%s\"}",
             i > 0 ? "," : "", d->allowed ? "true" : "false", d->remaining, d->limit,
             d->reset_after_ms, d->retry_after_ms, sluice_mode_name(d->mode));
    }
    puts("]}");
    return;
  }
  printf("%s\n", all_allowed ? "allowed" : "denied");
  for (size_t i = 0; i < count; i++) {
    printf("  %zu: ", i + 1);
    print_decision(&results[i], -1, 0);
  }
}

/* A reservation's answer: the decision, its id (0: none opened) and, for a
 * settle or cancel, what was given back, charged and left unpaid. */
static void print_reservation(const sluice_decision* d, uint64_t id, int settled,
                              int64_t refunded, int64_t debt, int64_t unpaid, int json) {
  if (json) {
    printf("{\"allowed\":%s,\"remaining\":%" PRId64 ",\"limit\":%" PRId64
           ",\"reset_after_ms\":%" PRId64 ",\"retry_after_ms\":%" PRId64 ",\"mode\":\"%s\"",
           d->allowed ? "true" : "false", d->remaining, d->limit, d->reset_after_ms,
           d->retry_after_ms, sluice_mode_name(d->mode));
    if (id != 0) printf(",\"id\":%" PRIu64, id);
    if (settled) {
      printf(",\"refunded\":%" PRId64 ",\"debt\":%" PRId64 ",\"unpaid\":%" PRId64, refunded,
             debt, unpaid);
    }
    puts("}");
    return;
  }
  print_decision(d, -1, 0);
  if (id != 0) printf("id %" PRIu64 "\n", id);
  if (settled) {
    printf("refunded %" PRId64 ", debt %" PRId64 ", unpaid %" PRId64 "\n", refunded, debt, unpaid);
  }
}

/* Whether compact JSON (as libsluice writes it) is an object whose "status"
 * is "ok": the key is looked for at the top level only. */
static int health_is_ok(const char* json) {
  static const char want[] = "\"status\":\"ok\"";
  int depth = 0;
  char prev = 0;
  for (const char* p = json; *p != '\0'; p++) {
    if (*p == '"') {
      if (depth == 1 && (prev == '{' || prev == ',') && strncmp(p, want, sizeof want - 1) == 0) {
        char after = p[sizeof want - 1];
        if (after == ',' || after == '}') {
          return 1;
        }
      }
      for (p++; *p != '"'; p++) {
        if (*p == '\0') {
          return 0;
        }
        if (*p == '\\' && p[1] != '\0') {
          p++;
        }
      }
      prev = '"';
      continue;
    }
    if (*p == '{' || *p == '[') {
      depth++;
    } else if (*p == '}' || *p == ']') {
      depth--;
    }
    prev = *p;
  }
  return 0;
}

/* Prints compact JSON (as libsluice writes it) indented, two spaces a level. */
static void print_indented(const char* json) {
  int depth = 0, in_string = 0;
  for (const char* p = json; *p != '\0'; p++) {
    char ch = *p;
    if (in_string) {
      putchar(ch);
      if (ch == '\\' && p[1] != '\0') {
        putchar(*++p);
      } else if (ch == '"') {
        in_string = 0;
      }
      continue;
    }
    switch (ch) {
      case '"':
        in_string = 1;
        putchar(ch);
        break;
      case '{':
      case '[':
        putchar(ch);
        if (p[1] == '}' || p[1] == ']') {
          putchar(*++p);
        } else {
          printf("\n%*s", 2 * ++depth, "");
        }
        break;
      case '}':
      case ']':
        printf("\n%*s%c", 2 * --depth, "", ch);
        break;
      case ',':
        printf(",\n%*s", 2 * depth, "");
        break;
      case ':':
        printf(": ");
        break;
      default:
        putchar(ch);
    }
  }
  putchar('\n');
}

int main(int argc, char** argv) {
  const char* socket_path = getenv("SLUICE_SOCKET");
  int json = 0;
  int timeout_ms = DEFAULT_TIMEOUT_MS;
  uint32_t wait_ms = 0;
  int waits = 0; /* --wait given: acquire says max_wait_ms */
  int64_t waited_ms = -1;
  int i = 1;
  if (socket_path == NULL || socket_path[0] == '\0') {
    socket_path = SLUICE_DEFAULT_SOCKET;
  }
  for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
    const char* arg = argv[i];
    const char* value = strchr(arg, '=');
    size_t name_len = value ? (size_t)(value - arg) : strlen(arg);
    int takes_value = (name_len == 8 && strncmp(arg, "--socket", 8) == 0) ||
                      (name_len == 9 && strncmp(arg, "--timeout", 9) == 0) ||
                      (name_len == 6 && strncmp(arg, "--wait", 6) == 0);
    if (takes_value) {
      if (value != NULL) {
        value++;
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return usage_error("option needs a value");
      }
    } else if (value != NULL) {
      return usage_error("option takes no value");
    }
    if (strcmp(arg, "--") == 0) {
      i++;
      break;
    } else if (strcmp(arg, "--help") == 0) {
      fputs(usage_text, stdout);
      return EXIT_OK;
    } else if (strcmp(arg, "--version") == 0) {
      printf("sluicectl %s\n", sluice_version());
      return EXIT_OK;
    } else if (strcmp(arg, "--json") == 0) {
      json = 1;
    } else if (name_len == 8) {
      socket_path = value;
    } else if (name_len == 6) {
      if (parse_u32(value, &wait_ms) != 0 || wait_ms > MAX_WAIT_MS) {
        return usage_error("--wait needs a number of milliseconds up to 60000");
      }
      waits = 1;
    } else if (name_len == 9) {
      uint32_t ms;
      if (parse_u32(value, &ms) != 0 || ms > INT32_MAX) {
        return usage_error("--timeout needs a number of milliseconds");
      }
      timeout_ms = (int)ms;
    } else {
      return usage_error("unknown option");
    }
  }
  if (i >= argc) {
    return usage_error("missing command");
  }
  const char* command = argv[i++];
  int nargs = argc - i;
  char** args = argv + i;
  int is_item = strcmp(command, "acquire") == 0 || strcmp(command, "release") == 0;
  int is_all = strcmp(command, "acquire_all") == 0;
  int is_reset = strcmp(command, "reset") == 0;
  int is_peek = strcmp(command, "peek") == 0 || is_reset; /* both take RULE KEY */
  int is_reserve = strcmp(command, "reserve") == 0;
  int is_settle = strcmp(command, "settle") == 0 || strcmp(command, "cancel") == 0;
  uint32_t ttl_ms = 0;
  uint64_t reservation = 0;
  int is_plain = strcmp(command, "health") == 0 || strcmp(command, "stats") == 0 ||
                 strcmp(command, "rules") == 0 || strcmp(command, "reload") == 0;
  uint32_t cost = 1;
  sluice_item* items = NULL; /* acquire_all's, in argv order */
  size_t item_count = 0;
  if (is_item) {
    if (nargs < 2 || nargs > 3) {
      return command_usage_error(command, "expected RULE KEY [COST]", "RULE KEY [COST]");
    }
    const char* bad = nargs == 3 ? parse_cost(args[2], &cost) : NULL;
    if (bad != NULL) {
      return command_usage_error(command, bad, "RULE KEY [COST]");
    }
  } else if (is_all) {
    static const char synopsis[] = "RULE KEY COST [RULE KEY COST ...]";
    if (nargs == 0 || nargs % 3 != 0) {
      return command_usage_error(command, "expected items of three words, RULE KEY COST",
                                 synopsis);
    }
    items = calloc((size_t)nargs / 3, sizeof *items);
    if (items == NULL) {
      fprintf(stderr, "sluicectl: out of memory\n");
      return EXIT_FAILED;
    }
    for (int k = 0; k < nargs; k += 3) {
      uint32_t item_cost;
      const char* bad = parse_cost(args[k + 2], &item_cost);
      if (bad != NULL) {
        free(items);
        return command_usage_error(command, bad, synopsis);
      }
      sluice_item item = {args[k], args[k + 1], strlen(args[k + 1]), item_cost};
      items[item_count++] = item;
    }
  } else if (is_reserve) {
    static const char synopsis[] = "RULE KEY ESTIMATE [TTL_MS]";
    if (nargs < 3 || nargs > 4) {
      return command_usage_error(command, "expected RULE KEY ESTIMATE [TTL_MS]", synopsis);
    }
    const char* bad = parse_cost(args[2], &cost);
    if (bad == NULL && cost == 0) bad = "ESTIMATE must be at least 1";
    if (bad == NULL && nargs == 4) {
      char* end = NULL;
      errno = 0;
      unsigned long long value = strtoull(args[3], &end, 10);
      if (errno != 0 || end == args[3] || *end != '\0' || value == 0 || value > 86400000ull) {
        bad = "TTL_MS must be a number of milliseconds, 1 to 86400000";
      }
      ttl_ms = (uint32_t)value;
    }
    if (bad != NULL) {
      return command_usage_error(command, bad, synopsis);
    }
  } else if (is_settle) {
    const int cancel = command[0] == 'c';
    const char* synopsis = cancel ? "ID" : "ID ACTUAL";
    if (nargs != (cancel ? 1 : 2)) {
      return command_usage_error(command, cancel ? "expected ID" : "expected ID ACTUAL", synopsis);
    }
    char* end = NULL;
    errno = 0;
    unsigned long long value = strtoull(args[0], &end, 10);
    const char* bad = NULL;
    if (errno != 0 || end == args[0] || *end != '\0' || value == 0 || args[0][0] == '-') {
      bad = "ID must be the id reserve printed";
    }
    reservation = (uint64_t)value;
    if (bad == NULL && !cancel) bad = parse_cost(args[1], &cost);
    if (bad != NULL) {
      return command_usage_error(command, bad, synopsis);
    }
  } else if (is_peek) {
    if (nargs != 2) {
      return command_usage_error(command, "expected RULE KEY", "RULE KEY");
    }
  } else if (is_plain) {
    if (nargs != 0) {
      return command_usage_error(command, "this command takes no arguments", "");
    }
  } else {
    char message[160];
    snprintf(message, sizeof message, "unknown command '%.64s'", command);
    return usage_error(message);
  }

  sluice_client* client = NULL;
  int rc = sluice_connect(socket_path, timeout_ms, &client);
  if (rc != 0) {
    fprintf(stderr, "sluicectl: %s: %s\n", socket_path, sluice_strerror(rc));
    free(items);
    return EXIT_FAILED;
  }
  int status = EXIT_OK;
  if (is_all) {
    sluice_decision* results = calloc(item_count, sizeof *results);
    int all_allowed = 0;
    rc = results == NULL ? SLUICE_ENOMEM
                         : sluice_acquire_all(client, items, item_count, timeout_ms,
                                              &all_allowed, results);
    if (rc == 0) {
      print_decisions(results, item_count, all_allowed, json);
      status = all_allowed ? EXIT_OK : EXIT_DENIED;
    }
    free(results);
  } else if (is_reserve || is_settle) {
    sluice_decision d;
    int64_t refunded = 0;
    int64_t debt = 0;
    int64_t unpaid = 0;
    if (is_reserve) {
      rc = sluice_reserve(client, args[0], args[1], strlen(args[1]), cost, ttl_ms, timeout_ms, &d,
                          &reservation);
    } else if (command[0] == 's') {
      rc = sluice_settle_with_unpaid(client, reservation, cost, timeout_ms, &d, &refunded, &debt,
                                     &unpaid);
    } else {
      rc = sluice_cancel(client, reservation, timeout_ms, &d, &refunded);
    }
    if (rc == 0) {
      print_reservation(&d, reservation, is_settle, refunded, debt, unpaid, json);
      status = is_settle || d.allowed ? EXIT_OK : EXIT_DENIED;
    }
  } else if (is_item || is_peek) {
    sluice_decision d;
    size_t key_len = strlen(args[1]);
    if (is_reset) {
      rc = sluice_reset(client, args[0], args[1], key_len, timeout_ms, &d);
    } else if (is_peek) {
      rc = sluice_peek(client, args[0], args[1], key_len, timeout_ms, &d);
    } else if (command[0] == 'a') {
      if (waits) {
        if (timeout_ms < (int)wait_ms + WAIT_MARGIN_MS) {
          timeout_ms = (int)wait_ms + WAIT_MARGIN_MS;
        }
        waited_ms = 0;
        rc = sluice_acquire_wait(client, args[0], args[1], key_len, cost, wait_ms, timeout_ms, &d,
                                 &waited_ms);
      } else {
        rc = sluice_acquire(client, args[0], args[1], key_len, cost, timeout_ms, &d);
      }
    } else {
      rc = sluice_release(client, args[0], args[1], key_len, cost, timeout_ms, &d);
    }
    if (rc == 0) {
      print_decision(&d, waited_ms, json);
      status = d.allowed ? EXIT_OK : EXIT_DENIED;
    }
  } else {
    /* One request: health's exit status comes from the JSON it prints. */
    char* text = NULL;
    rc = sluice_call_json(client, command, timeout_ms, &text);
    if (rc == 0 && strcmp(command, "health") == 0 && !health_is_ok(text)) {
      status = EXIT_DENIED;
    }
    if (rc == 0) {
      if (json) {
        puts(text);
      } else {
        print_indented(text);
      }
    }
    sluice_free(text);
  }
  if (rc != 0) {
    status = fail(client, rc);
  }
  sluice_destroy(client);
  free(items);
  return status;
}
