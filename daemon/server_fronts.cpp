// Server: the fronts beside the Unix socket ([http], [resp], [envoy]) and
// the rules they add while running; see server.h.
#include "server.h"

#include <set>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

namespace sluice {

std::vector<Rule> Server::withAddedRules(std::vector<Rule> rules, const std::vector<Rule>& added) {
  std::set<uint32_t> ids;
  std::set<std::string_view> names;
  for (const Rule& rule : rules) {
    ids.insert(rule.id);
    names.insert(rule.name);
  }
  for (const Rule& rule : added) {
    if (names.contains(rule.name)) continue;
    Rule copy = rule;
    while (copy.id == 0 || ids.contains(copy.id)) copy.id = (copy.id + 1) & kRuleIdMask;
    ids.insert(copy.id);
    rules.push_back(std::move(copy));
  }
  return rules;
}

bool Server::startHttp(std::string* error) {
  HttpFront::Options options;
  options.listen = config_.http.listen;
  options.deny_status = config_.http.deny_status;
  options.max_key_bytes = config_.limits.max_key_bytes;
  options.max_connections = config_.limits.max_connections;
  options.idle_timeout_s = static_cast<unsigned>((config_.limits.idle_timeout_ms + 999) / 1000);
  // Questions go to the workers in turn; each decides on the shared key table.
  auto submit = [this](HeldQuestion question, Recipient* recipient, MsgId tag) {
    size_t index = http_next_worker_.fetch_add(1, std::memory_order_relaxed) % workers_.size();
    workers_[index]->submit(std::move(question), recipient, tag);
  };
  auto admit = [this](int fd) {
    Peer peer = access_.admit(fd);
    return peer.allowed;
  };
  if (!http_front_.start(options, config_.rules, submit, admit, error)) return false;
  spdlog::info("serving HTTP checks on {}", config_.http.listen);
  return true;
}

bool Server::startResp(std::string* error) {
  RespFront::Options options;
  options.listen = config_.resp.listen;
  options.limits.max_command_bytes = config_.limits.max_frame_bytes;
  options.limits.max_arguments = config_.limits.max_items;
  options.limits.max_key_bytes = config_.limits.max_key_bytes;
  options.max_connections = config_.limits.max_connections;
  options.max_output_bytes = config_.limits.max_output_bytes;
  auto submit = [this](size_t worker, HeldQuestion question, Recipient* recipient, MsgId tag) {
    workers_[worker % workers_.size()]->submit(std::move(question), recipient, tag);
  };
  auto ensure = [this](const resp::Throttle& throttle, std::string* refusal) {
    return ensureThrottleRule(throttle, refusal);
  };
  auto admit = [this](int fd) { return access_.admit(fd).allowed; };
  if (!resp_front_.start(options, workers_.size(), submit, ensure, admit, error)) return false;
  spdlog::info("serving the Redis protocol on {}", config_.resp.listen);
  return true;
}

bool Server::ensureThrottleRule(const resp::Throttle& throttle, std::string* error) {
  std::lock_guard<std::mutex> lock(reload_mutex_);
  const std::string name = resp::throttleRuleName(throttle);
  if (config_.rules->find(name) != nullptr) return true;
  if (stopping_) {
    *error = "the daemon is stopping";
    return false;
  }
  if (throttle_sets_ >= config_.resp.max_parameter_sets) {
    *error = "CL.THROTTLE has " + std::to_string(throttle_sets_) +
             " parameter sets already, [resp] max_parameter_sets; use fewer distinct "
             "(max_burst, count, period), or raise it";
    return false;
  }
  Rule rule;
  rule.name = name;
  rule.algorithm = Algorithm::kGcra;
  rule.limits = {Limit{.limit = throttle.count,
                       .period_ns = throttle.period_s * 1'000'000'000,
                       .burst = throttle.max_burst + 1}};
  rule.scope = config_.resp.scope == "global" ? Scope::kGlobal : Scope::kLocal;
  ++throttle_sets_;
  addRuleLocked(rule);
  return true;
}

bool Server::startEnvoy(std::string* error) {
  envoy_ = makeEnvoyFront();
  if (envoy_ == nullptr) {
    *error = config_.path + ": [envoy] needs sluiced built with gRPC (cmake -DSLUICE_GRPC=ON); "
             "remove [envoy] or rebuild";
    return false;
  }
  std::vector<Worker*> workers;
  for (auto& worker : workers_) workers.push_back(worker.get());
  if (!envoy_->start(*config_.envoy, config_.daemon.socket_mode, std::move(workers),
                     [this](const Rule& rule) { return addRule(rule); },
                     &metrics_.envoyOverridesRefused(), error)) {
    envoy_.reset();
    return false;
  }
  return true;
}

bool Server::addRule(const Rule& rule) {
  std::lock_guard<std::mutex> lock(reload_mutex_);
  if (stopping_) return false;
  if (config_.rules->find(rule.name) != nullptr) return true;
  addRuleLocked(rule);
  return true;
}

void Server::addRuleLocked(const Rule& rule) {
  Rule added = rule;
  // FNV-1a of the name, as stable as a configured rule's id.
  uint32_t hash = 2166136261u;
  for (char c : rule.name) hash = (hash ^ static_cast<unsigned char>(c)) * 16777619u;
  added.id = hash & kRuleIdMask;
  std::vector<Rule> rules = withAddedRules(std::vector<Rule>(config_.rules->rules()), {added});
  added_rules_.push_back(rules.back());  // with the id it got, kept across reloads
  installRules(std::make_shared<const RuleSet>(std::move(rules), config_.rules->fallbackNodes()));
  spdlog::info("added rule {}", rule.name);
}

}  // namespace sluice
