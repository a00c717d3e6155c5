/* echo_server: the bare Unix-socket reference that bench/run.sh measures
 * next to sluiced.
 *
 * It does what sluiced does minus the decision: the same threading (the main
 * thread's loop accepts, hands each connection to the worker with the fewest,
 * and N workers each run their own libuv loop) and the same I/O pattern per
 * connection (64 KiB reads; the answers to one read go out together in one
 * uv_try_write, with at most one uv_write in flight). For every
 * `request_bytes` received it answers `response_bytes`, so a client that
 * sends blobs the size of a real acquire request gets blobs the size of a
 * real acquire response.
 *
 *   echo_server SOCKET_PATH REQUEST_BYTES RESPONSE_BYTES WORKERS
 *   echo_server --rpc SOCKET_PATH RESPONSE_HEX WORKERS
 *
 * --rpc (the `rpc-echo` reference): the client is libsluice, as for sluiced,
 * and for every complete MessagePack-RPC request frame read the server writes
 * back RESPONSE_HEX, a real acquire response of sluiced ([1, msgid, nil,
 * decision map], as `load sizes` prints it), with the request's msgid bytes
 * spliced in: both ends encode a msgid in its shortest form, so the answer
 * has exactly the size and bytes sluiced would send. Finding a frame's end
 * and its msgid is a minimal, bounded MessagePack walk of the one shape the
 * bench sends, [0, msgid, method, fixarray of scalars or strings]; anything
 * else, or a frame over MAX_FRAME_BYTES, closes the connection. No hashing,
 * no tables, no allocation per request: this is a floor, not a second daemon.
 *
 * Thread model: the main thread owns the listening socket and pushes accepted
 * descriptors onto a worker's inbox (guarded by the worker's mutex) and wakes
 * it with uv_async_send; everything else of a connection belongs to its
 * worker's loop. It runs until killed; SIGTERM ends it with the default
 * action, which is all a benchmark reference needs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#define READ_CHUNK_BYTES (64 * 1024)
#define INBOX_CAPACITY 1024
/* --rpc: the longest request frame; one that straddles two reads is gathered
 * in a buffer of this size. */
#define MAX_FRAME_BYTES 512

typedef struct buffer {
  char* data;
  size_t len;
  size_t cap;
} buffer;

typedef struct worker worker;

typedef struct connection {
  uv_pipe_t pipe;
  uv_write_t write_req;
  worker* owner;
  char input[READ_CHUNK_BYTES];
  size_t partial_bytes; /* bytes of an unfinished request blob */
  unsigned char carry[MAX_FRAME_BYTES]; /* --rpc: an unfinished request frame */
  size_t carry_len;
  buffer output;        /* answers gathered while a write is in flight */
  buffer writing;       /* the answers of the write in flight */
  int write_in_flight;
  int closing;
} connection;

struct worker {
  pthread_t thread;
  uv_loop_t loop;
  uv_async_t wakeup;
  pthread_mutex_t mutex; /* guards inbox and inbox_len */
  int inbox[INBOX_CAPACITY];
  size_t inbox_len;
  size_t connections; /* written by the main thread only */
};

static size_t request_bytes;
static size_t response_bytes;
/* --rpc: the canned answer is 0x94 0x01, the request's msgid, then rpc_tail
 * (nil, the decision map). */
static int rpc_mode;
static unsigned char* rpc_tail;
static size_t rpc_tail_len;
static worker* workers;
static size_t worker_count;
static int listen_fd;

static void die(const char* what, int err) {
  fprintf(stderr, "echo_server: %s: %s\n", what, strerror(err));
  exit(1);
}

static void buffer_grow(buffer* b, size_t extra) {
  if (b->len + extra <= b->cap) {
    return;
  }
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->len + extra) {
    cap *= 2;
  }
  b->data = realloc(b->data, cap);
  if (b->data == NULL) {
    die("realloc", ENOMEM);
  }
  b->cap = cap;
}

static void on_close(uv_handle_t* handle) {
  connection* c = handle->data;
  free(c->output.data);
  free(c->writing.data);
  free(c);
}

static void connection_close(connection* c) {
  if (!c->closing) {
    c->closing = 1;
    uv_close((uv_handle_t*)&c->pipe, on_close);
  }
}

static void on_write(uv_write_t* req, int status);

/* Sends what is gathered: now if the socket takes it, else by one uv_write. */
static void connection_flush(connection* c) {
  if (c->closing || c->write_in_flight || c->output.len == 0) {
    return;
  }
  buffer swap = c->writing;
  c->writing = c->output;
  c->output = swap;
  c->output.len = 0;
  uv_buf_t buf = uv_buf_init(c->writing.data, (unsigned int)c->writing.len);
  int written = uv_try_write((uv_stream_t*)&c->pipe, &buf, 1);
  if (written == (int)c->writing.len) {
    c->writing.len = 0;
    return;
  }
  if (written < 0 && written != UV_EAGAIN) {
    connection_close(c);
    return;
  }
  size_t offset = written > 0 ? (size_t)written : 0;
  buf = uv_buf_init(c->writing.data + offset, (unsigned int)(c->writing.len - offset));
  if (uv_write(&c->write_req, (uv_stream_t*)&c->pipe, &buf, 1, on_write) != 0) {
    connection_close(c);
    return;
  }
  c->write_in_flight = 1;
}

static void on_write(uv_write_t* req, int status) {
  connection* c = req->data;
  c->write_in_flight = 0;
  c->writing.len = 0;
  if (c->closing) {
    return;
  }
  if (status < 0) {
    connection_close(c);
    return;
  }
  connection_flush(c);
}

static void on_alloc(uv_handle_t* handle, size_t suggested, uv_buf_t* buf) {
  (void)suggested;
  connection* c = handle->data;
  *buf = uv_buf_init(c->input, sizeof c->input);
}

/* --rpc: the size of the scalar or string at p: > 0, 0 when it does not
 * fully fit before `end` yet, -1 when it is none the bench sends. */
static long item_len(const unsigned char* p, const unsigned char* end) {
  if (p >= end) {
    return 0;
  }
  unsigned char b = p[0];
  long len;
  if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
    len = 1; /* fixint, nil, bool */
  } else if (b >= 0xa0 && b <= 0xbf) {
    len = 1 + (b & 0x1f); /* fixstr */
  } else if (b == 0xcc || b == 0xd0) {
    len = 2;
  } else if (b == 0xcd || b == 0xd1) {
    len = 3;
  } else if (b == 0xce || b == 0xd2) {
    len = 5;
  } else if (b == 0xcf || b == 0xd3) {
    len = 9;
  } else if (b == 0xd9 || b == 0xc4) { /* str 8, bin 8 */
    if (end - p < 2) {
      return 0;
    }
    len = 2 + p[1];
  } else if (b == 0xda || b == 0xc5) { /* str 16, bin 16 */
    if (end - p < 3) {
      return 0;
    }
    len = 3 + ((long)p[1] << 8 | p[2]);
  } else {
    return -1;
  }
  if (len > MAX_FRAME_BYTES) {
    return -1;
  }
  return end - p >= len ? len : 0;
}

/* --rpc: the length of the request frame at p (0: not all there yet; -1: not
 * a frame of the bench's shape), and where its msgid is. */
static long frame_len(const unsigned char* p, const unsigned char* end,
                      const unsigned char** msgid, long* msgid_len) {
  const unsigned char* q = p + 2;
  long n;
  if (end - p < 2) {
    return 0;
  }
  if (p[0] != 0x94 || p[1] != 0x00) { /* [0, ... */
    return -1;
  }
  if ((n = item_len(q, end)) <= 0) {
    return n;
  }
  if (q[0] > 0x7f && (q[0] < 0xcc || q[0] > 0xcf)) { /* msgid: an unsigned int */
    return -1;
  }
  *msgid = q;
  *msgid_len = n;
  q += n;
  if ((n = item_len(q, end)) <= 0) { /* method */
    return n;
  }
  q += n;
  if (q >= end) {
    return 0;
  }
  if ((q[0] & 0xf0) != 0x90) { /* params: a fixarray */
    return -1;
  }
  for (unsigned count = *q++ & 0x0f; count > 0; count--) {
    if ((n = item_len(q, end)) <= 0) {
      return n;
    }
    q += n;
  }
  return q - p;
}

/* --rpc: queues the canned answer to the request with this msgid. */
static void rpc_answer(connection* c, const unsigned char* msgid, long msgid_len) {
  buffer_grow(&c->output, 2 + (size_t)msgid_len + rpc_tail_len);
  char* out = c->output.data + c->output.len;
  out[0] = (char)0x94;
  out[1] = 0x01;
  memcpy(out + 2, msgid, (size_t)msgid_len);
  memcpy(out + 2 + msgid_len, rpc_tail, rpc_tail_len);
  c->output.len += 2 + (size_t)msgid_len + rpc_tail_len;
}

/* --rpc: answers every complete frame of this read; a frame cut by the end of
 * the read waits in c->carry for the rest. */
static void rpc_on_read(connection* c, const unsigned char* in, size_t len) {
  const unsigned char* p = in;
  const unsigned char* end = in + len;
  const unsigned char* msgid;
  long msgid_len, n;
  size_t before = c->output.len;
  if (c->carry_len > 0) {
    size_t take = len < MAX_FRAME_BYTES - c->carry_len ? len : MAX_FRAME_BYTES - c->carry_len;
    memcpy(c->carry + c->carry_len, in, take);
    n = frame_len(c->carry, c->carry + c->carry_len + take, &msgid, &msgid_len);
    if (n < 0 || (n == 0 && c->carry_len + take == MAX_FRAME_BYTES)) {
      connection_close(c);
      return;
    }
    if (n == 0) {
      c->carry_len += take;
      return;
    }
    rpc_answer(c, msgid, msgid_len);
    p += (size_t)n - c->carry_len;
    c->carry_len = 0;
  }
  while (p < end) {
    n = frame_len(p, end, &msgid, &msgid_len);
    if (n < 0 || (n == 0 && end - p >= MAX_FRAME_BYTES)) {
      connection_close(c);
      return;
    }
    if (n == 0) {
      memcpy(c->carry, p, (size_t)(end - p));
      c->carry_len = (size_t)(end - p);
      break;
    }
    rpc_answer(c, msgid, msgid_len);
    p += n;
  }
  if (c->output.len > before) {
    connection_flush(c);
  }
}

static void on_read(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
  (void)buf;
  connection* c = stream->data;
  if (nread < 0) {
    connection_close(c);
    return;
  }
  if (rpc_mode) {
    rpc_on_read(c, (const unsigned char*)c->input, (size_t)nread);
    return;
  }
  c->partial_bytes += (size_t)nread;
  size_t answers = c->partial_bytes / request_bytes;
  c->partial_bytes %= request_bytes;
  if (answers > 0) {
    buffer_grow(&c->output, answers * response_bytes);
    memset(c->output.data + c->output.len, 0x5a, answers * response_bytes);
    c->output.len += answers * response_bytes;
    connection_flush(c);
  }
}

static void on_wakeup(uv_async_t* handle) {
  worker* w = handle->data;
  int fds[INBOX_CAPACITY];
  size_t count;
  pthread_mutex_lock(&w->mutex);
  count = w->inbox_len;
  memcpy(fds, w->inbox, count * sizeof fds[0]);
  w->inbox_len = 0;
  pthread_mutex_unlock(&w->mutex);
  for (size_t i = 0; i < count; i++) {
    connection* c = calloc(1, sizeof *c);
    if (c == NULL) {
      die("calloc", ENOMEM);
    }
    c->owner = w;
    uv_pipe_init(&w->loop, &c->pipe, 0);
    c->pipe.data = c;
    c->write_req.data = c;
    if (uv_pipe_open(&c->pipe, fds[i]) != 0 ||
        uv_read_start((uv_stream_t*)&c->pipe, on_alloc, on_read) != 0) {
      connection_close(c);
    }
  }
}

static void* worker_main(void* arg) {
  worker* w = arg;
  uv_run(&w->loop, UV_RUN_DEFAULT);
  return NULL;
}

static void on_acceptable(uv_poll_t* handle, int status, int events) {
  (void)handle;
  (void)status;
  (void)events;
  for (;;) {
    int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) {
        continue;
      }
      return;
    }
    worker* least = &workers[0];
    for (size_t i = 1; i < worker_count; i++) {
      if (workers[i].connections < least->connections) {
        least = &workers[i];
      }
    }
    pthread_mutex_lock(&least->mutex);
    if (least->inbox_len == INBOX_CAPACITY) {
      close(fd);
    } else {
      least->inbox[least->inbox_len++] = fd;
      least->connections++;
    }
    pthread_mutex_unlock(&least->mutex);
    uv_async_send(&least->wakeup);
  }
}

/* --rpc: splits a real response, [1, msgid, nil, result] in hex, into what
 * goes before and after the msgid; 0 when it has another shape. */
static int rpc_template(const char* hex) {
  size_t len = strlen(hex) / 2;
  unsigned char* bytes = malloc(len + 1);
  if (bytes == NULL || strlen(hex) % 2 != 0) {
    return 0;
  }
  for (size_t i = 0; i < len; i++) {
    unsigned value;
    if (sscanf(hex + 2 * i, "%2x", &value) != 1) {
      return 0;
    }
    bytes[i] = (unsigned char)value;
  }
  if (len < 4 || bytes[0] != 0x94 || bytes[1] != 0x01) {
    return 0;
  }
  long msgid_len = item_len(bytes + 2, bytes + len);
  if (msgid_len <= 0 || 2 + (size_t)msgid_len >= len || bytes[2 + msgid_len] != 0xc0) {
    return 0;
  }
  rpc_tail = bytes + 2 + msgid_len;
  rpc_tail_len = len - 2 - (size_t)msgid_len;
  response_bytes = len;
  return 1;
}

int main(int argc, char** argv) {
  rpc_mode = argc > 1 && strcmp(argv[1], "--rpc") == 0;
  if (argc != 5) {
    fprintf(stderr,
            "usage: echo_server SOCKET_PATH REQUEST_BYTES RESPONSE_BYTES WORKERS\n"
            "       echo_server --rpc SOCKET_PATH RESPONSE_HEX WORKERS\n");
    return 2;
  }
  /* A client that goes away mid-write must not kill the server. */
  signal(SIGPIPE, SIG_IGN);
  const char* path = argv[1 + rpc_mode];
  if (rpc_mode) {
    request_bytes = 1; /* unused */
    if (!rpc_template(argv[3])) {
      fprintf(stderr, "echo_server: RESPONSE_HEX is not a [1, msgid, nil, result] response\n");
      return 2;
    }
  } else {
    request_bytes = strtoul(argv[2], NULL, 10);
    response_bytes = strtoul(argv[3], NULL, 10);
  }
  worker_count = strtoul(argv[4], NULL, 10);
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  if (request_bytes == 0 || response_bytes == 0 || worker_count == 0 ||
      strlen(path) >= sizeof addr.sun_path) {
    fprintf(stderr, "echo_server: bad arguments\n");
    return 2;
  }
  strcpy(addr.sun_path, path);
  unlink(path);
  listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd < 0 || bind(listen_fd, (struct sockaddr*)&addr, sizeof addr) != 0 ||
      listen(listen_fd, 1024) != 0) {
    die(path, errno);
  }

  workers = calloc(worker_count, sizeof *workers);
  if (workers == NULL) {
    die("calloc", ENOMEM);
  }
  for (size_t i = 0; i < worker_count; i++) {
    worker* w = &workers[i];
    pthread_mutex_init(&w->mutex, NULL);
    uv_loop_init(&w->loop);
    uv_async_init(&w->loop, &w->wakeup, on_wakeup);
    w->wakeup.data = w;
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
      die("pthread_create", errno);
    }
  }

  uv_loop_t loop;
  uv_poll_t listener;
  uv_loop_init(&loop);
  uv_poll_init(&loop, &listener, listen_fd);
  uv_poll_start(&listener, UV_READABLE, on_acceptable);
  if (rpc_mode) {
    printf("echo_server: serving %s (rpc: each request frame -> a %zu-byte acquire response, %zu workers)\n",
           path, response_bytes, worker_count);
  } else {
    printf("echo_server: serving %s (%zu -> %zu bytes, %zu workers)\n", path, request_bytes,
           response_bytes, worker_count);
  }
  fflush(stdout);
  return uv_run(&loop, UV_RUN_DEFAULT);
}
