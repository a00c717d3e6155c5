// load: the load generator of bench/run.sh, over libsluice, and the client of
// the echo reference (bench/echo_server.c) that it is compared with.
//
//   load sizes SOCKET RULE
//       Prints "request_bytes=R response_bytes=S response_hex=H": R is what
//       libsluice writes for one acquire of an 8-byte key (captured on a
//       socket of our own, at a msgid past 65535 as in a long run), S what
//       the daemon on SOCKET answers to exactly those bytes, H that answer
//       (the canned response of `echo_server --rpc`).
//   load sync SOCKET RULE KEYS [SECONDS]
//       One connection, one sluice_acquire at a time; every latency recorded.
//   load pipelined SOCKET RULE KEYS CONNECTIONS WINDOW [SECONDS]
//       CONNECTIONS threads, each with its own handle keeping WINDOW/2 to
//       WINDOW acquires in flight (sluice_send_acquire / sluice_recv).
//   load warm SOCKET RULE KEYS CONNECTIONS WINDOW
//       Sends one acquire for each of the KEYS keys, then exits.
//   load echo-sync SOCKET R S [SECONDS]
//   load echo-pipelined SOCKET R S CONNECTIONS WINDOW [SECONDS]
//       The same two shapes against echo_server with raw read()/write():
//       R-byte requests, S-byte answers. (`echo_server --rpc`, which answers
//       real requests with real responses, is driven by sync and pipelined,
//       like the daemon.)
//   load evalsha-sync HOST:PORT SCRIPT LIMIT/PERIOD_MS/BURST KEYS [SECONDS]
//   load evalsha-pipelined HOST:PORT SCRIPT LIMIT/PERIOD_MS/BURST KEYS
//                          CONNECTIONS WINDOW [SECONDS]
//       The baseline of the global-path benchmark (bench/global.sh): the same
//       two shapes, each decision one EVALSHA of the rate script SCRIPT
//       (lua/token_bucket.lua: the text sluiced embeds for that file name)
//       straight to Redis, over hiredis.
//
// KEYS is "hot" (one key) or a count N of distinct keys, visited in a fixed
// pseudo-random order that covers all N before repeating. Every key is
// KEY_LEN = 8 bytes ("hot00000", "k0000042").
//
// A measurement runs for a warm-up (kWarmupSeconds), then SECONDS (default 3)
// during which it counts, and prints one line of key=value pairs:
// rate_per_s, p50_us, p99_us, p999_us (sync modes only), n (answers counted),
// allowed, denied, errors (these three include the warm-up), client_cpus and
// server_cpus (CPUs used, the server's read from /proc/$BENCH_SERVER_PID).
// Latencies are CLOCK_MONOTONIC around each whole call.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <hiredis/hiredis.h>

#include "scripts.h"
#include "sluice.h"

namespace {

constexpr double kWarmupSeconds = 0.5;
constexpr double kDefaultSeconds = 3.0;
constexpr size_t kKeyLen = 8;
// Coprime with any N we use (it is prime and larger than them), so
// i * kKeyStride mod N visits every key once per N requests, in an order that
// does not follow the daemon's allocation order.
constexpr uint64_t kKeyStride = 1'000'003;
constexpr int kConnectTimeoutMs = 2000;

int64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "load: %s\n", what.c_str());
  std::exit(1);
}

// CPU seconds used so far by process `pid` (all its threads), from
// /proc/PID/stat; 0 when it cannot be read. The machine may be shared, so
// every measurement reports how much CPU the client and the server actually
// got next to the rate they reached.
double cpuSeconds(long pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return 0;
  char text[1024];
  size_t len = std::fread(text, 1, sizeof text - 1, f);
  std::fclose(f);
  text[len] = '\0';
  const char* p = std::strrchr(text, ')');  // the command name may hold spaces
  unsigned long long utime = 0, stime = 0;
  if (p == nullptr || std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
                                  &utime, &stime) != 2) {
    return 0;
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// CPU used by this client and by the server ($BENCH_SERVER_PID, when set)
// between start() and the print.
class CpuMeter {
 public:
  CpuMeter() {
    const char* pid = std::getenv("BENCH_SERVER_PID");
    server_pid_ = pid != nullptr ? std::atol(pid) : 0;
  }
  void start() {
    client_ = cpuSeconds(getpid());
    server_ = server_pid_ > 0 ? cpuSeconds(server_pid_) : 0;
  }
  void stop() {
    client_ = cpuSeconds(getpid()) - client_;
    server_ = server_pid_ > 0 ? cpuSeconds(server_pid_) - server_ : 0;
  }
  // " client_cpus=... server_cpus=...": CPUs used on average over `seconds`.
  std::string text(double seconds) const {
    char out[96];
    std::snprintf(out, sizeof out, " client_cpus=%.2f server_cpus=%.2f", client_ / seconds,
                  server_ / seconds);
    return out;
  }

 private:
  long server_pid_ = 0;
  double client_ = 0;
  double server_ = 0;
};

// Chooses the key of each request: one hot key, or N distinct ones.
class Keys {
 public:
  explicit Keys(const std::string& spec) {
    if (spec == "hot") {
      count_ = 0;
    } else {
      count_ = std::strtoull(spec.c_str(), nullptr, 10);
      if (count_ == 0 || count_ >= kKeyStride || count_ > 9'999'999) {
        fail("KEYS is \"hot\" or a count from 1 to 9999999");
      }
    }
  }
  // Writes the key of request number i into out[kKeyLen].
  void key(uint64_t i, char* out) const {
    if (count_ == 0) {
      std::memcpy(out, "hot00000", kKeyLen);
      return;
    }
    uint64_t k = (i * kKeyStride) % count_;
    out[0] = 'k';
    for (size_t d = kKeyLen - 1; d >= 1; --d) {
      out[d] = static_cast<char>('0' + k % 10);
      k /= 10;
    }
  }
  uint64_t count() const { return count_; }

 private:
  uint64_t count_;
};

// What became of one request.
enum class Outcome { kAllowed, kDenied, kError };

Outcome outcomeOf(int rc, const sluice_decision& d) {
  if (rc != 0) return Outcome::kError;
  return d.allowed ? Outcome::kAllowed : Outcome::kDenied;
}

struct Tally {
  uint64_t allowed = 0;
  uint64_t denied = 0;
  uint64_t errors = 0;
  void add(Outcome o) {
    switch (o) {
      case Outcome::kAllowed: ++allowed; break;
      case Outcome::kDenied: ++denied; break;
      case Outcome::kError: ++errors; break;
    }
  }
  void add(const Tally& t) {
    allowed += t.allowed;
    denied += t.denied;
    errors += t.errors;
  }
};

double percentileUs(const std::vector<uint32_t>& sorted_ns, double q) {
  if (sorted_ns.empty()) return 0;
  size_t i = static_cast<size_t>(q * static_cast<double>(sorted_ns.size() - 1));
  return sorted_ns[i] / 1000.0;
}

void printSync(double seconds, std::vector<uint32_t>& latencies_ns, const Tally& t,
               const CpuMeter& cpu) {
  std::sort(latencies_ns.begin(), latencies_ns.end());
  std::printf("rate_per_s=%.0f p50_us=%.2f p99_us=%.2f p999_us=%.2f n=%zu allowed=%llu denied=%llu errors=%llu%s\n",
              static_cast<double>(latencies_ns.size()) / seconds, percentileUs(latencies_ns, 0.50),
              percentileUs(latencies_ns, 0.99), percentileUs(latencies_ns, 0.999),
              latencies_ns.size(), static_cast<unsigned long long>(t.allowed),
              static_cast<unsigned long long>(t.denied), static_cast<unsigned long long>(t.errors),
              cpu.text(seconds).c_str());
}

sluice_client* connectOrDie(const std::string& path) {
  sluice_client* client = nullptr;
  int rc = sluice_connect(path.c_str(), kConnectTimeoutMs, &client);
  if (rc != 0) fail("cannot connect to " + path + ": " + sluice_strerror(rc));
  return client;
}

int rawConnect(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) fail("socket path too long: " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    fail("cannot connect to " + path + ": " + std::strerror(errno));
  }
  return fd;
}

void writeAll(int fd, const char* data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(std::string("write: ") + std::strerror(errno));
    data += n;
    len -= static_cast<size_t>(n);
  }
}

// --- sizes -------------------------------------------------------------------

int runSizes(const std::string& socket_path, const std::string& rule) {
  // Capture what libsluice writes, on a listener of our own.
  std::string capture_path = socket_path + ".cap";
  unlink(capture_path.c_str());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, capture_path.c_str(), capture_path.size() + 1);
  int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(listener, 1) != 0) {
    fail("cannot listen on " + capture_path);
  }
  sluice_client* client = connectOrDie(capture_path);
  int server = accept(listener, nullptr, nullptr);
  unlink(capture_path.c_str());
  // msgids past 65535 take 5 bytes, as they do for all but the first 65535
  // requests of a connection; skip to one.
  constexpr uint32_t kSteadyMsgid = 70'000;
  char key[kKeyLen];
  Keys("hot").key(0, key);
  std::vector<char> request(4096);
  size_t request_len = 0;
  for (uint32_t msgid = 0; msgid < kSteadyMsgid;) {
    if (sluice_send_acquire(client, rule.c_str(), key, kKeyLen, 1, &msgid) != 0 ||
        sluice_flush(client, kConnectTimeoutMs) != 0) {
      fail("capture: send failed");
    }
    ssize_t n = read(server, request.data(), request.size());
    if (n <= 0) fail("capture: read failed");
    request_len = static_cast<size_t>(n);
  }
  sluice_destroy(client);
  close(server);
  close(listener);

  // Send exactly those bytes to the daemon and measure its answer.
  int fd = rawConnect(socket_path);
  writeAll(fd, request.data(), request_len);
  std::vector<char> response(4096);
  pollfd pfd{fd, POLLIN, 0};
  size_t response_len = 0;
  // One small frame arrives in one read; wait briefly for any straggler.
  while (poll(&pfd, 1, response_len == 0 ? kConnectTimeoutMs : 50) == 1) {
    ssize_t n = read(fd, response.data() + response_len, response.size() - response_len);
    if (n <= 0) break;
    response_len += static_cast<size_t>(n);
  }
  close(fd);
  if (response_len == 0) fail("sizes: no answer from " + socket_path);
  std::printf("request_bytes=%zu response_bytes=%zu response_hex=", request_len, response_len);
  for (size_t i = 0; i < response_len; ++i) {
    std::printf("%02x", static_cast<unsigned>(static_cast<unsigned char>(response[i])));
  }
  std::printf("\n");
  return 0;
}

// --- sync --------------------------------------------------------------------

// Calls `once` (one request, waiting for its answer) through the warm-up, then
// for `seconds`, timing each call, and prints the line. 0 when none failed.
int measureSync(double seconds, const std::function<Outcome()>& once) {
  Tally tally;
  int64_t warm_end = nowNs() + static_cast<int64_t>(kWarmupSeconds * 1e9);
  while (nowNs() < warm_end) tally.add(once());
  std::vector<uint32_t> latencies_ns;
  latencies_ns.reserve(static_cast<size_t>(seconds * 2e6));
  CpuMeter cpu;
  cpu.start();
  int64_t start = nowNs();
  int64_t end = start + static_cast<int64_t>(seconds * 1e9);
  int64_t before = start;
  while (before < end) {
    tally.add(once());
    int64_t after = nowNs();
    latencies_ns.push_back(static_cast<uint32_t>(std::min<int64_t>(after - before, UINT32_MAX)));
    before = after;
  }
  cpu.stop();
  printSync(static_cast<double>(before - start) / 1e9, latencies_ns, tally, cpu);
  return tally.errors == 0 ? 0 : 1;
}

int runSync(const std::string& socket_path, const std::string& rule, const Keys& keys,
            double seconds) {
  sluice_client* client = connectOrDie(socket_path);
  char key[kKeyLen];
  sluice_decision decision;
  uint64_t i = 0;
  bool reported = false;
  int status = measureSync(seconds, [&] {
    keys.key(i++, key);
    int rc = sluice_acquire(client, rule.c_str(), key, kKeyLen, 1, -1, &decision);
    if (rc != 0 && !reported) {
      reported = true;
      std::fprintf(stderr, "load: acquire: %s %s\n", sluice_strerror(rc),
                   sluice_server_error_message(client));
    }
    return outcomeOf(rc, decision);
  });
  sluice_destroy(client);
  return status;
}

int runEchoSync(const std::string& socket_path, size_t request_bytes, size_t response_bytes,
                double seconds) {
  int fd = rawConnect(socket_path);
  std::vector<char> request(request_bytes, 'r');
  std::vector<char> response(64 * 1024);
  int status = measureSync(seconds, [&] {
    writeAll(fd, request.data(), request_bytes);
    size_t got = 0;
    while (got < response_bytes) {
      ssize_t n = read(fd, response.data(), response.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("echo read failed");
      got += static_cast<size_t>(n);
    }
    return Outcome::kAllowed;
  });
  close(fd);
  return status;
}

// --- pipelined -----------------------------------------------------------------

// One counter per thread, on its own cache line; only its thread writes it.
struct alignas(64) Counter {
  std::atomic<uint64_t> done{0};
  Tally tally;  // read only after the thread has joined
};

struct Run {
  std::atomic<bool> stop{false};
  std::vector<Counter> counters;
  explicit Run(size_t threads) : counters(threads) {}
  uint64_t total() const {
    uint64_t sum = 0;
    for (const Counter& c : counters) sum += c.done.load(std::memory_order_relaxed);
    return sum;
  }
};

// Keeps between window/2 and `window` acquires in flight on one handle:
// each round blocks until half a window of answers is in (sluice_recv reads
// many per read(), so most calls only parse), then queues as many new
// requests, which the next sluice_recv writes in one send(). Refilling at
// half a window, rather than waiting for the whole window, keeps the daemon
// busy with one half while this thread parses the other. With `limit` > 0 it
// stops after that many answers.
void pipelinedThread(const std::string& socket_path, const std::string& rule, const Keys& keys,
                     size_t window, uint64_t first_key, uint64_t key_step, uint64_t limit, Run* run,
                     Counter* counter) {
  sluice_client* client = connectOrDie(socket_path);
  char key[kKeyLen];
  uint64_t next = first_key;  // request number, mapped to a key by Keys
  uint64_t sent = 0;
  uint64_t done = 0;
  auto send = [&] {
    keys.key(next, key);
    next += key_step;
    ++sent;
    if (sluice_send_acquire(client, rule.c_str(), key, kKeyLen, 1, nullptr) != 0) {
      fail("send_acquire failed");
    }
  };
  const size_t refill = std::max<size_t>(1, window / 2);
  for (size_t i = 0; i < window && (limit == 0 || sent < limit); ++i) send();
  sluice_response response;
  while (!run->stop.load(std::memory_order_relaxed) && sluice_in_flight(client) > 0) {
    size_t answered = 0;
    while (answered < refill && sluice_in_flight(client) > 0) {
      int rc = sluice_recv(client, -1, &response);
      if (rc != 0) fail(std::string("recv: ") + sluice_strerror(rc));
      ++answered;
      counter->tally.add(outcomeOf(response.status, response.decision));
    }
    done += answered;
    counter->done.store(done, std::memory_order_relaxed);
    for (size_t i = 0; i < answered && (limit == 0 || sent < limit); ++i) send();
  }
  sluice_destroy(client);
}

// Runs `connections` threads, thread t as body(t, &run, &run.counters[t]):
// lets them warm up, counts their answers for `seconds`, stops and joins
// them, and prints the line. 0 when no answer was an error.
int measurePipelined(size_t connections, double seconds,
                     const std::function<void(size_t, Run*, Counter*)>& body) {
  Run run(connections);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < connections; ++t) {
    threads.emplace_back(body, t, &run, &run.counters[t]);
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(kWarmupSeconds));
  CpuMeter cpu;
  cpu.start();
  uint64_t first = run.total();
  int64_t start = nowNs();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  uint64_t last = run.total();
  int64_t end = nowNs();
  cpu.stop();
  run.stop = true;
  for (std::thread& t : threads) t.join();
  Tally sum;
  for (const Counter& c : run.counters) sum.add(c.tally);
  std::printf("rate_per_s=%.0f n=%llu allowed=%llu denied=%llu errors=%llu%s\n",
              static_cast<double>(last - first) * 1e9 / static_cast<double>(end - start),
              static_cast<unsigned long long>(last - first),
              static_cast<unsigned long long>(sum.allowed), static_cast<unsigned long long>(sum.denied),
              static_cast<unsigned long long>(sum.errors),
              cpu.text(static_cast<double>(end - start) / 1e9).c_str());
  return sum.errors == 0 ? 0 : 1;
}

int runPipelined(const std::string& socket_path, const std::string& rule, const Keys& keys,
                 size_t connections, size_t window, double seconds) {
  return measurePipelined(connections, seconds, [&](size_t t, Run* run, Counter* counter) {
    pipelinedThread(socket_path, rule, keys, window, t, connections, 0, run, counter);
  });
}

int runWarm(const std::string& socket_path, const std::string& rule, const Keys& keys,
            size_t connections, size_t window) {
  if (keys.count() == 0) fail("warm needs a key count");
  Run run(connections);
  std::vector<std::thread> threads;
  int64_t start = nowNs();
  for (size_t t = 0; t < connections; ++t) {
    // Thread t sends request numbers t, t + C, t + 2C, ...: together, 0..N-1.
    uint64_t share = keys.count() / connections + (t < keys.count() % connections ? 1 : 0);
    threads.emplace_back(pipelinedThread, socket_path, rule, std::cref(keys), window, t,
                         connections, share, &run, &run.counters[t]);
  }
  for (std::thread& t : threads) t.join();
  Tally sum;
  for (const Counter& c : run.counters) sum.add(c.tally);
  std::printf("warmed=%llu seconds=%.2f errors=%llu\n", static_cast<unsigned long long>(run.total()),
              static_cast<double>(nowNs() - start) / 1e9, static_cast<unsigned long long>(sum.errors));
  return sum.errors == 0 ? 0 : 1;
}

// Raw-socket twin of pipelinedThread: `window` blobs in flight; once half a
// window of answers is in, as many requests go out in one write.
void echoPipelinedThread(const std::string& socket_path, size_t request_bytes,
                         size_t response_bytes, size_t window, Run* run, Counter* counter) {
  int fd = rawConnect(socket_path);
  std::vector<char> requests(window * request_bytes, 'r');
  std::vector<char> input(64 * 1024);
  const size_t refill = std::max<size_t>(1, window / 2);
  writeAll(fd, requests.data(), requests.size());
  size_t partial = 0;   // bytes of an unfinished answer
  size_t answered = 0;  // answers not yet replaced by new requests
  uint64_t done = 0;
  while (!run->stop.load(std::memory_order_relaxed)) {
    ssize_t n = read(fd, input.data(), input.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("echo read failed");
    partial += static_cast<size_t>(n);
    answered += partial / response_bytes;
    done += partial / response_bytes;
    partial %= response_bytes;
    counter->done.store(done, std::memory_order_relaxed);
    if (answered >= refill) {
      writeAll(fd, requests.data(), answered * request_bytes);
      answered = 0;
    }
  }
  counter->tally.allowed = done;  // an echo cannot refuse
  close(fd);
}

int runEchoPipelined(const std::string& socket_path, size_t request_bytes, size_t response_bytes,
                     size_t connections, size_t window, double seconds) {
  return measurePipelined(connections, seconds, [&](size_t, Run* run, Counter* counter) {
    echoPipelinedThread(socket_path, request_bytes, response_bytes, window, run, counter);
  });
}

// --- the per-decision EVALSHA baseline ------------------------------------------

// What most Redis limiters do: one EVALSHA of a rate script per decision,
// straight to Redis. The script is sluice's own lua/token_bucket.lua asked
// for a lease of one unit ("lease", n = need = 1), so Redis does per decision
// exactly the work that sluiced asks of it per lease.
struct EvalshaTarget {
  std::string host;
  int port = 0;
  std::string sha;
  std::string limit, period_ms, burst;  // the rule, as the script's ARGV
};

redisContext* redisOrDie(const EvalshaTarget& target) {
  redisContext* c = redisConnect(target.host.c_str(), target.port);
  if (c == nullptr || c->err != 0) {
    fail("cannot connect to Redis at " + target.host + ":" + std::to_string(target.port) +
         (c != nullptr ? std::string(": ") + c->errstr : std::string()));
  }
  return c;
}

// HOST:PORT SCRIPT_FILE LIMIT/PERIOD_MS/BURST: loads the script, checks the rule.
EvalshaTarget evalshaTarget(const std::string& address, const std::string& script_file,
                            const std::string& rule) {
  EvalshaTarget t;
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) fail("expected HOST:PORT, got " + address);
  t.host = address.substr(0, colon);
  t.port = std::atoi(address.c_str() + colon + 1);
  size_t a = rule.find('/');
  size_t b = a == std::string::npos ? a : rule.find('/', a + 1);
  if (b == std::string::npos) fail("expected LIMIT/PERIOD_MS/BURST, got " + rule);
  t.limit = rule.substr(0, a);
  t.period_ms = rule.substr(a + 1, b - a - 1);
  t.burst = rule.substr(b + 1);
  // The text sluiced loads for that file (its preludes, lua/common.lua and
  // for a rate script lua/rate_lease.lua, then the file), so the baseline
  // runs the daemon's script.
  const std::string file_name = script_file.substr(script_file.rfind('/') + 1);
  std::string text;
  for (const sluice::scripts::ScriptSource& source : sluice::scripts::all()) {
    if (source.name == file_name) text = source.source;
  }
  if (text.empty()) fail(script_file + " is not one of sluiced's scripts (lua/*.lua)");
  redisContext* c = redisOrDie(t);
  auto* reply = static_cast<redisReply*>(redisCommand(c, "SCRIPT LOAD %b", text.data(), text.size()));
  if (reply == nullptr || reply->type != REDIS_REPLY_STRING) {
    fail("SCRIPT LOAD of " + script_file + " failed" +
         (reply != nullptr && reply->type == REDIS_REPLY_ERROR ? std::string(": ") + reply->str
                                                               : std::string()));
  }
  t.sha.assign(reply->str, reply->len);
  freeReplyObject(reply);
  redisFree(c);
  return t;
}

void appendEvalsha(redisContext* c, const EvalshaTarget& t, const char* key) {
  redisAppendCommand(c, "EVALSHA %s 1 bench:evalsha:%b lease 1 1 %s %s %s 0 0", t.sha.c_str(), key,
                     kKeyLen, t.limit.c_str(), t.period_ms.c_str(), t.burst.c_str());
}

// The script answers {granted, remaining, retry_after_ms, reset_after_ms, now_ms}.
Outcome evalshaOutcome(redisReply* reply) {
  static std::atomic<bool> reported{false};
  if (reply != nullptr && reply->type == REDIS_REPLY_ARRAY && reply->elements == 5 &&
      reply->element[0]->type == REDIS_REPLY_INTEGER) {
    return reply->element[0]->integer > 0 ? Outcome::kAllowed : Outcome::kDenied;
  }
  if (!reported.exchange(true)) {
    std::fprintf(stderr, "load: EVALSHA: %s\n",
                 reply == nullptr ? "no reply"
                 : reply->type == REDIS_REPLY_ERROR ? reply->str
                                                    : "an unexpected reply");
  }
  return Outcome::kError;
}

Outcome evalshaReply(redisContext* c) {
  void* reply = nullptr;
  if (redisGetReply(c, &reply) != REDIS_OK) fail(std::string("Redis: ") + c->errstr);
  Outcome o = evalshaOutcome(static_cast<redisReply*>(reply));
  freeReplyObject(reply);
  return o;
}

int runEvalshaSync(const EvalshaTarget& target, const Keys& keys, double seconds) {
  redisContext* c = redisOrDie(target);
  char key[kKeyLen];
  uint64_t i = 0;
  int status = measureSync(seconds, [&] {
    keys.key(i++, key);
    appendEvalsha(c, target, key);
    return evalshaReply(c);
  });
  redisFree(c);
  return status;
}

// pipelinedThread's twin over hiredis: `window` EVALSHAs in flight; once half
// a window of replies is in, as many new ones go out in one write.
void evalshaPipelinedThread(const EvalshaTarget& target, const Keys& keys, size_t window,
                            uint64_t first_key, uint64_t key_step, Run* run, Counter* counter) {
  redisContext* c = redisOrDie(target);
  char key[kKeyLen];
  uint64_t next = first_key;
  auto send = [&] {
    keys.key(next, key);
    next += key_step;
    appendEvalsha(c, target, key);
  };
  const size_t refill = std::max<size_t>(1, window / 2);
  for (size_t i = 0; i < window; ++i) send();
  uint64_t done = 0;
  while (!run->stop.load(std::memory_order_relaxed)) {
    for (size_t i = 0; i < refill; ++i) counter->tally.add(evalshaReply(c));  // flushes, then reads
    done += refill;
    counter->done.store(done, std::memory_order_relaxed);
    for (size_t i = 0; i < refill; ++i) send();
  }
  redisFree(c);
}

int runEvalshaPipelined(const EvalshaTarget& target, const Keys& keys, size_t connections,
                        size_t window, double seconds) {
  return measurePipelined(connections, seconds, [&](size_t t, Run* run, Counter* counter) {
    evalshaPipelinedThread(target, keys, window, t, connections, run, counter);
  });
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: load sizes SOCKET RULE\n"
               "       load sync SOCKET RULE KEYS [SECONDS]\n"
               "       load pipelined SOCKET RULE KEYS CONNECTIONS WINDOW [SECONDS]\n"
               "       load warm SOCKET RULE KEYS CONNECTIONS WINDOW\n"
               "       load echo-sync SOCKET REQUEST_BYTES RESPONSE_BYTES [SECONDS]\n"
               "       load echo-pipelined SOCKET REQUEST_BYTES RESPONSE_BYTES CONNECTIONS WINDOW [SECONDS]\n"
               "       load evalsha-sync HOST:PORT SCRIPT LIMIT/PERIOD_MS/BURST KEYS [SECONDS]\n"
               "       load evalsha-pipelined HOST:PORT SCRIPT LIMIT/PERIOD_MS/BURST KEYS CONNECTIONS WINDOW [SECONDS]\n"
               "KEYS: hot, or a number of distinct keys\n");
  std::exit(2);
}

size_t positive(const char* text) {
  long long v = std::strtoll(text, nullptr, 10);
  if (v <= 0) usage();
  return static_cast<size_t>(v);
}

double secondsArg(int argc, char** argv, int index) {
  if (argc <= index) return kDefaultSeconds;
  double v = std::strtod(argv[index], nullptr);
  if (v <= 0) usage();
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) usage();
  signal(SIGPIPE, SIG_IGN);  // a server that goes away is reported by write()
  std::string mode = argv[1];
  std::string socket_path = argv[2];
  if (mode == "sizes" && argc == 4) {
    return runSizes(socket_path, argv[3]);
  }
  if (mode == "sync" && (argc == 5 || argc == 6)) {
    return runSync(socket_path, argv[3], Keys(argv[4]), secondsArg(argc, argv, 5));
  }
  if (mode == "pipelined" && (argc == 7 || argc == 8)) {
    return runPipelined(socket_path, argv[3], Keys(argv[4]), positive(argv[5]), positive(argv[6]),
                        secondsArg(argc, argv, 7));
  }
  if (mode == "warm" && argc == 7) {
    return runWarm(socket_path, argv[3], Keys(argv[4]), positive(argv[5]), positive(argv[6]));
  }
  if (mode == "echo-sync" && (argc == 5 || argc == 6)) {
    return runEchoSync(socket_path, positive(argv[3]), positive(argv[4]), secondsArg(argc, argv, 5));
  }
  if (mode == "echo-pipelined" && (argc == 7 || argc == 8)) {
    return runEchoPipelined(socket_path, positive(argv[3]), positive(argv[4]), positive(argv[5]),
                            positive(argv[6]), secondsArg(argc, argv, 7));
  }
  if (mode == "evalsha-sync" && (argc == 6 || argc == 7)) {
    return runEvalshaSync(evalshaTarget(argv[2], argv[3], argv[4]), Keys(argv[5]),
                          secondsArg(argc, argv, 6));
  }
  if (mode == "evalsha-pipelined" && (argc == 8 || argc == 9)) {
    return runEvalshaPipelined(evalshaTarget(argv[2], argv[3], argv[4]), Keys(argv[5]),
                               positive(argv[6]), positive(argv[7]), secondsArg(argc, argv, 8));
  }
  usage();
}
