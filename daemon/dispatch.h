// Dispatch: turns one parsed request into its response.
//
// A Dispatcher belongs to one worker thread and is called only from that
// worker's loop. It looks the rule up in the worker's current rule set, the
// key in the shared key table, runs the limiter and appends the encoded
// response to the connection's output. On a warm key it allocates nothing:
// its scratch vectors keep their capacity between requests.
//
// The caller must hold a KeyTable::ReadGuard around handle(), so that the
// entries it looks up stay alive until the decision is made.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "key_table.h"
#include "limiter.h"
#include "metrics.h"
#include "rpc.h"
#include "rules.h"

namespace sluice {

class DaemonStatus;

// Who is on the other end of a connection (SO_PEERCRED).
// Unknown credentials are (uid_t)-1, which is never an admin.
struct Peer {
  pid_t pid = 0;
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
};

class Dispatcher {
 public:
  Dispatcher(KeyTable& keys, MetricsShard& metrics, DaemonStatus& status);

  // Installs the rule set that later requests see (after a reload).
  void setRules(RuleSetPtr rules) { rules_ = std::move(rules); }

  // Answers `request` into `out` (nothing for a notification). now_ns is the
  // monotonic time of the read that carried the request.
  void handle(const rpc::Request& request, const Peer& peer, int64_t now_ns, std::string* out);

  // Answers a request that could not be parsed.
  void handleParseError(const rpc::ParseResult& result, std::string* out);

 private:
  void acquireOne(const rpc::Request& request, int64_t now_ns, std::string* out);
  void acquireAll(const rpc::Request& request, int64_t now_ns, std::string* out);
  void writeHealth(uint32_t msgid, std::string* out);
  void writeStats(uint32_t msgid, std::string* out);
  void writeRules(uint32_t msgid, std::string* out);
  void reload(uint32_t msgid, const Peer& peer, std::string* out);
  // Which rule decides a configured rule's requests, and in which mode. A
  // null rule means the rule's Redis-down policy answers without state.
  struct Route {
    const Rule* rule;
    Mode mode;
  };
  Route route(const Rule& rule) const;
  void error(uint32_t msgid, rpc::ErrorCode code, std::string_view message, std::string* out);
  void count(const Decision& decision, Mode mode);
  std::span<std::atomic<uint64_t>> freshState(const Rule& rule);

  KeyTable& keys_;
  MetricsShard& metrics_;
  DaemonStatus& status_;
  RuleSetPtr rules_;

  // Scratch space reused between requests.
  std::vector<AcquireItem> items_;
  std::vector<AcquireItem> limited_;
  std::vector<Decision> decisions_;
  std::vector<Mode> modes_;
  std::vector<std::atomic<uint64_t>> fresh_;  // a fresh key's state, for peek
  std::string message_;
};

// What `health` says about Redis (control.h owns the facts).
struct RedisHealth {
  bool configured = false;  // the config has a [redis] section
  bool up = false;
  uint32_t nodes = 1;       // live nodes N, or expected_nodes before heartbeats
  // Redis's TIME minus this host's wall clock, from the heartbeats; nullopt
  // before the first heartbeat answers (and without Redis).
  std::optional<int64_t> clock_offset_ms;
};

// What health, stats and reload need from the daemon as a whole. Implemented
// by the server; every method may be called from any worker thread.
class DaemonStatus {
 public:
  virtual ~DaemonStatus() = default;
  virtual int64_t uptimeMs() const = 0;
  virtual size_t workers() const = 0;
  virtual MetricsSnapshot metrics() const = 0;
  // Open client connections.
  virtual size_t connections() const = 0;
  // Redis as the control thread last saw it.
  virtual RedisHealth redisHealth() const = 0;
  // Re-reads the config file and installs its rules on every worker. Returns
  // false with a message when the file is refused (the old rules stay).
  virtual bool reload(std::string* error) = 0;
  // True when this peer may call admin methods (reload).
  virtual bool isAdmin(const Peer& peer) const = 0;
};

}  // namespace sluice
