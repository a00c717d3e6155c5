// HttpFront; see http_front.h.
#include "http_front.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>

#include "config.h"
#include "http_codec.h"

namespace sluice {

// One request: created on its first call, deleted when MHD completes it.
// The Recipient of its question: receive() runs on a worker thread while
// the connection is suspended, encodes the reply, and resumes it.
struct HttpFront::Call final : Recipient {
  HttpFront* front = nullptr;
  MHD_Connection* connection = nullptr;
  bool submitted = false;                 // HTTP thread only
  std::atomic<bool> answered{false};      // set by receive(), before the resume
  RuleSetPtr rules;                       // the rules the reply's headers describe
  std::string rule_name;
  http::Reply reply;                      // written by receive()

  void receive(MsgId /*tag*/, const Answer& answer) override {
    const Rule* rule = answer.failed ? nullptr : rules->find(rule_name);
    reply = http::encodeAnswer(answer, rule, rule_name, front->options().deny_status);
    answered.store(true, std::memory_order_release);
    // Last: once resumed, the HTTP thread may send the reply and delete this.
    MHD_resume_connection(connection);
  }
};

namespace {

MHD_Result send(MHD_Connection* connection, const http::Reply& reply) {
  MHD_Response* response = MHD_create_response_from_buffer(
      reply.body.size(), const_cast<char*>(reply.body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  if (!reply.content_type.empty()) {
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, reply.content_type.c_str());
  }
  for (const auto& [name, value] : reply.headers) {
    MHD_add_response_header(response, name.c_str(), value.c_str());
  }
  MHD_Result result = MHD_queue_response(connection, reply.status, response);
  MHD_destroy_response(response);
  return result;
}

std::optional<std::string_view> lookup(MHD_Connection* connection, MHD_ValueKind kind,
                                       const char* name) {
  const char* value = nullptr;
  size_t size = 0;
  if (MHD_lookup_connection_value_n(connection, kind, name, std::strlen(name), &value, &size) !=
          MHD_YES ||
      value == nullptr) {
    return std::nullopt;
  }
  return std::string_view(value, size);
}

MHD_Result handle(void* cls, MHD_Connection* connection, const char* url, const char* method,
                  const char* /*version*/, const char* /*upload_data*/, size_t* upload_data_size,
                  void** state) {
  auto* front = static_cast<HttpFront*>(cls);
  auto* call = static_cast<HttpFront::Call*>(*state);
  if (call == nullptr) {
    call = new HttpFront::Call();
    call->front = front;
    call->connection = connection;
    *state = call;
    return MHD_YES;
  }
  if (*upload_data_size != 0) {
    *upload_data_size = 0;  // a body is not read: the parameters are in the query and headers
    return MHD_YES;
  }
  if (call->answered.load(std::memory_order_acquire)) return send(connection, call->reply);
  if (call->submitted) return MHD_YES;

  if (front->unixListener()) {
    const MHD_ConnectionInfo* info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info == nullptr || !front->admits(info->connect_fd)) {
      return send(connection, http::problem(403, "this user may not use sluiced ([access])"));
    }
  }
  http::Parameters parameters;
  parameters.query_rule = lookup(connection, MHD_GET_ARGUMENT_KIND, "rule");
  parameters.query_key = lookup(connection, MHD_GET_ARGUMENT_KIND, "key");
  parameters.query_cost = lookup(connection, MHD_GET_ARGUMENT_KIND, "cost");
  parameters.query_key_header = lookup(connection, MHD_GET_ARGUMENT_KIND, "key_header");
  std::string key_header;
  if (parameters.query_key_header) {
    key_header.assign(*parameters.query_key_header);  // lookup wants it NUL-terminated
    parameters.named_header = lookup(connection, MHD_HEADER_KIND, key_header.c_str());
  }
  parameters.header_rule = lookup(connection, MHD_HEADER_KIND, "Sluice-Rule");
  parameters.header_key = lookup(connection, MHD_HEADER_KIND, "Sluice-Key");
  parameters.header_cost = lookup(connection, MHD_HEADER_KIND, "Sluice-Cost");
  parameters.query_estimate = lookup(connection, MHD_GET_ARGUMENT_KIND, "estimate");
  parameters.query_ttl_ms = lookup(connection, MHD_GET_ARGUMENT_KIND, "ttl_ms");
  parameters.query_id = lookup(connection, MHD_GET_ARGUMENT_KIND, "id");
  parameters.query_actual = lookup(connection, MHD_GET_ARGUMENT_KIND, "actual");
  http::Parsed parsed =
      http::parseCheck(url, method, parameters, front->options().max_key_bytes);
  if (!parsed.ok) return send(connection, parsed.refusal);

  call->rules = front->rules();
  call->rule_name.assign(parsed.item.rule);
  call->submitted = true;
  // Suspended before it is submitted: the answer may come at once.
  MHD_suspend_connection(connection);
  front->submit(HeldQuestion(Question{parsed.method, {&parsed.item, 1}}), call);
  return MHD_YES;
}

void completed(void* /*cls*/, MHD_Connection* /*connection*/, void** state,
               MHD_RequestTerminationCode /*code*/) {
  delete static_cast<HttpFront::Call*>(*state);
  *state = nullptr;
}

// A listening Unix socket at `path`, mode `mode`; -1 with `error`.
int listenUnix(const std::string& path, std::string* error) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = std::string("socket: ") + std::strerror(errno);
    return -1;
  }
  struct stat info{};
  if (lstat(path.c_str(), &info) == 0 && S_ISSOCK(info.st_mode)) unlink(path.c_str());
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      chmod(path.c_str(), 0660) != 0 || listen(fd, SOMAXCONN) != 0) {
    *error = std::strerror(errno);
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

HttpFront::~HttpFront() { stop(); }

void HttpFront::setRules(RuleSetPtr rules) {
  std::lock_guard<std::mutex> lock(mutex_);
  rules_ = std::move(rules);
}

RuleSetPtr HttpFront::rules() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return rules_;
}

bool HttpFront::start(const Options& options, RuleSetPtr rules, Submit submit, Admit admit,
                      std::string* error) {
  options_ = options;
  submit_ = std::move(submit);
  setRules(std::move(rules));
  std::string host;
  uint16_t port = 0;
  std::string unix_path;
  std::string problem;
  if (!parseFrontAddress(options.listen, &host, &port, &unix_path, &problem)) {
    *error = "[http] listen " + options.listen + ": " + problem;
    return false;
  }
  unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME;
  sockaddr_storage storage{};
  int listen_fd = -1;
  if (!unix_path.empty()) {
    admit_ = std::move(admit);
    listen_fd = listenUnix(unix_path, &problem);
    if (listen_fd < 0) {
      *error = "cannot serve HTTP checks on " + options.listen + ": " + problem +
               "; check that the directory exists and the daemon may write there";
      return false;
    }
    unix_path_ = unix_path;
  } else if (host.find(':') != std::string::npos) {
    auto* address = reinterpret_cast<sockaddr_in6*>(&storage);
    address->sin6_family = AF_INET6;
    address->sin6_port = htons(port);
    inet_pton(AF_INET6, host.c_str(), &address->sin6_addr);
    flags |= MHD_USE_IPv6;
  } else {
    auto* address = reinterpret_cast<sockaddr_in*>(&storage);
    address->sin_family = AF_INET;
    address->sin_port = htons(port);
    inet_pton(AF_INET, host.c_str(), &address->sin_addr);
  }
  if (listen_fd >= 0) {
    daemon_ = MHD_start_daemon(
        flags, 0, nullptr, nullptr, handle, this, MHD_OPTION_LISTEN_SOCKET, listen_fd,
        MHD_OPTION_NOTIFY_COMPLETED, completed, nullptr, MHD_OPTION_CONNECTION_LIMIT,
        options.max_connections, MHD_OPTION_CONNECTION_TIMEOUT, options.idle_timeout_s,
        MHD_OPTION_END);
    if (daemon_ == nullptr) close(listen_fd);
  } else {
    daemon_ = MHD_start_daemon(
        flags, port, nullptr, nullptr, handle, this, MHD_OPTION_SOCK_ADDR,
        reinterpret_cast<sockaddr*>(&storage), MHD_OPTION_NOTIFY_COMPLETED, completed, nullptr,
        MHD_OPTION_CONNECTION_LIMIT, options.max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
        options.idle_timeout_s, MHD_OPTION_END);
  }
  if (daemon_ == nullptr) {
    *error = "cannot serve HTTP checks on " + options.listen +
             " (in use, or not an address of this host); choose another [http] listen";
    return false;
  }
  return true;
}

void HttpFront::stop() {
  if (daemon_ != nullptr) {
    MHD_stop_daemon(daemon_);
    daemon_ = nullptr;
  }
  if (!unix_path_.empty()) {
    unlink(unix_path_.c_str());
    unix_path_.clear();
  }
}

}  // namespace sluice
