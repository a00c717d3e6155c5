// Worker: a thread with its own loop serving its own connections.
#include "worker.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include <spdlog/spdlog.h>

#include "uv_handles.h"

namespace sluice {

namespace {

// The most one read takes: enough for a pipelining client's burst, answered
// then in one write.
constexpr size_t kReadScratchBytes = 64 * 1024;

// Bad-input lines logged per worker per second; the rest are counted.
constexpr int kBadInputLogsPerSecond = 5;

}  // namespace

// The recipient a sibling answers a relayed settle to: it carries the answer
// back to its home worker's loop and is done (one answer each).
class Worker::Relay final : public Recipient {
 public:
  Relay(Worker* home, uint64_t token) : home_(home), token_(token) {}
  void receive(MsgId /*tag*/, const Answer& answer) override {
    home_->postRelayed(token_, answer);
    delete this;
  }

 private:
  Worker* home_;
  uint64_t token_;
};

Worker::Worker(size_t index, const WorkerOptions& options, KeyTable& keys, MetricsShard& metrics,
               DaemonStatus& status, RuleSetPtr rules, LeaseBroker* broker,
               RespFront::EnsureRule throttle_rules, MetricsShard* lane_metrics)
    : index_(index),
      options_(options),
      keys_(keys),
      metrics_(metrics),
      dispatcher_(keys, metrics, broker, options.lease_timeout_ms * 1'000'000,
                  static_cast<uint32_t>(index)),
      rpc_front_(dispatcher_, keys, metrics, status, broker),
      resp_front_(dispatcher_, options_.resp, std::move(throttle_rules)),
      http_front_(dispatcher_, options_.http),
      reader_slot_(keys.registerReader()),
      read_scratch_(kReadScratchBytes) {
  if (lane_metrics != nullptr) {
    lane_ = std::make_unique<Dispatcher>(keys, *lane_metrics, broker,
                                         options.lease_timeout_ms * 1'000'000,
                                         static_cast<uint32_t>(index));
    lane_->setRules(rules);
    lane_reader_ = keys.registerReader();
  }
  dispatcher_.setRules(std::move(rules));
  dispatcher_.routeSettlesWith([this](uint32_t worker, const Question& question,
                                      Recipient* recipient, MsgId tag) {
    return routeSettle(worker, question, recipient, tag);
  });
  uv_loop_init(&loop_);
  uv_async_init(&loop_, &wakeup_, [](uv_async_t* handle) {
    static_cast<Worker*>(handle->data)->onMessages();
  });
  wakeup_.data = this;
  uv_timer_init(&loop_, &sweep_timer_);
  sweep_timer_.data = this;
  uv_timer_init(&loop_, &stop_timer_);
  stop_timer_.data = this;
  uv_timer_init(&loop_, &lease_timer_);
  lease_timer_.data = this;
  uv_idle_init(&loop_, &resume_idle_);
  resume_idle_.data = this;
}

std::unique_ptr<Codec> Worker::makeCodec(Protocol protocol, const Peer& peer) {
  if (protocol == Protocol::kResp) return resp_front_.makeCodec();
  if (protocol == Protocol::kHttp) return http_front_.makeCodec(peer);
  return std::make_unique<RpcCodec>(
      rpc_front_, metrics_, options_.protocol, peer,
      [this](const rpc::ParseResult* result, const rpc::Request* request) {
        if (result != nullptr) logBadInput(*result);
        if (request != nullptr) noteUnknownFields(*request);
      });
}

void Worker::resumeLater(Connection* connection) {
  resuming_.push_back(connection);
  uv_idle_start(&resume_idle_, [](uv_idle_t* idle) {
    auto* self = static_cast<Worker*>(idle->data);
    uv_idle_stop(idle);
    std::vector<Connection*> resuming;
    resuming.swap(self->resuming_);
    // A connection closed meanwhile left the list (onConnectionClosed).
    for (Connection* c : resuming) c->resume();
  });
}

Worker::~Worker() {
  join();
  for (Message& message : inbox_) {
    if (message.kind == Message::Kind::kAdopt) {
      ::close(message.fd);
    } else if (message.kind == Message::Kind::kAsk) {
      // A sibling's relayed settle: its home may be gone already, and its
      // connection with it.
      if (auto* relay = dynamic_cast<Relay*>(message.recipient)) {
        delete relay;
        continue;
      }
      refuseStopped(message);
    }
  }
}

void Worker::refuseStopped(const Message& message) {
  Answer answer;
  answer.method = message.question.question().method;
  answer.fail(ErrorCode::kOverloaded, "the daemon is stopping; ask again once it is back");
  message.recipient->receive(message.tag, answer);
}

void Worker::submit(HeldQuestion question, Recipient* recipient, MsgId tag) {
  Message message(Message::Kind::kAsk);
  message.question = std::move(question);
  message.recipient = recipient;
  message.tag = tag;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!wakeup_closed_) {
      inbox_.push_back(std::move(message));
      uv_async_send(&wakeup_);
      return;
    }
  }
  refuseStopped(message);
}

bool Worker::decideOnLane(const Question& question, Recipient* recipient, MsgId tag,
                          Answer* answer, Outcome* outcome) {
  // Reservations and settles stay on the loop: their table is the worker's.
  const bool rides = question.method == Method::kAcquire ||
                     question.method == Method::kAcquireAll || question.method == Method::kPeek;
  if (lane_ == nullptr || !rides) return false;
  std::unique_lock<std::mutex> lock(lane_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  const int64_t now_ns = monotonicNowNs();
  Asker asker = lane_->askerFor(recipient, tag, now_ns);
  asker.may_wait = asker.may_wait && !lane_stopping_;
  {
    KeyTable::ReadGuard guard(keys_, lane_reader_);
    *outcome = lane_->ask(question, now_ns, asker, answer);
  }
  lock.unlock();
  if (*outcome != Outcome::kAnswered) {
    // Its wait is the loop's to end: by lease news, or at its deadline. A
    // loop that has stopped answered it when it stopped.
    std::lock_guard<std::mutex> closed_lock(mutex_);
    if (!wakeup_closed_) {
      inbox_.emplace_back(Message::Kind::kLaneWaits);
      uv_async_send(&wakeup_);
    }
  }
  return true;
}

bool Worker::routeSettle(uint32_t worker, const Question& question, Recipient* recipient,
                         MsgId tag) {
  if (worker >= siblings_.size() || siblings_[worker] == this || siblings_[worker] == nullptr) {
    return false;
  }
  const uint64_t token = next_relay_++;
  relays_.emplace(token, Relayed{recipient, tag});
  siblings_[worker]->submit(HeldQuestion(question), new Relay(this, token), tag);
  return true;
}

void Worker::postRelayed(uint64_t relay, const Answer& answer) {
  Message message(Message::Kind::kRelayed);
  message.relay = relay;
  message.answer = answer;
  std::lock_guard<std::mutex> lock(mutex_);
  if (wakeup_closed_) return;  // this worker has stopped: nobody waits for it
  inbox_.push_back(std::move(message));
  uv_async_send(&wakeup_);
}

void Worker::ask(const Message& message) {
  int64_t now_ns = monotonicNowNs();
  Asker asker = dispatcher_.askerFor(message.recipient, message.tag, now_ns);
  // A stopping worker has answered its waiters: a question now may not wait.
  asker.may_wait = asker.may_wait && !stopping_;
  Outcome outcome = Outcome::kAnswered;
  {
    KeyTable::ReadGuard guard(keys_, reader_slot_);
    outcome = dispatcher_.ask(message.question.question(), now_ns, asker, &answer_);
  }
  if (outcome == Outcome::kAnswered) {
    message.recipient->receive(message.tag, answer_);
  } else {
    armLeaseTimer();
  }
}

void Worker::start() {
  uint64_t sweep_ms = static_cast<uint64_t>(
      std::clamp<int64_t>(std::min({options_.idle_timeout_ms, options_.partial_frame_timeout_ms,
                                    options_.linger_ms}) / 4,
                          10, 1000));
  uv_timer_start(
      &sweep_timer_, [](uv_timer_t* t) { static_cast<Worker*>(t->data)->onSweep(); }, sweep_ms,
      sweep_ms);
  thread_ = std::thread([this] { run(); });
}

void Worker::run() {
  // Named for top -H, gdb and the watchdog test: "sluice-w0", "sluice-w1", ...
  pthread_setname_np(pthread_self(), ("sluice-w" + std::to_string(index_)).c_str());
  handle_count_.store(openHandles(&loop_), std::memory_order_relaxed);
  uv_run(&loop_, UV_RUN_DEFAULT);
  // Every handle is closed by now (finishIfDrained), so the loop closes.
  int rc = uv_loop_close(&loop_);
  if (rc != 0) {
    spdlog::error("worker {}: loop closed with handles still open ({})", index_, uv_strerror(rc));
  }
}

void Worker::join() {
  if (thread_.joinable()) {
    thread_.join();
  }
}

void Worker::post(Message message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    inbox_.push_back(std::move(message));
  }
  uv_async_send(&wakeup_);
}

void Worker::adopt(int fd, const Peer& peer, Protocol protocol) {
  Message message(Message::Kind::kAdopt);
  message.fd = fd;
  message.peer = peer;
  message.protocol = protocol;
  connection_count_.fetch_add(1, std::memory_order_relaxed);
  post(std::move(message));
}

void Worker::setRules(RuleSetPtr rules) {
  if (lane_ != nullptr) {
    std::lock_guard<std::mutex> lock(lane_mutex_);
    lane_->setRules(rules);
  }
  Message message(Message::Kind::kRules);
  message.rules = std::move(rules);
  post(std::move(message));
}

void Worker::stop() { post(Message(Message::Kind::kStop)); }

void Worker::ping(uint64_t seq) {
  Message message(Message::Kind::kPing);
  message.seq = seq;
  post(std::move(message));
}

void Worker::notifyLeases() {
  // The caller wrote the slices first: see the thread model.
  std::lock_guard<std::mutex> lock(mutex_);
  if (!awaits_news_.load(std::memory_order_relaxed)) {
    news_missed_ = true;
    return;
  }
  wakeForNewsLocked();
}

void Worker::wakeForNewsLocked() {
  if (lease_news_ || wakeup_closed_) return;
  lease_news_ = true;
  lease_wakeups_.fetch_add(1, std::memory_order_relaxed);
  uv_async_send(&wakeup_);
}

bool Worker::laneAwaitsNews() {
  if (lane_ == nullptr) return false;
  std::lock_guard<std::mutex> lock(lane_mutex_);
  return lane_->awaitsLeaseNews();
}

int64_t Worker::nextDeferredDeadlineNs() {
  int64_t next_ns = dispatcher_.hasDeferred() ? dispatcher_.nextDeadlineNs() : INT64_MAX;
  if (lane_ != nullptr) {
    std::lock_guard<std::mutex> lock(lane_mutex_);
    if (lane_->hasDeferred()) next_ns = std::min(next_ns, lane_->nextDeadlineNs());
  }
  return next_ns;
}

void Worker::noteWaiters() {
  bool awaits = dispatcher_.awaitsLeaseNews() || laneAwaitsNews();
  if (awaits == awaits_news_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  awaits_news_.store(awaits, std::memory_order_relaxed);
  // A reply that came while the flag was down woke nobody; it may be one a
  // request now waiting asked for: look at the slices once more.
  if (awaits && news_missed_) wakeForNewsLocked();
  news_missed_ = false;
}

void Worker::retryDeferred() {
  const int64_t now_ns = monotonicNowNs();
  if (dispatcher_.hasDeferred()) {
    KeyTable::ReadGuard guard(keys_, reader_slot_);
    dispatcher_.retryDeferred(now_ns, stopping_);
  }
  if (lane_ != nullptr) {
    std::lock_guard<std::mutex> lock(lane_mutex_);
    // Stopping, every waiter is answered now: none may wait after it.
    lane_stopping_ = lane_stopping_ || stopping_;
    if (lane_->hasDeferred()) {
      KeyTable::ReadGuard guard(keys_, lane_reader_);
      lane_->retryDeferred(now_ns, stopping_);
    }
  }
  armLeaseTimer();  // or, none left waiting, stops its timer
}

void Worker::armLeaseTimer() {
  noteWaiters();
  const int64_t next_ns = nextDeferredDeadlineNs();
  if (next_ns == INT64_MAX) {
    uv_timer_stop(&lease_timer_);
    return;
  }
  int64_t wait_ns = next_ns - monotonicNowNs();
  auto wait_ms = static_cast<uint64_t>(std::max<int64_t>((wait_ns + 999'999) / 1'000'000, 0));
  uv_timer_start(
      &lease_timer_, [](uv_timer_t* t) { static_cast<Worker*>(t->data)->retryDeferred(); },
      wait_ms, 0);
}

void Worker::onMessages() {
  bool lease_news = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    taken_.swap(inbox_);
    lease_news = lease_news_;
    lease_news_ = false;
  }
  if (lease_news) {
    retryDeferred();
  }
  for (Message& message : taken_) {
    switch (message.kind) {
      case Message::Kind::kAdopt: {
        if (stopping_) {
          ::close(message.fd);
          UserConnections::release(message.peer);
          connection_count_.fetch_sub(1, std::memory_order_relaxed);
          break;
        }
        auto* connection = new Connection(*this, message.peer, message.protocol);
        connection->index = connections_.size();
        connections_.push_back(connection);
        metrics_.connections_accepted.add();
        connection->open(message.fd, static_cast<int64_t>(uv_now(&loop_)));
        break;
      }
      case Message::Kind::kRules: dispatcher_.setRules(std::move(message.rules)); break;
      case Message::Kind::kStop: beginStop(); break;
      case Message::Kind::kPing: pong_.store(message.seq, std::memory_order_release); break;
      case Message::Kind::kAsk: ask(message); break;
      case Message::Kind::kLaneWaits: armLeaseTimer(); break;
      case Message::Kind::kRelayed: {
        // Its connection may have closed meanwhile (forgotten below).
        auto relayed = relays_.find(message.relay);
        if (relayed != relays_.end()) {
          Relayed to = relayed->second;
          relays_.erase(relayed);
          to.recipient->receive(to.tag, message.answer);
        }
        break;
      }
    }
  }
  taken_.clear();
}

void Worker::onSweep() {
  handle_count_.store(openHandles(&loop_), std::memory_order_relaxed);
  {
    // Reservations past their TTL settle at their estimate.
    KeyTable::ReadGuard guard(keys_, reader_slot_);
    dispatcher_.expireReservations(monotonicNowNs());
  }
  auto now_ms = static_cast<int64_t>(uv_now(&loop_));
  // checkTimeouts may close a connection, but the list changes only in the
  // close callback, which runs later in this loop iteration.
  for (Connection* connection : connections_) {
    connection->checkTimeouts(now_ms);
  }
}

void Worker::onConnectionClosed(Connection* connection) {
  dispatcher_.forget(connection);
  std::erase(resuming_, connection);
  std::erase_if(relays_, [connection](const auto& relayed) {
    return relayed.second.recipient == connection;
  });
  size_t index = connection->index;
  connections_[index] = connections_.back();
  connections_[index]->index = index;
  connections_.pop_back();
  UserConnections::release(connection->peer());
  delete connection;
  connection_count_.fetch_sub(1, std::memory_order_relaxed);
  if (stopping_) {
    finishIfDrained();
  }
}

void Worker::beginStop() {
  if (stopping_) {
    return;
  }
  stopping_ = true;
  uv_timer_stop(&sweep_timer_);
  // Requests waiting for a lease are answered now, by their policy, and
  // those waiting for reserved units with a denial.
  retryDeferred();
  // Answer what was read, then close; a client that does not take its
  // answers within the shutdown timeout is cut off.
  std::vector<Connection*> open = connections_;
  for (Connection* connection : open) {
    connection->drain();
  }
  uv_timer_start(
      &stop_timer_,
      [](uv_timer_t* t) {
        auto* self = static_cast<Worker*>(t->data);
        for (Connection* connection : self->connections_) {
          connection->close(CloseReason::kShutdown);
        }
      },
      static_cast<uint64_t>(options_.shutdown_timeout_ms), 0);
  finishIfDrained();
}

void Worker::finishIfDrained() {
  if (!connections_.empty()) {
    return;
  }
  auto* wakeup = reinterpret_cast<uv_handle_t*>(&wakeup_);
  if (uv_is_closing(wakeup)) {
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    wakeup_closed_ = true;
  }
  uv_close(wakeup, nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&sweep_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&stop_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&lease_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&resume_idle_), nullptr);
}

bool Worker::mayLogBadInput() {
  auto now_ms = static_cast<int64_t>(uv_now(&loop_));
  if (now_ms - log_window_ms_ >= 1000) {
    log_window_ms_ = now_ms;
    log_lines_ = 0;
  }
  if (log_lines_ >= kBadInputLogsPerSecond) {
    ++log_suppressed_;
    return false;
  }
  ++log_lines_;
  return true;
}

std::string Worker::suppressedNote() {
  std::string note = log_suppressed_ > 0
                         ? fmt::format("; {} similar lines suppressed", log_suppressed_)
                         : std::string();
  log_suppressed_ = 0;
  return note;
}

void Worker::logBadInput(const rpc::ParseResult& result) {
  if (!mayLogBadInput()) return;
  spdlog::warn("worker {}: {} request: {} ({}){}", index_,
               result.status == rpc::ParseStatus::kFatal ? "unreadable" : "bad",
               result.message, rpc::errorCodeName(result.error), suppressedNote());
}

namespace {

// A client's text for a log line: at most 64 bytes, each byte outside
// printable ASCII shown as '?'.
std::string printable(std::string_view text) {
  std::string shown(text.substr(0, 64));
  for (char& c : shown) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return shown;
}

}  // namespace

void Worker::noteUnknownFields(const rpc::Request& request) {
  metrics().unknown_fields.add(request.unknown_fields);
  if (!mayLogBadInput()) return;
  std::string first = request.first_unknown_field.empty()
                          ? std::string("a name that is not a str")
                          : "\"" + printable(request.first_unknown_field) + "\"";
  spdlog::warn("worker {}: {} request had {} unknown field(s), skipped (first: {}){}", index_,
               printable(request.method_name), request.unknown_fields, first, suppressedNote());
}

}  // namespace sluice
