// Prometheus exposition and its HTTP endpoint; see prometheus.h.
#include "prometheus.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string_view>

#include "config.h"
#include "rpc.h"

namespace sluice {

namespace {

constexpr std::string_view kContentType = "text/plain; version=0.0.4; charset=utf-8";
constexpr unsigned kMaxScrapes = 8;          // connections served at once
constexpr unsigned kScrapeTimeoutSeconds = 10;

constexpr std::array<Mode, kModes> kAllModes = {Mode::kLocal,  Mode::kNormal, Mode::kFallback,
                                                Mode::kOpen,   Mode::kClosed, Mode::kShadow,
                                                Mode::kBlocked};

// Label values are escaped as the format asks: backslash, quote, newline.
std::string escape(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// A counter of one unlabelled sample: a field of Source.
template <typename Source>
struct CounterRow {
  std::string_view name;
  std::string_view help;
  uint64_t Source::*field;
};

// One sample of a family: its labels and the field of Source it reads.
template <typename Source>
struct SampleRow {
  std::string_view labels;
  uint64_t Source::*field;
};

constexpr std::array<SampleRow<MetricsSnapshot>, 3> kReservationsClosed = {{
    {"how=\"settled\"", &MetricsSnapshot::reservations_settled},
    {"how=\"cancelled\"", &MetricsSnapshot::reservations_cancelled},
    {"how=\"expired\"", &MetricsSnapshot::reservations_expired},
}};

constexpr std::array<CounterRow<MetricsSnapshot>, 4> kReservationUnits = {{
    {"sluice_reservation_refunded_units_total",
     "Units given back by settles below the estimate and by cancels.",
     &MetricsSnapshot::reservation_refunded_units},
    {"sluice_reservation_debt_units_total",
     "Units charged past the estimate by settles, even past the limit (debt).",
     &MetricsSnapshot::reservation_debt_units},
    {"sluice_reservation_unpaid_units_total",
     "Units of settles' excess left unpaid: past the key's debt bound (max_debt).",
     &MetricsSnapshot::reservation_unpaid_units},
    {"sluice_reservations_unpaid_total",
     "Settles that left units unpaid at the key's debt bound (max_debt).",
     &MetricsSnapshot::reservations_unpaid},
}};

constexpr std::array<SampleRow<LeaseStats>, 3> kLeaseAnswers = {{
    {"outcome=\"granted\"", &LeaseStats::granted},
    {"outcome=\"empty\"", &LeaseStats::empty},
    {"outcome=\"failed\"", &LeaseStats::failed},
}};

constexpr std::array<SampleRow<LeaseStats>, 4> kLeaseUnits = {{
    {"direction=\"granted\"", &LeaseStats::granted_units},
    {"direction=\"returned\"", &LeaseStats::returned_units},
    {"direction=\"debited\"", &LeaseStats::debited_units},
    {"direction=\"lost\"", &LeaseStats::lost_units},
}};

constexpr std::array<CounterRow<MetricsSnapshot>, 3> kLeaseWaits = {{
    {"sluice_lease_deferred_total", "Requests that waited for a lease.",
     &MetricsSnapshot::lease_deferred},
    {"sluice_lease_deferred_expired_total",
     "Requests whose lease wait ran out; their policy answered.",
     &MetricsSnapshot::lease_deferred_expired},
    {"sluice_lease_negative_cache_hits_total",
     "Denials answered locally while Redis said the key is empty.",
     &MetricsSnapshot::lease_negative_hits},
}};

class Writer {
 public:
  // # HELP and # TYPE of a family; its samples follow.
  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  void sample(std::string_view name, std::string_view labels, double value) {
    out_ += name;
    if (!labels.empty()) {
      out_ += '{';
      out_ += labels;
      out_ += '}';
    }
    out_ += ' ';
    if (std::isinf(value)) {
      out_ += value > 0 ? "+Inf" : "-Inf";  // the format's spelling, not printf's
    } else {
      char number[32];
      std::snprintf(number, sizeof(number), "%.12g", value);
      out_ += number;
    }
    out_ += '\n';
  }
  void sample(std::string_view name, std::string_view labels, uint64_t value) {
    sample(name, labels, static_cast<double>(value));
  }
  // One metric: family header and a single unlabelled sample.
  void single(std::string_view name, std::string_view type, std::string_view help, double value) {
    family(name, type, help);
    sample(name, "", value);
  }
  void histogram(std::string_view name, std::string_view help, const HistogramSnapshot& h) {
    family(name, "histogram", help);
    std::string bucket = std::string(name) + "_bucket";
    uint64_t cumulative = 0;
    for (size_t i = 0; i < kLatencyBucketsUs.size(); ++i) {
      cumulative += h.buckets[i];
      char le[48];
      std::snprintf(le, sizeof(le), "le=\"%g\"", static_cast<double>(kLatencyBucketsUs[i]) / 1e6);
      sample(bucket, le, cumulative);
    }
    cumulative += h.buckets.back();
    sample(bucket, "le=\"+Inf\"", cumulative);
    sample(std::string(name) + "_sum", "", static_cast<double>(h.sum_us) / 1e6);
    sample(std::string(name) + "_count", "", cumulative);
  }
  // Counters of one unlabelled sample each, in the rows' order.
  template <typename Source, size_t N>
  void counters(const std::array<CounterRow<Source>, N>& rows, const Source& source) {
    for (const CounterRow<Source>& row : rows) {
      single(row.name, "counter", row.help, static_cast<double>(source.*row.field));
    }
  }
  // The samples of one family, one a row.
  template <typename Source, size_t N>
  void samples(std::string_view name, const std::array<SampleRow<Source>, N>& rows,
               const Source& source) {
    for (const SampleRow<Source>& row : rows) sample(name, row.labels, source.*row.field);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace

std::string renderPrometheus(const MetricsView& view) {
  Writer w;
  const MetricsSnapshot& t = view.totals;

  w.family("sluice_decisions_total", "counter",
           "Decisions on acquire requests, by rule, result and mode.");
  for (const RuleSnapshot& rule : view.rules) {
    std::string name = escape(rule.name);
    for (Mode mode : kAllModes) {
      auto i = static_cast<size_t>(mode);
      for (auto [result, count] : {std::pair{"allowed", rule.allowed[i]}, {"denied", rule.denied[i]}}) {
        if (count == 0) continue;
        w.sample("sluice_decisions_total",
                 "rule=\"" + name + "\",result=\"" + result + "\",mode=\"" +
                     std::string(modeName(mode)) + "\"",
                 count);
      }
    }
  }
  w.family("sluice_rule_near_limit_total", "counter",
           "Decisions allowed with under a fifth of the limit left, by rule.");
  for (const RuleSnapshot& rule : view.rules) {
    if (rule.near_limit > 0) {
      w.sample("sluice_rule_near_limit_total", "rule=\"" + escape(rule.name) + "\"", rule.near_limit);
    }
  }
  w.family("sluice_rule_shadow_denials_total", "counter",
           "Decisions of a shadow rule that would have denied, by rule.");
  for (const RuleSnapshot& rule : view.rules) {
    if (rule.shadow_denied > 0) {
      w.sample("sluice_rule_shadow_denials_total", "rule=\"" + escape(rule.name) + "\"",
               rule.shadow_denied);
    }
  }
  w.single("sluice_penalty_blocks_total", "counter",
           "Keys blocked by their rule's penalty (repeat offenders).",
           static_cast<double>(t.penalty_blocks));
  w.single("sluice_unknown_fields_total", "counter",
           "Map entries of requests skipped because the method does not know their name.",
           static_cast<double>(t.unknown_fields));
  w.single("sluice_reservations", "gauge",
           "Reservations open now: reserved and not yet settled, cancelled or expired.",
           static_cast<double>(t.reservationsOpen()));
  w.family("sluice_reservations_closed_total", "counter",
           "Reservations closed, by how: settled, cancelled, or expired at their estimate.");
  w.samples("sluice_reservations_closed_total", kReservationsClosed, t);
  w.counters(kReservationUnits, t);
  w.single("sluice_shadow_denials_total", "counter",
           "Decisions of shadow rules that would have denied.", static_cast<double>(t.shadow_denied));
  w.single("sluice_envoy_overrides_refused_total", "counter",
           "Envoy descriptors whose limit override got no rule (past the bound on distinct "
           "overrides), decided on their configured limit.",
           static_cast<double>(t.envoy_overrides_refused));
  w.single("sluice_envoy_deadline_exceeded_total", "counter",
           "Envoy calls whose deadline had passed when the front read them, finished "
           "DEADLINE_EXCEEDED without a decision.",
           static_cast<double>(t.envoy_deadline_exceeded));
  w.histogram("sluice_decision_duration_seconds",
              "Time from reading a request to writing its answer, waits for leases included.",
              t.decision_latency);
  w.single("sluice_requests_total", "counter", "Requests and notifications read.",
           static_cast<double>(t.requests));
  w.family("sluice_protocol_errors_total", "counter", "Error responses, by error code.");
  for (size_t i = 0; i < kErrorCodes; ++i) {
    w.sample("sluice_protocol_errors_total",
             "code=\"" + std::string(rpc::errorCodeName(static_cast<rpc::ErrorCode>(i))) + "\"",
             t.errors[i]);
  }

  w.single("sluice_connections", "gauge", "Client connections open now.",
           static_cast<double>(view.connections));
  w.single("sluice_uv_handles", "gauge",
           "libuv handles open on the daemon's loops, each counted by its loop on a timer: "
           "steady under steady load.",
           static_cast<double>(view.handles));
  w.single("sluice_connections_accepted_total", "counter", "Client connections accepted.",
           static_cast<double>(t.connections_accepted));
  w.family("sluice_connections_refused_total", "counter",
           "Client connections closed the moment they were accepted, by the limit they hit.");
  for (size_t i = 0; i < kRefuseReasons; ++i) {
    w.sample("sluice_connections_refused_total",
             "reason=\"" + std::string(refuseReasonName(static_cast<RefuseReason>(i))) + "\"",
             t.connections_refused[i]);
  }
  w.single("sluice_connections_forbidden_total", "counter",
           "Client connections from peers that [access] does not allow; their requests are "
           "answered FORBIDDEN.",
           static_cast<double>(t.connections_forbidden));
  w.family("sluice_connections_closed_total", "counter", "Client connections closed, by reason.");
  for (size_t i = 0; i < kCloseReasons; ++i) {
    w.sample("sluice_connections_closed_total",
             "reason=\"" + std::string(closeReasonName(static_cast<CloseReason>(i))) + "\"",
             t.connections_closed[i]);
  }

  w.single("sluice_keys", "gauge", "(rule, key) entries in the key table.",
           static_cast<double>(view.keys.size));
  w.single("sluice_key_table_bytes", "gauge", "Bytes of the key table's entries.",
           static_cast<double>(view.keys.bytes));
  w.family("sluice_key_evictions_total", "counter",
           "Keys dropped from the table: idle ones by the sweep, others because it was full.");
  w.sample("sluice_key_evictions_total", "reason=\"idle\"", view.keys.idle_evictions);
  w.sample("sluice_key_evictions_total", "reason=\"full\"", view.keys.forced_evictions);
  w.single("sluice_uptime_seconds", "gauge", "Seconds since the daemon started.",
           static_cast<double>(view.uptime_ms) / 1e3);

  if (view.redis) {
    const RedisHealth& h = *view.redis;
    const LeaseStats& l = view.leases;
    w.single("sluice_redis_up", "gauge", "1 while the link to Redis is up.", h.up ? 1 : 0);
    w.family("sluice_breaker_state", "gauge",
             "The lease path's breaker: 1 for the state it is in (open: fallback).");
    for (Breaker state : {Breaker::kClosed, Breaker::kOpen, Breaker::kHalfOpen}) {
      w.sample("sluice_breaker_state", "state=\"" + std::string(breakerName(state)) + "\"",
               h.breaker == state ? 1.0 : 0.0);
    }
    w.single("sluice_state_refused", "gauge",
             "1 while the fleet marker names another Redis state version: no leases.",
             h.state_refused ? 1 : 0);
    w.single("sluice_learning", "gauge", "1 while some rule leases cautiously (learning mode).",
             h.learning ? 1 : 0);
    w.family("sluice_learning_seconds", "gauge",
             "Seconds until the rule stops leasing cautiously; only rules in learning mode.");
    for (const LearningRule& rule : h.learning_rules) {
      w.sample("sluice_learning_seconds", "rule=\"" + escape(rule.name) + "\"",
               static_cast<double>(rule.left_ms) / 1e3);
    }
    w.single("sluice_fallback_entries_total", "counter", "Times the breaker opened.",
             static_cast<double>(l.fallback_entries));
    w.single("sluice_fallback_seconds_total", "counter", "Time spent with the breaker open.",
             static_cast<double>(l.fallback_ms) / 1e3);
    w.single("sluice_learning_entries_total", "counter",
             "Times Redis came back without this fleet's state.",
             static_cast<double>(l.learning_entries));
    w.single("sluice_nodes", "gauge", "Live nodes N sharing the global limits.",
             static_cast<double>(h.nodes));
    if (h.clock_offset_ms) {
      w.single("sluice_clock_offset_seconds", "gauge",
               "Redis TIME minus this host's wall clock.",
               static_cast<double>(*h.clock_offset_ms) / 1e3);
    }
    w.single("sluice_lease_requests_total", "counter", "Leases sent to Redis.",
             static_cast<double>(l.requested));
    w.single("sluice_redis_tryagains_total", "counter",
             "Redis Cluster calls sent again after a -TRYAGAIN answer (a slot migrating with the "
             "call's keys on two nodes); 0 outside Cluster mode.",
             static_cast<double>(h.try_agains));
    w.family("sluice_leases_total", "counter", "Lease answers, by outcome.");
    w.samples("sluice_leases_total", kLeaseAnswers, l);
    w.family("sluice_lease_units_total", "counter",
             "Units moved between Redis and this node's slices, by direction.");
    w.samples("sluice_lease_units_total", kLeaseUnits, l);
    w.single("sluice_lease_renewals_total", "counter",
             "Renewals of this node's concurrency holdings in Redis.",
             static_cast<double>(l.renewed));
    w.single("sluice_lease_renew_words_total", "counter",
             "Words heard on the renew channel: another node found a key's rates to be divided "
             "again.",
             static_cast<double>(l.renew_words));
    w.single("sluice_leased_units", "gauge", "Leased units this node holds and has not spent.",
             static_cast<double>(h.leased_units));
    w.family("sluice_overshoot_bound_units", "gauge",
             "The most this node could admit on one key of a global rule beyond its fair part "
             "of the limit now, by rule (+Inf: no bound); sum it over the fleet.");
    for (const RuleOvershoot& rule : view.overshoot) {
      w.sample("sluice_overshoot_bound_units", "rule=\"" + escape(rule.name) + "\"",
               rule.units ? static_cast<double>(*rule.units) : std::numeric_limits<double>::infinity());
    }
    w.histogram("sluice_lease_duration_seconds", "Round trip of a lease script to Redis.",
                view.lease_latency);
    w.counters(kLeaseWaits, t);
  }
  return w.take();
}

// --- the endpoint -----------------------------------------------------------------

MetricsEndpoint::~MetricsEndpoint() { stop(); }

bool MetricsEndpoint::start(const std::string& address, std::function<std::string()> render,
                            std::string* error) {
  std::string host;
  uint16_t port = 0;
  std::string problem;
  if (!parseListenAddress(address, &host, &port, &problem)) {
    *error = "metrics address " + address + ": " + problem;
    return false;
  }
  render_ = std::move(render);
  sockaddr_storage storage{};
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
  if (host.find(':') != std::string::npos) {
    auto* addr = reinterpret_cast<sockaddr_in6*>(&storage);
    addr->sin6_family = AF_INET6;
    addr->sin6_port = htons(port);
    inet_pton(AF_INET6, host.c_str(), &addr->sin6_addr);
    flags |= MHD_USE_IPv6;
  } else {
    auto* addr = reinterpret_cast<sockaddr_in*>(&storage);
    addr->sin_family = AF_INET;
    addr->sin_port = htons(port);
    inet_pton(AF_INET, host.c_str(), &addr->sin_addr);
  }
  auto handler = [](void* cls, MHD_Connection* connection, const char* url, const char* method,
                    const char* /*version*/, const char* /*upload_data*/,
                    size_t* upload_data_size, void** /*state*/) -> MHD_Result {
    auto* self = static_cast<MetricsEndpoint*>(cls);
    if (*upload_data_size != 0) {
      *upload_data_size = 0;  // a body we do not read
      return MHD_YES;
    }
    unsigned status = MHD_HTTP_OK;
    std::string body;
    if (std::strcmp(url, "/metrics") != 0) {
      status = MHD_HTTP_NOT_FOUND;
      body = "sluiced serves GET /metrics only\n";
    } else if (std::strcmp(method, "GET") != 0 && std::strcmp(method, "HEAD") != 0) {
      status = MHD_HTTP_METHOD_NOT_ALLOWED;
      body = "GET /metrics\n";
    } else {
      body = self->render_();
    }
    MHD_Response* response =
        MHD_create_response_from_buffer(body.size(), body.data(), MHD_RESPMEM_MUST_COPY);
    if (response == nullptr) return MHD_NO;
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE,
                            status == MHD_HTTP_OK ? kContentType.data() : "text/plain");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED) {
      MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    }
    MHD_Result result = MHD_queue_response(connection, status, response);
    MHD_destroy_response(response);
    return result;
  };
  daemon_ = MHD_start_daemon(flags, port, nullptr, nullptr, handler, this,
                             MHD_OPTION_SOCK_ADDR, reinterpret_cast<sockaddr*>(&storage),
                             MHD_OPTION_CONNECTION_LIMIT, kMaxScrapes,
                             MHD_OPTION_CONNECTION_TIMEOUT, kScrapeTimeoutSeconds,
                             MHD_OPTION_END);
  if (daemon_ == nullptr) {
    *error = "cannot serve metrics on " + address + " (in use, or not an address of this host); "
             "choose another [daemon] metrics address";
    return false;
  }
  return true;
}

void MetricsEndpoint::stop() {
  if (daemon_ != nullptr) {
    MHD_stop_daemon(daemon_);
    daemon_ = nullptr;
  }
}

}  // namespace sluice
