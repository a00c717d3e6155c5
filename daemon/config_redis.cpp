// ConfigRedis: the [redis] section's urls, addresses and modes (see
// config_values.h and config.h).
#include "config_values.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sluice {
namespace config_detail {
namespace {

// Percent-decodes `text`; nullopt on a malformed escape.
std::optional<std::string> percentDecode(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    if (i + 2 >= text.size()) return std::nullopt;
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    int high = hex(text[i + 1]);
    int low = hex(text[i + 2]);
    if (high < 0 || low < 0) return std::nullopt;
    out += static_cast<char>(high * 16 + low);
    i += 2;
  }
  return out;
}

// Cluster mode: `cluster_nodes`, with the masters' AUTH (username,
// password); url, the Sentinel options and db (a cluster has only db 0) are
// refused.
void checkClusterMode(const Given& given, const toml::node& nodes, RedisConfig* redis) {
  std::string line = std::to_string(nodes.source().begin.line);
  for (std::string_view key : {"url", "sentinel_master", "sentinels", "sentinel_username",
                               "sentinel_password", "sentinel_password_file"}) {
    auto it = given.find(key);
    if (it == given.end()) continue;
    refuse(*it->second,
           "[redis] " + std::string(key) + " belongs to " +
               (key == "url" ? "standalone mode" : "Sentinel mode") +
               ", and this section also has cluster_nodes (line " + line + "), which name a " +
               "Redis Cluster; write either cluster_nodes or " +
               (key == "url" ? "url" : "sentinel_master and sentinels") + ", not both");
  }
  if (auto db = given.find("db"); db != given.end()) {
    refuse(*db->second, "[redis] db does not apply to a Redis Cluster, which has only database "
                        "0; remove db");
  }
  if (auto user = given.find("username"); user != given.end() && redis->password.empty()) {
    refuse(*user->second, "[redis] username needs password: add password = \"...\", the ACL "
                          "user's password on the cluster's nodes");
  }
  redis->url.clear();
  redis->host.clear();
  redis->port = 0;
  redis->unix_path.clear();
  redis->cluster_addresses.clear();
  for (const std::string& text : redis->cluster_nodes) {
    RedisAddress address;
    std::string problem;
    parseRedisAddress(text, &address, &problem);  // checked when given
    redis->cluster_addresses.push_back(std::move(address));
  }
}

// The longest password a file may hold, as the password option.
constexpr size_t kMaxPasswordBytes = 512;

// The password in the file at `path`, given as `what` at `where`: the file's
// bytes without one trailing newline. Refuses a file the daemon cannot read,
// one its group or others have any access to (the password would not be
// the daemon's secret), and one that is empty, too long or not one line.
std::string readSecretFile(const toml::node& where, const std::string& what,
                           const std::string& path) {
  const std::string subject = what + " " + quote(path);
  const std::string fix = "write the path of a file the daemon's user can read, holding the "
                          "password alone";
  // Only a regular file is opened: opening a FIFO would wait for a writer,
  // and opening a device may do something.
  struct stat info{};
  if (stat(path.c_str(), &info) != 0) {
    refuse(where, subject + " cannot be read: " + std::strerror(errno) + "; " + fix);
  }
  if (!S_ISREG(info.st_mode)) refuse(where, subject + " is not a regular file; " + fix);
  if ((info.st_mode & 077) != 0) {
    refuse(where, subject + " is open to its group or others (mode " +
                      formatMode(info.st_mode & 07777) + "); chmod 600 it, owned by the " +
                      "daemon's user, so that only the daemon reads the password");
  }
  std::string secret(kMaxPasswordBytes + 3, '\0');
  ssize_t got = -1;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd >= 0) {
    got = read(fd, secret.data(), secret.size());
    const int read_errno = errno;
    close(fd);
    errno = read_errno;
  }
  if (got < 0) refuse(where, subject + " cannot be read: " + std::strerror(errno) + "; " + fix);
  secret.resize(static_cast<size_t>(got));
  if (secret.ends_with('\n')) secret.pop_back();
  if (secret.ends_with('\r')) secret.pop_back();
  if (secret.empty()) {
    refuse(where, subject + " is empty; write the password in it, alone on one line");
  }
  if (secret.size() > kMaxPasswordBytes) {
    refuse(where, subject + " holds more than " + std::to_string(kMaxPasswordBytes) +
                      " bytes; write the password in it, alone on one line");
  }
  if (std::any_of(secret.begin(), secret.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
    refuse(where, subject + " holds more than one line or a control character; write the " +
                      "password in it, alone on one line");
  }
  return secret;
}

// Reads the secret of option `file_key` (a path; "" for none) unless the
// option `inline_key` also gives it, which is refused.
std::optional<std::string> secretFromFile(const Given& given, std::string_view file_key,
                                          std::string_view inline_key, const std::string& path) {
  auto file = given.find(file_key);
  if (file == given.end() || path.empty()) return std::nullopt;
  if (auto written = given.find(inline_key); written != given.end()) {
    refuse(*file->second, "[redis] " + std::string(file_key) + " and " + std::string(inline_key) +
                              " (line " + std::to_string(written->second->source().begin.line) +
                              ") both give the password; keep " + std::string(file_key) +
                              ", which keeps the secret out of this file, and remove " +
                              std::string(inline_key));
  }
  return readSecretFile(*file->second, "[redis] " + std::string(file_key), path);
}

}  // namespace

// --- redis urls -----------------------------------------------------------------

std::string redactPassword(std::string_view url) {
  size_t scheme_end = url.find("://");
  size_t at = url.rfind('@');
  if (scheme_end == std::string_view::npos || at == std::string_view::npos || at < scheme_end) {
    return std::string(url);
  }
  size_t colon = url.find(':', scheme_end + 3);
  if (colon == std::string_view::npos || colon > at) return std::string(url);
  return std::string(url.substr(0, colon + 1)) + "***" + std::string(url.substr(at));
}

// the url ("" when it is fine).
std::string parseRedisUrl(std::string_view url, RedisConfig* redis) {
  redis->host.clear();
  redis->unix_path.clear();
  redis->username.clear();
  redis->password.clear();
  redis->port = 0;
  redis->db = 0;
  if (url.starts_with("unix://")) {
    std::string_view path = url.substr(7);
    if (!path.starts_with("/")) return "the path after unix:// must be absolute (three slashes)";
    if (path.find_first_of("?#") != std::string_view::npos) {
      return "unix:// urls take no options after the path";
    }
    if (path.size() > static_cast<size_t>(kMaxSocketPathBytes)) {
      return "the socket path is longer than " + std::to_string(kMaxSocketPathBytes) + " bytes";
    }
    redis->unix_path = std::string(path);
    return "";
  }
  if (url.starts_with("rediss://")) return "TLS (rediss://) is not supported yet";
  if (!url.starts_with("redis://")) return "it must start with redis:// or unix://";
  std::string_view rest = url.substr(8);
  if (rest.find_first_of("?#") != std::string_view::npos) return "query options are not supported";

  size_t at = rest.rfind('@');
  if (at != std::string_view::npos) {
    std::string_view userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    size_t colon = userinfo.find(':');
    if (colon == std::string_view::npos) {
      return "a password goes after a colon: redis://:password@host or "
             "redis://user:password@host";
    }
    auto username = percentDecode(userinfo.substr(0, colon));
    auto password = percentDecode(userinfo.substr(colon + 1));
    if (!username || !password) return "a % in the user or password must start an escape like %40";
    if (password->empty()) return "the password after the colon is empty";
    redis->username = std::move(*username);
    redis->password = std::move(*password);
  }

  std::string_view path;
  if (size_t slash = rest.find('/'); slash != std::string_view::npos) {
    path = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
  }
  std::string_view port;
  if (rest.starts_with("[")) {
    size_t close = rest.find(']');
    if (close == std::string_view::npos) return "an IPv6 address needs its closing ]";
    redis->host = std::string(rest.substr(1, close - 1));
    rest = rest.substr(close + 1);
    if (!rest.empty() && !rest.starts_with(":")) return "a port after ] starts with a colon";
    if (!rest.empty()) port = rest.substr(1);
    if (redis->host.empty() || redis->host.find_first_not_of("0123456789abcdefABCDEF:.") !=
                                   std::string::npos) {
      return "the address in [ ] is not an IPv6 address";
    }
  } else {
    size_t colon = rest.find(':');
    redis->host = std::string(rest.substr(0, colon));
    if (colon != std::string_view::npos) port = rest.substr(colon + 1);
    if (redis->host.empty()) return "the host is missing";
    if (redis->host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                      "0123456789.-_") != std::string::npos) {
      return "the host " + quote(redis->host) + " is not a host name or address";
    }
  }
  if (port.empty() && rest.find(':') != std::string_view::npos) return "the port is missing";
  redis->port = 6379;
  if (!port.empty()) {
    if (!allDigits(port) || port.size() > 5 || std::stoi(std::string(port)) < 1 ||
        std::stoi(std::string(port)) > 65535) {
      return "the port " + quote(port) + " is not a number from 1 to 65535";
    }
    redis->port = static_cast<uint16_t>(std::stoi(std::string(port)));
  }
  if (!path.empty()) {
    if (!allDigits(path) || path.size() > 9) {
      return "the database " + quote(path) + " after the / is not a number";
    }
    redis->db = static_cast<uint32_t>(std::stoul(std::string(path)));
  }
  return "";
}


// [redis] names the Redis one way: `url` (standalone), `sentinel_master`
// with `sentinels` (Sentinel) or `cluster_nodes` (Cluster). Each mode's own
// options are refused in the others, so that nothing the operator wrote is
// silently ignored.
void checkRedisMode(const Given& given, RedisConfig* redis) {
  auto at = [&](std::string_view key) -> const toml::node* {
    auto it = given.find(key);
    return it != given.end() ? it->second : nullptr;
  };
  // Redis Cluster hashes a key name's first {...}: a brace in the prefix
  // would come before each key's own hash tag (redis_keys.h) and could put
  // a (rule, key)'s two keys in different slots, or every key in one.
  if (const toml::node* prefix = at("key_prefix");
      prefix && redis->key_prefix.find_first_of("{}") != std::string::npos) {
    refuse(*prefix, "[redis] key_prefix " + quote(redis->key_prefix) + " has a brace, which " +
                        "Redis Cluster reads as a hash tag; write a prefix without { and }, " +
                        "e.g. key_prefix = \"sluice:\"");
  }
  // Passwords kept out of this file, each in place of its option; the
  // sentinels' only in Sentinel mode (the checks below refuse it in others).
  const std::optional<std::string> password =
      secretFromFile(given, "password_file", "password", redis->password_file);
  const bool sentinel_mode = at("sentinel_master") && !at("cluster_nodes") && !at("url");
  const std::optional<std::string> sentinel_password =
      sentinel_mode ? secretFromFile(given, "sentinel_password_file", "sentinel_password",
                                     redis->sentinel_password_file)
                    : std::nullopt;
  if (password) redis->password = *password;
  if (sentinel_password) redis->sentinel_password = *sentinel_password;
  if (const toml::node* nodes = at("cluster_nodes")) {
    checkClusterMode(given, *nodes, redis);
    return;
  }
  constexpr std::string_view kSentinelExample =
      "sentinel_master = \"mymaster\" and sentinels = [\"10.0.0.1:26379\", \"10.0.0.2:26379\"]";
  const char* sentinel_keys[] = {"sentinel_master",   "sentinels", "sentinel_username",
                                 "sentinel_password", "sentinel_password_file",
                                 "username",          "password",  "db"};
  // With a password_file, a standalone Redis takes the ACL user as username
  // (a url holds a user only with its password).
  auto standalone_key = [&](std::string_view key) { return key == "username" && password; };
  if (const toml::node* url = at("url")) {
    for (std::string_view key : sentinel_keys) {
      if (standalone_key(key)) continue;
      if (const toml::node* node = at(key)) {
        bool credentials = !key.starts_with("sentinel");
        refuse(*node, "[redis] " + std::string(key) + " belongs to Sentinel mode, and this " +
                          "section also has url (line " + std::to_string(url->source().begin.line) +
                          "), which names one Redis; " +
                          (credentials ? "write the master's user, password and db in the url "
                                         "instead, e.g. url = \"redis://user:password@host:6379/0\""
                                       : "write either url (one Redis) or " +
                                             std::string(kSentinelExample) + ", not both"));
      }
    }
  }
  const toml::node* master = at("sentinel_master");
  const toml::node* sentinels = at("sentinels");
  if (master == nullptr) {
    for (std::string_view key : sentinel_keys) {
      if (standalone_key(key)) continue;
      if (const toml::node* node = at(key)) {
        refuse(*node, "[redis] " + std::string(key) + " applies in Sentinel mode only, which " +
                          "needs sentinel_master, the master's name as the sentinels know it; " +
                          "add e.g. " + std::string(kSentinelExample) + ", or remove " +
                          std::string(key) + " and write url = \"redis://host:6379\"");
      }
    }
    // Standalone. The url was checked when given, and the default is valid,
    // so this only fills in the address fields.
    const std::string username = redis->username;
    parseRedisUrl(redis->url, redis);
    if (password) {
      if (!redis->password.empty()) {
        refuse(*at("password_file"), "[redis] password_file and the url both give the "
                                     "password; keep password_file, which keeps the secret out "
                                     "of this file, and write the url without user:password@");
      }
      redis->password = *password;
      redis->username = username;
    }
    return;
  }
  if (redis->sentinel_master.empty()) {
    refuse(*master, "[redis] sentinel_master is empty; write the master's name as in the "
                    "sentinels' config (sentinel monitor <name> ...), e.g. sentinel_master = "
                    "\"mymaster\", or remove it and write url = \"redis://host:6379\"");
  }
  if (redis->sentinel_master.find(' ') != std::string::npos) {
    refuse(*master, "[redis] sentinel_master " + quote(redis->sentinel_master) + " has a space, " +
                        "which no Sentinel master name has; write the name as in the " +
                        "sentinels' config (sentinel monitor <name> ...), e.g. \"mymaster\"");
  }
  if (sentinels == nullptr) {
    refuse(*master, "[redis] sentinel_master needs sentinels, the addresses to ask where the "
                    "master is; add e.g. sentinels = [\"10.0.0.1:26379\", \"10.0.0.2:26379\", "
                    "\"10.0.0.3:26379\"]");
  }
  if (const toml::node* user = at("sentinel_username"); user && redis->sentinel_password.empty()) {
    refuse(*user, "[redis] sentinel_username needs sentinel_password: add sentinel_password = "
                  "\"...\", the ACL user's password on the sentinels");
  }
  if (const toml::node* user = at("username"); user && redis->password.empty()) {
    refuse(*user, "[redis] username needs password: add password = \"...\", the ACL user's "
                  "password on the master");
  }
  redis->url.clear();
  redis->host.clear();
  redis->port = 0;
  redis->unix_path.clear();
  redis->sentinel_addresses.clear();
  for (const std::string& text : redis->sentinels) {
    RedisAddress address;
    std::string problem;
    parseRedisAddress(text, &address, &problem);  // checked when given
    redis->sentinel_addresses.push_back(std::move(address));
  }
}

}  // namespace config_detail

using config_detail::allDigits;
using config_detail::quote;

std::string RedisAddress::text() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

bool parseRedisAddress(std::string_view text, RedisAddress* address, std::string* problem) {
  size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) {
    *problem = "no port";
    return false;
  }
  std::string_view host = text.substr(0, colon);
  std::string_view port = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    in6_addr scratch{};
    if (inet_pton(AF_INET6, std::string(host).c_str(), &scratch) != 1) {
      *problem = "the address in [ ] is not an IPv6 address";
      return false;
    }
  } else if (host.empty() || host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQ"
                                                    "RSTUVWXYZ0123456789.-_") != std::string::npos) {
    *problem = host.find(':') != std::string_view::npos
                   ? "an IPv6 address goes in brackets"
                   : "the host " + quote(host) + " is not a host name or address";
    return false;
  }
  if (!allDigits(port) || port.size() > 5 || std::stoi(std::string(port)) < 1 ||
      std::stoi(std::string(port)) > 65535) {
    *problem = "the port " + quote(port) + " is not a number from 1 to 65535";
    return false;
  }
  address->host = std::string(host);
  address->port = static_cast<uint16_t>(std::stoi(std::string(port)));
  return true;
}


}  // namespace sluice
