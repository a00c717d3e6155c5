// The HTTP check endpoint's words; see http_codec.h.
#include "http_codec.h"

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cctype>
#include <cstdio>

#include "algorithm.h"

namespace sluice::http {

namespace {

// The largest cost a check may ask, as on the MessagePack socket.
constexpr int64_t kMaxCost = 1'000'000'000;
// RFC 8941 sf-integers have at most 15 digits.
constexpr int64_t kMaxSfInteger = 999'999'999'999'999;
constexpr int64_t kNsPerSecond = 1'000'000'000;

int64_t sfClamp(int64_t value) { return std::clamp<int64_t>(value, 0, kMaxSfInteger); }

// Whole seconds, rounded up, so a client told to wait never comes back early.
int64_t ceilSeconds(int64_t ms) { return ms <= 0 ? 0 : ms / 1000 + (ms % 1000 != 0); }

std::string_view reasonPhrase(unsigned status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return status < 500 ? "Client Error" : "Server Error";
  }
}

// An sf-string of `text`: printable ASCII, '"' and '\' escaped; other bytes
// become '?' (rule names are printable, checked by the config).
std::string sfString(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += (c < 0x20 || c > 0x7e) ? '?' : c;
  }
  out += '"';
  return out;
}

std::optional<int64_t> parseCost(std::string_view text) {
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 0 || value > kMaxCost) {
    return std::nullopt;
  }
  return value;
}

unsigned errorStatus(ErrorCode code) {
  switch (code) {
    case ErrorCode::kBadRequest:
    case ErrorCode::kTooLarge: return 400;
    case ErrorCode::kUnknownRule:
    case ErrorCode::kUnknownMethod:
    case ErrorCode::kUnknownReservation: return 404;
    case ErrorCode::kForbidden: return 403;
    case ErrorCode::kOverloaded: return 503;
    case ErrorCode::kInternal: return 500;
  }
  return 500;
}

void appendField(std::string* body, std::string_view name, int64_t value) {
  *body += ",\"";
  *body += name;
  *body += "\":";
  *body += std::to_string(value);
}

void appendNumber(std::string* out, uint64_t value) {
  char text[24];
  char* end = std::to_chars(text, text + sizeof(text), value).ptr;
  out->append(text, static_cast<size_t>(end - text));
}

void appendTwoDigits(std::string* out, int value) {
  *out += static_cast<char>('0' + value / 10 % 10);
  *out += static_cast<char>('0' + value % 10);
}

}  // namespace

void writeResponse(std::string* out, const Reply& reply, std::string_view connection,
                   std::string_view date, bool with_body) {
  *out += "HTTP/1.1 ";
  appendNumber(out, reply.status);
  *out += ' ';
  *out += reasonPhrase(reply.status);
  *out += "\r\n";
  if (!date.empty()) {
    *out += "Date: ";
    *out += date;
    *out += "\r\n";
  }
  if (!connection.empty()) {
    *out += "Connection: ";
    *out += connection;
    *out += "\r\n";
  }
  if (!reply.content_type.empty()) {
    *out += "Content-Type: ";
    *out += reply.content_type;
    *out += "\r\n";
  }
  for (const auto& [name, value] : reply.headers) {
    *out += name;
    *out += ": ";
    *out += value;
    *out += "\r\n";
  }
  *out += "Content-Length: ";
  appendNumber(out, reply.body.size());
  *out += "\r\n\r\n";
  if (with_body) *out += reply.body;
}

std::string imfDate(int64_t unix_s) {
  static constexpr const char* kDays[] = {"Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"};
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  if (unix_s < 0) unix_s = 0;
  const int64_t days = unix_s / 86400;
  const int64_t second_of_day = unix_s % 86400;
  // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
  const int64_t z = days + 719468;
  const int64_t era = z / 146097;
  const int64_t doe = z - era * 146097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  const int64_t day = doy - (153 * mp + 2) / 5 + 1;
  const int64_t month = mp < 10 ? mp + 3 : mp - 9;
  const int64_t year = yoe + era * 400 + (month <= 2 ? 1 : 0);
  std::string out = kDays[days % 7];
  out += ", ";
  appendTwoDigits(&out, static_cast<int>(day));
  out += ' ';
  out += kMonths[month - 1];
  out += ' ';
  appendNumber(&out, static_cast<uint64_t>(year));
  out += ' ';
  appendTwoDigits(&out, static_cast<int>(second_of_day / 3600));
  out += ':';
  appendTwoDigits(&out, static_cast<int>(second_of_day / 60 % 60));
  out += ':';
  appendTwoDigits(&out, static_cast<int>(second_of_day % 60));
  out += " GMT";
  return out;
}

const std::string* Reply::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (key == name) return &value;
  }
  return nullptr;
}

std::string jsonString(std::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c >= 0x7f) {
          // Bytes beyond ASCII are shown escaped: a key need not be UTF-8.
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          out += escaped;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
  return out;
}

std::string_view lastForwarded(std::string_view value) {
  size_t comma = value.rfind(',');
  std::string_view last = comma == std::string_view::npos ? value : value.substr(comma + 1);
  while (!last.empty() && (last.front() == ' ' || last.front() == '\t')) last.remove_prefix(1);
  while (!last.empty() && (last.back() == ' ' || last.back() == '\t')) last.remove_suffix(1);
  return last;
}

Reply problem(unsigned status, std::string_view detail) {
  Reply reply;
  reply.status = status;
  reply.content_type = "application/problem+json";
  reply.body = "{\"type\":\"about:blank\",\"title\":" + jsonString(reasonPhrase(status)) +
               ",\"status\":" + std::to_string(status) + ",\"detail\":" + jsonString(detail) +
               "}";
  return reply;
}

Parsed parseCheck(std::string_view path, std::string_view http_method,
                  const Parameters& parameters, size_t max_key_bytes) {
  Parsed parsed;
  if (path == kCheckPath) {
    parsed.method = Method::kAcquire;
  } else if (path == kPeekPath) {
    parsed.method = Method::kPeek;
  } else if (path == kReservePath) {
    parsed.method = Method::kReserve;
  } else if (path == kSettlePath) {
    parsed.method = Method::kSettle;
  } else {
    parsed.refusal = problem(
        404, "no such endpoint; ask GET or POST /v1/check, /v1/peek, /v1/reserve or /v1/settle");
    return parsed;
  }
  if (http_method != "GET" && http_method != "POST") {
    parsed.refusal = problem(405, "ask GET or POST " + std::string(path));
    parsed.refusal.headers.emplace_back("Allow", "GET, POST");
    return parsed;
  }
  if (parsed.method == Method::kSettle) {
    std::optional<uint64_t> id;
    if (parameters.query_id) {
      uint64_t value = 0;
      auto [end, error] = std::from_chars(parameters.query_id->data(),
                                          parameters.query_id->data() + parameters.query_id->size(),
                                          value);
      if (error == std::errc() && end == parameters.query_id->data() + parameters.query_id->size() &&
          value != 0) {
        id = value;
      }
    }
    std::optional<int64_t> actual =
        parameters.query_actual ? parseCost(*parameters.query_actual) : std::nullopt;
    if (!id || !actual) {
      parsed.refusal = problem(400, "/v1/settle needs ?id=ID (what /v1/reserve answered) and "
                                    "&actual=UNITS (0..1000000000; 0 cancels)");
      return parsed;
    }
    if (*actual == 0) parsed.method = Method::kCancel;
    parsed.item.reservation = *id;
    parsed.item.cost = *actual;
    parsed.ok = true;
    return parsed;
  }
  auto pick = [](std::optional<std::string_view> query, std::optional<std::string_view> header) {
    return query ? query : header;
  };
  std::optional<std::string_view> rule = pick(parameters.query_rule, parameters.header_rule);
  std::optional<std::string_view> key = pick(parameters.query_key, parameters.header_key);
  if (parameters.query_key_header) {
    std::string_view name = *parameters.query_key_header;
    if (!parameters.named_header || parameters.named_header->empty()) {
      parsed.refusal = problem(400, "parameter key_header names header " + std::string(name) +
                                        ", which the request does not carry");
      return parsed;
    }
    key = parameters.named_header;
    auto equalsIgnoringCase = [](std::string_view a, std::string_view b) {
      return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) ==
                      std::tolower(static_cast<unsigned char>(y));
             });
    };
    if (equalsIgnoringCase(name, "X-Forwarded-For")) key = lastForwarded(*key);
  }
  std::optional<std::string_view> cost = pick(parameters.query_cost, parameters.header_cost);
  if (!rule || rule->empty()) {
    parsed.refusal = problem(400, "parameter rule is missing; pass ?rule=NAME or a Sluice-Rule header");
    return parsed;
  }
  if (!key || key->empty()) {
    parsed.refusal = problem(400, "parameter key is missing; pass ?key=KEY or a Sluice-Key header");
    return parsed;
  }
  if (key->size() > max_key_bytes) {
    parsed.refusal = problem(400, "parameter key is " + std::to_string(key->size()) +
                                      " bytes long; at most " + std::to_string(max_key_bytes) +
                                      " are allowed ([limits] max_key_bytes)");
    return parsed;
  }
  parsed.item.rule = *rule;
  parsed.item.key = *key;
  parsed.item.cost = parsed.method == Method::kPeek ? 0 : 1;
  if (parsed.method == Method::kReserve) {
    std::optional<int64_t> estimate =
        parameters.query_estimate ? parseCost(*parameters.query_estimate) : std::nullopt;
    std::optional<int64_t> ttl_ms =
        parameters.query_ttl_ms ? parseCost(*parameters.query_ttl_ms) : std::nullopt;
    if (!estimate || *estimate == 0 ||
        (parameters.query_ttl_ms && (!ttl_ms || *ttl_ms == 0 || *ttl_ms > kMaxReservationTtlMs))) {
      parsed.refusal = problem(400, "/v1/reserve needs &estimate=UNITS (1..1000000000) and takes "
                                    "&ttl_ms=MS (1..86400000)");
      return parsed;
    }
    parsed.item.cost = *estimate;
    parsed.item.max_wait_ms = 0;
    parsed.item.ttl_ms = ttl_ms.value_or(-1);
    parsed.ok = true;
    return parsed;
  }
  if (cost) {
    std::optional<int64_t> value = parseCost(*cost);
    if (!value) {
      parsed.refusal = problem(400, "parameter cost must be an integer 0..1000000000");
      return parsed;
    }
    parsed.item.cost = *value;
  }
  parsed.ok = true;
  return parsed;
}

std::pair<std::string, std::string> rateLimitHeaders(const Rule& rule, const Decision& decision) {
  const bool concurrency = algorithmTraits(rule.algorithm).holds;
  const bool several = rule.limits.size() > 1;
  // The limit the decision reports: the first of the rule's whose limit it is.
  size_t reported = 0;
  for (size_t i = 0; i < rule.limits.size(); ++i) {
    if (rule.limits[i].limit == decision.limit) {
      reported = i;
      break;
    }
  }
  auto name = [&](size_t i) {
    return sfString(several ? rule.name + "/" + std::to_string(i) : rule.name);
  };
  std::string ratelimit = name(reported) + ";r=" + std::to_string(sfClamp(decision.remaining)) +
                          ";t=" + std::to_string(sfClamp(ceilSeconds(decision.reset_after_ms)));
  std::string policy;
  for (size_t i = 0; i < rule.limits.size(); ++i) {
    const Limit& limit = rule.limits[i];
    if (i > 0) policy += ", ";
    // Overrides may give a key another limit; the decision knows the one applied.
    int64_t quota = i == reported ? decision.limit : limit.limit;
    policy += name(i) + ";q=" + std::to_string(sfClamp(quota));
    if (concurrency) {
      policy += ";qu=\"concurrent-requests\"";
    } else if (limit.period_ns > 0) {
      policy += ";w=" + std::to_string(sfClamp((limit.period_ns + kNsPerSecond - 1) / kNsPerSecond));
    }
  }
  return {std::move(ratelimit), std::move(policy)};
}

Reply encodeAnswer(const Answer& answer, const Rule* rule, std::string_view rule_name,
                   unsigned deny_status) {
  if (answer.failed) {
    Reply reply = problem(errorStatus(answer.error), answer.message);
    // The daemon's trouble passes: say when to come back.
    if (reply.status == 503) reply.headers.emplace_back("Retry-After", "1");
    return reply;
  }
  if (settles(answer.method) && !answer.decisions.empty()) {
    // What was settled, and the key's state afterwards.
    const Decision& decision = answer.decisions.front();
    Reply reply;
    reply.content_type = "application/json";
    reply.body = "{\"id\":" + std::to_string(answer.reservation);
    appendField(&reply.body, "refunded", answer.refunded);
    appendField(&reply.body, "debt", answer.debt);
    appendField(&reply.body, "unpaid", answer.unpaid);
    reply.body += std::string(",\"allowed\":") + (decision.allowed ? "true" : "false");
    appendField(&reply.body, "remaining", decision.remaining);
    appendField(&reply.body, "limit", decision.limit);
    appendField(&reply.body, "reset_after_ms", decision.reset_after_ms);
    reply.body += ",\"mode\":" + jsonString(modeName(answer.modes.front())) + "}";
    return reply;
  }
  if (answer.decisions.empty()) {
    return problem(500, "the daemon answered no decision; this is a bug, please report it");
  }
  const Decision& decision = answer.decisions.front();
  // A decision made before a reload removed its rule (a request that waited
  // for units it was given): answered as made, its policy the decision's
  // limit alone, since the rule's windows are gone with it.
  std::optional<Rule> removed;
  if (rule == nullptr) {
    removed.emplace();
    removed->name = std::string(rule_name);
    removed->limits = {Limit{.limit = decision.limit}};
    rule = &*removed;
  }
  const Mode mode = answer.modes.empty() ? Mode::kLocal : answer.modes.front();
  Reply reply;
  auto [ratelimit, policy] = rateLimitHeaders(*rule, decision);
  reply.headers.emplace_back("RateLimit-Policy", std::move(policy));
  reply.headers.emplace_back("RateLimit", std::move(ratelimit));
  reply.headers.emplace_back("Sluice-Mode", std::string(modeName(mode)));
  std::string fields;
  appendField(&fields, "remaining", decision.remaining);
  appendField(&fields, "limit", decision.limit);
  appendField(&fields, "reset_after_ms", decision.reset_after_ms);
  appendField(&fields, "retry_after_ms", decision.retry_after_ms);
  fields += ",\"mode\":" + jsonString(modeName(mode));
  if (answer.method == Method::kReserve && answer.reservation != 0) {
    fields += ",\"id\":" + std::to_string(answer.reservation);
    reply.headers.emplace_back("Sluice-Reservation", std::to_string(answer.reservation));
  }
  if (decision.allowed) {
    reply.status = 200;
    reply.content_type = "application/json";
    reply.body = "{\"allowed\":true,\"rule\":" + jsonString(rule_name) + fields + "}";
    return reply;
  }
  // A denial always says to wait at least a second: "0" invites a hot loop.
  int64_t retry_s = std::max<int64_t>(1, ceilSeconds(decision.retry_after_ms));
  reply.headers.emplace_back("Retry-After", std::to_string(sfClamp(retry_s)));
  std::string detail = decision.cost_exceeds_limit
                           ? "the cost is more than rule " + std::string(rule_name) +
                                 " can ever allow at once; retrying cannot help"
                           : "rule " + std::string(rule_name) + " denied this key; retry after " +
                                 std::to_string(retry_s) + " s";
  Reply denial = problem(deny_status, detail);
  reply.status = denial.status;
  reply.content_type = denial.content_type;
  denial.body.pop_back();  // the closing brace: the decision's fields follow
  reply.body = denial.body + ",\"rule\":" + jsonString(rule_name) + fields + "}";
  return reply;
}

}  // namespace sluice::http
