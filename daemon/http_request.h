// http_request: a strict HTTP/1.1 request parser (RFC 9112), a pure
// function of the bytes with no sockets; HttpCodec (http_front.h) reads
// the [http] listener's connections with it.
//
// In: the bytes a connection has read, which may hold less than one
// request or several (pipelining). Out: the first request's method,
// target, version and headers as views into the bytes, how many bytes it
// took (its Content-Length body included, read and ignored), and whether
// the connection stays open after its answer; or a refusal, a status and a
// detail for the problem body, after which the connection closes (nothing
// after a malformed request can be framed).
//
// What it refuses:
//   400  a request line that is not METHOD SP TARGET SP HTTP/1.x (the
//        target a path, or an absolute http(s) URL, whose path counts), an
//        HTTP/1.1 request without exactly one Host header, a
//        bare CR, a header line without a token and ':' (a blank before
//        the ':' included), a folded header line (obs-fold), a control
//        byte in a value, a Content-Length that is not digits or that is
//        given twice with different values
//   411  a Transfer-Encoding (chunked or any other): only Content-Length
//        bodies are read
//   413  a body that would take the request past max_request_bytes
//   414  a request line that ends past max_request_bytes
//   431  a head (request line and headers) that ends past
//        max_request_bytes, or more than max_headers header lines
//   505  an HTTP version other than 1.0 and 1.1
// Empty lines before a request line are skipped (RFC 9112 section 2.2),
// and count toward its bound; a line may end in LF alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::http {

struct Limits {
  size_t max_request_bytes = 64 * 1024;  // head and body together
  size_t max_headers = 100;              // header lines of one request
};

struct Header {
  std::string_view name;   // as sent (a token)
  std::string_view value;  // blanks around it trimmed
};

struct Request {
  std::string_view method;  // a token, as sent (methods are case-sensitive)
  std::string_view target;  // as sent
  std::string_view path;    // the target's path, not decoded
  std::string_view query;   // after the '?', not decoded; "" without one
  int minor_version = 1;    // HTTP/1.0 or HTTP/1.1
  std::vector<Header> headers;
  size_t body_bytes = 0;    // Content-Length
  // HTTP/1.1 unless Connection: close; HTTP/1.0 with Connection: keep-alive.
  bool keep_alive = true;
  size_t consumed = 0;      // bytes the request took: empty lines, head, body

  // The value of the first header named `name` (case-insensitive).
  std::optional<std::string_view> header(std::string_view name) const;
};

struct Refusal {
  unsigned status = 400;
  std::string detail;  // for the problem body
};

enum class Parse {
  kRequest,     // one request in `request`
  kIncomplete,  // more bytes are needed (none consumed); once the head is
                // whole, request->consumed is the size the request needs
  kError,       // malformed or over a limit: answer `refusal`, then close
};

// Parses the first request of `input`. Views in `request` point into it.
Parse parseRequest(std::string_view input, const Limits& limits, Request* request,
                   Refusal* refusal);

// Where the head of the request starting `input` ends (the byte after its
// blank line), or 0 when it has not ended yet. Resumes where it stopped,
// at `*scanned`, which it sets when the head has not ended (start at 0 for a
// new request), so a head that trickles in is walked once.
size_t headEnd(std::string_view input, size_t* scanned);

// The value of the first parameter named `name` in `query`
// (application/x-www-form-urlencoded: name=value pairs split by '&'), as
// sent, not decoded; the name is compared decoded and case-insensitively,
// as libmicrohttpd compared it. A name with no '=' has no value (nullopt).
std::optional<std::string_view> queryValue(std::string_view query, std::string_view name);

// `raw` percent-decoded (%XX a byte; a '%' not followed by two hex digits
// stays as it is) and, when `plus_is_space`, '+' a blank (the query's
// form encoding; not in a path). Writes at most raw.size() bytes to `out`
// and returns how many.
size_t percentDecode(std::string_view raw, bool plus_is_space, char* out);

// Equal ignoring ASCII case.
bool equalsIgnoringCase(std::string_view a, std::string_view b);

}  // namespace sluice::http
