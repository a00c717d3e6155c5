// EnvoyPolicy: the YAML reader (yaml-cpp) and the descriptor matcher.
//
// Error policy as in config.cpp: the first problem is thrown as a Problem
// (position and message) and caught at the top of readEnvoyYaml.
#include "envoy_policy.h"

#include <glob.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

namespace sluice {
namespace {

struct Problem {
  YAML::Mark at;
  std::string message;
};

[[noreturn]] void refuse(const YAML::Node& where, std::string message) {
  throw Problem{where.Mark(), std::move(message)};
}

std::string quote(std::string_view text) { return "\"" + std::string(text) + "\""; }

constexpr std::array<std::string_view, 3> kTopKeys = {"domain", "descriptors", "shadow_mode"};
constexpr std::array<std::string_view, 9> kDescriptorKeys = {
    "key",      "value",   "rate_limit",      "descriptors", "shadow_mode",
    "unlimited", "replaces", "detailed_metric", "name"};
constexpr std::array<std::string_view, 3> kRateLimitKeys = {"unit", "requests_per_unit", "name"};
constexpr std::array<std::string_view, 4> kUnits = {"second", "minute", "hour", "day"};

std::string joined(std::span<const std::string_view> names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i];
  }
  return out;
}

void checkKeys(const YAML::Node& map, std::span<const std::string_view> known,
               std::string_view where) {
  for (const auto& pair : map) {
    const std::string key = pair.first.Scalar();
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      refuse(pair.first, "unknown key " + quote(key) + " in " + std::string(where) +
                             "; the keys are " + joined(known));
    }
  }
}

// A scalar string, with no control characters (they would be ambiguous in
// a key or a rule name).
std::string text(const YAML::Node& node, std::string_view what) {
  if (!node.IsScalar()) refuse(node, std::string(what) + " must be a string; write e.g. " +
                                         std::string(what) + ": my_value");
  const std::string& value = node.Scalar();
  for (char c : value) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      refuse(node, std::string(what) + " has a control character; write printable text");
    }
  }
  return value;
}

bool flag(const YAML::Node& node, std::string_view what) {
  if (node.IsScalar()) {
    const std::string& value = node.Scalar();
    if (value == "true" || value == "True" || value == "yes") return true;
    if (value == "false" || value == "False" || value == "no") return false;
  }
  refuse(node, std::string(what) + " must be true or false; write e.g. " + std::string(what) +
                   ": true");
}

class Reader {
 public:
  Reader(const EnvoyRuleOptions& options, EnvoyPolicy* policy) : options_(options), policy_(policy) {}

  void read(const YAML::Node& root) {
    if (!root.IsMap()) refuse(root, "the file must be a map with domain and descriptors; write "
                                    "e.g. domain: mongo_cps, then descriptors: as a list");
    checkKeys(root, kTopKeys, "the file");
    const YAML::Node domain = root["domain"];
    if (!domain) refuse(root, "no domain; add e.g. domain: mongo_cps at the top");
    EnvoyDomain out;
    out.name = text(domain, "domain");
    if (out.name.empty()) refuse(domain, "domain is empty; name the domain Envoy sends");
    for (const EnvoyDomain& other : policy_->domains) {
      if (other.name == out.name) {
        refuse(domain, "domain " + quote(out.name) + " is configured twice; keep each domain "
                       "in one file");
      }
    }
    const bool shadow = root["shadow_mode"] && flag(root["shadow_mode"], "shadow_mode");
    if (const YAML::Node list = root["descriptors"]) {
      std::string path;
      appendEnvoyNamePart(&path, out.name);
      readList(list, path, shadow, &out.descriptors);
    }
    policy_->domains.push_back(std::move(out));
  }

 private:
  void readList(const YAML::Node& list, const std::string& path, bool shadow,
                std::vector<EnvoyNode>* out) {
    if (list.IsNull()) return;
    if (!list.IsSequence()) refuse(list, "descriptors must be a list; write each as "
                                         "- key: name");
    for (const YAML::Node& item : list) out->push_back(readDescriptor(item, path, shadow));
  }

  EnvoyNode readDescriptor(const YAML::Node& node, const std::string& parent, bool shadow) {
    if (!node.IsMap()) refuse(node, "a descriptor must be a map; write e.g. - key: remote_address");
    checkKeys(node, kDescriptorKeys, "a descriptor");
    EnvoyNode out;
    if (!node["key"]) refuse(node, "a descriptor without key; add e.g. key: remote_address");
    out.key = text(node["key"], "key");
    if (out.key.empty()) refuse(node["key"], "key is empty; name the descriptor's key");
    std::string path = parent + "/";
    appendEnvoyNamePart(&path, out.key);
    if (const YAML::Node value = node["value"]) {
      out.value = text(value, "value");
      out.has_value = true;
      path += "=";
      appendEnvoyNamePart(&path, out.value);  // with the `*` of a prefix
      if (!out.value.empty() && out.value.back() == '*') {
        out.wildcard = true;
        out.value.pop_back();
      }
    }
    if (node["shadow_mode"]) shadow = flag(node["shadow_mode"], "shadow_mode");
    if (node["detailed_metric"]) flag(node["detailed_metric"], "detailed_metric");
    const bool unlimited = node["unlimited"] && flag(node["unlimited"], "unlimited");
    const YAML::Node rate = node["rate_limit"];
    if (rate && unlimited) {
      refuse(node["unlimited"], "descriptor " + quote(path) + " has both rate_limit and "
                                "unlimited: true; keep one");
    }
    if (rate || unlimited) {
      EnvoyLimit limit;
      limit.unlimited = unlimited;
      limit.shadow = shadow;
      if (node["name"]) limit.name = text(node["name"], "name");
      if (const YAML::Node replaces = node["replaces"]) {
        if (!replaces.IsSequence()) refuse(replaces, "replaces must be a list; write e.g. "
                                                     "replaces: [{name: other}]");
        for (const YAML::Node& entry : replaces) {
          if (!entry.IsMap() || !entry["name"]) {
            refuse(entry, "each replaces entry names a limit; write e.g. - name: other");
          }
          limit.replaces.push_back(text(entry["name"], "name"));
        }
      }
      if (rate) readRate(rate, path, &limit);
      if (!unlimited) {
        limit.rule = path;
        if (!names_.insert(path).second) {
          refuse(node, "descriptor " + quote(path) + " is configured twice; merge the two");
        }
        Rule rule;
        rule.name = path;
        rule.algorithm = options_.algorithm;
        const int64_t period_ns = envoyUnitNs(limit.unit);
        rule.limits.push_back(Limit{.limit = limit.requests_per_unit, .period_ns = period_ns,
                                    .burst = limit.requests_per_unit});
        rule.scope = options_.scope;
        rule.on_redis_down = options_.on_redis_down;
        rule.shadow = shadow;
        policy_->rules.push_back(std::move(rule));
      }
      out.limit = static_cast<int>(policy_->limits.size());
      policy_->limits.push_back(std::move(limit));
    } else if (node["replaces"] || node["name"]) {
      // A name or replaces without a limit means nothing; say so.
      refuse(node, "descriptor " + quote(path) + " has name or replaces but no rate_limit; "
                   "add a rate_limit or remove them");
    }
    if (const YAML::Node children = node["descriptors"]) {
      readList(children, path, shadow, &out.children);
    }
    return out;
  }

  void readRate(const YAML::Node& rate, const std::string& path, EnvoyLimit* limit) {
    if (!rate.IsMap()) refuse(rate, "rate_limit must be a map; write e.g. rate_limit: "
                                    "{unit: second, requests_per_unit: 10}");
    checkKeys(rate, kRateLimitKeys, "rate_limit");
    const YAML::Node unit = rate["unit"];
    if (!unit) refuse(rate, "rate_limit of " + quote(path) + " has no unit; add e.g. unit: second");
    std::string name = text(unit, "unit");
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    auto it = std::find(kUnits.begin(), kUnits.end(), name);
    if (it == kUnits.end()) {
      refuse(unit, "unknown unit " + quote(unit.Scalar()) + "; write " + joined(kUnits));
    }
    limit->unit = static_cast<EnvoyUnit>(it - kUnits.begin() + 1);
    const YAML::Node count = rate["requests_per_unit"];
    if (!count) refuse(rate, "rate_limit of " + quote(path) + " has no requests_per_unit; "
                             "add e.g. requests_per_unit: 100");
    const std::string& digits = count.IsScalar() ? count.Scalar() : std::string();
    const bool numeric = !digits.empty() && digits.size() <= 10 &&
                         std::all_of(digits.begin(), digits.end(),
                                     [](char c) { return c >= '0' && c <= '9'; });
    const uint64_t value = numeric ? std::stoull(digits) : 0;
    if (!numeric || value == 0 || value > UINT32_MAX) {
      refuse(count, "requests_per_unit must be a whole number from 1 to 4294967295; for no "
                    "limit write unlimited: true instead of rate_limit");
    }
    const int64_t most = maxLimit(options_.algorithm);
    if (static_cast<int64_t>(value) > most) {
      refuse(count, "requests_per_unit " + digits + " is above " + std::to_string(most) +
                        ", the most [envoy] algorithm = \"" +
                        std::string(algorithmName(options_.algorithm)) +
                        "\" counts; lower it or use algorithm = \"fixed_window\"");
    }
    limit->requests_per_unit = static_cast<uint32_t>(value);
    if (rate["name"] && limit->name.empty()) limit->name = text(rate["name"], "name");
  }

  const EnvoyRuleOptions& options_;
  EnvoyPolicy* policy_;
  std::set<std::string> names_;
};

std::string locate(const std::string& source_name, const YAML::Mark& at) {
  if (at.line < 0) return source_name + ": ";
  return source_name + ":" + std::to_string(at.line + 1) + ":" + std::to_string(at.column + 1) +
         ": ";
}

const EnvoyNode* find(const std::vector<EnvoyNode>& nodes, const EnvoyEntry& entry) {
  const EnvoyNode* wildcard = nullptr;
  const EnvoyNode* any = nullptr;
  for (const EnvoyNode& node : nodes) {
    if (node.key != entry.key) continue;
    if (!node.has_value) {
      if (any == nullptr) any = &node;
    } else if (node.wildcard) {
      if (wildcard == nullptr && entry.value.substr(0, node.value.size()) == node.value) {
        wildcard = &node;
      }
    } else if (node.value == entry.value) {
      return &node;
    }
  }
  return wildcard != nullptr ? wildcard : any;
}

}  // namespace

int64_t envoyUnitNs(EnvoyUnit unit) {
  constexpr int64_t kSecondNs = 1'000'000'000;
  switch (unit) {
    case EnvoyUnit::kSecond: return kSecondNs;
    case EnvoyUnit::kMinute: return 60 * kSecondNs;
    case EnvoyUnit::kHour: return 3600 * kSecondNs;
    case EnvoyUnit::kDay: return 86400 * kSecondNs;
    case EnvoyUnit::kUnknown: break;
  }
  return 0;
}

const EnvoyLimit* EnvoyPolicy::match(std::string_view domain,
                                     std::span<const EnvoyEntry> entries) const {
  const std::vector<EnvoyNode>* level = nullptr;
  for (const EnvoyDomain& candidate : domains) {
    if (candidate.name == domain) level = &candidate.descriptors;
  }
  if (level == nullptr || entries.empty()) return nullptr;
  for (size_t i = 0; i < entries.size(); ++i) {
    const EnvoyNode* node = find(*level, entries[i]);
    if (node == nullptr) return nullptr;
    if (i + 1 == entries.size()) return node->limit < 0 ? nullptr : &limits[node->limit];
    level = &node->children;
  }
  return nullptr;
}

void appendEnvoyNamePart(std::string* out, std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '%' || c == '/' || c == '=' || byte < 0x20 || byte == 0x7f) {
      out->push_back('%');
      out->push_back(kHex[byte >> 4]);
      out->push_back(kHex[byte & 0xf]);
    } else {
      out->push_back(c);
    }
  }
}

std::string envoyKey(std::span<const EnvoyEntry> entries) {
  std::string key;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i > 0) key += kEnvoyKeySeparator;
    appendEnvoyNamePart(&key, entries[i].value);
  }
  return key;
}

std::string readEnvoyYaml(std::string_view text, const std::string& source_name,
                          const EnvoyRuleOptions& options, EnvoyPolicy* policy) {
  try {
    YAML::Node root = YAML::Load(std::string(text));
    Reader(options, policy).read(root);
  } catch (const Problem& problem) {
    return locate(source_name, problem.at) + problem.message;
  } catch (const YAML::Exception& error) {
    return locate(source_name, error.mark) + "invalid YAML: " + error.msg +
           "; check the indentation and quoting on that line";
  }
  return "";
}

std::string readEnvoyFiles(const std::string& pattern, const EnvoyRuleOptions& options,
                           EnvoyPolicy* policy) {
  glob_t found{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &found);
  std::vector<std::string> paths(found.gl_pathv, found.gl_pathv + found.gl_pathc);
  globfree(&found);
  if (rc != 0 || paths.empty()) {
    return pattern + ": no file matches; write [envoy] config as the path or glob of "
                     "envoyproxy/ratelimit's YAML files, e.g. \"/etc/sluice/ratelimit/*.yaml\"";
  }
  for (const std::string& path : paths) {
    std::ifstream file(path, std::ios::binary);
    if (!file) return path + ": cannot read the file: " + std::strerror(errno);
    std::ostringstream bytes;
    bytes << file.rdbuf();
    std::string error = readEnvoyYaml(bytes.str(), path, options, policy);
    if (!error.empty()) return error;
  }
  return "";
}

}  // namespace sluice
