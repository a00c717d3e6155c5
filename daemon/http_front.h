// HttpFront: the HTTP check endpoint (`[http] listen`), an adapter over the
// decision seam for proxies (nginx auth_request, Traefik ForwardAuth, Envoy
// ext_authz) and any HTTP client.
//
// libmicrohttpd (the library /metrics uses) serves it on a thread of its
// own. Each request is parsed by the codec (http_codec.h) into a Question
// of one item, handed to a worker through `submit` (Worker::submit), and
// its connection is suspended until the worker calls the request's
// Recipient with the Answer; the Recipient encodes the reply there and
// resumes the connection, and the HTTP thread sends it. No decision is made
// here: the worker's dispatcher decides, as for every front.
//
// A TCP listener has no peer credentials: it is unauthenticated, and binds
// where the operator writes (loopback in the shipped config). On a
// Unix-socket listener, `admit` ([access], access.h) decides each request's
// peer, and a peer it does not allow is answered 403.
//
// Thread-safety: start() and stop() on one thread (the server's main
// thread); setRules() from any thread. stop() must come after the workers
// have stopped, so that no question is still waiting for its answer (a
// stopped worker answers at once).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "question.h"
#include "rules.h"

struct MHD_Daemon;

namespace sluice {

class HttpFront {
 public:
  struct Options {
    std::string listen;         // "HOST:PORT" or "unix:/path" (parseFrontAddress)
    unsigned deny_status = 429;  // the status of a denial
    size_t max_key_bytes = 4096;
    unsigned max_connections = 4096;  // open at once; more are refused
    unsigned idle_timeout_s = 300;    // a silent connection is closed; 0: never
  };
  // Hands a question to a worker (Worker::submit); any thread.
  using Submit = std::function<void(HeldQuestion, Recipient*, MsgId)>;
  // Whether the peer on a Unix-socket connection `fd` may ask ([access]).
  using Admit = std::function<bool(int fd)>;

  HttpFront() = default;
  ~HttpFront();
  HttpFront(const HttpFront&) = delete;
  HttpFront& operator=(const HttpFront&) = delete;

  // Listens and serves; false with `error` (naming the address and what to
  // do) when it cannot.
  bool start(const Options& options, RuleSetPtr rules, Submit submit, Admit admit,
             std::string* error);
  // Later requests' headers describe `rules` (after a reload).
  void setRules(RuleSetPtr rules);
  RuleSetPtr rules() const;
  void stop();

  // Used by the request handler (http_front.cpp), on the HTTP thread.
  struct Call;
  const Options& options() const { return options_; }
  void submit(HeldQuestion question, Recipient* recipient) {
    submit_(std::move(question), recipient, MsgId(++asked_));
  }
  bool admits(int fd) const { return !admit_ || admit_(fd); }
  bool unixListener() const { return !unix_path_.empty(); }

 private:
  Options options_;
  Submit submit_;
  Admit admit_;
  mutable std::mutex mutex_;  // guards rules_
  RuleSetPtr rules_;
  MHD_Daemon* daemon_ = nullptr;
  std::string unix_path_;  // the socket file to remove on stop; "" for TCP
  uint64_t asked_ = 0;     // HTTP thread only: the questions' tags
};

}  // namespace sluice
