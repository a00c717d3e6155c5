// Admin: the methods about the daemon as a whole rather than one decision:
// health, stats, rules, reload and reset.
//
// health, stats and rules read the daemon's status (status.h), the key table
// and the worker's rule set and write one answer; they change nothing and
// any caller that the daemon allows may use them. reload and reset change
// state, and are for admins only (Peer::admin): reload asks the server to
// re-read the config (the new rules reach the worker later, by setRules);
// reset forgets one key's state (see reset() in admin.cpp for what it does
// on each kind of rule).
//
// An Admin belongs to one worker's RpcFront and is called only from that
// worker's loop, inside its KeyTable::ReadGuard.
#pragma once

#include <cstdint>
#include <string>

#include "access.h"
#include "key_table.h"
#include "lease.h"
#include "lookup.h"
#include "metrics.h"
#include "rpc.h"
#include "rules.h"
#include "status.h"

namespace sluice {

class Admin {
 public:
  // `broker` is null without Redis.
  Admin(KeyTable& keys, MetricsShard& metrics, DaemonStatus& status, LeaseBroker* broker)
      : keys_(keys), metrics_(metrics), status_(status), broker_(broker) {}

  // Answers an admin request into `out` on the worker's current `rules`.
  // now_ns is the monotonic time of the read that carried it.
  void handle(const RuleSet& rules, const rpc::Request& request, const Peer& peer,
              int64_t now_ns, std::string* out);

 private:
  void writeHealth(rpc::MsgId msgid, std::string* out);
  void writeStats(rpc::MsgId msgid, std::string* out);
  void writeRules(const RuleSet& rules, rpc::MsgId msgid, std::string* out);
  void reload(rpc::MsgId msgid, const Peer& peer, std::string* out);
  void reset(const RuleSet& rules, const rpc::Request& request, const Peer& peer,
             int64_t now_ns, std::string* out);
  // Zeroes the words of a key of `rule` (its state, slice or share).
  void forgetKey(const Rule& rule, std::string_view key);

  KeyTable& keys_;
  MetricsShard& metrics_;
  DaemonStatus& status_;
  LeaseBroker* broker_;
  FreshState fresh_;
};

}  // namespace sluice
