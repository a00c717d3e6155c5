// ConfigValues: the config loader's message helpers and value readers (see
// config_values.h).
#include "config_values.h"

#include <algorithm>
#include <array>
#include <iomanip>
#include <limits>
#include <sstream>
#include <vector>

namespace sluice {
namespace {

// Edit distance, for "did you mean" on misspelled keys.
size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

struct DurationUnit {
  std::string_view suffix;
  int64_t ns;
};
// Longest suffix first where one is a prefix of another ("ms" before "m").
constexpr std::array<DurationUnit, 5> kDurationUnits = {{
    {"ms", 1'000'000},
    {"s", 1'000'000'000},
    {"m", 60LL * 1'000'000'000},
    {"h", 3600LL * 1'000'000'000},
    {"d", 86400LL * 1'000'000'000},
}};

}  // namespace

namespace config_detail {

// --- errors -------------------------------------------------------------------

[[noreturn]] void refuse(const toml::node& where, std::string message) {
  throw Refusal{where.source().begin, std::move(message)};
}

[[noreturn]] void refuse(const toml::key& where, std::string message) {
  throw Refusal{where.source().begin, std::move(message)};
}

std::string locate(const std::string& source_name, const toml::source_position& at) {
  if (at.line == 0) return source_name + ": ";
  return source_name + ":" + std::to_string(at.line) + ":" + std::to_string(at.column) + ": ";
}

std::string quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20 || byte == 0x7f) {
      static constexpr char kHex[] = "0123456789ABCDEF";
      out += "\\u00";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string_view describe(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a floating-point number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::none: break;
  }
  return "nothing";
}

// The known name closest to `unknown`, when one is close enough to be a typo
// (or the same word with a suffix, like `period_ms` for `period`).
std::optional<std::string_view> closest(std::string_view unknown,
                                        std::span<const std::string_view> known) {
  std::optional<std::string_view> best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (std::string_view candidate : known) {
    size_t distance = editDistance(unknown, candidate);
    bool prefix = candidate.size() >= 4 &&
                  (unknown.starts_with(candidate) || candidate.starts_with(unknown));
    bool typo = distance <= std::max<size_t>(2, candidate.size() / 4);
    if ((prefix || typo) && distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

std::string joinQuoted(std::span<const std::string_view> names) {
  std::string out;
  for (std::string_view name : names) {
    if (!out.empty()) out += ", ";
    out += quote(name);
  }
  return out;
}

std::string joinPlain(std::span<const std::string_view> names) {
  std::string out;
  for (std::string_view name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

// --- durations ----------------------------------------------------------------

// The shortest way to write `ns` (a whole number of milliseconds) in the file.
std::string formatDuration(int64_t ns) {
  if (ns == 0) return "0";
  for (auto unit = kDurationUnits.rbegin(); unit != kDurationUnits.rend(); ++unit) {
    if (ns % unit->ns == 0) return std::to_string(ns / unit->ns) + std::string(unit->suffix);
  }
  return std::to_string(ns) + "ns";
}


std::string formatMode(int64_t mode) {
  std::ostringstream out;
  out << std::setfill('0') << std::setw(4) << std::oct << mode;
  return out.str();
}


bool allDigits(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(),
                                      [](char c) { return c >= '0' && c <= '9'; });
}

// Fills the address fields of `redis` from `url`; returns what is wrong with

// --- sections -------------------------------------------------------------------

const toml::table& asSection(const toml::node& node, std::string_view name) {
  if (const toml::table* table = node.as_table()) return *table;
  refuse(node, std::string(name) + " is " + std::string(describe(node)) +
                   "; it must be a section: write [" + std::string(name) +
                   "] on a line of its own and its options below");
}

// `subject` prefixes the message ("rule \"api\": "); `where` names the table.
void refuseUnknownKey(const toml::key& key, const std::string& subject, std::string_view where,
                      std::span<const std::string_view> known) {
  std::string message = subject + "unknown key " + quote(key.str()) + " in " + std::string(where);
  if (key.str() == "calendar" &&
      std::find(known.begin(), known.end(), std::string_view("window")) != known.end()) {
    // Other limiters' spelling of a calendar window (period plus a flag).
    message += "; a calendar window is written window = \"day\", \"week\" or \"month\" in "
               "place of period (with time_zone)";
  } else if (auto suggestion = closest(key.str(), known)) {
    message += "; did you mean " + quote(*suggestion) + "?";
  } else {
    message += "; remove it (the keys of " + std::string(where) + " are " + joinPlain(known) + ")";
  }
  refuse(key, std::move(message));
}

int64_t integerValue(const toml::node& node, const std::string& what, std::string_view example) {
  if (const auto* value = node.as_integer()) return value->get();
  std::string fix = "write a whole number";
  if (node.is_string() || node.is_floating_point()) fix += " without quotes or decimals";
  refuse(node, what + " is " + std::string(describe(node)) + "; " + fix + ", e.g. " +
                   std::string(example));
}

const std::string& stringValue(const toml::node& node, const std::string& what,
                               std::string_view example) {
  if (const auto* value = node.as_string()) return value->get();
  refuse(node, what + " is " + std::string(describe(node)) + "; write a string in double " +
                   "quotes, e.g. " + std::string(example));
}

// Nanoseconds of a duration value; refuses anything else.
int64_t durationValue(const toml::node& node, const std::string& what, std::string_view example) {
  const auto* value = node.as_string();
  if (value == nullptr) {
    refuse(node, what + " is " + std::string(describe(node)) +
                     "; write a duration in quotes with a unit, e.g. " + std::string(example));
  }
  auto ns = parseDurationNs(value->get());
  if (!ns) {
    const std::string_view text = value->get();
    // Weeks and months are calendar spans, not durations (a month is 28 to
    // 31 days): a rule counts them with window, which other limiters spell
    // as a period with a calendar flag.
    const bool calendar = text.ends_with("w") || text.ends_with("mo") ||
                          text.ends_with("week") || text.ends_with("month");
    refuse(node, what + " " + quote(text) + " is not a duration; " +
                     (calendar ? std::string("a rule's limit per calendar week or month is "
                                             "written window = \"week\" or \"month\" in "
                                             "place of period (with time_zone)")
                               : std::string(kDurationHint)));
  }
  return *ns;
}

int64_t fileModeValue(const toml::node& node, const std::string& what, std::string_view example) {
  if (const auto* value = node.as_integer()) {
    if (!!(value->flags() & toml::value_flags::format_as_octal)) return value->get();
    refuse(node, what + " is the decimal number " + std::to_string(value->get()) +
                     "; write permission bits in octal, in quotes: " + std::string(example));
  }
  if (const auto* value = node.as_string()) {
    const std::string& text = value->get();
    bool octal = text.find_first_not_of("01234567") == std::string::npos;
    if (!text.empty() && text.size() <= 4 && octal) {
      return std::stoll(text, nullptr, 8);
    }
    refuse(node, what + " " + quote(text) + " is not an octal mode; write up to four octal " +
                     "digits, e.g. " + std::string(example));
  }
  refuse(node, what + " is " + std::string(describe(node)) +
                   "; write permission bits in octal, in quotes: " + std::string(example));
}


}  // namespace config_detail

std::optional<int64_t> parseDurationNs(std::string_view text) {
  if (text == "0") return 0;
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0) return std::nullopt;
  std::string_view suffix = text.substr(digits);
  for (const DurationUnit& unit : kDurationUnits) {
    if (suffix != unit.suffix) continue;
    const int64_t most = std::numeric_limits<int64_t>::max();
    int64_t count = 0;
    for (char c : text.substr(0, digits)) {
      if (count > (most - (c - '0')) / 10) return most;
      count = count * 10 + (c - '0');
    }
    return count > most / unit.ns ? most : count * unit.ns;
  }
  return std::nullopt;
}

}  // namespace sluice
