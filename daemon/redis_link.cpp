// RedisLink: hiredis async on a libuv loop, with our own poll glue, deadlines
// and reconnects. See redis_link.h for the contract.
//
// Why our own glue: Debian's hiredis is 0.14.1. Its adapters/libuv.h returns
// early when the poll reports an error, so a refused or reset connection is
// never reported (fixed upstream in 1.0, commit 9ce15c4), and its async API
// has no connect or command timeouts at all. RedisPoll below is that adapter
// with the fix; the deadline timer below is the timeouts.
//
// Who frees what:
// - A Request is owned by hiredis from redisAsyncCommandArgv() on: hiredis
//   calls onReplyThunk exactly once for it (with the reply, or with NULL when
//   the context is freed), and the thunk deletes it. We also list it in
//   in_flight_/deadlines_ until it is answered or failed; a Request that we
//   failed early is marked `done` and only waits for hiredis to free it.
// - A redisAsyncContext is freed either by hiredis itself (after an I/O error:
//   it then calls every pending reply callback with NULL and, if it was
//   connected, the disconnect callback) or by us with redisAsyncFree(). We
//   never call redisAsyncFree() from hiredis's connect or disconnect callback
//   (hiredis is freeing the context then, or still using it); from a reply
//   callback it is safe, as hiredis defers the free until the callback returns.
// - A RedisPoll (the uv_poll_t of one socket) is closed by hiredis's cleanup
//   hook and freed in its close callback; the link counts it in
//   open_handles_, so close()'s callback waits for it.
// - The Request of a SUBSCRIBE is the exception to "called exactly once":
//   hiredis calls it for the confirmation, for every message, and once more
//   with NULL when it frees the context, and only that last call deletes it.
#include "redis_link.h"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <limits>

namespace sluice {

namespace {

// Connection-failure logs are limited to this many per window; the rest are
// counted and the count is logged with the next allowed message.
constexpr uint64_t kLogWindowMs = 10'000;
constexpr int kLogsPerWindow = 5;

const redisReply* asHiredis(const void* reply) { return static_cast<const redisReply*>(reply); }

}  // namespace

// ---------------------------------------------------------------------------
// RedisReply

RedisReply::Kind RedisReply::kind() const {
  switch (asHiredis(reply_)->type) {
    case REDIS_REPLY_STRING: return Kind::kString;
    case REDIS_REPLY_ARRAY: return Kind::kArray;
    case REDIS_REPLY_INTEGER: return Kind::kInteger;
    case REDIS_REPLY_STATUS: return Kind::kStatus;
    case REDIS_REPLY_ERROR: return Kind::kError;
    default: return Kind::kNil;
  }
}

int64_t RedisReply::integer() const {
  const redisReply* r = asHiredis(reply_);
  return r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
}

std::string_view RedisReply::str() const {
  const redisReply* r = asHiredis(reply_);
  if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS ||
      r->type == REDIS_REPLY_ERROR) {
    return std::string_view(r->str, r->len);
  }
  return {};
}

size_t RedisReply::size() const {
  const redisReply* r = asHiredis(reply_);
  return r->type == REDIS_REPLY_ARRAY ? r->elements : 0;
}

RedisReply RedisReply::operator[](size_t i) const { return RedisReply(asHiredis(reply_)->element[i]); }

std::optional<std::vector<int64_t>> RedisReply::integers() const {
  if (kind() != Kind::kArray) return std::nullopt;
  std::vector<int64_t> values;
  values.reserve(size());
  for (size_t i = 0; i < size(); i++) {
    RedisReply element = (*this)[i];
    if (element.kind() != Kind::kInteger) return std::nullopt;
    values.push_back(element.integer());
  }
  return values;
}

std::string_view toString(RedisStatus status) {
  switch (status) {
    case RedisStatus::kOk: return "ok";
    case RedisStatus::kRedisError: return "redis error";
    case RedisStatus::kTimeout: return "timeout";
    case RedisStatus::kDisconnected: return "disconnected";
  }
  return "?";
}

// ---------------------------------------------------------------------------
// RedisPoll: hiredis's event hooks on a uv_poll_t (see the file comment).

struct RedisPoll {
  uv_poll_t handle;
  redisAsyncContext* context;  // nullptr once hiredis has called cleanup
  RedisLink* link;
  int events = 0;

  static void onPoll(uv_poll_t* handle, int status, int events) {
    auto* poll = static_cast<RedisPoll*>(handle->data);
    // On an error (POLLERR: refused, reset) libuv reports status < 0 and no
    // events, and has stopped the poll. Let hiredis try whatever it waits
    // for, so that its read or connect check meets the error and reports it.
    int ready = status < 0 ? poll->events : events;
    if (poll->context != nullptr && (ready & UV_READABLE)) {
      if (poll->context == poll->link->context_) poll->link->noteRead();
      redisAsyncHandleRead(poll->context);
    }
    if (poll->context != nullptr && (ready & UV_WRITABLE)) {
      redisAsyncHandleWrite(poll->context);  // also sends what the connect callback queued
      poll->link->startClocks();
    }
  }

  void update() {
    if (events != 0) {
      uv_poll_start(&handle, events, onPoll);
    } else {
      uv_poll_stop(&handle);
    }
  }

  static void addRead(void* data) {
    auto* poll = static_cast<RedisPoll*>(data);
    poll->events |= UV_READABLE;
    poll->update();
  }
  static void delRead(void* data) {
    auto* poll = static_cast<RedisPoll*>(data);
    poll->events &= ~UV_READABLE;
    poll->update();
  }
  static void addWrite(void* data) {
    auto* poll = static_cast<RedisPoll*>(data);
    poll->events |= UV_WRITABLE;
    poll->update();
  }
  static void delWrite(void* data) {
    auto* poll = static_cast<RedisPoll*>(data);
    poll->events &= ~UV_WRITABLE;
    poll->update();
  }
  static void cleanup(void* data) {
    auto* poll = static_cast<RedisPoll*>(data);
    poll->context = nullptr;
    uv_close(reinterpret_cast<uv_handle_t*>(&poll->handle), [](uv_handle_t* handle) {
      auto* closed = static_cast<RedisPoll*>(handle->data);
      RedisLink* link = closed->link;
      delete closed;
      link->onHandleClosed();
    });
  }

  // Attaches a new RedisPoll to `context`; false (and nothing to free) when
  // the poll handle cannot be created.
  static bool attach(redisAsyncContext* context, uv_loop_t* loop, RedisLink* link) {
    auto* poll = new RedisPoll{};
    if (uv_poll_init(loop, &poll->handle, context->c.fd) != 0) {
      delete poll;
      return false;
    }
    poll->handle.data = poll;
    poll->context = context;
    poll->link = link;
    link->open_handles_++;
    context->ev.data = poll;
    context->ev.addRead = addRead;
    context->ev.delRead = delRead;
    context->ev.addWrite = addWrite;
    context->ev.delWrite = delWrite;
    context->ev.cleanup = cleanup;
    return true;
  }
};

// ---------------------------------------------------------------------------
// Requests

struct RedisLink::Request {
  enum class Kind { kCommand, kEval, kAuth, kSelect, kRole, kScriptLoad, kPing, kSubscribe };

  RedisLink* link = nullptr;
  Kind kind = Kind::kCommand;
  RedisCallback callback;  // kCommand, kEval
  int64_t timeout_ms = 0;
  uint64_t deadline_ms = 0;  // loop time: written + timeout_ms; 0 until written
  uint64_t started_ns = 0;   // uv_hrtime
  bool done = false;         // answered or failed; no longer listed

  // kEval, kScriptLoad
  ScriptId script = 0;
  // kEval: keys then args, kept for the one retry after NOSCRIPT.
  std::vector<std::string> keys_and_args;
  size_t key_count = 0;
  bool retried = false;

  std::list<Request*>::iterator in_flight_it;
  std::multimap<uint64_t, Request*>::iterator deadline_it;
};

// ---------------------------------------------------------------------------
// RedisLink

RedisLink::RedisLink(uv_loop_t* loop, RedisConfig config, RedisLinkOptions options)
    : loop_(loop),
      config_(std::move(config)),
      options_(options),
      random_(static_cast<std::minstd_rand::result_type>(uv_hrtime() ^ getpid())) {
  uv_timer_init(loop_, &retry_timer_);
  uv_timer_init(loop_, &deadline_timer_);
  retry_timer_.data = this;
  deadline_timer_.data = this;
  open_handles_ = 2;
}

RedisLink::~RedisLink() {
  if (state_ != State::kClosed) {
    spdlog::critical("RedisLink destroyed before its close() callback ran");
    std::abort();
  }
}

RedisLink::ScriptId RedisLink::registerScript(std::string name, std::string source) {
  if (state_ != State::kIdle) {
    spdlog::critical("RedisLink::registerScript({}) after start()", name);
    std::abort();
  }
  scripts_.push_back(Script{std::move(name), std::move(source), {}});
  return scripts_.size() - 1;
}

std::string RedisLink::address() const {
  if (resolver_) return target_ ? target_->text() : "";
  if (!config_.unix_path.empty()) return "unix:" + config_.unix_path;
  return RedisAddress{config_.host, config_.port}.text();
}

std::string RedisLink::logAddress() const {
  std::string at = address();
  return at.empty() ? "(not found yet)" : at;
}

void RedisLink::subscribe(std::string channel,
                          std::function<void(std::string_view payload)> on_message) {
  if (state_ != State::kIdle || !subscription_channel_.empty() || channel.empty()) {
    spdlog::critical("RedisLink::subscribe({}) after start(), twice, or without a channel", channel);
    std::abort();
  }
  subscription_channel_ = std::move(channel);
  on_message_ = std::move(on_message);
}

bool RedisLink::logAllowed() {
  uint64_t now_ms = uv_now(loop_);
  if (now_ms - log_window_start_ms_ >= kLogWindowMs) {
    log_window_start_ms_ = now_ms;
    logs_in_window_ = 0;
  }
  if (logs_in_window_ >= kLogsPerWindow) {
    logs_suppressed_++;
    return false;
  }
  logs_in_window_++;
  return true;
}

void RedisLink::start() {
  if (state_ != State::kIdle) return;
  connectNow();
}

void RedisLink::connectNow() {
  if (closing_) return;
  ++attempt_;
  for (Script& script : scripts_) script.sha.clear();
  if (!resolver_) {
    connectTo();
    return;
  }
  state_ = State::kResolving;
  resolver_([this, attempt = attempt_](std::optional<RedisAddress> address,
                                        std::string_view reason) {
    if (closing_ || attempt != attempt_ || state_ != State::kResolving) return;  // moved on
    if (!address) {
      loseConnection(std::string(reason), false, false);
      return;
    }
    target_ = std::move(*address);
    connectTo();
  });
}

void RedisLink::connectTo() {
  state_ = State::kConnecting;
  uv_update_time(loop_);  // start() may come long after the loop's last tick
  connect_deadline_ms_ = uv_now(loop_) + static_cast<uint64_t>(options_.connect_timeout_ms);

  redisAsyncContext* context =
      resolver_                      ? redisAsyncConnect(target_->host.c_str(), target_->port)
      : config_.unix_path.empty()    ? redisAsyncConnect(config_.host.c_str(), config_.port)
                                     : redisAsyncConnectUnix(config_.unix_path.c_str());
  if (context == nullptr) {
    loseConnection("connect: out of memory", false, false);
    return;
  }
  if (context->err != 0) {
    std::string reason = std::string("connect: ") + context->errstr;
    redisAsyncFree(context);
    loseConnection(reason, false, false);
    return;
  }
  if (!RedisPoll::attach(context, loop_, this)) {
    redisAsyncFree(context);
    loseConnection("connect: cannot poll the socket", false, false);
    return;
  }
  context->data = this;
  context_ = context;
  redisAsyncSetConnectCallback(context, onConnectThunk);  // also starts polling for writable
  redisAsyncSetDisconnectCallback(context, onDisconnectThunk);
  armDeadlineTimer();
}

void RedisLink::onConnectThunk(const redisAsyncContext* context, int status) {
  auto* link = static_cast<RedisLink*>(context->data);
  if (link == nullptr) return;
  if (status != REDIS_OK) {
    // hiredis frees the context after this returns.
    link->loseConnection(std::string("connect: ") + context->errstr, false, false);
    return;
  }
  link->state_ = State::kHandshaking;
  link->sendHandshake();
}

void RedisLink::onDisconnectThunk(const redisAsyncContext* context, int /*status*/) {
  auto* link = static_cast<RedisLink*>(context->data);
  if (link == nullptr) return;  // we dropped it ourselves
  link->loseConnection(context->errstr != nullptr && context->err != 0
                           ? std::string(context->errstr)
                           : std::string("connection closed"),
                       false, false);
}

// AUTH and SELECT come first, so that nothing runs as the wrong user or in the
// wrong db; then ROLE, when the server must be a master; PING (or the
// subscription) comes last, so that the link is up only once the server has
// answered everything.
void RedisLink::sendHandshake() {
  auto internal = [this](Request::Kind kind) {
    auto request = std::make_unique<Request>();
    request->link = this;
    request->kind = kind;
    request->timeout_ms = options_.connect_timeout_ms;
    request->started_ns = uv_hrtime();
    return request;
  };
  bool sent = true;
  if (!config_.password.empty()) {
    if (config_.username.empty()) {
      std::string_view argv[] = {"AUTH", config_.password};
      sent = sent && send(argv, internal(Request::Kind::kAuth)) == nullptr;
    } else {
      std::string_view argv[] = {"AUTH", config_.username, config_.password};
      sent = sent && send(argv, internal(Request::Kind::kAuth)) == nullptr;
    }
  }
  if (config_.db != 0) {
    std::string db = std::to_string(config_.db);
    std::string_view argv[] = {"SELECT", db};
    sent = sent && send(argv, internal(Request::Kind::kSelect)) == nullptr;
  }
  if (options_.require_master) {
    std::string_view argv[] = {"ROLE"};
    sent = sent && send(argv, internal(Request::Kind::kRole)) == nullptr;
  }
  for (ScriptId id = 0; id < scripts_.size(); id++) {
    auto request = internal(Request::Kind::kScriptLoad);
    request->script = id;
    std::string_view argv[] = {"SCRIPT", "LOAD", scripts_[id].source};
    sent = sent && send(argv, std::move(request)) == nullptr;
  }
  if (subscription_channel_.empty()) {
    std::string_view ping[] = {"PING"};
    sent = sent && send(ping, internal(Request::Kind::kPing)) == nullptr;
  } else {
    // hiredis keeps this request for the subscription's messages rather than
    // in its reply queue; the commands above are answered first all the same.
    std::string_view argv[] = {"SUBSCRIBE", subscription_channel_};
    sent = sent && send(argv, internal(Request::Kind::kSubscribe)) == nullptr;
  }
  if (!sent) {
    // We are inside hiredis's connect callback, where the context must not
    // be freed: drop it from the deadline timer instead.
    drop_reason_ = "handshake: cannot queue commands";
    armDeadlineTimer();
  }
}

// hiredis answers these more than once per call (pub/sub, MONITOR), which
// would break "exactly once" and free a Request while hiredis still uses it.
static bool isMultiReplyCommand(std::string_view name) {
  auto equals = [name](std::string_view other) {
    return std::equal(name.begin(), name.end(), other.begin(), other.end(),
                      [](char a, char b) { return std::toupper(static_cast<unsigned char>(a)) == b; });
  };
  return equals("SUBSCRIBE") || equals("PSUBSCRIBE") || equals("SSUBSCRIBE") ||
         equals("UNSUBSCRIBE") || equals("PUNSUBSCRIBE") || equals("SUNSUBSCRIBE") ||
         equals("MONITOR");
}

bool RedisLink::command(std::span<const std::string_view> argv, RedisCallback callback,
                        int64_t timeout_ms) {
  if (state_ != State::kConnected || argv.empty() || isMultiReplyCommand(argv[0]) ||
      !subscription_channel_.empty()) {
    return false;
  }
  auto request = std::make_unique<Request>();
  request->link = this;
  request->kind = Request::Kind::kCommand;
  request->callback = std::move(callback);
  request->timeout_ms = std::max<int64_t>(timeout_ms, 1);
  request->started_ns = uv_hrtime();
  return send(argv, std::move(request)) == nullptr;
}

bool RedisLink::evalsha(ScriptId script, std::span<const std::string_view> keys,
                        std::span<const std::string_view> args, RedisCallback callback,
                        int64_t timeout_ms) {
  if (state_ != State::kConnected || script >= scripts_.size() || !subscription_channel_.empty()) {
    return false;
  }
  auto request = std::make_unique<Request>();
  request->link = this;
  request->kind = Request::Kind::kEval;
  request->callback = std::move(callback);
  request->timeout_ms = std::max<int64_t>(timeout_ms, 1);
  request->started_ns = uv_hrtime();
  request->script = script;
  request->key_count = keys.size();
  request->keys_and_args.reserve(keys.size() + args.size());
  for (std::string_view key : keys) request->keys_and_args.emplace_back(key);
  for (std::string_view arg : args) request->keys_and_args.emplace_back(arg);
  return sendEval(std::move(request)) == nullptr;
}

std::unique_ptr<RedisLink::Request> RedisLink::sendEval(std::unique_ptr<Request> request) {
  const Script& script = scripts_[request->script];
  std::string key_count = std::to_string(request->key_count);
  std::vector<std::string_view> argv;
  argv.reserve(3 + request->keys_and_args.size());
  if (script.sha.empty()) {
    // It did not load on this connection (a compile error, most likely):
    // EVAL lets Redis report the error to the caller.
    argv.insert(argv.end(), {"EVAL", script.source, key_count});
  } else {
    argv.insert(argv.end(), {"EVALSHA", script.sha, key_count});
  }
  argv.insert(argv.end(), request->keys_and_args.begin(), request->keys_and_args.end());
  return send(argv, std::move(request));
}

std::unique_ptr<RedisLink::Request> RedisLink::send(std::span<const std::string_view> argv,
                                                    std::unique_ptr<Request> request) {
  if (context_ == nullptr) return request;
  std::vector<const char*> pointers(argv.size());
  std::vector<size_t> lengths(argv.size());
  for (size_t i = 0; i < argv.size(); i++) {
    pointers[i] = argv[i].data();
    lengths[i] = argv[i].size();
  }
  if (redisAsyncCommandArgv(context_, onReplyThunk, request.get(), static_cast<int>(argv.size()),
                            pointers.data(), lengths.data()) != REDIS_OK) {
    return request;
  }
  Request* sent = request.release();  // hiredis owns it now
  sent->in_flight_it = in_flight_.insert(in_flight_.end(), sent);
  unwritten_++;
  return nullptr;
}

// Commands issued in a tick go out when the loop next polls, which may be
// long after they were issued (a busy tick, a descheduled thread): their
// clocks start when they have been written, with fresh time.
void RedisLink::startClocks() {
  if (unwritten_ == 0) return;
  uv_update_time(loop_);
  uint64_t now_ms = uv_now(loop_);
  uint64_t earliest_ms = std::numeric_limits<uint64_t>::max();
  auto it = in_flight_.end();
  for (; unwritten_ > 0; unwritten_--) {
    Request* request = *--it;
    request->deadline_ms = now_ms + static_cast<uint64_t>(request->timeout_ms);
    request->deadline_it = deadlines_.emplace(request->deadline_ms, request);
    earliest_ms = std::min(earliest_ms, request->deadline_ms);
  }
  // Commands already waiting can only be late later than they could be
  // when the timer was armed; these may be due sooner.
  bool armed = uv_is_active(reinterpret_cast<uv_handle_t*>(&deadline_timer_)) != 0;
  if (!armed || earliest_ms < now_ms + uv_timer_get_due_in(&deadline_timer_)) armDeadlineTimer();
}

void RedisLink::onReplyThunk(redisAsyncContext* context, void* reply, void* privdata) {
  auto* subscription = static_cast<Request*>(privdata);
  if (subscription->kind == Request::Kind::kSubscribe && reply != nullptr) {
    // Not the last call (see the file comment): keep the request.
    if (!subscription->done) subscription->link->onSubscription(subscription, reply);
    return;
  }
  std::unique_ptr<Request> request(static_cast<Request*>(privdata));
  if (request->done) return;  // failed already (timeout, disconnect, close)
  request->link->onReply(request.get(), reply,
                         context->errstr != nullptr && context->err != 0 ? context->errstr
                                                                         : "connection lost");
}

void RedisLink::forget(Request* request) {
  request->done = true;
  in_flight_.erase(request->in_flight_it);
  if (request->deadline_ms != 0) deadlines_.erase(request->deadline_it);
}

void RedisLink::finish(Request* request, const RedisResult& result) {
  forget(request);
  RedisCallback callback = std::move(request->callback);
  if (callback) callback(result);
}

void RedisLink::onReply(Request* request, const void* raw_reply, const char* errstr) {
  if (raw_reply == nullptr) {
    // hiredis met an I/O error and is freeing the context; `request` is
    // still listed, so it is failed with the rest.
    loseConnection(errstr, false, false);
    return;
  }
  last_answer_ms_ = uv_now(loop_);
  uint64_t rtt_us = (uv_hrtime() - request->started_ns) / 1000;
  if (on_latency_) {
    on_latency_(rtt_us);
    if (request->done) return;  // the observer closed the link
  }

  RedisReply reply(raw_reply);
  bool is_error = reply.kind() == RedisReply::Kind::kError;
  RedisResult result{is_error ? RedisStatus::kRedisError : RedisStatus::kOk, &reply,
                     is_error ? reply.str() : std::string_view(), rtt_us};

  if (is_error && options_.require_master && reply.str().starts_with("READONLY") &&
      (request->kind == Request::Kind::kCommand || request->kind == Request::Kind::kEval)) {
    // The master was demoted to a replica under us: the caller gets the
    // error, the connection goes on the next timer tick (the callback may do
    // anything to the link), and the next attempt finds the master again.
    finish(request, result);
    if (context_ != nullptr && drop_reason_.empty()) {
      drop_reason_ = "READONLY: the server is a replica now; finding the master again";
      armDeadlineTimer();
    }
    return;
  }

  switch (request->kind) {
    case Request::Kind::kCommand:
      finish(request, result);
      return;

    case Request::Kind::kEval:
      if (is_error && !request->retried && reply.str().starts_with("NOSCRIPT")) {
        // The server lost its script cache (restart, failover, SCRIPT
        // FLUSH): load the script again and retry once, pipelined, within
        // the caller's deadline.
        forget(request);
        auto load = std::make_unique<Request>();
        load->link = this;
        load->kind = Request::Kind::kScriptLoad;
        load->script = request->script;
        load->timeout_ms = request->timeout_ms;
        load->started_ns = uv_hrtime();
        auto retry = std::make_unique<Request>();
        retry->link = this;
        retry->kind = Request::Kind::kEval;
        retry->callback = std::move(request->callback);
        retry->timeout_ms = request->timeout_ms;
        retry->started_ns = request->started_ns;
        retry->script = request->script;
        retry->keys_and_args = std::move(request->keys_and_args);
        retry->key_count = request->key_count;
        retry->retried = true;
        std::string_view argv[] = {"SCRIPT", "LOAD", scripts_[request->script].source};
        if (send(argv, std::move(load)) == nullptr) retry = sendEval(std::move(retry));
        if (retry != nullptr && retry->callback) {
          retry->callback(RedisResult{RedisStatus::kDisconnected, nullptr,
                                      "connection lost while reloading a script", 0});
        }
        return;
      }
      finish(request, result);
      return;

    case Request::Kind::kScriptLoad: {
      forget(request);
      Script& script = scripts_[request->script];
      if (!is_error && reply.kind() == RedisReply::Kind::kString) {
        script.sha = std::string(reply.str());
      } else {
        script.sha.clear();
        if (logAllowed()) {
          spdlog::error("redis {}: SCRIPT LOAD of {} failed: {}", address(), script.name,
                        reply.str());
        }
      }
      return;
    }

    case Request::Kind::kRole:
      forget(request);
      if (!is_error && reply.kind() == RedisReply::Kind::kArray && reply.size() > 0 &&
          reply[0].str() == "master") {
        return;
      }
      // A replica (a failover under way, or a stale answer from a sentinel):
      // the next attempt, after the backoff's short first steps, resolves
      // again. From a reply callback hiredis defers the free until we return.
      loseConnection("handshake: ROLE answered " +
                         std::string(is_error ? reply.str()
                                     : reply.kind() == RedisReply::Kind::kArray && reply.size() > 0
                                         ? reply[0].str()
                                         : "something else") +
                         ", not master",
                     true, false);
      return;

    case Request::Kind::kAuth:
    case Request::Kind::kSelect:
    case Request::Kind::kPing:
    case Request::Kind::kSubscribe:  // only an error reply; see onSubscription
      forget(request);
      if (is_error) {
        const char* what = request->kind == Request::Kind::kAuth        ? "AUTH"
                           : request->kind == Request::Kind::kSelect    ? "SELECT"
                           : request->kind == Request::Kind::kSubscribe ? "SUBSCRIBE"
                                                                        : "PING";
        // From a reply callback hiredis defers the free until we return.
        loseConnection(std::string("handshake: ") + what + ": " + std::string(reply.str()), true,
                       false);
        return;
      }
      if (request->kind == Request::Kind::kPing) handshakeDone();
      return;
  }
}

void RedisLink::handshakeDone() {
  state_ = State::kConnected;
  connect_deadline_ms_ = 0;
  if (!options_.quiet && reconnect_attempt_ > 0) {
    spdlog::info("{} {}: connected after {} failed attempts", options_.log_name, address(),
                 reconnect_attempt_);
  } else if (!options_.quiet) {
    spdlog::info("{} {}: connected", options_.log_name, address());
  }
  reconnect_attempt_ = 0;
  if (on_connected_) on_connected_();
}

// The subscription's confirmation ends the handshake; its messages go to
// on_message_. Anything else on a subscribed connection is ignored.
void RedisLink::onSubscription(Request* request, const void* raw_reply) {
  RedisReply reply(raw_reply);
  if (reply.kind() == RedisReply::Kind::kError) {
    onReply(request, raw_reply, nullptr);  // fails the handshake; hiredis frees it later
    return;
  }
  if (reply.kind() != RedisReply::Kind::kArray || reply.size() < 3) return;
  last_answer_ms_ = uv_now(loop_);
  std::string_view type = reply[0].str();
  if (type == "subscribe" && subscription_ == nullptr) {
    in_flight_.erase(request->in_flight_it);
    if (request->deadline_ms != 0) deadlines_.erase(request->deadline_it);
    subscription_ = request;
    handshakeDone();
    if (subscription_ == request) scheduleProbe();  // unless on_connected dropped or closed it
  } else if (type == "message" && subscription_ == request && on_message_) {
    on_message_(reply[2].str());
  }
}

// A PING on a subscribed connection is answered ["pong", ""], which hiredis
// 0.14 takes for a message of a pattern subscription named "" and drops; the
// PING's callback, had it one, would stay queued until the connection ends,
// one per PING. So the PING goes into the output buffer with no callback
// (redisAppendCommandArgv, hiredis's pipelining call), and what proves the
// server alive is that the connection has bytes to read after it: the pong,
// or a message.
void RedisLink::scheduleProbe() {
  if (options_.probe_interval_ms <= 0 || subscription_ == nullptr) return;
  next_probe_ms_ = uv_now(loop_) + static_cast<uint64_t>(options_.probe_interval_ms);
  armDeadlineTimer();
}

void RedisLink::sendProbe() {
  next_probe_ms_ = 0;
  const char* argv[] = {"PING"};
  size_t lengths[] = {4};
  if (redisAppendCommandArgv(&context_->c, 1, argv, lengths) != REDIS_OK) {
    drop_reason_ = "cannot queue a PING";
    return;
  }
  context_->ev.addWrite(context_->ev.data);
  probe_deadline_ms_ = uv_now(loop_) + static_cast<uint64_t>(options_.probe_timeout_ms);
}

void RedisLink::noteRead() {
  if (probe_deadline_ms_ == 0) return;
  probe_deadline_ms_ = 0;
  scheduleProbe();
}

// Ends the current connection or attempt: every listed request is failed
// (`timeout` for those past their deadline when `deadline_passed`, else
// `disconnected`), the context is freed when `free_context` (otherwise hiredis
// is freeing it), and a reconnect is scheduled unless the link is closing.
void RedisLink::loseConnection(const std::string& reason, bool free_context,
                               bool deadline_passed) {
  redisAsyncContext* context = context_;
  context_ = nullptr;
  if (context != nullptr) context->data = nullptr;  // its callbacks are stale from now on
  state_ = closing_ ? State::kClosing : State::kBackoff;
  connect_deadline_ms_ = 0;
  drop_reason_.clear();
  next_probe_ms_ = probe_deadline_ms_ = 0;
  for (Script& script : scripts_) script.sha.clear();
  if (subscription_ != nullptr) {
    subscription_->done = true;  // hiredis deletes it when it frees the context
    subscription_ = nullptr;
  }

  std::list<Request*> failed;
  failed.swap(in_flight_);
  deadlines_.clear();
  unwritten_ = 0;
  for (Request* request : failed) request->done = true;

  if (!closing_) {
    if (!options_.quiet && logAllowed()) {
      if (logs_suppressed_ > 0) {
        spdlog::warn("{} {}: {} (and {} similar messages suppressed)", options_.log_name,
                     logAddress(), reason, logs_suppressed_);
        logs_suppressed_ = 0;
      } else {
        spdlog::warn("{} {}: {}", options_.log_name, logAddress(), reason);
      }
    }
    if (on_disconnected_) on_disconnected_(reason);
  }

  uint64_t now_ms = uv_now(loop_);
  for (Request* request : failed) {
    if (!request->callback) continue;
    RedisCallback callback = std::move(request->callback);
    std::string timeout_reason;
    if (deadline_passed && late(*request, now_ms)) {
      timeout_reason = "no answer within " + std::to_string(request->timeout_ms) + " ms";
      callback(RedisResult{RedisStatus::kTimeout, nullptr, timeout_reason, 0});
    } else {
      callback(RedisResult{RedisStatus::kDisconnected, nullptr, reason, 0});
    }
  }

  if (free_context && context != nullptr) redisAsyncFree(context);
  if (!closing_) scheduleReconnect();
}

void RedisLink::scheduleReconnect() {
  int64_t delay_ms = options_.backoff_initial_ms;
  for (int i = 0; i < reconnect_attempt_ && delay_ms < options_.backoff_max_ms; i++) delay_ms *= 2;
  delay_ms = std::min(delay_ms, options_.backoff_max_ms);
  std::uniform_real_distribution<double> jitter(1.0 - options_.backoff_jitter,
                                                1.0 + options_.backoff_jitter);
  auto jittered_ms = static_cast<uint64_t>(static_cast<double>(delay_ms) * jitter(random_));
  reconnect_attempt_++;
  state_ = State::kBackoff;
  uv_update_time(loop_);  // the delay counts from this report, not the loop's last tick
  uv_timer_start(&retry_timer_,
                 [](uv_timer_t* timer) { static_cast<RedisLink*>(timer->data)->connectNow(); },
                 jittered_ms, 0);
}

void RedisLink::armDeadlineTimer() {
  uint64_t now_ms = uv_now(loop_);
  uint64_t next_ms = std::numeric_limits<uint64_t>::max();
  if (!drop_reason_.empty()) next_ms = now_ms;
  if (connect_deadline_ms_ != 0) next_ms = std::min(next_ms, connect_deadline_ms_);
  if (next_probe_ms_ != 0) next_ms = std::min(next_ms, next_probe_ms_);
  if (probe_deadline_ms_ != 0) next_ms = std::min(next_ms, probe_deadline_ms_);
  const Request* late_request = nullptr;
  next_ms = std::min(next_ms, nextCommandDeadline(now_ms, &late_request));
  if (next_ms == std::numeric_limits<uint64_t>::max()) {
    uv_timer_stop(&deadline_timer_);
    return;
  }
  uv_timer_start(&deadline_timer_,
                 [](uv_timer_t* timer) { static_cast<RedisLink*>(timer->data)->onDeadlineTimer(); },
                 next_ms > now_ms ? next_ms - now_ms : 0, 0);
}

void RedisLink::onDeadlineTimer() {
  uint64_t now_ms = uv_now(loop_);
  if (next_probe_ms_ != 0 && now_ms >= next_probe_ms_ && context_ != nullptr) sendProbe();
  if (!drop_reason_.empty()) {
    std::string reason = drop_reason_;
    loseConnection(reason, true, false);
    return;
  }
  const Request* late_request = nullptr;
  bool connect_late = connect_deadline_ms_ != 0 && now_ms >= connect_deadline_ms_;
  bool probe_late = probe_deadline_ms_ != 0 && now_ms >= probe_deadline_ms_;
  nextCommandDeadline(now_ms, &late_request);
  if ((connect_late || probe_late || late_request != nullptr) && context_ != nullptr) {
    // libuv runs timers before it polls: when this thread was busy or
    // descheduled, the answers may be waiting in the socket. Read them
    // before calling anything late.
    redisAsyncContext* context = context_;
    int waiting = 0;
    if (ioctl(context->c.fd, FIONREAD, &waiting) == 0 && waiting > 0) noteRead();
    redisAsyncHandleRead(context);
    if (context_ != context) return;  // the read lost the connection, or a callback closed the link
  }
  if (probe_deadline_ms_ != 0 && now_ms >= probe_deadline_ms_) {
    loseConnection("a PING got no answer within " + std::to_string(options_.probe_timeout_ms) +
                       " ms; dropping the connection",
                   true, true);
  } else if (connect_deadline_ms_ != 0 && now_ms >= connect_deadline_ms_) {
    loseConnection("connect: no answer within " + std::to_string(options_.connect_timeout_ms) +
                       " ms",
                   true, false);
  } else if (const Request* late_request = nullptr;
             nextCommandDeadline(now_ms, &late_request), late_request != nullptr) {
    loseConnection("a command got no answer within " + std::to_string(late_request->timeout_ms) +
                       " ms; dropping the connection",
                   true, true);
  } else {
    armDeadlineTimer();
  }
}

// A command is late once its timeout has passed both since it was written
// and since Redis last answered anything: until then it is waiting its turn.
bool RedisLink::late(const Request& request, uint64_t now_ms) const {
  if (request.deadline_ms == 0) return false;  // not written yet
  return now_ms >= std::max(request.deadline_ms,
                            last_answer_ms_ + static_cast<uint64_t>(request.timeout_ms));
}

uint64_t RedisLink::nextCommandDeadline(uint64_t now_ms, const Request** late_request) const {
  *late_request = nullptr;
  uint64_t next_ms = std::numeric_limits<uint64_t>::max();
  // Only commands whose sent + timeout has passed can be late now; for
  // each of those, answers since have moved its deadline on.
  for (const auto& [deadline_ms, request] : deadlines_) {
    if (deadline_ms > now_ms) return std::min(next_ms, deadline_ms);
    if (late(*request, now_ms)) {
      *late_request = request;
      return now_ms;
    }
    next_ms = std::min(next_ms, last_answer_ms_ + static_cast<uint64_t>(request->timeout_ms));
  }
  return next_ms;
}

void RedisLink::reconnect(const std::string& reason) {
  if (closing_ || state_ == State::kIdle) return;
  if (context_ != nullptr) {
    loseConnection(reason, true, false);  // schedules a retry, stopped below
    if (closing_) return;                 // a callback closed the link
  } else if (!options_.quiet) {
    spdlog::info("{} {}: {}", options_.log_name, logAddress(), reason);
  }
  uv_timer_stop(&retry_timer_);
  reconnect_attempt_ = 0;
  connectNow();  // a resolve still under way is ignored when it answers
}

void RedisLink::close(std::function<void()> on_closed) {
  if (closing_) {
    spdlog::critical("RedisLink::close() called twice");
    std::abort();
  }
  closing_ = true;
  on_closed_ = std::move(on_closed);
  state_ = State::kClosing;
  if (context_ != nullptr) loseConnection("the link was closed", true, false);
  auto closed = [](uv_handle_t* handle) { static_cast<RedisLink*>(handle->data)->onHandleClosed(); };
  uv_close(reinterpret_cast<uv_handle_t*>(&retry_timer_), closed);
  uv_close(reinterpret_cast<uv_handle_t*>(&deadline_timer_), closed);
}

void RedisLink::onHandleClosed() {
  if (--open_handles_ > 0 || !closing_) return;
  state_ = State::kClosed;
  std::function<void()> on_closed = std::move(on_closed_);
  if (on_closed) on_closed();
}

// --- RetiredLinks ---------------------------------------------------------------

void RetiredLinks::retire(std::unique_ptr<RedisLink> link) {
  if (!link) return;
  links_.push_back(Retired{std::move(link), false});
  auto it = std::prev(links_.end());
  ++closing_;
  it->link->close([this, it] {
    it->closed = true;
    if (--closing_ == 0 && on_drained_) on_drained_();
  });
}

void RetiredLinks::freeClosed() {
  links_.remove_if([](const Retired& retired) { return retired.closed; });
}

}  // namespace sluice
