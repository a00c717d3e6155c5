/* client.c: the libsluice handle: connection, buffered socket I/O, requests
 * and responses (the API is documented in sluice.h).
 *
 * A handle owns one non-blocking stream socket and two buffers. `out` holds
 * encoded requests; out.data[out_pos, out.len) is not yet written. `in` holds
 * received bytes; in.data[in_pos, in.len) is not yet decoded. A response
 * frame has no length prefix: it ends where its MessagePack value ends, and
 * mp_frame_size() finds that end without trusting any length beyond the
 * SLUICE_MAX_RESPONSE_BYTES cap. sluice_recv() skips that pre-scan on its hot
 * path: it decodes the response straight from `in`, every read bounded by the
 * buffered bytes and the cap, and only when that fails (a frame not all here
 * yet, or not shaped like a response) asks mp_frame_size() which it is.
 *
 * Reconnection (the rule in sluice.h): `resend_safe()` is true when every
 * request in flight is still wholly unwritten in `out`, i.e. the daemon
 * cannot have seen any of them. Only then may the handle replace a dead
 * socket and write them on the new one; otherwise a dead socket drops every
 * request in flight and the call returns the error.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "codec.h"
#include "json.h"
#include "sluice.h"

/* Free space guaranteed before each read(), so one read takes many responses. */
#define SLUICE_READ_CHUNK_BYTES (64u * 1024u)
/* While flushing, received bytes are buffered only up to this much; beyond
 * it the handle stops reading until the caller consumes responses. */
#define SLUICE_MAX_BUFFERED_INPUT_BYTES (2u * SLUICE_MAX_RESPONSE_BYTES)
/* The bytes of a request around its parameters: [0, msgid, method, params]. */
#define SLUICE_REQUEST_OVERHEAD_BYTES (4u * MP_MAX_HEADER)

struct sluice_client {
  int fd; /* -1 while disconnected */
  char* socket_path;
  sluice_buf out;
  size_t out_pos;
  size_t queued; /* requests in `out` of which not one byte was written */
  sluice_buf in;
  size_t in_pos;
  uint32_t next_msgid;
  size_t in_flight;
  /* Which msgids are in flight: bit i of pending[] stands for msgid
   * pending_base + i (mod 2^32). Msgids are handed out in order, so the
   * window spans the oldest unanswered one to next_msgid; it grows like the
   * buffers do, then sending and receiving allocate nothing. */
  uint64_t* pending;
  size_t pending_cap;   /* words allocated */
  size_t pending_words; /* words that may hold a set bit */
  uint32_t pending_base;
  char error_code[64];
  char error_message[512];
};

/* ---- errors and versions --------------------------------------------------- */

const char* sluice_strerror(int code) {
  switch (code) {
#define SLUICE_XX_(name, value, text) \
  case SLUICE_##name:                 \
    return text;
    SLUICE_ERRNO_MAP(SLUICE_XX_)
#undef SLUICE_XX_
    case SLUICE_OK:
      return "success";
  }
  return "unknown error";
}

const char* sluice_err_name(int code) {
  switch (code) {
#define SLUICE_XX_(name, value, text) \
  case SLUICE_##name:                 \
    return "SLUICE_" #name;
    SLUICE_ERRNO_MAP(SLUICE_XX_)
#undef SLUICE_XX_
    case SLUICE_OK:
      return "SLUICE_OK";
  }
  return "SLUICE_UNKNOWN";
}

#define SLUICE_STR_(x) #x
#define SLUICE_XSTR_(x) SLUICE_STR_(x)

const char* sluice_version(void) {
  return SLUICE_XSTR_(SLUICE_VERSION_MAJOR) "." SLUICE_XSTR_(SLUICE_VERSION_MINOR) "." SLUICE_XSTR_(
      SLUICE_VERSION_PATCH);
}

int sluice_version_number(void) { return SLUICE_VERSION_NUMBER; }

static const char* const mode_names[] = {"unknown", "normal", "fallback", "open",
                                         "closed",  "shadow", "local",    "blocked"};

const char* sluice_mode_name(sluice_mode mode) {
  if ((int)mode < 0 || (size_t)mode >= sizeof mode_names / sizeof mode_names[0]) {
    return mode_names[0];
  }
  return mode_names[mode];
}

void sluice_free(void* ptr) { free(ptr); }

const char* sluice_server_error_code(const sluice_client* c) { return c ? c->error_code : ""; }

const char* sluice_server_error_message(const sluice_client* c) {
  return c ? c->error_message : "";
}

/* ---- time ------------------------------------------------------------------ */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Deadlines are monotonic ms, or one of these (both negative, never a time). */
#define SLUICE_DEADLINE_NONE (-1) /* wait as long as it takes */
#define SLUICE_DEADLINE_NOW (-2)  /* a 0-ms timeout: passed already, no clock read */

/* The deadline for a timeout: none when negative, now when 0. */
static int64_t deadline_after(int timeout_ms) {
  if (timeout_ms <= 0) {
    return timeout_ms < 0 ? SLUICE_DEADLINE_NONE : SLUICE_DEADLINE_NOW;
  }
  return now_ms() + timeout_ms;
}

/* Milliseconds left for poll(): -1 without a deadline, 0 once it passed. */
static int ms_left(int64_t deadline_ms) {
  if (deadline_ms < 0) {
    return deadline_ms == SLUICE_DEADLINE_NONE ? -1 : 0;
  }
  int64_t left = deadline_ms - now_ms();
  return left <= 0 ? 0 : (int)left;
}

/* ---- connection -------------------------------------------------------------- */

static int open_socket(const char* path, int64_t deadline_ms, int* fd_out) {
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  size_t path_len = strlen(path);
  if (path_len == 0 || path_len >= sizeof addr.sun_path) {
    return SLUICE_EINVAL;
  }
  memcpy(addr.sun_path, path, path_len + 1);

  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) {
    return errno == ENOMEM || errno == ENOBUFS ? SLUICE_ENOMEM : SLUICE_ECONNECT;
  }
  if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0 ||
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) {
    close(fd);
    return SLUICE_ECONNECT;
  }
  for (;;) {
    if (connect(fd, (const struct sockaddr*)&addr, sizeof addr) == 0) {
      *fd_out = fd;
      return 0;
    }
    if (errno == EINTR) {
      continue;
    }
    if (errno == EAGAIN) {
      /* The daemon's accept backlog is full: retry until the deadline. */
      if (ms_left(deadline_ms) == 0) {
        close(fd);
        return SLUICE_ETIMEDOUT;
      }
      poll(NULL, 0, 1);
      continue;
    }
    if (errno == EINPROGRESS) {
      struct pollfd pfd = {fd, POLLOUT, 0};
      int err = 0;
      socklen_t err_len = sizeof err;
      int n = poll(&pfd, 1, ms_left(deadline_ms));
      if (n == 0) {
        close(fd);
        return SLUICE_ETIMEDOUT;
      }
      if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) != 0 || err != 0) {
        close(fd);
        return SLUICE_ECONNECT;
      }
      *fd_out = fd;
      return 0;
    }
    close(fd);
    return SLUICE_ECONNECT;
  }
}

/* Closes the socket and forgets what was received on it. */
static void close_socket(sluice_client* c) {
  if (c->fd >= 0) {
    close(c->fd);
    c->fd = -1;
  }
  c->in.len = 0;
  c->in_pos = 0;
}

/* ---- msgids in flight ------------------------------------------------------------ */

/* Forgets every msgid in flight. */
static void clear_in_flight(sluice_client* c) {
  if (c->pending_words > 0) {
    memset(c->pending, 0, c->pending_words * sizeof c->pending[0]);
  }
  c->pending_words = 0;
  c->pending_base = c->next_msgid & ~(uint32_t)63;
  c->in_flight = 0;
}

/* Makes room in the window for msgid next_msgid: drops leading words with
 * no msgid in flight, and grows the array when that frees less than half of
 * it (so a slide, which costs a memmove, comes at most once per cap*32
 * requests). Returns 0, or SLUICE_ENOMEM with the window unchanged. */
static int pending_make_room(sluice_client* c) {
  size_t word = (uint32_t)(c->next_msgid - c->pending_base) / 64;
  if (word < c->pending_cap) {
    return 0;
  }
  size_t skip = 0;
  while (skip < c->pending_words && c->pending[skip] == 0) {
    skip++;
  }
  if (skip > 0) {
    memmove(c->pending, c->pending + skip, (c->pending_words - skip) * sizeof c->pending[0]);
    memset(c->pending + (c->pending_words - skip), 0, skip * sizeof c->pending[0]);
    c->pending_words -= skip;
    c->pending_base += (uint32_t)(skip * 64);
    word -= skip;
  }
  if (word < c->pending_cap && c->pending_words <= c->pending_cap / 2) {
    return 0;
  }
  size_t cap = c->pending_cap < 4 ? 4 : c->pending_cap * 2;
  while (cap <= word) {
    cap *= 2;
  }
  uint64_t* grown = (uint64_t*)realloc(c->pending, cap * sizeof *grown);
  if (grown == NULL) {
    return word < c->pending_cap ? 0 : SLUICE_ENOMEM;
  }
  memset(grown + c->pending_cap, 0, (cap - c->pending_cap) * sizeof *grown);
  c->pending = grown;
  c->pending_cap = cap;
  return 0;
}

/* Marks msgid in flight; pending_make_room() made room for it. */
static void pending_add(sluice_client* c, uint32_t msgid) {
  size_t bit = (uint32_t)(msgid - c->pending_base);
  c->pending[bit / 64] |= (uint64_t)1 << (bit % 64);
  if (bit / 64 >= c->pending_words) {
    c->pending_words = bit / 64 + 1;
  }
  c->in_flight++;
}

/* Marks msgid answered. Returns 0, or -1 when it was not in flight. */
static int pending_take(sluice_client* c, uint32_t msgid) {
  size_t bit = (uint32_t)(msgid - c->pending_base);
  uint64_t mask = (uint64_t)1 << (bit % 64);
  if (bit / 64 >= c->pending_words || (c->pending[bit / 64] & mask) == 0) {
    return -1;
  }
  c->pending[bit / 64] &= ~mask;
  if (--c->in_flight == 0) {
    clear_in_flight(c);
  }
  return 0;
}

/* Closes the socket and drops every request in flight, written or not. */
static void drop_connection(sluice_client* c) {
  close_socket(c);
  c->out.len = 0;
  c->out_pos = 0;
  c->queued = 0;
  clear_in_flight(c);
}

static int resend_safe(const sluice_client* c) { return c->out_pos == 0 && c->in_flight == c->queued; }

static int reconnect(sluice_client* c, int64_t deadline_ms) {
  close_socket(c);
  return open_socket(c->socket_path, deadline_ms, &c->fd);
}

int sluice_connect(const char* socket_path, int timeout_ms, sluice_client** out) {
  if (out == NULL) {
    return SLUICE_EINVAL;
  }
  *out = NULL;
  if (socket_path == NULL) {
    return SLUICE_EINVAL;
  }
  sluice_client* c = (sluice_client*)calloc(1, sizeof *c);
  if (c == NULL) {
    return SLUICE_ENOMEM;
  }
  c->fd = -1;
  c->next_msgid = 1;
  size_t path_len = strlen(socket_path);
  c->socket_path = (char*)malloc(path_len + 1);
  if (c->socket_path == NULL || sluice_buf_reserve(&c->in, SLUICE_READ_CHUNK_BYTES) == NULL) {
    sluice_destroy(c);
    return SLUICE_ENOMEM;
  }
  memcpy(c->socket_path, socket_path, path_len + 1);
  int rc = open_socket(c->socket_path, deadline_after(timeout_ms), &c->fd);
  if (rc != 0) {
    sluice_destroy(c);
    return rc;
  }
  *out = c;
  return 0;
}

void sluice_destroy(sluice_client* c) {
  if (c == NULL) {
    return;
  }
  close_socket(c);
  sluice_buf_free(&c->out);
  sluice_buf_free(&c->in);
  free(c->pending);
  free(c->socket_path);
  free(c);
}

size_t sluice_in_flight(const sluice_client* c) { return c ? c->in_flight : 0; }

/* ---- socket I/O ---------------------------------------------------------------- */

static int io_error(int err) {
  if (err == EPIPE || err == ECONNRESET || err == ENOTCONN) {
    return SLUICE_ECLOSED;
  }
  return err == ENOMEM || err == ENOBUFS ? SLUICE_ENOMEM : SLUICE_EIO;
}

/* Writes as much of `out` as the socket takes now. */
static int write_some(sluice_client* c) {
  while (c->out_pos < c->out.len) {
    ssize_t n = send(c->fd, c->out.data + c->out_pos, c->out.len - c->out_pos, MSG_NOSIGNAL);
    if (n > 0) {
      c->out_pos += (size_t)n;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return 0;
    } else {
      return io_error(errno);
    }
  }
  c->out.len = 0;
  c->out_pos = 0;
  c->queued = 0;
  return 0;
}

/* One read() into `in`, after making room for at least one chunk. */
static int read_some(sluice_client* c) {
  if (c->in_pos > 0) {
    memmove(c->in.data, c->in.data + c->in_pos, c->in.len - c->in_pos);
    c->in.len -= c->in_pos;
    c->in_pos = 0;
  }
  if (sluice_buf_reserve(&c->in, SLUICE_READ_CHUNK_BYTES) == NULL) {
    c->in.failed = 0; /* the handle stays usable once memory is back */
    return SLUICE_ENOMEM;
  }
  for (;;) {
    ssize_t n = recv(c->fd, c->in.data + c->in.len, c->in.cap - c->in.len, 0);
    if (n > 0) {
      c->in.len += (size_t)n;
      return 0;
    }
    if (n == 0) {
      return SLUICE_ECLOSED;
    }
    if (errno == EINTR) {
      continue;
    }
    return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : io_error(errno);
  }
}

/* Waits until the socket can be written or read (either one being enough),
 * then does that I/O. `want_read` asks for reading too. */
static int pump(sluice_client* c, int64_t deadline_ms, int want_read) {
  int want_write = c->out_pos < c->out.len;
  struct pollfd pfd = {c->fd, (short)((want_read ? POLLIN : 0) | (want_write ? POLLOUT : 0)), 0};
  int n;
  do {
    n = poll(&pfd, 1, ms_left(deadline_ms));
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    return SLUICE_EIO;
  }
  if (n == 0) {
    return SLUICE_ETIMEDOUT;
  }
  if (want_write && (pfd.revents & (POLLOUT | POLLERR | POLLHUP))) {
    int rc = write_some(c);
    if (rc != 0) {
      return rc;
    }
  }
  if (want_read && (pfd.revents & (POLLIN | POLLERR | POLLHUP))) {
    return read_some(c);
  }
  return 0;
}

/* Writes everything queued, reconnecting once when that is safe (see top).
 * Returns 0 or a code; the caller decides what a failure does to the handle. */
static int flush_until(sluice_client* c, int64_t deadline_ms) {
  int reconnects_left = 1;
  if (c->out_pos == c->out.len) {
    return 0;
  }
  /* A socket whose peer has gone fails the first send() with EPIPE before
   * taking a byte, so a restarted daemon is noticed below, not probed for. */
  if (c->fd < 0 && resend_safe(c)) {
    reconnects_left = 0;
    int rc = reconnect(c, deadline_ms);
    if (rc != 0) {
      return rc;
    }
  }
  if (c->fd < 0) {
    return SLUICE_ECLOSED;
  }
  while (c->out_pos < c->out.len) {
    int rc = write_some(c);
    if (rc == SLUICE_ECLOSED && resend_safe(c) && reconnects_left-- > 0) {
      rc = reconnect(c, deadline_ms);
      if (rc != 0) {
        return rc;
      }
      continue;
    }
    if (rc != 0) {
      return rc;
    }
    if (c->out_pos < c->out.len) {
      /* Keep reading answers while the daemon is slow to take requests, so
       * neither side can fill its buffers and wait on the other forever. */
      int read_too = c->in.len - c->in_pos < SLUICE_MAX_BUFFERED_INPUT_BYTES;
      rc = pump(c, deadline_ms, read_too);
      if (rc != 0) {
        return rc;
      }
    }
  }
  return 0;
}

/* Writes what the socket takes now, without waiting, reconnecting (once per
 * call, counted in *reconnects_left) when that is safe. */
static int write_now(sluice_client* c, int64_t deadline_ms, int* reconnects_left) {
  if (c->out_pos == c->out.len) {
    return 0;
  }
  if (c->fd < 0) {
    if (!resend_safe(c) || (*reconnects_left)-- <= 0) {
      return SLUICE_ECLOSED;
    }
    int rc = reconnect(c, deadline_ms);
    if (rc != 0) {
      return rc;
    }
  }
  for (;;) {
    int rc = write_some(c);
    if (rc == SLUICE_ECLOSED && resend_safe(c) && (*reconnects_left)-- > 0) {
      rc = reconnect(c, deadline_ms);
      if (rc == 0) {
        continue;
      }
    }
    return rc;
  }
}

/* Marks the next `size` bytes of `in` decoded. */
static void consume_input(sluice_client* c, size_t size) {
  c->in_pos += size;
  if (c->in_pos == c->in.len) {
    c->in_pos = 0;
    c->in.len = 0;
  }
}

/* The next complete response frame from `in`, reading as needed. The frame
 * stays valid until the next read on the handle. */
static int next_frame(sluice_client* c, int64_t deadline_ms, const uint8_t** frame, size_t* len) {
  for (;;) {
    size_t size = 0;
    const uint8_t* start = c->in.data + c->in_pos;
    int rc = mp_frame_size(start, c->in.len - c->in_pos, SLUICE_MAX_RESPONSE_BYTES, &size);
    if (rc == 1) {
      *frame = start;
      *len = size;
      consume_input(c, size);
      return 0;
    }
    if (rc == -1) {
      return SLUICE_EPROTO;
    }
    if (rc == -2) {
      return SLUICE_ETOOLARGE;
    }
    if (c->fd < 0) {
      return SLUICE_ECLOSED;
    }
    rc = pump(c, deadline_ms, 1);
    if (rc != 0) {
      return rc;
    }
  }
}

/* ---- requests ------------------------------------------------------------------- */

static void clear_server_error(sluice_client* c) {
  c->error_code[0] = '\0';
  c->error_message[0] = '\0';
}

static void copy_text(char* dst, size_t cap, const uint8_t* src, uint32_t len) {
  size_t n = len < cap - 1 ? len : cap - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
}

/* A method name as two arguments, the name and its length; the "" makes
 * anything but a string literal a compile error, so sizeof is its length. */
#define SLUICE_METHOD(name) ("" name), (sizeof("" name) - 1)

/* Reserves room for a request whose parameters take at most params_bytes,
 * writes [0, msgid, method, and returns where the parameters go (NULL when
 * memory ran out). finish_request() completes it. */
static uint8_t* begin_request(sluice_client* c, const char* method, size_t method_len,
                              size_t params_bytes, uint32_t* msgid) {
  if (pending_make_room(c) != 0) {
    return NULL;
  }
  uint8_t* p = sluice_buf_reserve(&c->out, SLUICE_REQUEST_OVERHEAD_BYTES + method_len + params_bytes);
  if (p == NULL) {
    c->out.failed = 0;
    return NULL;
  }
  *msgid = c->next_msgid++;
  p = mp_put_array(p, 4);
  p = mp_put_uint(p, 0);
  p = mp_put_uint(p, *msgid);
  return mp_put_str(p, method, (uint32_t)method_len);
}

static void finish_request(sluice_client* c, uint8_t* end, uint32_t msgid) {
  c->out.len = (size_t)(end - c->out.data);
  c->queued++;
  pending_add(c, msgid);
}

/* A key goes out as str when it is UTF-8 (what most MessagePack libraries
 * decode to a string) and as bin otherwise; the daemon accepts both. */
static uint8_t* put_key(uint8_t* p, const void* key, size_t key_len) {
  if (mp_is_utf8((const uint8_t*)key, key_len)) {
    return mp_put_str(p, key, (uint32_t)key_len);
  }
  return mp_put_bin(p, key, (uint32_t)key_len);
}

/* Item checks and encoding take the rule's length, measured once per item. */
static int item_valid(const char* rule, size_t rule_len, const void* key, size_t key_len) {
  return rule != NULL && (key != NULL || key_len == 0) && key_len <= UINT32_MAX &&
         rule_len <= UINT32_MAX;
}

static size_t item_bytes(size_t rule_len, size_t key_len) {
  return 5 * MP_MAX_HEADER + rule_len + key_len;
}

/* No max_wait_ms in a request: the rule's own applies. */
#define NO_WAIT_GIVEN (-1)

/* [rule, key], [rule, key, cost] or, with max_wait_ms >= 0,
 * [rule, key, cost, max_wait_ms] */
static uint8_t* put_item(uint8_t* p, const char* rule, size_t rule_len, const void* key,
                         size_t key_len, int with_cost, uint32_t cost, int64_t max_wait_ms) {
  int waits = with_cost && max_wait_ms >= 0;
  p = mp_put_array(p, waits ? 4 : with_cost ? 3 : 2);
  p = mp_put_str(p, rule, (uint32_t)rule_len);
  p = put_key(p, key, key_len);
  if (with_cost) {
    p = mp_put_uint(p, cost);
  }
  return waits ? mp_put_uint(p, (uint64_t)max_wait_ms) : p;
}

static int queue_item_request(sluice_client* c, const char* method, size_t method_len,
                              const char* rule, const void* key, size_t key_len, int with_cost,
                              uint32_t cost, int64_t max_wait_ms, uint32_t* msgid) {
  size_t rule_len = rule != NULL ? strlen(rule) : 0;
  if (c == NULL || !item_valid(rule, rule_len, key, key_len)) {
    return SLUICE_EINVAL;
  }
  uint8_t* p = begin_request(c, method, method_len, item_bytes(rule_len, key_len), msgid);
  if (p == NULL) {
    return SLUICE_ENOMEM;
  }
  finish_request(c, put_item(p, rule, rule_len, key, key_len, with_cost, cost, max_wait_ms), *msgid);
  return 0;
}

/* ---- responses ------------------------------------------------------------------ */

/* Whether a frame is a notification, [2, method, params]: nothing answers
 * a request with one, so the handle skips it. */
static int is_notification(const uint8_t* frame, size_t len) {
  mp_reader r;
  mp_value v;
  uint64_t type;
  mp_reader_init(&r, frame, len);
  return mp_read(&r, &v) == 0 && v.type == MP_ARRAY && v.v.count == 3 &&
         mp_read_uint(&r, &type) == 0 && type == 2;
}

/* Decodes [1, msgid, error, result] up to the result, which `r` is left at.
 * *status is 0, or SLUICE_ESERVER with the error map copied into the handle.
 * Returns SLUICE_EPROTO when the frame is not a response. */
static int parse_response(sluice_client* c, const uint8_t* frame, size_t len, mp_reader* r,
                          uint32_t* msgid, int* status) {
  mp_value v;
  uint64_t type, id;
  mp_reader_init(r, frame, len);
  if (mp_read(r, &v) != 0 || v.type != MP_ARRAY || v.v.count != 4 || mp_read_uint(r, &type) != 0 ||
      type != 1 || mp_read_uint(r, &id) != 0 || id > UINT32_MAX) {
    return SLUICE_EPROTO;
  }
  *msgid = (uint32_t)id;
  *status = 0;
  const uint8_t* error_start = r->p;
  if (mp_read(r, &v) != 0) {
    return SLUICE_EPROTO;
  }
  if (v.type == MP_NIL) {
    return 0;
  }
  *status = SLUICE_ESERVER;
  clear_server_error(c);
  if (v.type == MP_STR) {
    /* Not our daemon's shape, but some MessagePack-RPC servers send a string. */
    copy_text(c->error_message, sizeof c->error_message, v.v.bytes.ptr, v.v.bytes.len);
    return 0;
  }
  if (v.type != MP_MAP) {
    r->p = error_start;
    return mp_skip(r) == 0 ? 0 : SLUICE_EPROTO;
  }
  for (uint32_t i = 0; i < v.v.count; i++) {
    const uint8_t* key;
    uint32_t key_len;
    mp_value field;
    if (mp_read_bytes(r, &key, &key_len) != 0) {
      return SLUICE_EPROTO;
    }
    const uint8_t* field_start = r->p;
    if (mp_read(r, &field) != 0) {
      return SLUICE_EPROTO;
    }
    int is_text = field.type == MP_STR || field.type == MP_BIN;
    if (is_text && MP_BYTES_ARE(key, key_len, "code")) {
      copy_text(c->error_code, sizeof c->error_code, field.v.bytes.ptr, field.v.bytes.len);
    } else if (is_text && MP_BYTES_ARE(key, key_len, "message")) {
      copy_text(c->error_message, sizeof c->error_message, field.v.bytes.ptr, field.v.bytes.len);
    } else {
      r->p = field_start;
      if (mp_skip(r) != 0) {
        return SLUICE_EPROTO;
      }
    }
  }
  return 0;
}

/* The mode a wire name stands for. The names (mode_names) start with six
 * different letters, so the first byte picks the one candidate. */
static sluice_mode mode_from_name(const uint8_t* name, uint32_t len) {
#define SLUICE_MODE_IF_(text, mode) (MP_BYTES_ARE(name, len, text) ? (mode) : SLUICE_MODE_UNKNOWN)
  switch (len > 0 ? name[0] : 0) {
    case 'n': return SLUICE_MODE_IF_("normal", SLUICE_MODE_NORMAL);
    case 'f': return SLUICE_MODE_IF_("fallback", SLUICE_MODE_FALLBACK);
    case 'o': return SLUICE_MODE_IF_("open", SLUICE_MODE_OPEN);
    case 'c': return SLUICE_MODE_IF_("closed", SLUICE_MODE_CLOSED);
    case 's': return SLUICE_MODE_IF_("shadow", SLUICE_MODE_SHADOW);
    case 'l': return SLUICE_MODE_IF_("local", SLUICE_MODE_LOCAL);
    case 'b': return SLUICE_MODE_IF_("blocked", SLUICE_MODE_BLOCKED);
    default: return SLUICE_MODE_UNKNOWN;
  }
#undef SLUICE_MODE_IF_
}

/* The decision map's keys: the hot loop below tells them apart by length
 * first (no two kinds share one but the two *_after_ms), then by bytes. */
enum decision_key { KEY_OTHER, KEY_NUMBER, KEY_ALLOWED, KEY_MODE };

static enum decision_key decision_key(const uint8_t* key, uint32_t len, sluice_decision* d,
                                      int64_t** number) {
  switch (len) {
    case sizeof "mode" - 1:
      return MP_BYTES_ARE(key, len, "mode") ? KEY_MODE : KEY_OTHER;
    case sizeof "limit" - 1:
      *number = &d->limit;
      return MP_BYTES_ARE(key, len, "limit") ? KEY_NUMBER : KEY_OTHER;
    case sizeof "allowed" - 1:
      return MP_BYTES_ARE(key, len, "allowed") ? KEY_ALLOWED : KEY_OTHER;
    case sizeof "remaining" - 1:
      *number = &d->remaining;
      return MP_BYTES_ARE(key, len, "remaining") ? KEY_NUMBER : KEY_OTHER;
    case sizeof "reset_after_ms" - 1: /* == sizeof "retry_after_ms" - 1 */
      if (MP_BYTES_ARE(key, len, "reset_after_ms")) {
        *number = &d->reset_after_ms;
        return KEY_NUMBER;
      }
      *number = &d->retry_after_ms;
      return MP_BYTES_ARE(key, len, "retry_after_ms") ? KEY_NUMBER : KEY_OTHER;
    default:
      return KEY_OTHER;
  }
}

/* What a decision map may carry besides the decision; NULL fields are skipped. */
typedef struct decision_extras {
  int64_t* waited_ms; /* acquire with waiting */
  uint64_t* id;       /* reserve, settle, cancel */
  int64_t* refunded;  /* settle, cancel */
  int64_t* debt;      /* settle */
  int64_t* unpaid;    /* settle */
} decision_extras;

/* Reads a decision map; keys this library does not know are skipped, and
 * the extras' keys are stored where `extras` points (it may be NULL). */
static int parse_decision_extras(mp_reader* r, sluice_decision* d, const decision_extras* extras) {
  static const decision_extras none = {NULL, NULL, NULL, NULL, NULL};
  int64_t* waited_ms;
  mp_value v;
  int saw_allowed = 0;
  if (extras == NULL) {
    extras = &none;
  }
  waited_ms = extras->waited_ms;
  memset(d, 0, sizeof *d);
  if (mp_read(r, &v) != 0 || v.type != MP_MAP) {
    return SLUICE_EPROTO;
  }
  for (uint32_t i = 0; i < v.v.count; i++) {
    const uint8_t* key;
    uint32_t key_len;
    if (mp_read_bytes(r, &key, &key_len) != 0) {
      return SLUICE_EPROTO;
    }
    int64_t* number = NULL;
    enum decision_key kind = decision_key(key, key_len, d, &number);
    if (waited_ms != NULL && MP_BYTES_ARE(key, key_len, "waited_ms")) {
      kind = KEY_NUMBER;
      number = waited_ms;
    } else if (extras->refunded != NULL && MP_BYTES_ARE(key, key_len, "refunded")) {
      kind = KEY_NUMBER;
      number = extras->refunded;
    } else if (extras->debt != NULL && MP_BYTES_ARE(key, key_len, "debt")) {
      kind = KEY_NUMBER;
      number = extras->debt;
    } else if (extras->unpaid != NULL && MP_BYTES_ARE(key, key_len, "unpaid")) {
      kind = KEY_NUMBER;
      number = extras->unpaid;
    } else if (extras->id != NULL && MP_BYTES_ARE(key, key_len, "id")) {
      if (mp_read_uint(r, extras->id) != 0) {
        return SLUICE_EPROTO;
      }
      continue;
    }
    if (kind == KEY_NUMBER) {
      if (mp_read_int(r, number) != 0) {
        return SLUICE_EPROTO;
      }
    } else if (kind == KEY_ALLOWED) {
      mp_value b;
      if (mp_read(r, &b) != 0 || b.type != MP_BOOL) {
        return SLUICE_EPROTO;
      }
      d->allowed = b.v.boolean;
      saw_allowed = 1;
    } else if (kind == KEY_MODE) {
      const uint8_t* name;
      uint32_t name_len;
      if (mp_read_bytes(r, &name, &name_len) != 0) {
        return SLUICE_EPROTO;
      }
      d->mode = mode_from_name(name, name_len);
    } else if (mp_skip(r) != 0) {
      return SLUICE_EPROTO;
    }
  }
  return saw_allowed ? 0 : SLUICE_EPROTO;
}

static int parse_decision(mp_reader* r, sluice_decision* d) {
  return parse_decision_extras(r, d, NULL);
}

/* ---- synchronous calls --------------------------------------------------------- */

/* Starts a synchronous call: no pipelined request may be in flight. */
static int sync_begin(sluice_client* c) {
  if (c == NULL) {
    return SLUICE_EINVAL;
  }
  clear_server_error(c);
  return c->in_flight > 0 ? SLUICE_EBUSY : 0;
}

/* Sends the one queued request and waits for its answer; on return `r` is at
 * the result. Any failure but SLUICE_ESERVER closes the connection, so a late
 * answer can never be taken for the next call's. */
static int sync_exchange(sluice_client* c, int64_t deadline_ms, uint32_t msgid, mp_reader* r) {
  const uint8_t* frame;
  size_t len;
  uint32_t got_id;
  int status = 0;
  int rc = flush_until(c, deadline_ms);
  while (rc == 0 && (rc = next_frame(c, deadline_ms, &frame, &len)) == 0 &&
         is_notification(frame, len)) {
    continue; /* not an answer: wait for the one to this request */
  }
  if (rc == 0) {
    rc = parse_response(c, frame, len, r, &got_id, &status);
  }
  if (rc == 0 && got_id != msgid) {
    rc = SLUICE_EPROTO;
  }
  if (rc != 0) {
    drop_connection(c);
    return rc;
  }
  clear_in_flight(c);
  return status;
}

static int sync_item_call(sluice_client* c, const char* method, size_t method_len,
                          const char* rule, const void* key, size_t key_len, int with_cost,
                          uint32_t cost, int64_t max_wait_ms, int timeout_ms, mp_reader* r) {
  int64_t deadline_ms = deadline_after(timeout_ms);
  uint32_t msgid;
  int rc = sync_begin(c);
  if (rc == 0) {
    rc = queue_item_request(c, method, method_len, rule, key, key_len, with_cost, cost,
                            max_wait_ms, &msgid);
  }
  return rc != 0 ? rc : sync_exchange(c, deadline_ms, msgid, r);
}

int sluice_acquire(sluice_client* c, const char* rule, const void* key, size_t key_len,
                   uint32_t cost, int timeout_ms, sluice_decision* out) {
  mp_reader r;
  if (out == NULL) {
    return SLUICE_EINVAL;
  }
  int rc = sync_item_call(c, SLUICE_METHOD("acquire"), rule, key, key_len, 1, cost, NO_WAIT_GIVEN,
                          timeout_ms, &r);
  return rc != 0 ? rc : parse_decision(&r, out);
}

int sluice_acquire_wait(sluice_client* c, const char* rule, const void* key, size_t key_len,
                        uint32_t cost, uint32_t max_wait_ms, int timeout_ms, sluice_decision* out,
                        int64_t* waited_ms) {
  mp_reader r;
  int64_t ignored = 0;
  if (out == NULL) {
    return SLUICE_EINVAL;
  }
  int rc = sync_item_call(c, SLUICE_METHOD("acquire"), rule, key, key_len, 1, cost, max_wait_ms,
                          timeout_ms, &r);
  decision_extras extras = {waited_ms != NULL ? waited_ms : &ignored, NULL, NULL, NULL, NULL};
  return rc != 0 ? rc : parse_decision_extras(&r, out, &extras);
}

/* A [rule, key] call (peek, reset) whose result is a decision map. */
static int key_decision_call(sluice_client* c, const char* method, size_t method_len,
                             const char* rule, const void* key, size_t key_len, int timeout_ms,
                             sluice_decision* out) {
  mp_reader r;
  if (out == NULL) {
    return SLUICE_EINVAL;
  }
  int rc = sync_item_call(c, method, method_len, rule, key, key_len, 0, 0, NO_WAIT_GIVEN,
                          timeout_ms, &r);
  return rc != 0 ? rc : parse_decision(&r, out);
}

int sluice_peek(sluice_client* c, const char* rule, const void* key, size_t key_len,
                int timeout_ms, sluice_decision* out) {
  return key_decision_call(c, SLUICE_METHOD("peek"), rule, key, key_len, timeout_ms, out);
}

int sluice_reset(sluice_client* c, const char* rule, const void* key, size_t key_len,
                 int timeout_ms, sluice_decision* out) {
  return key_decision_call(c, SLUICE_METHOD("reset"), rule, key, key_len, timeout_ms, out);
}

int sluice_release(sluice_client* c, const char* rule, const void* key, size_t key_len,
                   uint32_t cost, int timeout_ms, sluice_decision* out) {
  mp_reader r;
  sluice_decision ignored;
  int rc = sync_item_call(c, SLUICE_METHOD("release"), rule, key, key_len, 1, cost, NO_WAIT_GIVEN,
                          timeout_ms, &r);
  if (rc != 0) {
    return rc;
  }
  if (out == NULL) {
    out = &ignored;
  }
  if (parse_decision(&r, out) != 0) {
    /* The contract leaves release's result open: anything else means done. */
    memset(out, 0, sizeof *out);
    out->allowed = 1;
  }
  return 0;
}

int sluice_reserve(sluice_client* c, const char* rule, const void* key, size_t key_len,
                   uint32_t estimate, uint32_t ttl_ms, int timeout_ms, sluice_decision* out,
                   uint64_t* id) {
  mp_reader r;
  uint64_t got = 0;
  if (out == NULL || id == NULL || estimate == 0) {
    return SLUICE_EINVAL;
  }
  *id = 0;
  /* [rule, key, estimate, ttl_ms]: the item's shape, its fourth field the TTL. */
  int rc = sync_item_call(c, SLUICE_METHOD("reserve"), rule, key, key_len, 1, estimate,
                          ttl_ms > 0 ? (int64_t)ttl_ms : SLUICE_DEFAULT_TTL_MS, timeout_ms, &r);
  decision_extras extras = {NULL, &got, NULL, NULL, NULL};
  if (rc == 0) {
    rc = parse_decision_extras(&r, out, &extras);
  }
  if (rc == 0) {
    *id = out->allowed ? got : 0;
  }
  return rc;
}

/* settle [id, actual] or cancel [id]; the answer is a decision map with
 * refunded, debt and unpaid. */
static int settle_call(sluice_client* c, const char* method, size_t method_len, uint64_t id,
                       int with_actual, uint32_t actual, int timeout_ms, sluice_decision* out,
                       int64_t* refunded, int64_t* debt, int64_t* unpaid) {
  int64_t deadline_ms = deadline_after(timeout_ms);
  int64_t ignored_refunded = 0, ignored_debt = 0, ignored_unpaid = 0;
  uint32_t msgid;
  mp_reader r;
  sluice_decision ignored;
  int rc = sync_begin(c);
  if (rc != 0) {
    return rc;
  }
  if (id == 0) {
    return SLUICE_EINVAL;
  }
  uint8_t* p = begin_request(c, method, method_len, 3 * MP_MAX_HEADER, &msgid);
  if (p == NULL) {
    return SLUICE_ENOMEM;
  }
  p = mp_put_array(p, with_actual ? 2 : 1);
  p = mp_put_uint(p, id);
  if (with_actual) {
    p = mp_put_uint(p, actual);
  }
  finish_request(c, p, msgid);
  rc = sync_exchange(c, deadline_ms, msgid, &r);
  if (rc != 0) {
    return rc;
  }
  decision_extras extras = {NULL, NULL, refunded != NULL ? refunded : &ignored_refunded,
                            debt != NULL ? debt : &ignored_debt,
                            unpaid != NULL ? unpaid : &ignored_unpaid};
  *extras.refunded = 0;
  *extras.debt = 0;
  *extras.unpaid = 0;
  return parse_decision_extras(&r, out != NULL ? out : &ignored, &extras);
}

int sluice_settle(sluice_client* c, uint64_t id, uint32_t actual, int timeout_ms,
                  sluice_decision* out, int64_t* refunded, int64_t* debt) {
  return settle_call(c, SLUICE_METHOD("settle"), id, 1, actual, timeout_ms, out, refunded, debt,
                     NULL);
}

int sluice_settle_with_unpaid(sluice_client* c, uint64_t id, uint32_t actual, int timeout_ms,
                              sluice_decision* out, int64_t* refunded, int64_t* debt,
                              int64_t* unpaid) {
  return settle_call(c, SLUICE_METHOD("settle"), id, 1, actual, timeout_ms, out, refunded, debt,
                     unpaid);
}

int sluice_cancel(sluice_client* c, uint64_t id, int timeout_ms, sluice_decision* out,
                  int64_t* refunded) {
  return settle_call(c, SLUICE_METHOD("cancel"), id, 0, 0, timeout_ms, out, refunded, NULL, NULL);
}

int sluice_acquire_all(sluice_client* c, const sluice_item* items, size_t count, int timeout_ms,
                       int* all_allowed, sluice_decision* results) {
  int64_t deadline_ms = deadline_after(timeout_ms);
  if (c == NULL || items == NULL || count == 0 || count > UINT32_MAX || all_allowed == NULL) {
    return SLUICE_EINVAL;
  }
  size_t params_bytes = 2 * MP_MAX_HEADER;
  for (size_t i = 0; i < count; i++) {
    size_t rule_len = items[i].rule != NULL ? strlen(items[i].rule) : 0;
    if (!item_valid(items[i].rule, rule_len, items[i].key, items[i].key_len)) {
      return SLUICE_EINVAL;
    }
    params_bytes += item_bytes(rule_len, items[i].key_len);
  }
  int rc = sync_begin(c);
  if (rc != 0) {
    return rc;
  }
  uint32_t msgid;
  uint8_t* p = begin_request(c, SLUICE_METHOD("acquire_all"), params_bytes, &msgid);
  if (p == NULL) {
    return SLUICE_ENOMEM;
  }
  p = mp_put_array(p, 1);
  p = mp_put_array(p, (uint32_t)count);
  for (size_t i = 0; i < count; i++) {
    p = put_item(p, items[i].rule, strlen(items[i].rule), items[i].key, items[i].key_len, 1,
                 items[i].cost, NO_WAIT_GIVEN);
  }
  finish_request(c, p, msgid);

  mp_reader r;
  rc = sync_exchange(c, deadline_ms, msgid, &r);
  if (rc != 0) {
    return rc;
  }
  mp_value v;
  int saw_allowed = 0, saw_results = 0;
  if (mp_read(&r, &v) != 0 || v.type != MP_MAP) {
    return SLUICE_EPROTO;
  }
  for (uint32_t i = 0; i < v.v.count; i++) {
    const uint8_t* key;
    uint32_t key_len;
    mp_value field;
    if (mp_read_bytes(&r, &key, &key_len) != 0) {
      return SLUICE_EPROTO;
    }
    if (MP_BYTES_ARE(key, key_len, "allowed")) {
      if (mp_read(&r, &field) != 0 || field.type != MP_BOOL) {
        return SLUICE_EPROTO;
      }
      *all_allowed = field.v.boolean;
      saw_allowed = 1;
    } else if (MP_BYTES_ARE(key, key_len, "results")) {
      if (mp_read(&r, &field) != 0 || field.type != MP_ARRAY || field.v.count != count) {
        return SLUICE_EPROTO;
      }
      for (size_t k = 0; k < count; k++) {
        sluice_decision ignored;
        if (parse_decision(&r, results ? &results[k] : &ignored) != 0) {
          return SLUICE_EPROTO;
        }
      }
      saw_results = 1;
    } else if (mp_skip(&r) != 0) {
      return SLUICE_EPROTO;
    }
  }
  return saw_allowed && saw_results ? 0 : SLUICE_EPROTO;
}

static int sync_plain_call(sluice_client* c, const char* method, int timeout_ms, mp_reader* r) {
  int64_t deadline_ms = deadline_after(timeout_ms);
  if (method == NULL) {
    return SLUICE_EINVAL;
  }
  int rc = sync_begin(c);
  if (rc != 0) {
    return rc;
  }
  uint32_t msgid;
  uint8_t* p = begin_request(c, method, strlen(method), 1, &msgid);
  if (p == NULL) {
    return SLUICE_ENOMEM;
  }
  finish_request(c, mp_put_array(p, 0), msgid);
  return sync_exchange(c, deadline_ms, msgid, r);
}

int sluice_health(sluice_client* c, int timeout_ms, sluice_health_info* out) {
  mp_reader r;
  mp_value v;
  if (out == NULL) {
    return SLUICE_EINVAL;
  }
  memset(out, 0, sizeof *out);
  int rc = sync_plain_call(c, "health", timeout_ms, &r);
  if (rc != 0) {
    return rc;
  }
  if (mp_read(&r, &v) != 0 || v.type != MP_MAP) {
    return SLUICE_EPROTO;
  }
  for (uint32_t i = 0; i < v.v.count; i++) {
    const uint8_t* key;
    uint32_t key_len;
    const uint8_t* text;
    uint32_t text_len;
    if (mp_read_bytes(&r, &key, &key_len) != 0) {
      return SLUICE_EPROTO;
    }
    char* field = MP_BYTES_ARE(key, key_len, "status")  ? out->status
                  : MP_BYTES_ARE(key, key_len, "redis") ? out->redis
                                                          : NULL;
    if (field == NULL) {
      if (mp_skip(&r) != 0) {
        return SLUICE_EPROTO;
      }
    } else if (mp_read_bytes(&r, &text, &text_len) == 0) {
      copy_text(field, sizeof out->status, text, text_len);
    } else {
      return SLUICE_EPROTO;
    }
  }
  return out->status[0] != '\0' ? 0 : SLUICE_EPROTO;
}

int sluice_call_json(sluice_client* c, const char* method, int timeout_ms, char** json_out) {
  mp_reader r;
  if (json_out == NULL) {
    return SLUICE_EINVAL;
  }
  *json_out = NULL;
  int rc = sync_plain_call(c, method, timeout_ms, &r);
  if (rc != 0) {
    return rc;
  }
  sluice_buf json = {0};
  if (sluice_json_append(&r, &json, 0) != 0) {
    sluice_buf_free(&json);
    return SLUICE_EPROTO;
  }
  sluice_buf_append(&json, "", 1);
  if (json.failed) {
    sluice_buf_free(&json);
    return SLUICE_ENOMEM;
  }
  *json_out = (char*)json.data;
  return 0;
}

/* ---- pipelined calls ------------------------------------------------------------ */

int sluice_send_acquire(sluice_client* c, const char* rule, const void* key, size_t key_len,
                        uint32_t cost, uint32_t* msgid_out) {
  uint32_t msgid;
  int rc = queue_item_request(c, SLUICE_METHOD("acquire"), rule, key, key_len, 1, cost,
                              NO_WAIT_GIVEN, &msgid);
  if (rc == 0 && msgid_out != NULL) {
    *msgid_out = msgid;
  }
  return rc;
}

int sluice_send_peek(sluice_client* c, const char* rule, const void* key, size_t key_len,
                     uint32_t* msgid_out) {
  uint32_t msgid;
  int rc = queue_item_request(c, SLUICE_METHOD("peek"), rule, key, key_len, 0, 0,
                              NO_WAIT_GIVEN, &msgid);
  if (rc == 0 && msgid_out != NULL) {
    *msgid_out = msgid;
  }
  return rc;
}

int sluice_flush(sluice_client* c, int timeout_ms) {
  if (c == NULL) {
    return SLUICE_EINVAL;
  }
  int rc = flush_until(c, deadline_after(timeout_ms));
  if (rc != 0 && rc != SLUICE_ETIMEDOUT) {
    drop_connection(c);
  }
  return rc;
}

/* Decodes a pipelined response, [1, msgid, error, result], from the start of
 * data[0, len) into *out; on success returns the bytes it took (the frame's
 * length, as every element is read whole), else 0: then the bytes are an
 * incomplete frame, not MessagePack, too large, or a frame of another shape
 * (`out` and the handle's error texts may hold a partial result). */
static size_t decode_response(sluice_client* c, const uint8_t* data, size_t len,
                              sluice_response* out) {
  mp_reader r;
  if (parse_response(c, data, len, &r, &out->msgid, &out->status) != 0) {
    return 0;
  }
  memset(&out->decision, 0, sizeof out->decision);
  if (out->status == 0 ? parse_decision(&r, &out->decision) != 0 : mp_skip(&r) != 0) {
    return 0;
  }
  return (size_t)(r.p - data);
}

/* Takes the response at the head of `in` into *out. Returns 1 when one was
 * complete, 0 when more bytes are needed, else SLUICE_EPROTO or
 * SLUICE_ETOOLARGE (the connection is then unusable).
 *
 * One pass on the hot path: decode_response() reads the frame straight from
 * `in`, bounded by the bytes buffered and by SLUICE_MAX_RESPONSE_BYTES, and
 * where it succeeds the frame was complete and within the cap. Only when it
 * fails does mp_frame_size() say why, with the exact rules of next_frame():
 * incomplete, not MessagePack, too large (declared lengths included), or
 * complete but shaped otherwise, which is decoded again within the frame to
 * give that response its status, as a synchronous call would. */
static int take_response(sluice_client* c, sluice_response* out) {
  const uint8_t* start;
  size_t size;
  sluice_response got;
next:
  start = c->in.data + c->in_pos;
  size_t avail = c->in.len - c->in_pos;
  size_t bound = avail < SLUICE_MAX_RESPONSE_BYTES ? avail : SLUICE_MAX_RESPONSE_BYTES;
  size = avail > 0 ? decode_response(c, start, bound, &got) : 0;
  if (size == 0) {
    int rc = mp_frame_size(start, avail, SLUICE_MAX_RESPONSE_BYTES, &size);
    if (rc != 1) {
      clear_server_error(c); /* a partial frame's error texts are no answer */
      return rc == 0 ? 0 : rc == -1 ? SLUICE_EPROTO : SLUICE_ETOOLARGE;
    }
    if (is_notification(start, size)) {
      consume_input(c, size);
      goto next;
    }
    mp_reader r;
    if (parse_response(c, start, size, &r, &got.msgid, &got.status) != 0) {
      return SLUICE_EPROTO;
    }
    memset(&got.decision, 0, sizeof got.decision);
    if (got.status == 0) {
      got.status = parse_decision(&r, &got.decision);
    }
  }
  consume_input(c, size);
  *out = got;
  return 1;
}

/* Reads what has already arrived, without waiting: after a failed write,
 * the daemon's last answers may still be waiting in the socket. */
static void drain_input(sluice_client* c) {
  while (c->fd >= 0 && c->in.len - c->in_pos < SLUICE_MAX_BUFFERED_INPUT_BYTES) {
    size_t before = c->in.len - c->in_pos;
    if (read_some(c) != 0 || c->in.len - c->in_pos == before) {
      return;
    }
  }
}

/* The loop hands out every complete response already buffered before it
 * writes, waits or reports a connection error: it reads only while nothing
 * complete is buffered (so `in` holds at most one partial frame plus a
 * read), and then reads without limit, so the daemon, blocked on sending
 * answers, always gets to take more requests. Writes never wait on their
 * own; poll() waits for either direction. */
int sluice_recv(sluice_client* c, int timeout_ms, sluice_response* out) {
  if (c == NULL || out == NULL || c->in_flight == 0) {
    return SLUICE_EINVAL;
  }
  clear_server_error(c);
  int64_t deadline_ms = 0;
  int have_deadline = 0;
  int reconnects_left = 1;
  int failed = 0; /* a connection error, reported once nothing is buffered */
  for (;;) {
    int rc = take_response(c, out);
    if (rc == 1) {
      if (pending_take(c, out->msgid) != 0) {
        /* Answers nothing in flight (unknown or duplicate): only this reply
         * is wrong, the connection and the requests in flight are fine. */
        clear_server_error(c);
        return SLUICE_EPROTO;
      }
      return 0;
    }
    if (rc == 0 && failed != 0) {
      rc = failed;
    }
    if (rc != 0) {
      drop_connection(c);
      return rc;
    }
    if (!have_deadline) {
      /* With an answer buffered the loop got no further: no clock read. */
      deadline_ms = deadline_after(timeout_ms);
      have_deadline = 1;
    }
    rc = write_now(c, deadline_ms, &reconnects_left);
    if (rc == 0) {
      rc = c->fd < 0 ? SLUICE_ECLOSED : pump(c, deadline_ms, 1);
    }
    if (rc == SLUICE_ETIMEDOUT) {
      return rc;
    }
    if (rc != 0) {
      drain_input(c);
      failed = rc;
    }
  }
}
