// EnvoyFront over gRPC's async API (envoy_front.h): [envoy] threads polling
// threads (Pollers) on one completion queue, handling every event inline;
// one Exchange per call in gRPC's hands and one Call per ShouldRateLimit
// in flight; grpc.health.v1.Health's Check (HealthCheck); the server's
// start and stop.
#include "envoy_front.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <absl/synchronization/mutex.h>
#include <google/protobuf/arena.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include "clock.h"
#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "envoy_rls.h"
#include "worker.h"

namespace sluice {
namespace {

using RlsService = envoy::service::ratelimit::v3::RateLimitService;

// What calls read of the config, replaced whole on a reload.
struct Settings {
  EnvoyPolicyPtr policy;
  EnvoyRuleOptions options;
  bool all_or_nothing = false;
};

// What the completion queue hands back: an operation of ours, done.
class Tag {
 public:
  virtual ~Tag() = default;
  // On the polling thread: the operation finished; `ok` as gRPC says.
  virtual void done(bool ok) = 0;
};

class Pollers;

// One ShouldRateLimit call's gRPC side, owned by the Pollers: its context,
// its request and response on a protobuf arena that starts in the
// exchange itself (parsing the request and building the response cost no
// allocation of their own unless they outgrow kArenaBlockBytes), and its
// responder. Reused call after call: reset() rebuilds the context and
// responder in place and empties the arena.
class Exchange final : public Tag {
 public:
  explicit Exchange(Pollers* owner) : owner_(owner), arena_(arenaOptions(block_)) { reset(); }
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  // Ready for the next call: a fresh context, responder and messages.
  void reset() {
    responder_.reset();
    context_.reset();
    arena_.Reset();
    context_.emplace();
    responder_.emplace(&*context_);
    request_ = google::protobuf::Arena::CreateMessage<RateLimitRequest>(&arena_);
    response_ = google::protobuf::Arena::CreateMessage<RateLimitResponse>(&arena_);
  }
  // Asks gRPC for the next call on `queue`; `this` comes back from it.
  void request(RlsService::AsyncService* service, grpc::ServerCompletionQueue* queue) {
    finishing_ = false;
    service->RequestShouldRateLimit(&*context_, request_, &*responder_, queue, queue, this);
  }
  // Any thread, once: answers the call with the response; `this` comes
  // back from the queue when gRPC is done with it.
  void finish() {
    finishing_ = true;
    responder_->Finish(*response_, grpc::Status::OK, this);
  }
  // On the polling thread, instead of finish(): the call's deadline passed
  // before it was decided.
  void finishLate() {
    finishing_ = true;
    responder_->FinishWithError(kLate, this);
  }
  // When the client gives up on the call (time_point::max() for never).
  std::chrono::system_clock::time_point deadline() const { return context_->deadline(); }
  const RateLimitRequest& requestMessage() const { return *request_; }
  RateLimitResponse* response() { return response_; }
  // Whether the queue's event for this is the finish (else a new call).
  bool finishing() const { return finishing_; }
  void done(bool ok) override;

 private:
  // Enough for a request of a few descriptors and its response.
  static constexpr size_t kArenaBlockBytes = 4096;
  static inline const grpc::Status kLate{grpc::StatusCode::DEADLINE_EXCEEDED,
                                         "the deadline passed before the call was decided"};
  static google::protobuf::ArenaOptions arenaOptions(char* block) {
    google::protobuf::ArenaOptions options;
    options.initial_block = block;
    options.initial_block_size = kArenaBlockBytes;
    return options;
  }
  Pollers* owner_;
  alignas(8) char block_[kArenaBlockBytes];  // before arena_: it lives longer
  google::protobuf::Arena arena_;
  std::optional<grpc::ServerContext> context_;
  std::optional<grpc::ServerAsyncResponseWriter<RateLimitResponse>> responder_;
  RateLimitRequest* request_ = nullptr;
  RateLimitResponse* response_ = nullptr;
  bool finishing_ = false;  // the polling thread's, and finish()'s before the queue returns this
};

// One ShouldRateLimit call: the questions it asked and the answers so far.
// Deletes itself once the call is finished; `live` counts the Calls not
// yet finished (stop() waits for none).
class Call final : public Recipient {
 public:
  Call(Exchange* exchange, std::shared_ptr<const Settings> settings, EnvoyPlan plan,
       std::atomic<size_t>* live)
      : exchange_(exchange), settings_(std::move(settings)), plan_(std::move(plan)),
        live_(live), outcomes_(plan_.rules.size()) {
    live_->fetch_add(1, std::memory_order_relaxed);
  }

  // Asks the questions, each on the first free lane (Worker::decideOnLane)
  // of `workers` from `first` on, else submitted to workers[first]. The
  // last answer finishes the call, maybe before this returns.
  void ask(const std::vector<Worker*>& workers, size_t first) {
    const size_t items = plan_.rules.size();
    if (items == 0) {
      finish();
      return;
    }
    // One count more than the questions, this function's: a question
    // answered at once must not finish the call while it asks the next.
    if (settings_->all_or_nothing && items > 1) {
      std::vector<Item> all;
      for (size_t i = 0; i < items; ++i) all.push_back(envoyItem(plan_, i));
      pending_.store(2, std::memory_order_relaxed);
      askOne(workers, first, Question{Method::kAcquireAll, all}, MsgId(kAllTag));
    } else {
      pending_.store(items + 1, std::memory_order_relaxed);
      for (size_t i = 0; i < items; ++i) {
        Item item = envoyItem(plan_, i);
        const Method method = item.cost == 0 ? Method::kPeek : Method::kAcquire;
        askOne(workers, first, Question{method, std::span<const Item>(&item, 1)}, MsgId(i));
      }
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) finish();
  }

  void receive(MsgId tag, const Answer& answer) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (answer.failed) noteError(answer);
      if (tag.bits == kAllTag) {
        for (size_t i = 0; i < outcomes_.size(); ++i) {
          outcomes_[i].failed = answer.failed;
          // All or nothing: each item's own decision, though a denied
          // request spent nothing on any of them.
          if (!answer.failed && i < answer.decisions.size()) outcomes_[i].decision = answer.decisions[i];
        }
      } else if (tag.bits < outcomes_.size()) {
        EnvoyOutcome& outcome = outcomes_[tag.bits];
        outcome.failed = answer.failed;
        if (!answer.failed && !answer.decisions.empty()) outcome.decision = answer.decisions[0];
      }
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) finish();
  }

 private:
  static constexpr uint64_t kAllTag = ~uint64_t{0};

  // One question, on a lane when one is free: answered here, without a hop
  // to a worker's loop and back, unless it waits.
  void askOne(const std::vector<Worker*>& workers, size_t first, const Question& question,
              MsgId tag) {
    thread_local Answer answer;  // the lanes' answers on this gRPC thread, reused
    for (size_t k = 0; k < workers.size(); ++k) {
      Outcome outcome = Outcome::kAnswered;
      if (workers[(first + k) % workers.size()]->decideOnLane(question, this, tag, &answer,
                                                               &outcome)) {
        if (outcome == Outcome::kAnswered) receive(tag, answer);
        return;
      }
    }
    workers[first % workers.size()]->submit(HeldQuestion(question), this, tag);
  }

  // Logs an error answered as OK, at most once a second for the process
  // (an error repeats with every call that meets it).
  static void noteError(const Answer& answer) {
    static std::atomic<int64_t> last_logged_ns{INT64_MIN / 2};
    const int64_t now_ns = monotonicNowNs();
    int64_t last_ns = last_logged_ns.load(std::memory_order_relaxed);
    if (now_ns - last_ns < 1'000'000'000 ||
        !last_logged_ns.compare_exchange_strong(last_ns, now_ns, std::memory_order_relaxed)) {
      return;
    }
    spdlog::warn("envoy: a descriptor answered OK after an error: {} {}",
                 errorCodeName(answer.error), answer.message);
  }

  void finish() {
    encodeResponse(plan_, outcomes_, exchange_->response());
    Exchange* exchange = exchange_;
    std::atomic<size_t>* live = live_;
    delete this;
    exchange->finish();
    live->fetch_sub(1, std::memory_order_release);
  }

  Exchange* exchange_;
  std::shared_ptr<const Settings> settings_;  // keeps the plan's limits alive
  EnvoyPlan plan_;
  std::atomic<size_t>* live_;
  std::mutex mutex_;  // outcomes_: answers come from lanes and workers, on their threads
  std::vector<EnvoyOutcome> outcomes_;
  std::atomic<size_t> pending_{0};
};

// What every call shares: the settings, the workers and the override
// rules. Thread-safe.
class Service {
 public:
  explicit Service(DeadlineClock clock) : clock_(std::move(clock)) {}

  // A new call on `exchange`, on its polling thread: plans it and asks its
  // questions; the last answer finishes it (Call::finish), here or later on
  // a worker's thread. A call whose deadline has passed is finished at once,
  // undecided (envoy_front.h).
  void shouldRateLimit(Exchange* exchange) {
    if (exchange->deadline() <= clock_()) {
      {
        std::lock_guard<std::mutex> lock(late_mutex_);
        late_->add();
      }
      exchange->finishLate();
      return;
    }
    std::shared_ptr<const Settings> settings = settings_.load(std::memory_order_acquire);
    EnvoyPlan plan = planRequest(*settings->policy, exchange->requestMessage(),
                                 [&](std::string_view domain, const EnvoyLimit& limit) {
                                   return admitOverride(domain, limit, settings->options);
                                 });
    auto* call = new Call(exchange, settings, std::move(plan), &live_);
    const size_t turn = next_.fetch_add(1, std::memory_order_relaxed);
    call->ask(workers_, turn % workers_.size());
  }

  // The Calls not yet finished (any thread).
  size_t live() const { return live_.load(std::memory_order_acquire); }

  void setConfig(const EnvoyConfig& envoy) {
    auto settings = std::make_shared<Settings>();
    settings->policy = envoy.policy;
    settings->options = {.scope = envoy.scope, .algorithm = envoy.algorithm,
                         .on_redis_down = envoy.on_redis_down};
    settings->all_or_nothing = envoy.all_or_nothing;
    settings_.store(std::move(settings), std::memory_order_release);
  }
  void setWorkers(std::vector<Worker*> workers, AddRule add_rule, EnvoyCounters counters) {
    workers_ = std::move(workers);
    add_rule_ = std::move(add_rule);
    refused_ = counters.overrides_refused;
    late_ = counters.deadline_exceeded;
  }

 private:
  // AdmitOverride (envoy_rls.h): adds an override's rule the first time it
  // is met, within the bounds of envoy_front.h; refuses it past them.
  bool admitOverride(std::string_view domain, const EnvoyLimit& limit,
                     const EnvoyRuleOptions& options) {
    std::lock_guard<std::mutex> lock(overrides_mutex_);
    if (installed_.contains(limit.rule)) return true;
    if (installed_.size() < kMaxEnvoyOverrides && domain.size() <= kMaxEnvoyOverrideDomainBytes) {
      if (!add_rule_(envoyOverrideRule(domain, limit.requests_per_unit, limit.unit, options))) {
        return false;  // stopping
      }
      installed_.insert(limit.rule);
      return true;
    }
    refused_->add();
    const uint64_t refused = refused_->get();
    const int64_t now_ns = monotonicNowNs();
    if (refused == 1 || now_ns - refusal_logged_ns_ >= kRefusalLogIntervalNs) {
      refusal_logged_ns_ = now_ns;
      spdlog::warn("envoy: a limit override refused ({} so far): {} distinct overrides have "
                   "rules (at most {}), domains of at most {} bytes; the descriptor is decided "
                   "on its configured limit (the last: {:.80})",
                   refused, installed_.size(), kMaxEnvoyOverrides, kMaxEnvoyOverrideDomainBytes,
                   limit.rule);
    }
    return false;
  }

  static constexpr int64_t kRefusalLogIntervalNs = 60'000'000'000;

  const DeadlineClock clock_;
  AddRule add_rule_;
  std::mutex overrides_mutex_;  // installed_, refusal_logged_ns_
  std::set<std::string, std::less<>> installed_;  // override rules added, at most kMaxEnvoyOverrides
  int64_t refusal_logged_ns_ = 0;
  Counter* refused_ = nullptr;  // set before the server starts; written under overrides_mutex_
  std::mutex late_mutex_;  // late_ (Counter has one writer at a time)
  Counter* late_ = nullptr;  // set before the server starts; calls finished DEADLINE_EXCEEDED
  std::atomic<std::shared_ptr<const Settings>> settings_;
  std::vector<Worker*> workers_;  // set before the server starts
  std::atomic<size_t> next_{0};
  std::atomic<size_t> live_{0};
};

// The polling threads ([envoy] threads, 1 by default): blocked in the
// completion queue's Next() (or, with [envoy] poll_spin_us, polling it
// without blocking for that long after an event: run()), each handles the
// events it polled inline,
// with no hop to another thread. A new call is planned
// and asked at once (most are answered on a lane, on this thread, and
// finished before the next event); each call in hand gets another
// Exchange requested in its place, so gRPC always has kRequests waiting
// for calls. A finished Exchange is reset and kept for reuse.
//
// One thread by default, and no thread of gRPC's polling beside it: every
// thread in Next() on any of the server's queues takes turns polling the
// sockets, and each turn handed over is a wake-up. With calls arriving one
// at a time (Envoy's, evenly paced: bench/rls_load at 6,000 calls/s, /proc)
// gRPC's callback API and its two nexting_threads cost sluiced 73 to 91 µs
// of CPU and 6 to 9 context switches a call, two threads here as much, one
// thread 41 to 62 µs and 1.5. So grpc.health.v1.Health's Check is answered
// here too, through the generic service (HealthCheck), not by gRPC's
// default health service, whose callback threads would poll beside these.
// More threads carry more calls/s when calls come faster than one core
// answers them (some 13 µs of CPU a call).
class Pollers {
 public:
  static constexpr size_t kRequests = 32;

  Pollers(Service* service, RlsService::AsyncService* async, grpc::AsyncGenericService* generic,
          std::unique_ptr<grpc::ServerCompletionQueue> queue);

  // Requests the first calls and starts `threads` threads, each spinning
  // `spin_ns` after an event before it blocks (run()).
  void start(size_t threads, int64_t spin_ns);
  // After the server's shutdown: no call is requested any more.
  void stopRequesting() {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  // After every call's finish: Next() drains what is left, the thread ends.
  void stop() {
    queue_->Shutdown();
    for (std::thread& thread : threads_) thread.join();
    threads_.clear();
  }

  // Exchange::done: a new call on `exchange`, or its finish.
  void exchangeDone(Exchange* exchange, bool ok) {
    if (!exchange->finishing() && ok) {
      requestAnother();
      service_->shouldRateLimit(exchange);  // finishes it, now or later
      return;
    }
    // Finished, or a request the server's shutdown cancelled: free again.
    exchange->reset();
    std::lock_guard<std::mutex> lock(mutex_);
    spare_.push_back(exchange);
  }
  // Runs `start` (which requests a call from gRPC) unless stopping, under
  // the lock, so that no request starts once stopRequesting() returns
  // (the queue shuts down after): false when stopping.
  template <typename Start>
  bool requestUnlessStopping(Start start) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return false;
    start();
    return true;
  }
  grpc::ServerCompletionQueue* queue() { return queue_.get(); }

 private:
  // Handles events until the queue shuts down. After each event the thread
  // keeps polling without blocking (AsyncNext with a deadline already
  // past, one non-blocking poll of gRPC's sockets) until spin_ns_ passes
  // with no event, then blocks in Next(): calls that come one by one
  // within the spin are read without the thread sleeping and waking for
  // each, and an idle front spins once, then sleeps.
  void run() {
    void* tag = nullptr;
    bool ok = false;
    while (queue_->Next(&tag, &ok)) {
      static_cast<Tag*>(tag)->done(ok);
      int64_t last_event_ns = spin_ns_ > 0 ? monotonicNowNs() : 0;
      while (spin_ns_ > 0) {
        const auto status = queue_->AsyncNext(&tag, &ok, gpr_inf_past(GPR_CLOCK_MONOTONIC));
        if (status == grpc::CompletionQueue::SHUTDOWN) return;
        const int64_t now_ns = monotonicNowNs();
        if (status == grpc::CompletionQueue::GOT_EVENT) {
          static_cast<Tag*>(tag)->done(ok);
          last_event_ns = now_ns;
        } else if (now_ns - last_event_ns >= spin_ns_) {
          break;
        }
      }
    }
  }

  void requestAnother() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    if (spare_.empty()) {
      exchanges_.push_back(std::make_unique<Exchange>(this));
      spare_.push_back(exchanges_.back().get());
    }
    Exchange* exchange = spare_.back();
    spare_.pop_back();
    exchange->request(async_, queue_.get());
  }

  Service* service_;
  RlsService::AsyncService* async_;
  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  int64_t spin_ns_ = 0;  // [envoy] poll_spin_us, set before the threads start
  std::unique_ptr<Tag> health_;  // the HealthCheck
  std::vector<std::thread> threads_;
  std::mutex mutex_;  // the three below
  bool stopping_ = false;
  std::vector<std::unique_ptr<Exchange>> exchanges_;  // every one made, as many as calls in hand at once
  std::vector<Exchange*> spare_;  // reset, not requested
};

void Exchange::done(bool ok) { owner_->exchangeDone(this, ok); }

// grpc.health.v1.Health on the generic service (every method the server
// has not registered): Check answers SERVING for the server ("") and for
// the rate limit service, NOT_FOUND for another service name, as gRPC's
// default health service does; any other method (Watch among them) is
// UNIMPLEMENTED. One call at a time, in turn: requested, its request
// read, answered; then the next is requested (calls meanwhile wait in
// gRPC). On the polling thread only.
class HealthCheck final : public Tag {
 public:
  HealthCheck(Pollers* pollers, grpc::AsyncGenericService* generic)
      : pollers_(pollers), generic_(generic) {}

  // Asks gRPC for the next call; false when stopping.
  bool request() {
    context_.emplace();
    stream_.emplace(&*context_);
    step_ = Step::kCall;
    return pollers_->requestUnlessStopping([&] {
      generic_->RequestCall(&*context_, &*stream_, pollers_->queue(), pollers_->queue(), this);
    });
  }

  void done(bool ok) override {
    switch (step_) {
      case Step::kCall:
        if (!ok) return;  // the server's shutdown: no more calls
        if (context_->method() != kCheckMethod) {
          finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "sluice serves "
                              "ShouldRateLimit and grpc.health.v1.Health/Check"));
          return;
        }
        step_ = Step::kRead;
        request_.Clear();
        stream_->Read(&request_, this);
        return;
      case Step::kRead: {
        if (!ok) {
          finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no HealthCheckRequest"));
          return;
        }
        std::string service;
        if (!serviceOf(request_, &service)) {
          finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a malformed HealthCheckRequest"));
        } else if (service.empty() || service == RlsService::service_full_name()) {
          // HealthCheckResponse { status: SERVING (1) }.
          static constexpr char kServing[] = {0x08, 0x01};
          grpc::Slice slice(kServing, sizeof(kServing));
          grpc::ByteBuffer response(&slice, 1);
          step_ = Step::kFinish;
          stream_->WriteAndFinish(response, grpc::WriteOptions(), grpc::Status::OK, this);
        } else {
          finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service"));
        }
        return;
      }
      case Step::kFinish:
        request();
        return;
    }
  }

 private:
  static constexpr std::string_view kCheckMethod = "/grpc.health.v1.Health/Check";
  enum class Step { kCall, kRead, kFinish };

  void finish(const grpc::Status& status) {
    step_ = Step::kFinish;
    stream_->Finish(status, this);
  }

  // HealthCheckRequest's one field, `service` (1, a string); unknown
  // fields are refused rather than skipped (no client sends any).
  static bool serviceOf(const grpc::ByteBuffer& buffer, std::string* service) {
    std::vector<grpc::Slice> slices;
    if (!buffer.Dump(&slices).ok()) return false;
    std::string bytes;
    for (const grpc::Slice& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    size_t at = 0;
    while (at < bytes.size()) {
      if (bytes[at] != 0x0a || at + 1 >= bytes.size()) return false;
      const auto length = static_cast<unsigned char>(bytes[at + 1]);
      if (length >= 0x80 || at + 2 + length > bytes.size()) return false;  // names < 128 bytes
      service->assign(bytes, at + 2, length);
      at += 2 + length;
    }
    return true;
  }

  Pollers* pollers_;
  grpc::AsyncGenericService* generic_;
  std::optional<grpc::GenericServerContext> context_;
  std::optional<grpc::GenericServerAsyncReaderWriter> stream_;
  grpc::ByteBuffer request_;
  Step step_ = Step::kCall;
};

Pollers::Pollers(Service* service, RlsService::AsyncService* async,
                 grpc::AsyncGenericService* generic,
                 std::unique_ptr<grpc::ServerCompletionQueue> queue)
    : service_(service), async_(async), queue_(std::move(queue)),
      health_(std::make_unique<HealthCheck>(this, generic)) {}

void Pollers::start(size_t threads, int64_t spin_ns) {
  spin_ns_ = spin_ns;
  for (size_t i = 0; i < kRequests; ++i) requestAnother();
  static_cast<HealthCheck*>(health_.get())->request();
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
}

class GrpcEnvoyFront final : public EnvoyFront {
 public:
  explicit GrpcEnvoyFront(DeadlineClock clock) : service_(std::move(clock)) {}

  bool start(const EnvoyConfig& envoy, uint32_t socket_mode, std::vector<Worker*> workers,
             AddRule add_rule, EnvoyCounters counters, std::string* error) override {
    service_.setConfig(envoy);
    service_.setWorkers(std::move(workers), std::move(add_rule), counters);
    if (envoy.listen.starts_with("unix:")) {
      socket_path_ = envoy.listen.substr(5);
      ::unlink(socket_path_.c_str());  // a previous run's; bind would fail on it
    }
    // Debian's Abseil keeps its debug checks: each absl::Mutex gRPC locks or
    // destroys (several a call) goes through the deadlock detector's graph.
    // sluice's own locks are std::mutex; gRPC's are gRPC's to get right.
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    grpc::EnableDefaultHealthCheckService(false);  // HealthCheck answers it (Pollers)
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(envoy.listen, grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&async_);
    builder.RegisterAsyncGenericService(&generic_);
    // HTTP/2's BDP pings size the flow-control window to a network's
    // bandwidth-delay product: a Unix socket or loopback has none worth
    // probing, and each probe costs a ping and its ack.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxCallsPerConnection);
    std::unique_ptr<grpc::ServerCompletionQueue> queue = builder.AddCompletionQueue();
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || (socket_path_.empty() && port == 0)) {
      *error = "[envoy] listen " + envoy.listen + ": gRPC cannot listen there (in use, or not "
               "an address); free it or choose another";
      if (server_ != nullptr) server_->Shutdown();
      drain(queue.get());
      server_.reset();
      return false;
    }
    pollers_ = std::make_unique<Pollers>(&service_, &async_, &generic_, std::move(queue));
    pollers_->start(static_cast<size_t>(envoy.threads), envoy.poll_spin_us * 1'000);
    if (!socket_path_.empty() && ::chmod(socket_path_.c_str(), socket_mode) != 0) {
      *error = "[envoy] listen " + envoy.listen + ": cannot set the socket's mode: " +
               std::strerror(errno);
      stop();
      return false;
    }
    spdlog::info("envoy rate limit service on {}: {} domains, {} limits", envoy.listen,
                 envoy.policy->domains.size(), envoy.policy->limits.size());
    return true;
  }

  void setConfig(const EnvoyConfig& envoy) override { service_.setConfig(envoy); }

  // The server stops first (the pollers still run, to finish what it
  // answers and see its requests cancelled); then the Calls still waiting
  // on a worker finish there (the seam bounds every wait: waiting.h);
  // then the queues shut down and the pollers drain them and end.
  void stop() override {
    if (server_ == nullptr) return;
    pollers_->stopRequesting();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    const auto started = std::chrono::steady_clock::now();
    bool warned = false;
    while (service_.live() > 0) {
      if (!warned && std::chrono::steady_clock::now() - started > std::chrono::seconds(1)) {
        spdlog::warn("envoy: stopping waits for {} calls still waiting on a worker",
                     service_.live());
        warned = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    pollers_->stop();
    server_->Wait();
    server_.reset();
    pollers_.reset();  // the queue outlives the server, as gRPC asks
    if (!socket_path_.empty()) ::unlink(socket_path_.c_str());
  }

  ~GrpcEnvoyFront() override { stop(); }

 private:
  // A queue no poller runs: shut down and emptied (a failed start's).
  static void drain(grpc::ServerCompletionQueue* queue) {
    queue->Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (queue->Next(&tag, &ok)) {
    }
  }

  Service service_;
  RlsService::AsyncService async_;
  grpc::AsyncGenericService generic_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Pollers> pollers_;
  std::string socket_path_;
};

}  // namespace

std::unique_ptr<EnvoyFront> makeEnvoyFront(DeadlineClock clock) {
  if (!clock) clock = [] { return std::chrono::system_clock::now(); };
  return std::make_unique<GrpcEnvoyFront>(std::move(clock));
}

}  // namespace sluice
