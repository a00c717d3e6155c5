// EnvoyFront over gRPC's callback API (envoy_front.h): the service, one
// Call per ShouldRateLimit in flight, and the server's start and stop.
#include "envoy_front.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>

#include <absl/synchronization/mutex.h>
#include <google/protobuf/arena.h>
#include <grpcpp/grpcpp.h>
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

// A call's request and response on one protobuf arena that starts in the
// holder itself: parsing the request and building the response (a status
// per descriptor, the headers) cost no allocation of their own unless they
// outgrow kArenaBlockBytes. gRPC calls AllocateMessages on its threads and
// Release once the call is done with them.
class ArenaMessages final : public grpc::MessageHolder<RateLimitRequest, RateLimitResponse> {
 public:
  ArenaMessages() : arena_(options(block_)) {
    set_request(google::protobuf::Arena::CreateMessage<RateLimitRequest>(&arena_));
    set_response(google::protobuf::Arena::CreateMessage<RateLimitResponse>(&arena_));
  }
  void Release() override { delete this; }

 private:
  // Enough for a request of a few descriptors and its response.
  static constexpr size_t kArenaBlockBytes = 4096;
  static google::protobuf::ArenaOptions options(char* block) {
    google::protobuf::ArenaOptions options;
    options.initial_block = block;
    options.initial_block_size = kArenaBlockBytes;
    return options;
  }
  alignas(8) char block_[kArenaBlockBytes];  // before arena_: it lives longer
  google::protobuf::Arena arena_;
};

class ArenaAllocator final : public grpc::MessageAllocator<RateLimitRequest, RateLimitResponse> {
 public:
  grpc::MessageHolder<RateLimitRequest, RateLimitResponse>* AllocateMessages() override {
    return new ArenaMessages();
  }
};

// One ShouldRateLimit call: the questions it asked and the answers so far.
// Deletes itself once the call is finished.
class Call final : public Recipient {
 public:
  Call(grpc::ServerUnaryReactor* reactor, std::shared_ptr<const Settings> settings,
       EnvoyPlan plan, RateLimitResponse* response)
      : reactor_(reactor), settings_(std::move(settings)), plan_(std::move(plan)),
        response_(response), outcomes_(plan_.rules.size()) {}

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
    encodeResponse(plan_, outcomes_, response_);
    grpc::ServerUnaryReactor* reactor = reactor_;
    delete this;
    reactor->Finish(grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* reactor_;
  std::shared_ptr<const Settings> settings_;  // keeps the plan's limits alive
  EnvoyPlan plan_;
  RateLimitResponse* response_;
  std::mutex mutex_;  // outcomes_: answers come from lanes and workers, on their threads
  std::vector<EnvoyOutcome> outcomes_;
  std::atomic<size_t> pending_{0};
};

class Service final : public RlsService::CallbackService {
 public:
  grpc::ServerUnaryReactor* ShouldRateLimit(grpc::CallbackServerContext* context,
                                            const RateLimitRequest* request,
                                            RateLimitResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    std::shared_ptr<const Settings> settings = settings_.load(std::memory_order_acquire);
    EnvoyPlan plan = planRequest(*settings->policy, *request,
                                 [&](std::string_view domain, const EnvoyLimit& limit) {
                                   return admitOverride(domain, limit, settings->options);
                                 });
    auto* call = new Call(reactor, settings, std::move(plan), response);
    const size_t turn = next_.fetch_add(1, std::memory_order_relaxed);
    call->ask(workers_, turn % workers_.size());
    return reactor;
  }

  void setConfig(const EnvoyConfig& envoy) {
    auto settings = std::make_shared<Settings>();
    settings->policy = envoy.policy;
    settings->options = {.scope = envoy.scope, .algorithm = envoy.algorithm,
                         .on_redis_down = envoy.on_redis_down};
    settings->all_or_nothing = envoy.all_or_nothing;
    settings_.store(std::move(settings), std::memory_order_release);
  }
  Service() { SetMessageAllocatorFor_ShouldRateLimit(&allocator_); }

  void setWorkers(std::vector<Worker*> workers, AddRule add_rule, Counter* refused) {
    workers_ = std::move(workers);
    add_rule_ = std::move(add_rule);
    refused_ = refused;
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

  ArenaAllocator allocator_;  // outlives the server (a member of the front that owns it)
  AddRule add_rule_;
  std::mutex overrides_mutex_;  // installed_, refusal_logged_ns_
  std::set<std::string, std::less<>> installed_;  // override rules added, at most kMaxEnvoyOverrides
  int64_t refusal_logged_ns_ = 0;
  Counter* refused_ = nullptr;  // set before the server starts; written under overrides_mutex_
  std::atomic<std::shared_ptr<const Settings>> settings_;
  std::vector<Worker*> workers_;  // set before the server starts
  std::atomic<size_t> next_{0};
};

class GrpcEnvoyFront final : public EnvoyFront {
 public:
  bool start(const EnvoyConfig& envoy, uint32_t socket_mode, std::vector<Worker*> workers,
             AddRule add_rule, Counter* refused, std::string* error) override {
    service_.setConfig(envoy);
    service_.setWorkers(std::move(workers), std::move(add_rule), refused);
    if (envoy.listen.starts_with("unix:")) {
      socket_path_ = envoy.listen.substr(5);
      ::unlink(socket_path_.c_str());  // a previous run's; bind would fail on it
    }
    // Debian's Abseil keeps its debug checks: each absl::Mutex gRPC locks or
    // destroys (several a call) goes through the deadlock detector's graph.
    // sluice's own locks are std::mutex; gRPC's are gRPC's to get right.
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(envoy.listen, grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || (socket_path_.empty() && port == 0)) {
      *error = "[envoy] listen " + envoy.listen + ": gRPC cannot listen there (in use, or not "
               "an address); free it or choose another";
      server_.reset();
      return false;
    }
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

  void stop() override {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
    server_.reset();
    if (!socket_path_.empty()) ::unlink(socket_path_.c_str());
  }

  ~GrpcEnvoyFront() override { stop(); }

 private:
  Service service_;
  std::unique_ptr<grpc::Server> server_;
  std::string socket_path_;
};

}  // namespace

std::unique_ptr<EnvoyFront> makeEnvoyFront() { return std::make_unique<GrpcEnvoyFront>(); }

}  // namespace sluice
