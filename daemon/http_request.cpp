// The HTTP/1.1 request parser; see http_request.h.
#include "http_request.h"

#include <cstring>
#include <initializer_list>
#include <utility>

namespace sluice::http {

namespace {

// RFC 9110 section 5.6.2: token characters.
bool isTchar(unsigned char c) {
  if (c >= '0' && c <= '9') return true;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
  switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+':
    case '-': case '.': case '^': case '_': case '`': case '|': case '~': return true;
    default: return false;
  }
}

bool isToken(std::string_view text) {
  if (text.empty()) return false;
  for (unsigned char c : text) {
    if (!isTchar(c)) return false;
  }
  return true;
}

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Parse refuse(Refusal* refusal, unsigned status, std::string detail) {
  refusal->status = status;
  refusal->detail = std::move(detail);
  return Parse::kError;
}

// Whether the comma-separated list `value` has `token` (case-insensitive).
bool hasToken(std::string_view value, std::string_view token) {
  while (!value.empty()) {
    size_t comma = value.find(',');
    std::string_view item = value.substr(0, comma);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (equalsIgnoringCase(item, token)) return true;
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return false;
}

// Strips a line's CR; false when another CR is in it (a bare CR).
bool stripLine(std::string_view* line) {
  if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
  return line->find('\r') == std::string_view::npos;
}

// An absolute-form target's path and query ("http://host/p?q" is "/p?q",
// "http://host" is "/", "http://host?q" is "?q", whose path is "/"); the
// target itself when it is origin-form; "" when it is neither.
std::string_view originForm(std::string_view target) {
  if (!target.empty() && target.front() == '/') return target;
  for (std::string_view scheme : {std::string_view("http://"), std::string_view("https://")}) {
    if (target.size() >= scheme.size() &&
        equalsIgnoringCase(target.substr(0, scheme.size()), scheme)) {
      std::string_view rest = target.substr(scheme.size());
      size_t slash = rest.find_first_of("/?");
      return slash == std::string_view::npos ? std::string_view("/") : rest.substr(slash);
    }
  }
  return {};
}

}  // namespace

bool equalsIgnoringCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

std::optional<std::string_view> Request::header(std::string_view name) const {
  for (const Header& h : headers) {
    if (equalsIgnoringCase(h.name, name)) return h.value;
  }
  return std::nullopt;
}

size_t headEnd(std::string_view input, size_t* scanned) {
  // The blank line ends the head: "\n\n" or "\n\r\n". Empty lines before
  // the request line are not its end.
  size_t at = 0;
  while (at < input.size() && (input[at] == '\n' || input[at] == '\r')) ++at;
  size_t from = *scanned > at ? *scanned : at;
  while (from < input.size()) {
    const void* found = std::memchr(input.data() + from, '\n', input.size() - from);
    if (found == nullptr) break;
    size_t nl = static_cast<size_t>(static_cast<const char*>(found) - input.data());
    if (nl + 1 < input.size() && input[nl + 1] == '\n') return nl + 2;
    if (nl + 2 < input.size() && input[nl + 1] == '\r' && input[nl + 2] == '\n') return nl + 3;
    if (nl + 2 >= input.size()) {
      *scanned = nl;  // the blank line may come next
      return 0;
    }
    from = nl + 1;
  }
  *scanned = input.size();
  return 0;
}

Parse parseRequest(std::string_view input, const Limits& limits, Request* request,
                   Refusal* refusal) {
  request->headers.clear();
  request->body_bytes = 0;
  request->consumed = 0;
  size_t at = 0;
  // Empty lines before the request line.
  while (at < input.size() && (input[at] == '\n' || input[at] == '\r')) {
    if (input[at] == '\r') {
      if (at + 1 == input.size()) return Parse::kIncomplete;
      if (input[at + 1] != '\n') return refuse(refusal, 400, "a bare CR before the request line");
    }
    ++at;
  }
  // Empty lines before the request count toward its size: a stream of
  // them is bounded too.
  auto tooLong = [&](size_t end) { return end > limits.max_request_bytes; };

  // The request line.
  size_t nl = input.find('\n', at);
  if (nl == std::string_view::npos) {
    if (tooLong(input.size())) {
      return refuse(refusal, 414, "the request line is longer than " +
                                      std::to_string(limits.max_request_bytes) +
                                      " bytes ([limits] max_frame_bytes)");
    }
    return Parse::kIncomplete;
  }
  if (tooLong(nl + 1)) {
    return refuse(refusal, 414, "the request line is longer than " +
                                    std::to_string(limits.max_request_bytes) +
                                    " bytes ([limits] max_frame_bytes)");
  }
  std::string_view line = input.substr(at, nl - at);
  at = nl + 1;
  if (!stripLine(&line)) return refuse(refusal, 400, "a bare CR in the request line");
  size_t first = line.find(' ');
  size_t second = first == std::string_view::npos ? first : line.find(' ', first + 1);
  if (second == std::string_view::npos || line.find(' ', second + 1) != std::string_view::npos) {
    return refuse(refusal, 400, "the request line must be METHOD SP TARGET SP HTTP/1.1");
  }
  request->method = line.substr(0, first);
  request->target = line.substr(first + 1, second - first - 1);
  std::string_view version = line.substr(second + 1);
  if (!isToken(request->method)) return refuse(refusal, 400, "the method is not a token");
  if (request->target.empty()) return refuse(refusal, 400, "the request target is empty");
  for (unsigned char c : request->target) {
    if (c <= 0x20 || c >= 0x7f) {
      return refuse(refusal, 400, "the request target has a byte that is not visible ASCII");
    }
  }
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || version[5] < '0' ||
      version[5] > '9' || version[6] != '.' || version[7] < '0' || version[7] > '9') {
    return refuse(refusal, 400, "the request line must end in HTTP/1.1 or HTTP/1.0");
  }
  if (version[5] != '1' || (version[7] != '0' && version[7] != '1')) {
    return refuse(refusal, 505, "sluiced speaks HTTP/1.1 and HTTP/1.0 only");
  }
  request->minor_version = version[7] - '0';
  std::string_view origin = originForm(request->target);
  if (origin.empty()) {
    return refuse(refusal, 400, "the request target must be a path such as /v1/check?rule=R&key=K");
  }
  size_t question = origin.find('?');
  request->path = origin.substr(0, question);
  if (request->path.empty()) request->path = "/";  // http://host?query
  request->query = question == std::string_view::npos ? std::string_view() : origin.substr(question + 1);

  // The header lines, up to the blank line.
  std::optional<uint64_t> content_length;
  bool close = false;
  bool keep_alive = false;
  size_t hosts = 0;
  for (;;) {
    nl = input.find('\n', at);
    if (nl == std::string_view::npos) {
      if (tooLong(input.size())) {
        return refuse(refusal, 431, "the request's head is longer than " +
                                        std::to_string(limits.max_request_bytes) +
                                        " bytes ([limits] max_frame_bytes)");
      }
      return Parse::kIncomplete;
    }
    if (tooLong(nl + 1)) {
      return refuse(refusal, 431, "the request's head is longer than " +
                                      std::to_string(limits.max_request_bytes) +
                                      " bytes ([limits] max_frame_bytes)");
    }
    line = input.substr(at, nl - at);
    at = nl + 1;
    if (!stripLine(&line)) return refuse(refusal, 400, "a bare CR in a header line");
    if (line.empty()) break;
    if (line.front() == ' ' || line.front() == '\t') {
      return refuse(refusal, 400, "a folded header line (obs-fold); write each header on one line");
    }
    if (request->headers.size() == limits.max_headers) {
      return refuse(refusal, 431, "the request has more than " +
                                      std::to_string(limits.max_headers) + " header lines");
    }
    size_t colon = line.find(':');
    if (colon == std::string_view::npos || !isToken(line.substr(0, colon))) {
      return refuse(refusal, 400, "a header line must be NAME: VALUE, the name a token with no "
                                  "blank before the ':'");
    }
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    for (unsigned char c : value) {
      if ((c < 0x20 && c != '\t') || c == 0x7f) {
        return refuse(refusal, 400, "a header value has a control byte");
      }
    }
    Header header{line.substr(0, colon), value};
    request->headers.push_back(header);
    if (equalsIgnoringCase(header.name, "Content-Length")) {
      uint64_t length = 0;
      if (value.empty() || value.size() > 18) {
        return refuse(refusal, 400, "Content-Length must be a decimal number of bytes");
      }
      for (char c : value) {
        if (c < '0' || c > '9') {
          return refuse(refusal, 400, "Content-Length must be a decimal number of bytes");
        }
        length = length * 10 + static_cast<uint64_t>(c - '0');
      }
      if (content_length && *content_length != length) {
        return refuse(refusal, 400, "two Content-Length headers disagree");
      }
      content_length = length;
    } else if (equalsIgnoringCase(header.name, "Transfer-Encoding")) {
      return refuse(refusal, 411, "a Transfer-Encoding body (chunked) is not read; send the "
                                  "parameters in the query or Sluice-* headers, or a "
                                  "Content-Length body");
    } else if (equalsIgnoringCase(header.name, "Host")) {
      ++hosts;
    } else if (equalsIgnoringCase(header.name, "Connection")) {
      close = close || hasToken(value, "close");
      keep_alive = keep_alive || hasToken(value, "keep-alive");
    }
  }
  if (request->minor_version == 1 && hosts != 1) {
    return refuse(refusal, 400, "an HTTP/1.1 request carries one Host header");
  }
  const uint64_t body = content_length.value_or(0);
  if (body > limits.max_request_bytes - at) {
    return refuse(refusal, 413, "the body is " + std::to_string(body) +
                                    " bytes; a request is at most " +
                                    std::to_string(limits.max_request_bytes) +
                                    " bytes ([limits] max_frame_bytes), and the parameters go "
                                    "in the query or Sluice-* headers");
  }
  request->body_bytes = static_cast<size_t>(body);
  request->keep_alive = request->minor_version == 1 ? !close : keep_alive && !close;
  request->consumed = at + request->body_bytes;
  if (input.size() < request->consumed) return Parse::kIncomplete;
  return Parse::kRequest;
}

std::optional<std::string_view> queryValue(std::string_view query, std::string_view name) {
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    size_t equals = pair.find('=');
    std::string_view raw_name = pair.substr(0, equals);
    // The name decoded as it is compared: no name we look for needs more
    // than a few bytes, so a longer one cannot match.
    if (raw_name.size() <= 3 * name.size()) {
      char decoded[64];
      if (raw_name.size() <= sizeof(decoded)) {
        size_t size = percentDecode(raw_name, true, decoded);
        if (equals != std::string_view::npos && equalsIgnoringCase({decoded, size}, name)) {
          return pair.substr(equals + 1);
        }
      }
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return std::nullopt;
}

size_t percentDecode(std::string_view raw, bool plus_is_space, char* out) {
  size_t size = 0;
  for (size_t i = 0; i < raw.size(); ++i) {
    char c = raw[i];
    if (c == '%' && i + 2 < raw.size() && hexValue(raw[i + 1]) >= 0 &&
        hexValue(raw[i + 2]) >= 0) {
      out[size++] = static_cast<char>(hexValue(raw[i + 1]) * 16 + hexValue(raw[i + 2]));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out[size++] = ' ';
    } else {
      out[size++] = c;
    }
  }
  return size;
}

}  // namespace sluice::http
