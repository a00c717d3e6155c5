// RedisLink: the daemon's one connection to Redis, driven by the control
// thread's libuv loop. It connects (TCP or Unix socket), authenticates,
// selects the database, loads the Lua scripts, and from then on runs commands
// with a deadline each; when the connection fails it fails every pending
// command at once and reconnects forever, with capped, jittered exponential
// backoff, until close().
//
// Invariant: every command accepted by command() or evalsha() gets its
// callback called exactly once, with a reply, a Redis error reply, a timeout
// or `disconnected`. A call that fails (returns false) never calls its
// callback, as in libuv. A command is only accepted while the link is up
// (connected() is true): nothing is ever queued into a dead link.
//
// Threads: none of this is thread-safe. Construct, call and close a RedisLink
// on the thread that runs its loop (the control thread); every callback runs
// on that thread, from inside the loop.
//
// Lifetime: the link owns its handles (two timers and the poll handle of the
// current socket) and frees their memory only in their close callbacks. Call
// close() once, always, even if start() was never called; its callback runs
// after every handle is closed, and only then may the RedisLink be destroyed.
// After it, uv_loop_close() on the loop returns 0.
//
// Deadlines and order: Redis answers in order, so a stalled server stalls
// every command behind the first, and a busy pipeline keeps a command waiting
// behind the ones sent before it. A command's timeout therefore counts from
// when it was written to the socket or from Redis's latest answer, whichever
// is later: a command that waits its turn behind a pipeline Redis keeps
// answering is not late; one that waits its timeout with no answer at all
// is. Answers already in the socket are read before anything is called late
// (this thread may have been busy or descheduled). A late command
// gets `timeout` at once, and the connection is dropped: every other pending
// command gets `disconnected` (or `timeout`, if late too) at once and a
// reconnect starts. Commands issued in one loop tick go out in one write
// (pipelining).
//
// Units and clocks: durations are milliseconds of the loop's clock
// (uv_now, refreshed when commands are written); round-trip times are
// microseconds of uv_hrtime, from the call to the answer, so they include
// time queued behind earlier commands.
//
// Where to connect: the config's address, or, with resolveWith(), whatever the
// resolver answers before each attempt (Sentinel mode: sentinel.h). With
// RedisLinkOptions::require_master the handshake checks with ROLE that the
// server is a master, and a READONLY error reply (the master was demoted)
// drops the connection, so that the next attempt resolves again.
//
// Pub/sub: a link may carry one subscription (subscribe()), made again on
// every connection; such a link is up once Redis confirms it, and takes no
// commands (a subscribed connection answers nothing else). A server that
// hangs with the connection open sends no messages and no error, so with
// RedisLinkOptions::probe_interval_ms the link PINGs it and drops the
// connection, as for a late command, when nothing comes back in time.
//
// A host name in the config is resolved with a blocking getaddrinfo() on each
// connection attempt (hiredis 0.14); configure an address to avoid that.
#pragma once

#include <uv.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"

struct redisAsyncContext;

namespace sluice {

// A read-only view of one Redis reply. Valid only during the callback that
// received it; copy what you need out of it.
class RedisReply {
 public:
  enum class Kind { kString, kArray, kInteger, kNil, kStatus, kError };

  explicit RedisReply(const void* hiredis_reply) : reply_(hiredis_reply) {}

  Kind kind() const;
  int64_t integer() const;      // kInteger; 0 otherwise
  std::string_view str() const;  // kString, kStatus, kError; "" otherwise
  size_t size() const;           // kArray: number of elements; 0 otherwise
  RedisReply operator[](size_t i) const;  // kArray, i < size()
  // An array of integers (what the Lua scripts return) as its values;
  // nullopt for anything else, an array with any other element included.
  std::optional<std::vector<int64_t>> integers() const;

 private:
  const void* reply_;
};

enum class RedisStatus {
  kOk,            // `reply` holds the answer (which is never an error reply)
  kRedisError,    // Redis answered with an error reply; `error` is its text
  kTimeout,       // no answer before the command's deadline
  kDisconnected,  // the connection failed or the link closed before the answer
};

std::string_view toString(RedisStatus status);

struct RedisResult {
  RedisStatus status;
  // kOk and kRedisError: the reply (valid only during the callback);
  // nullptr otherwise.
  const RedisReply* reply;
  // kRedisError: the error reply's text; kTimeout, kDisconnected: why.
  std::string_view error;
  // Microseconds from the call to the answer (kOk, kRedisError); 0 otherwise.
  uint64_t rtt_us;
};

using RedisCallback = std::function<void(const RedisResult&)>;

// A link's knobs. The config file sets backoff_max_ms ([redis]
// reconnect_max, through Control); the others are the link owners' own.
struct RedisLinkOptions {
  // From the start of a connection attempt to the end of its handshake
  // (AUTH, SELECT, SCRIPT LOADs, PING).
  int64_t connect_timeout_ms = 1000;
  // Delay before reconnect attempt n (n = 0, 1, ...):
  // min(initial * 2^n, max), then scaled by a random factor in
  // [1 - jitter, 1 + jitter]. Reset to the first step by a completed handshake.
  int64_t backoff_initial_ms = 50;
  int64_t backoff_max_ms = kDefaultReconnectMaxMs;
  double backoff_jitter = 0.2;
  // The longest wait between two connection attempts: the cap, jittered up.
  double longestBackoffMs() const { return static_cast<double>(backoff_max_ms) * (1 + backoff_jitter); }
  // Sentinel mode's master link: ROLE must answer "master" in the handshake,
  // and a READONLY error reply drops the connection (see the file comment).
  bool require_master = false;
  // What the link's log lines start with ("redis", "sentinel").
  std::string log_name = "redis";
  // Logs nothing about connections: for short-lived links whose owner
  // reports their failures itself (Sentinel's queries).
  bool quiet = false;
  // A subscribed link sends a PING this long after the subscription is
  // confirmed and after each PING's answer (0: never), and drops the
  // connection when the server has sent nothing within probe_timeout_ms of
  // a PING.
  int64_t probe_interval_ms = 0;
  int64_t probe_timeout_ms = 1000;
};

// Where the control thread's commands go: one RedisLink (standalone and
// Sentinel mode) or a RedisCluster (cluster.h), which sends each script call
// to the master of its first key's slot. The methods keep RedisLink's
// contract, documented there; the interface exists for that seam only.
class RedisTarget {
 public:
  using ScriptId = size_t;

  virtual ~RedisTarget() = default;
  virtual void onConnected(std::function<void()> callback) = 0;
  virtual void onDisconnected(std::function<void(std::string_view reason)> callback) = 0;
  virtual ScriptId registerScript(std::string name, std::string source) = 0;
  virtual void start() = 0;
  virtual void close(std::function<void()> on_closed) = 0;
  virtual bool connected() const = 0;
  virtual std::string address() const = 0;
  virtual const RedisLinkOptions& options() const = 0;
  [[nodiscard]] virtual bool command(std::span<const std::string_view> argv,
                                     RedisCallback callback, int64_t timeout_ms) = 0;
  [[nodiscard]] bool command(std::initializer_list<std::string_view> argv, RedisCallback callback,
                             int64_t timeout_ms) {
    return command(std::span<const std::string_view>(argv.begin(), argv.size()),
                   std::move(callback), timeout_ms);
  }
  [[nodiscard]] virtual bool evalsha(ScriptId script, std::span<const std::string_view> keys,
                                     std::span<const std::string_view> args,
                                     RedisCallback callback, int64_t timeout_ms) = 0;
};

class RedisLink : public RedisTarget {
 public:
  // A resolver's answer: an address, or nullopt and why there is none.
  using AddressCallback =
      std::function<void(std::optional<RedisAddress> address, std::string_view reason)>;
  using Resolver = std::function<void(AddressCallback done)>;

  // Connects to `config`'s address (unix_path when set, else host:port), with
  // its username/password and db. Initializes the link's timers on `loop`;
  // does not connect before start().
  RedisLink(uv_loop_t* loop, RedisConfig config, RedisLinkOptions options = {});
  ~RedisLink();  // aborts unless close()'s callback has run
  RedisLink(const RedisLink&) = delete;
  RedisLink& operator=(const RedisLink&) = delete;

  // Observers; set before start(). on_connected runs when a handshake
  // completes; on_disconnected runs when a connection attempt fails or an
  // established connection is lost (not on close()), with the reason.
  // on_latency gets the round-trip time of every answered command.
  void onConnected(std::function<void()> callback) override {
    on_connected_ = std::move(callback);
  }
  void onDisconnected(std::function<void(std::string_view reason)> callback) override {
    on_disconnected_ = std::move(callback);
  }
  void onLatency(std::function<void(uint64_t rtt_us)> callback) {
    on_latency_ = std::move(callback);
  }

  // Registers a Lua script, loaded with SCRIPT LOAD on every (re)connect.
  // Only before start(). `name` is for logs.
  ScriptId registerScript(std::string name, std::string source) override;

  // Before start(): every connection attempt first asks `resolver` where to
  // connect (TCP), instead of using the config's address. The resolver calls
  // `done` once, now or later; an answer that comes after the link moved on
  // (closed, or reconnect() started a new attempt) is ignored. No address
  // counts as a failed attempt: the link retries with its backoff.
  void resolveWith(Resolver resolver) { resolver_ = std::move(resolver); }

  // Before start(), at most once: SUBSCRIBE to `channel` on every connection
  // and call `on_message` with each message's payload. The link is then up
  // once the subscription is confirmed, and command() and evalsha() refuse.
  void subscribe(std::string channel, std::function<void(std::string_view payload)> on_message);

  // Starts connecting (at once) and keeps the link up until close().
  void start() override;

  // Closes the link: every pending callback gets `disconnected`, the
  // connection and all handles are closed, then `on_closed` runs (from the
  // loop, never from inside close()). Call exactly once.
  void close(std::function<void()> on_closed) override;

  // Drops the current connection or attempt, if any (pending commands get
  // `disconnected`), and starts a new attempt at once, without backoff: for
  // news that the server moved (Sentinel's +switch-master). No-op before
  // start() and after close().
  void reconnect(const std::string& reason);

  // True while a connection is established and its handshake is done.
  bool connected() const override { return state_ == State::kConnected; }
  // The address of the current connection or the last attempt, "" before
  // the first (a resolver may not have answered yet): "host:port" or
  // "unix:/path".
  std::string address() const override;
  const RedisLinkOptions& options() const override { return options_; }
  // The SHA1 the server returned for a script on the current connection, or
  // "" before it is loaded (or when it did not load).
  const std::string& scriptSha(ScriptId id) const { return scripts_.at(id).sha; }

  // Sends one command (binary-safe arguments). Returns false, without calling
  // `callback`, when the link is not connected or has a subscription, or for
  // commands answered more than once (SUBSCRIBE and friends, MONITOR).
  // `timeout_ms` >= 1.
  [[nodiscard]] bool command(std::span<const std::string_view> argv, RedisCallback callback,
                             int64_t timeout_ms) override;
  using RedisTarget::command;

  // EVALSHA of a registered script. On a NOSCRIPT reply the script is loaded
  // again and the call retried once, within the same deadline. When the
  // script failed to load on this connection, it is sent with EVAL instead,
  // so the callback gets Redis's own compile error. Returns false, without
  // calling `callback`, when the link is not connected or has a subscription.
  [[nodiscard]] bool evalsha(ScriptId script, std::span<const std::string_view> keys,
                             std::span<const std::string_view> args, RedisCallback callback,
                             int64_t timeout_ms) override;

 private:
  enum class State {
    kIdle, kResolving, kConnecting, kHandshaking, kConnected, kBackoff, kClosing, kClosed
  };
  struct Request;
  struct Script {
    std::string name;
    std::string source;
    std::string sha;  // from SCRIPT LOAD on the current connection
  };

  static void onReplyThunk(redisAsyncContext* ac, void* reply, void* privdata);
  static void onConnectThunk(const redisAsyncContext* ac, int status);
  static void onDisconnectThunk(const redisAsyncContext* ac, int status);

  void connectNow();
  void connectTo();  // to target_
  void sendHandshake();
  void handshakeDone();
  // Subscribed links (probe_interval_ms): the next PING is due an interval
  // from now; send it.
  void scheduleProbe();
  void sendProbe();
  // The current connection has bytes to read: a PING sent is answered.
  void noteRead();
  void onSubscription(Request* request, const void* reply);
  // Both return nullptr when hiredis took the request, else the request.
  std::unique_ptr<Request> send(std::span<const std::string_view> argv,
                                std::unique_ptr<Request> request);
  std::unique_ptr<Request> sendEval(std::unique_ptr<Request> request);
  void onReply(Request* request, const void* reply, const char* errstr);
  void finish(Request* request, const RedisResult& result);
  void forget(Request* request);
  void loseConnection(const std::string& reason, bool free_context, bool deadline_passed);
  void scheduleReconnect();
  void startClocks();
  void armDeadlineTimer();
  void onDeadlineTimer();
  bool late(const Request& request, uint64_t now_ms) const;
  // The earliest moment a listed command can be late, and the first one
  // late at `now_ms` (or nullptr).
  uint64_t nextCommandDeadline(uint64_t now_ms, const Request** late_request) const;
  void onHandleClosed();
  bool logAllowed();  // rate limit for connection-failure logs
  std::string logAddress() const;  // address(), or what stands for it before the first

  uv_loop_t* loop_;
  RedisConfig config_;
  RedisLinkOptions options_;
  State state_ = State::kIdle;
  bool closing_ = false;

  Resolver resolver_;                // empty: connect to the config's address
  uint64_t attempt_ = 0;             // counts attempts; a resolver's late answer is ignored
  std::optional<RedisAddress> target_;  // resolved: the address of this attempt
  std::string subscription_channel_;    // "": none
  std::function<void(std::string_view)> on_message_;
  Request* subscription_ = nullptr;  // the confirmed SUBSCRIBE of this connection
  // The subscription's PINGs (loop times; 0: none): when the next is due,
  // and when the one sent is late unless the connection reads something.
  uint64_t next_probe_ms_ = 0;
  uint64_t probe_deadline_ms_ = 0;

  redisAsyncContext* context_ = nullptr;  // the current connection, if any
  uint64_t connect_deadline_ms_ = 0;      // 0: no attempt in progress
  std::string drop_reason_;               // set: drop the connection on the next timer tick
  int reconnect_attempt_ = 0;
  std::minstd_rand random_;  // backoff jitter
  uint64_t log_window_start_ms_ = 0;
  int logs_in_window_ = 0;
  uint64_t logs_suppressed_ = 0;

  // Commands in flight on the current connection, in the order issued, and
  // the written ones by the moment each would be late if Redis answered
  // nothing (written + timeout). Both hold the same Requests; hiredis owns
  // their memory.
  std::list<Request*> in_flight_;
  std::multimap<uint64_t, Request*> deadlines_;
  // The last unwritten_ of in_flight_ are not written yet. Only answered
  // commands leave in_flight_ one by one, and they leave from the front.
  size_t unwritten_ = 0;
  uint64_t last_answer_ms_ = 0;  // loop time of Redis's latest answer

  std::vector<Script> scripts_;

  uv_timer_t retry_timer_;     // reconnect backoff
  uv_timer_t deadline_timer_;  // the connect deadline, or when a command could be late
  int open_handles_ = 0;       // ours plus poll handles of sockets not yet closed
  std::function<void()> on_closed_;

  std::function<void()> on_connected_;
  std::function<void(std::string_view)> on_disconnected_;
  std::function<void(uint64_t)> on_latency_;

  friend struct RedisPoll;
};

// RetiredLinks: the RedisLinks an owner is done with (Sentinel's probes and
// watch link, RedisCluster's probes and the links of dropped masters), on
// their way out. An owner is often done with a link inside one of that
// link's callbacks, where the link may not be destroyed; retire() closes it
// instead, and freeClosed(), called later from outside any link callback,
// destroys the links whose close has completed.
//
// Threads: not thread-safe; the loop's thread only, like RedisLink.
//
// Lifetime: destroy it only once closing() is 0 (a RedisLink destroyed
// before its close callback aborts); an owner's close() retires its last
// links and waits for on_drained.
class RetiredLinks {
 public:
  // `on_drained` runs, from a link's close callback, each time the last link
  // still closing has closed.
  explicit RetiredLinks(std::function<void()> on_drained) : on_drained_(std::move(on_drained)) {}

  // Closes `link` and keeps it until freeClosed() after its close completed.
  // A null `link` is ignored.
  void retire(std::unique_ptr<RedisLink> link);
  // Destroys the retired links whose close has completed.
  void freeClosed();
  // Retired links whose close has not completed yet.
  size_t closing() const { return closing_; }

 private:
  struct Retired {
    std::unique_ptr<RedisLink> link;
    bool closed = false;
  };
  std::list<Retired> links_;  // closing, or closed and not destroyed yet
  size_t closing_ = 0;
  std::function<void()> on_drained_;
};

}  // namespace sluice
