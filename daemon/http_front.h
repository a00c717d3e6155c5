// HttpFront: the HTTP check endpoint (`[http] listen`), an adapter over the
// decision seam for proxies (nginx auth_request, Traefik ForwardAuth, Envoy
// ext_authz) and any HTTP client.
//
// Its connections live on the worker loops beside the MessagePack-RPC and
// RESP ones: the server's main loop accepts them on the [http] listener and
// hands each to a worker (server.h), whose Connection reads it through an
// HttpCodec. A request is parsed (http_request.h), turned into a Question
// of one item (http_codec.h) and decided on that loop, with no thread
// between the socket and the decision; a keep-alive connection's pipelined
// requests are answered in one write. Answers go out in request order: a
// question that waits (a lease, a line) holds the requests after it until
// it is answered (connection.h). `Connection: close`, and an HTTP/1.0
// request without `Connection: keep-alive`, close the connection once the
// answer is written; so does a request the parser refuses, after its
// problem answer. The bounds are the main socket's: a request (head and
// body) of at most [limits] max_frame_bytes, at most max_items header
// lines, the idle and partial-frame timeouts, the output cap.
//
// A TCP listener is unauthenticated (no peer credentials); on a Unix-socket
// listener [access] decides each connection at accept, and every request
// of a peer it does not allow is answered 403.
//
// One HttpFront per worker, and its codecs, on that worker's thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "access.h"
#include "codec.h"
#include "dispatch.h"
#include "http_codec.h"
#include "http_request.h"
#include "question.h"

namespace sluice {

class HttpFront {
 public:
  struct Options {
    unsigned deny_status = 429;  // the status of a denial ([http] deny_status)
    size_t max_key_bytes = 4096;
    http::Limits limits;
  };
  // Seconds since the epoch, for the Date header.
  using WallClock = std::function<int64_t()>;

  // `wall_clock_s` empty: the system's.
  HttpFront(Dispatcher& dispatcher, const Options& options, WallClock wall_clock_s = {});

  // A new connection's codec; `peer` (who must outlive it) says whether
  // [access] allows it.
  std::unique_ptr<Codec> makeCodec(const Peer& peer);

  const Options& options() const { return options_; }
  Dispatcher& dispatcher() { return dispatcher_; }
  // The Date header's value now, formatted once a second.
  std::string_view date();

 private:
  Dispatcher& dispatcher_;
  const Options& options_;
  WallClock wall_clock_s_;
  int64_t date_s_ = -1;
  std::string date_;
};

// HTTP/1.1 as a connection's codec. Replies go in request order
// (inOrder), so the request being answered is the one last read: its
// rule's name and how its connection goes on are kept here until its
// answer is written.
class HttpCodec final : public Codec {
 public:
  HttpCodec(HttpFront& front, const Peer& peer) : front_(front), peer_(peer) {}

  Frame read(std::span<const uint8_t> bytes, int64_t now_ns, std::string* out) override;
  // Walks an unfinished request once: to the end of its head, then waits
  // for the bytes of its body (ready at once when the client waits for
  // "100 Continue", which read() sends, whichever read ended the head).
  bool frameReady(std::span<const uint8_t> bytes) override;
  void restartFrame() override {
    scanned_ = 0;
    needed_ = 0;
  }
  void writeAnswer(std::string* out, MsgId tag, const Answer& answer) override;
  bool inOrder() const override { return true; }

 private:
  // Whether the request whose head was parsed last waits for "100
  // Continue" before its body, and has not had it.
  bool expectsContinue() const;
  // Writes `reply` as the answer to the request just read.
  void reply(std::string* out, const http::Reply& response);

  HttpFront& front_;
  const Peer& peer_;
  http::Request request_;  // the request being read; its headers vector is reused
  std::string decoded_;    // its path and parameters, percent-decoded
  std::string rule_name_;  // the rule the question names, for its answer's headers
  Item item_;              // the question's; views decoded_ or the request's bytes
  bool keep_alive_ = true;
  bool head_ = false;      // a HEAD request: its answer has no body
  bool keep_alive_1_0_ = false;  // an HTTP/1.0 keep-alive: say so in the answer
  bool continued_ = false; // the unfinished request was sent "100 Continue"
  size_t scanned_ = 0;     // frameReady: how far the unfinished head was walked
  size_t needed_ = 0;      // frameReady: the unfinished request's size, once known
};

}  // namespace sluice
