// Tests of libsluice (client/): its MessagePack codec against msgpack-c, and
// its calls against a fake daemon: a thread serving a Unix socket that
// decodes requests with msgpack-c and answers with canned responses.
#define MSGPACK_NO_BOOST
#include <msgpack.hpp>

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "codec.h"
#include "sluice.h"
#include "test_support.h"

namespace {

using sluice::test::TempDir;

constexpr int kTimeoutMs = 5000;
constexpr int kSluicectlTimeoutMs = 20000;

// ---- the fake daemon -----------------------------------------------------------

std::string bytesOf(const msgpack::object& o) {
  if (o.type == msgpack::type::STR) {
    return std::string(o.via.str.ptr, o.via.str.size);
  }
  if (o.type == msgpack::type::BIN) {
    return std::string(o.via.bin.ptr, o.via.bin.size);
  }
  return "<not bytes>";
}

// What the fake daemon saw of one request.
struct Request {
  uint32_t msgid = 0;
  std::string method;
  uint32_t param_count = 0;
  // The first (rule, key, cost) of acquire/peek/release, or of acquire_all's list.
  std::string rule;
  std::string key;
  bool key_is_bin = false;
  std::optional<uint64_t> cost;
  uint32_t item_count = 0;
  // reserve's fourth field; settle's and cancel's [id, actual].
  std::optional<uint64_t> ttl_ms;
  std::optional<uint64_t> id;
  std::optional<uint64_t> actual;
};

Request describe(const msgpack::object& o) {
  Request r;
  const auto& a = o.via.array;
  EXPECT_EQ(o.type, msgpack::type::ARRAY);
  EXPECT_EQ(a.size, 4u);
  EXPECT_EQ(a.ptr[0].as<int>(), 0);
  r.msgid = a.ptr[1].as<uint32_t>();
  r.method = bytesOf(a.ptr[2]);
  EXPECT_EQ(a.ptr[3].type, msgpack::type::ARRAY);
  const auto& params = a.ptr[3].via.array;
  r.param_count = params.size;
  const msgpack::object* item = nullptr;
  if (r.method == "settle" || r.method == "cancel") {
    if (params.size >= 1) r.id = params.ptr[0].as<uint64_t>();
    if (params.size >= 2) r.actual = params.ptr[1].as<uint64_t>();
    return r;
  }
  if (r.method == "reserve" && params.size == 4) r.ttl_ms = params.ptr[3].as<uint64_t>();
  if (r.method == "acquire_all" && params.size == 1) {
    r.item_count = params.ptr[0].via.array.size;
    item = r.item_count > 0 ? &params.ptr[0].via.array.ptr[0] : nullptr;
  } else if (params.size >= 2) {
    item = &a.ptr[3];
    r.item_count = 1;
  }
  if (item != nullptr) {
    const auto& fields = item->via.array;
    r.rule = bytesOf(fields.ptr[0]);
    r.key = bytesOf(fields.ptr[1]);
    r.key_is_bin = fields.ptr[1].type == msgpack::type::BIN;
    if (fields.size >= 3) {
      r.cost = fields.ptr[2].as<uint64_t>();
    }
  }
  return r;
}

// One accepted connection, as the server script sees it.
class Conn {
 public:
  // `seen` gets every request read (FakeServer records them).
  Conn(int fd, std::function<void(const Request&)> seen) : fd_(fd), seen_(std::move(seen)) {}
  // The next request, or nullopt when the client closed the connection.
  std::optional<Request> read() {
    for (;;) {
      msgpack::object_handle handle;
      if (unpacker_.next(handle)) {
        Request request = describe(handle.get());
        seen_(request);
        return request;
      }
      unpacker_.reserve_buffer(4096);
      ssize_t n = ::read(fd_, unpacker_.buffer(), unpacker_.buffer_capacity());
      if (n <= 0) {
        return std::nullopt;
      }
      unpacker_.buffer_consumed(static_cast<size_t>(n));
    }
  }
  void send(const std::string& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) {
        return;
      }
      done += static_cast<size_t>(n);
    }
  }

 private:
  int fd_;
  std::function<void(const Request&)> seen_;
  msgpack::unpacker unpacker_;
};

// A MessagePack-RPC server on `path`: each accepted connection runs
// `script(conn, index)` (index counts connections from 0), then is closed.
// Every request a script reads is recorded, in order (requests()).
// The destructor stops it, closing any open connection.
class FakeServer {
 public:
  using Script = std::function<void(Conn&, int)>;

  FakeServer(std::string path, Script script) : path_(std::move(path)), script_(std::move(script)) {
    ::unlink(path_.c_str());
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path_.c_str());
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listen_fd_, 16) != 0) {
      ADD_FAILURE() << "cannot listen on " << path_;
    }
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeServer() { stop(); }

  // Stops accepting, closes the open connection and joins the thread.
  void stop() {
    if (!thread_.joinable()) {
      return;
    }
    stopping_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (conn_fd_ >= 0) {
        ::shutdown(conn_fd_, SHUT_RDWR);
      }
    }
    thread_.join();
    ::close(listen_fd_);
  }

  std::vector<Request> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  void serve() {
    for (int index = 0; !stopping_; index++) {
      int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) {
        return;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        conn_fd_ = fd;
      }
      if (!stopping_) {
        Conn conn(fd, [this](const Request& r) {
          std::lock_guard<std::mutex> lock(mu_);
          requests_.push_back(r);
        });
        script_(conn, index);
      }
      std::lock_guard<std::mutex> lock(mu_);
      ::close(fd);
      conn_fd_ = -1;
    }
  }

  std::string path_;
  Script script_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  std::mutex mu_;
  int conn_fd_ = -1;  // guarded by mu_
  std::vector<Request> requests_;  // guarded by mu_
};

// ---- canned responses ------------------------------------------------------------

struct Decision {
  bool allowed = true;
  int64_t remaining = 4;
  int64_t limit = 5;
  int64_t reset_after_ms = 800;
  int64_t retry_after_ms = 0;
  std::string mode = "local";
};

void packDecision(msgpack::packer<msgpack::sbuffer>& pk, const Decision& d) {
  pk.pack_map(7);
  pk.pack(std::string("allowed"));
  pk.pack(d.allowed);
  pk.pack(std::string("remaining"));
  pk.pack(d.remaining);
  pk.pack(std::string("limit"));
  pk.pack(d.limit);
  pk.pack(std::string("reason"));  // an extra key the client must skip
  pk.pack_map(1);
  pk.pack(std::string("nested"));
  pk.pack(std::vector<int>{1, 2, 3});
  pk.pack(std::string("reset_after_ms"));
  pk.pack(d.reset_after_ms);
  pk.pack(std::string("retry_after_ms"));
  pk.pack(d.retry_after_ms);
  pk.pack(std::string("mode"));
  pk.pack(d.mode);
}

std::string decisionReply(uint32_t msgid, const Decision& d = Decision()) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(4);
  pk.pack(1);
  pk.pack(msgid);
  pk.pack_nil();
  packDecision(pk, d);
  return std::string(buf.data(), buf.size());
}

std::string errorReply(uint32_t msgid, const std::string& code, const std::string& message) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(4);
  pk.pack(1);
  pk.pack(msgid);
  pk.pack_map(2);
  pk.pack(std::string("code"));
  pk.pack(code);
  pk.pack(std::string("message"));
  pk.pack(message);
  pk.pack_nil();
  return std::string(buf.data(), buf.size());
}

// Answers every request with the same decision.
FakeServer::Script answerAll(Decision d = Decision()) {
  return [d](Conn& conn, int) {
    while (auto req = conn.read()) {
      conn.send(decisionReply(req->msgid, d));
    }
  };
}

class ClientTest : public ::testing::Test {
 protected:
  void TearDown() override { sluice_destroy(client_); }

  sluice_client* connect() {
    EXPECT_EQ(sluice_connect(path_.c_str(), kTimeoutMs, &client_), 0);
    return client_;
  }

  TempDir dir_;
  std::string path_ = dir_.file("sluice.sock");
  sluice_client* client_ = nullptr;
};

// ---- codec -----------------------------------------------------------------------

std::string encodeWithSluice(const std::function<uint8_t*(uint8_t*)>& write, size_t max_bytes) {
  std::vector<uint8_t> buf(max_bytes);
  uint8_t* end = write(buf.data());
  return std::string(reinterpret_cast<char*>(buf.data()), static_cast<size_t>(end - buf.data()));
}

const std::vector<uint64_t> kUints = {0,     1,      127,        128,        255,
                                      256,   65535,  65536,      0xffffffffull, 0x100000000ull,
                                      std::numeric_limits<uint64_t>::max()};
const std::vector<int64_t> kNegatives = {-1,     -32,    -33,   -128,       -129,
                                         -32768, -32769, INT32_MIN, int64_t{INT32_MIN} - 1,
                                         std::numeric_limits<int64_t>::min()};
const std::vector<size_t> kLengths = {0, 1, 31, 32, 255, 256, 65535, 65536};

// Verifies that what libsluice encodes is byte-for-byte what msgpack-c packs,
// and that msgpack-c decodes it back to the same values.
TEST(CodecTest, EncodingMatchesMsgpackCAndDecodesWithIt) {
  for (uint64_t u : kUints) {
    std::string ours = encodeWithSluice([&](uint8_t* p) { return mp_put_uint(p, u); }, 16);
    msgpack::sbuffer theirs;
    msgpack::pack(theirs, u);
    EXPECT_EQ(ours, std::string(theirs.data(), theirs.size())) << u;
    EXPECT_EQ(msgpack::unpack(ours.data(), ours.size())->as<uint64_t>(), u);
  }
  for (int64_t i : kNegatives) {
    std::string ours = encodeWithSluice([&](uint8_t* p) { return mp_put_int(p, i); }, 16);
    msgpack::sbuffer theirs;
    msgpack::pack(theirs, i);
    EXPECT_EQ(ours, std::string(theirs.data(), theirs.size())) << i;
    EXPECT_EQ(msgpack::unpack(ours.data(), ours.size())->as<int64_t>(), i);
  }
  for (size_t len : kLengths) {
    std::string text(len, 'x');
    text[len / 2] = '\0';
    std::string str = encodeWithSluice(
        [&](uint8_t* p) { return mp_put_str(p, text.data(), static_cast<uint32_t>(len)); }, len + 9);
    std::string bin = encodeWithSluice(
        [&](uint8_t* p) { return mp_put_bin(p, text.data(), static_cast<uint32_t>(len)); }, len + 9);
    msgpack::sbuffer theirs_str, theirs_bin;
    msgpack::pack(theirs_str, text);
    msgpack::packer<msgpack::sbuffer>(theirs_bin).pack_bin(static_cast<uint32_t>(len)).pack_bin_body(
        text.data(), static_cast<uint32_t>(len));
    EXPECT_EQ(str, std::string(theirs_str.data(), theirs_str.size())) << len;
    EXPECT_EQ(bin, std::string(theirs_bin.data(), theirs_bin.size())) << len;
    auto decoded = msgpack::unpack(bin.data(), bin.size());
    EXPECT_EQ(decoded->type, msgpack::type::BIN);
    EXPECT_EQ(bytesOf(decoded.get()), text);
  }
  for (uint32_t count : {0u, 15u, 16u, 65535u, 65536u}) {
    std::string arr = encodeWithSluice(
        [&](uint8_t* p) {
          p = mp_put_array(p, count);
          for (uint32_t i = 0; i < count; i++) {
            p = mp_put_nil(p);
          }
          return p;
        },
        count + 9);
    auto decoded = msgpack::unpack(arr.data(), arr.size());
    ASSERT_EQ(decoded->type, msgpack::type::ARRAY);
    EXPECT_EQ(decoded->via.array.size, count);
  }
  std::string map = encodeWithSluice(
      [](uint8_t* p) {
        p = mp_put_map(p, 2);
        p = mp_put_str(p, "yes", 3);
        p = mp_put_bool(p, 1);
        p = mp_put_str(p, "no", 2);
        return mp_put_bool(p, 0);
      },
      64);
  auto decoded = msgpack::unpack(map.data(), map.size())->as<std::map<std::string, bool>>();
  EXPECT_EQ(decoded, (std::map<std::string, bool>{{"yes", true}, {"no", false}}));
}

mp_value readOne(const msgpack::sbuffer& buf) {
  mp_reader r;
  mp_value v{};
  mp_reader_init(&r, buf.data(), buf.size());
  EXPECT_EQ(mp_read(&r, &v), 0);
  EXPECT_EQ(r.p, r.end);
  return v;
}

// Verifies that libsluice decodes every type msgpack-c packs, in every width.
TEST(CodecTest, DecodesWhatMsgpackCEncodes) {
  for (uint64_t u : kUints) {
    msgpack::sbuffer buf;
    msgpack::pack(buf, u);
    mp_value v = readOne(buf);
    EXPECT_EQ(v.type, MP_UINT);
    EXPECT_EQ(v.v.u, u);
  }
  for (int64_t i : kNegatives) {
    msgpack::sbuffer buf;
    msgpack::pack(buf, i);
    mp_value v = readOne(buf);
    EXPECT_EQ(v.type, MP_INT);
    EXPECT_EQ(v.v.i, i);
  }
  for (size_t len : kLengths) {
    std::string text(len, 'y');
    msgpack::sbuffer buf;
    msgpack::pack(buf, text);
    mp_value v = readOne(buf);
    EXPECT_EQ(v.type, MP_STR);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(v.v.bytes.ptr), v.v.bytes.len), text);
  }
  {
    msgpack::sbuffer buf;
    msgpack::pack(buf, 1.5f);
    mp_value v = readOne(buf);
    EXPECT_EQ(v.type, MP_FLOAT);
    EXPECT_EQ(v.v.f, 1.5);
  }
  {
    msgpack::sbuffer buf;
    msgpack::pack(buf, -2.25);
    mp_value v = readOne(buf);
    EXPECT_EQ(v.type, MP_FLOAT);
    EXPECT_EQ(v.v.f, -2.25);
  }
  {
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer>(buf).pack_ext(3, 7).pack_ext_body("abc", 3);
    mp_value v = readOne(buf);
    EXPECT_EQ(v.type, MP_EXT);
    EXPECT_EQ(v.ext_type, 7);
    EXPECT_EQ(v.v.bytes.len, 3u);
  }
  {
    msgpack::sbuffer buf;
    std::map<std::string, std::vector<int>> value{{"a", {1, -2}}, {"b", {}}};
    msgpack::pack(buf, value);
    mp_reader r;
    mp_reader_init(&r, buf.data(), buf.size());
    EXPECT_EQ(mp_skip(&r), 0);
    EXPECT_EQ(r.p, r.end);
    size_t size = 0;
    EXPECT_EQ(mp_frame_size(reinterpret_cast<const uint8_t*>(buf.data()), buf.size(), 1 << 20, &size), 1);
    EXPECT_EQ(size, buf.size());
  }
}

// Verifies that a value cut anywhere is reported incomplete, never misread.
TEST(CodecTest, FrameSizeReportsEveryPrefixAsIncomplete) {
  std::string reply = decisionReply(77);
  const auto* bytes = reinterpret_cast<const uint8_t*>(reply.data());
  for (size_t len = 0; len < reply.size(); len++) {
    size_t size = 0;
    EXPECT_EQ(mp_frame_size(bytes, len, 1 << 20, &size), 0) << len;
  }
  size_t size = 0;
  EXPECT_EQ(mp_frame_size(bytes, reply.size(), 1 << 20, &size), 1);
  EXPECT_EQ(size, reply.size());
  EXPECT_EQ(mp_frame_size(bytes, reply.size(), reply.size() - 1, &size), -2);
}

// Verifies that lengths and counts from the wire are checked against the cap
// before any byte of the value arrives, and that 0xc1 is refused.
TEST(CodecTest, FrameSizeRefusesHugeDeclaredLengthsAndInvalidBytes) {
  const uint8_t huge_str[] = {0xdb, 0x7f, 0xff, 0xff, 0xff};
  const uint8_t huge_array[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
  const uint8_t invalid[] = {0x92, 0x01, 0xc1};
  size_t size = 0;
  EXPECT_EQ(mp_frame_size(huge_str, sizeof huge_str, 1 << 20, &size), -2);
  EXPECT_EQ(mp_frame_size(huge_array, sizeof huge_array, 1 << 20, &size), -2);
  EXPECT_EQ(mp_frame_size(invalid, sizeof invalid, 1 << 20, &size), -1);
  mp_reader r;
  mp_reader_init(&r, huge_array, sizeof huge_array);
  EXPECT_EQ(mp_skip(&r), -1);
}

// Verifies the UTF-8 check that decides between str and bin for keys.
TEST(CodecTest, Utf8CheckAcceptsUtf8AndRefusesOtherBytes) {
  auto ok = [](const std::string& s) {
    return mp_is_utf8(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  EXPECT_TRUE(ok(std::string("a\0b", 3)));
  EXPECT_TRUE(ok("gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(ok("\xff"));
  EXPECT_FALSE(ok("\xc3"));          // cut short
  EXPECT_FALSE(ok("\xc0\xaf"));      // overlong
  EXPECT_FALSE(ok("\xed\xa0\x80"));  // surrogate
}

// ---- errors, versions, headers --------------------------------------------------

// Verifies that every code in the one table has its own text and name, and
// that codes outside it still get text.
TEST(ErrorTest, StrerrorCoversEveryCode) {
  std::set<std::string> texts;
  int count = 0;
#define CHECK_CODE(name, value, text)                                  \
  EXPECT_LT(value, 0);                                                 \
  EXPECT_STREQ(sluice_strerror(SLUICE_##name), text);                  \
  EXPECT_STREQ(sluice_err_name(SLUICE_##name), "SLUICE_" #name);       \
  texts.insert(sluice_strerror(value));                                \
  count++;
  SLUICE_ERRNO_MAP(CHECK_CODE)
#undef CHECK_CODE
  EXPECT_EQ(texts.size(), static_cast<size_t>(count));
  EXPECT_STREQ(sluice_strerror(-9999), "unknown error");
  EXPECT_STREQ(sluice_err_name(-9999), "SLUICE_UNKNOWN");
  EXPECT_STREQ(sluice_strerror(0), "success");
}

// Verifies that the run-time version is the compile-time one.
TEST(VersionTest, RunTimeVersionMatchesTheHeader) {
  EXPECT_EQ(sluice_version_number(), SLUICE_VERSION_NUMBER);
  EXPECT_EQ(std::string(sluice_version()), std::to_string(SLUICE_VERSION_MAJOR) + "." +
                                               std::to_string(SLUICE_VERSION_MINOR) + "." +
                                               std::to_string(SLUICE_VERSION_PATCH));
}

// Verifies the RateLimit and RateLimit-Policy values for an allowed decision,
// with seconds rounded up and no Retry-After.
TEST(HeadersTest, AllowedDecisionFormatsRateLimitAndPolicy) {
  sluice_decision d{};
  d.allowed = 1;
  d.remaining = 20;
  d.limit = 100;
  d.reset_after_ms = 29001;
  sluice_headers h;
  ASSERT_EQ(sluice_format_headers(&d, "api", 60, &h), 0);
  EXPECT_STREQ(h.ratelimit, "\"api\";r=20;t=30");
  EXPECT_STREQ(h.ratelimit_policy, "\"api\";q=100;w=60");
  EXPECT_STREQ(h.retry_after, "");
}

// Verifies Retry-After for denials: rounded up, and never 0.
TEST(HeadersTest, DeniedDecisionFormatsRetryAfterInWholeSeconds) {
  sluice_decision d{};
  d.allowed = 0;
  d.remaining = -3;  // clamped: a header never shows a negative count
  d.limit = 5;
  d.retry_after_ms = 2500;
  sluice_headers h;
  ASSERT_EQ(sluice_format_headers(&d, "login", 0, &h), 0);
  EXPECT_STREQ(h.retry_after, "3");
  EXPECT_STREQ(h.ratelimit, "\"login\";r=0;t=0");
  EXPECT_STREQ(h.ratelimit_policy, "\"login\";q=5");
  d.retry_after_ms = 0;
  ASSERT_EQ(sluice_format_headers(&d, "login", 0, &h), 0);
  EXPECT_STREQ(h.retry_after, "1");
}

// Verifies that policy names are escaped as sf-strings and bad ones refused.
TEST(HeadersTest, PolicyNamesAreEscapedOrRefused) {
  sluice_decision d{};
  d.allowed = 1;
  sluice_headers h;
  ASSERT_EQ(sluice_format_headers(&d, "a\"b\\", 0, &h), 0);
  EXPECT_STREQ(h.ratelimit_policy, "\"a\\\"b\\\\\";q=0");
  EXPECT_EQ(sluice_format_headers(&d, "", 0, &h), SLUICE_EINVAL);
  EXPECT_EQ(sluice_format_headers(&d, "caf\xc3\xa9", 0, &h), SLUICE_EINVAL);
  EXPECT_EQ(sluice_format_headers(&d, "tab\there", 0, &h), SLUICE_EINVAL);
  EXPECT_EQ(sluice_format_headers(&d, std::string(65, 'x').c_str(), 0, &h), SLUICE_EINVAL);
  std::string longest(64, '"');
  ASSERT_EQ(sluice_format_headers(&d, longest.c_str(), 999999999999999, &h), 0);
  EXPECT_EQ(std::string(h.ratelimit_policy).size(), 2 + 128 + std::string(";q=0;w=999999999999999").size());
}

// ---- the client against the fake daemon ------------------------------------------

// Verifies that destroying NULL is a no-op, as are other NULL handles.
TEST(ClientLifetimeTest, DestroyAcceptsNull) {
  sluice_destroy(nullptr);
  sluice_free(nullptr);
  EXPECT_EQ(sluice_in_flight(nullptr), 0u);
  EXPECT_STREQ(sluice_server_error_code(nullptr), "");
}

// Verifies that connecting to a path nobody listens on fails cleanly.
TEST_F(ClientTest, ConnectToMissingSocketFailsWithoutAHandle) {
  sluice_client* c = reinterpret_cast<sluice_client*>(0x1);
  EXPECT_EQ(sluice_connect(path_.c_str(), 100, &c), SLUICE_ECONNECT);
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(sluice_connect(std::string(200, 'x').c_str(), 100, &c), SLUICE_EINVAL);
}

// Verifies a synchronous acquire: the request on the wire and the decision
// decoded from the answer, with unknown keys skipped.
TEST_F(ClientTest, SyncAcquireSendsRuleKeyCostAndReturnsTheDecision) {
  Decision canned;
  canned.remaining = 4;
  canned.limit = 5;
  canned.reset_after_ms = 800;
  canned.mode = "fallback";
  FakeServer s(path_, answerAll(canned));
  connect();
  sluice_decision d;
  ASSERT_EQ(sluice_acquire(client_, "api", "user-1", 6, 2, kTimeoutMs, &d), 0);
  EXPECT_EQ(d.allowed, 1);
  EXPECT_EQ(d.remaining, 4);
  EXPECT_EQ(d.limit, 5);
  EXPECT_EQ(d.reset_after_ms, 800);
  EXPECT_EQ(d.retry_after_ms, 0);
  EXPECT_EQ(d.mode, SLUICE_MODE_FALLBACK);
  auto requests = s.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].method, "acquire");
  EXPECT_EQ(requests[0].rule, "api");
  EXPECT_EQ(requests[0].key, "user-1");
  EXPECT_FALSE(requests[0].key_is_bin);
  EXPECT_EQ(requests[0].cost, 2u);
}

// Verifies that keys are sent byte-exact: NUL inside a str, non-UTF-8 as bin.
TEST_F(ClientTest, KeysWithAnyBytesArriveUnchanged) {
  FakeServer s(path_, answerAll());
  connect();
  sluice_decision d;
  const std::string with_nul("a\0{b}", 5);
  const std::string binary("\xff\x00\xfe", 3);
  ASSERT_EQ(sluice_acquire(client_, "api", with_nul.data(), with_nul.size(), 1, kTimeoutMs, &d), 0);
  ASSERT_EQ(sluice_peek(client_, "api", binary.data(), binary.size(), kTimeoutMs, &d), 0);
  auto requests = s.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].key, with_nul);
  EXPECT_FALSE(requests[0].key_is_bin);
  EXPECT_EQ(requests[1].key, binary);
  EXPECT_TRUE(requests[1].key_is_bin);
  EXPECT_EQ(requests[1].method, "peek");
  EXPECT_EQ(requests[1].param_count, 2u);  // peek has no cost
}

// Verifies release's request and that a non-map result still means done.
TEST_F(ClientTest, ReleaseAcceptsAnyResult) {
  FakeServer s(path_, [](Conn& conn, int) {
    while (auto req = conn.read()) {
      msgpack::sbuffer buf;
      msgpack::pack(buf, std::make_tuple(1, req->msgid, msgpack::type::nil_t(), true));
      conn.send(std::string(buf.data(), buf.size()));
    }
  });
  connect();
  sluice_decision d;
  ASSERT_EQ(sluice_release(client_, "conns", "db", 1, 3, kTimeoutMs, &d), 0);
  EXPECT_EQ(d.allowed, 1);
  ASSERT_EQ(sluice_release(client_, "conns", "db", 1, 3, kTimeoutMs, nullptr), 0);
  auto requests = s.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].method, "release");
  EXPECT_EQ(requests[0].cost, 3u);
}

// Verifies reserve, settle and cancel send the wire shapes of
// docs/protocol.md and read the id, refunded, debt and unpaid back.
TEST_F(ClientTest, ReserveSettleAndCancelSendTheirParamsAndReadWhatWasSettled) {
  FakeServer s(path_, [](Conn& conn, int) {
    while (auto req = conn.read()) {
      msgpack::sbuffer buf;
      msgpack::packer<msgpack::sbuffer> pk(buf);
      pk.pack_array(4);
      pk.pack(1);
      pk.pack(req->msgid);
      pk.pack_nil();
      const bool reserve = req->method == "reserve";
      pk.pack_map(reserve ? 5 : 8);
      pk.pack(std::string("allowed"));
      pk.pack(true);
      pk.pack(std::string("remaining"));
      pk.pack(reserve ? 904 : -50);
      pk.pack(std::string("limit"));
      pk.pack(1000);
      pk.pack(std::string("mode"));
      pk.pack(std::string("local"));
      pk.pack(std::string("id"));
      pk.pack(uint64_t{7} << 48 | 3);
      if (!reserve) {
        pk.pack(std::string("refunded"));
        pk.pack(req->method == "cancel" ? 96 : 0);
        pk.pack(std::string("debt"));
        pk.pack(req->method == "cancel" ? 0 : 50);
        pk.pack(std::string("unpaid"));
        pk.pack(req->method == "cancel" ? 0 : 20);
      }
      conn.send(std::string(buf.data(), buf.size()));
    }
  });
  connect();
  sluice_decision d;
  uint64_t id = 0;
  ASSERT_EQ(sluice_reserve(client_, "llm", "tenant", 6, 96, 30000, kTimeoutMs, &d, &id), 0);
  EXPECT_EQ(id, uint64_t{7} << 48 | 3);
  EXPECT_EQ(d.remaining, 904);
  int64_t refunded = -1;
  int64_t debt = -1;
  ASSERT_EQ(sluice_settle(client_, id, 146, kTimeoutMs, &d, &refunded, &debt), 0);
  EXPECT_EQ(refunded, 0);
  EXPECT_EQ(debt, 50);
  EXPECT_EQ(d.remaining, -50);
  int64_t unpaid = -1;
  ASSERT_EQ(sluice_settle_with_unpaid(client_, id, 166, kTimeoutMs, &d, nullptr, &debt, &unpaid),
            0);
  EXPECT_EQ(debt, 50);
  EXPECT_EQ(unpaid, 20);
  ASSERT_EQ(sluice_cancel(client_, id, kTimeoutMs, nullptr, &refunded), 0);
  EXPECT_EQ(refunded, 96);
  EXPECT_EQ(sluice_reserve(client_, "llm", "tenant", 6, 0, 0, kTimeoutMs, &d, &id), SLUICE_EINVAL);
  EXPECT_EQ(sluice_settle(client_, 0, 1, kTimeoutMs, &d, nullptr, nullptr), SLUICE_EINVAL);

  auto requests = s.requests();
  ASSERT_EQ(requests.size(), 4u);
  EXPECT_EQ(requests[0].method, "reserve");
  EXPECT_EQ(requests[0].rule, "llm");
  EXPECT_EQ(requests[0].cost, 96u);
  EXPECT_EQ(requests[0].ttl_ms, 30000u);
  EXPECT_EQ(requests[1].method, "settle");
  EXPECT_EQ(requests[1].id, uint64_t{7} << 48 | 3);
  EXPECT_EQ(requests[1].actual, 146u);
  EXPECT_EQ(requests[2].method, "settle");
  EXPECT_EQ(requests[2].actual, 166u);
  EXPECT_EQ(requests[3].method, "cancel");
  EXPECT_EQ(requests[3].param_count, 1u);
}

// Verifies acquire_all's nested parameters and its per-item results.
TEST_F(ClientTest, AcquireAllSendsEveryItemAndReturnsEachDecision) {
  FakeServer s(path_, [](Conn& conn, int) {
    while (auto req = conn.read()) {
      msgpack::sbuffer buf;
      msgpack::packer<msgpack::sbuffer> pk(buf);
      pk.pack_array(4).pack(1).pack(req->msgid).pack_nil();
      pk.pack_map(2).pack(std::string("allowed")).pack(false).pack(std::string("results"));
      pk.pack_array(2);
      Decision yes;
      Decision no;
      no.allowed = false;
      no.remaining = 0;
      no.retry_after_ms = 1500;
      packDecision(pk, yes);
      packDecision(pk, no);
      conn.send(std::string(buf.data(), buf.size()));
    }
  });
  connect();
  const sluice_item items[] = {{"per_user", "u1", 2, 1}, {"per_ip", "10.0.0.1", 8, 4}};
  sluice_decision results[2];
  int all = -1;
  ASSERT_EQ(sluice_acquire_all(client_, items, 2, kTimeoutMs, &all, results), 0);
  EXPECT_EQ(all, 0);
  EXPECT_EQ(results[0].allowed, 1);
  EXPECT_EQ(results[1].allowed, 0);
  EXPECT_EQ(results[1].retry_after_ms, 1500);
  auto requests = s.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].method, "acquire_all");
  EXPECT_EQ(requests[0].param_count, 1u);
  EXPECT_EQ(requests[0].item_count, 2u);
  EXPECT_EQ(requests[0].rule, "per_user");
  EXPECT_EQ(requests[0].cost, 1u);
}

// Verifies that an error map surfaces as SLUICE_ESERVER with its code and
// message, and that the connection stays usable.
TEST_F(ClientTest, ErrorMapSurfacesAsServerErrorWithCodeAndMessage) {
  FakeServer s(path_, [](Conn& conn, int) {
    while (auto req = conn.read()) {
      if (req->rule == "nope") {
        conn.send(errorReply(req->msgid, "UNKNOWN_RULE", "no rule named \"nope\""));
      } else {
        conn.send(decisionReply(req->msgid));
      }
    }
  });
  connect();
  sluice_decision d;
  ASSERT_EQ(sluice_acquire(client_, "nope", "k", 1, 1, kTimeoutMs, &d), SLUICE_ESERVER);
  EXPECT_STREQ(sluice_server_error_code(client_), "UNKNOWN_RULE");
  EXPECT_STREQ(sluice_server_error_message(client_), "no rule named \"nope\"");
  ASSERT_EQ(sluice_acquire(client_, "api", "k", 1, 1, kTimeoutMs, &d), 0);
  EXPECT_STREQ(sluice_server_error_code(client_), "");
}

// Verifies health's status and redis fields, and the JSON text of a result
// with every kind of value.
TEST_F(ClientTest, HealthAndCallJsonDecodeResults) {
  FakeServer s(path_, [](Conn& conn, int) {
    while (auto req = conn.read()) {
      msgpack::sbuffer buf;
      msgpack::packer<msgpack::sbuffer> pk(buf);
      pk.pack_array(4).pack(1).pack(req->msgid).pack_nil();
      if (req->method == "health") {
        pk.pack_map(3).pack(std::string("status")).pack(std::string("degraded"));
        pk.pack(std::string("redis")).pack(std::string("down"));
        pk.pack(std::string("uptime_s")).pack(12);
      } else {
        pk.pack_map(4);
        pk.pack(std::string("decisions")).pack(uint64_t{18446744073709551615ull});
        pk.pack(std::string("skew")).pack(-0.5);
        pk.pack(7).pack_array(3).pack_nil().pack(true).pack(-3);
        pk.pack(std::string("raw")).pack_bin(3).pack_bin_body("a\"\x01", 3);
      }
      conn.send(std::string(buf.data(), buf.size()));
    }
  });
  connect();
  sluice_health_info health;
  ASSERT_EQ(sluice_health(client_, kTimeoutMs, &health), 0);
  EXPECT_STREQ(health.status, "degraded");
  EXPECT_STREQ(health.redis, "down");
  char* json = nullptr;
  ASSERT_EQ(sluice_call_json(client_, "stats", kTimeoutMs, &json), 0);
  EXPECT_STREQ(json,
               "{\"decisions\":18446744073709551615,\"skew\":-0.5,\"7\":[null,true,-3],"
               "\"raw\":\"a\\\"\\u0001\"}");
  sluice_free(json);
}

// Verifies that many pipelined requests go out, are answered in reverse
// order in one write, and are each matched to their own msgid; one error map
// among them surfaces on its own response only.
TEST_F(ClientTest, PipelinedResponsesOutOfOrderAreMatchedByMsgid) {
  constexpr int kCount = 3000;  // answers span several reads of the client
  FakeServer s(path_, [](Conn& conn, int) {
    std::vector<Request> batch;
    while (batch.size() < kCount) {
      auto req = conn.read();
      if (!req) {
        return;
      }
      batch.push_back(*req);
    }
    std::string replies;
    for (auto it = batch.rbegin(); it != batch.rend(); ++it) {
      int index = std::stoi(it->key);
      if (index == 1234) {
        replies += errorReply(it->msgid, "OVERLOADED", "busy");
      } else {
        Decision d;
        d.remaining = index;
        d.allowed = index % 2 == 0;
        replies += decisionReply(it->msgid, d);
      }
    }
    conn.send(replies);
    while (conn.read()) {
    }
  });
  connect();
  std::map<uint32_t, int> index_of;
  for (int i = 0; i < kCount; i++) {
    std::string key = std::to_string(i);
    uint32_t msgid = 0;
    ASSERT_EQ(sluice_send_acquire(client_, "api", key.data(), key.size(), 1, &msgid), 0);
    index_of[msgid] = i;
  }
  EXPECT_EQ(index_of.size(), static_cast<size_t>(kCount));
  EXPECT_EQ(sluice_in_flight(client_), static_cast<size_t>(kCount));
  ASSERT_EQ(sluice_flush(client_, kTimeoutMs), 0);
  sluice_decision d;
  EXPECT_EQ(sluice_acquire(client_, "api", "x", 1, 1, kTimeoutMs, &d), SLUICE_EBUSY);

  std::vector<int> order;
  for (int n = 0; n < kCount; n++) {
    sluice_response r;
    ASSERT_EQ(sluice_recv(client_, kTimeoutMs, &r), 0);
    ASSERT_EQ(index_of.count(r.msgid), 1u);
    int index = index_of[r.msgid];
    index_of.erase(r.msgid);
    order.push_back(index);
    if (index == 1234) {
      EXPECT_EQ(r.status, SLUICE_ESERVER);
      EXPECT_STREQ(sluice_server_error_code(client_), "OVERLOADED");
    } else {
      ASSERT_EQ(r.status, 0);
      EXPECT_EQ(r.decision.remaining, index);
      EXPECT_EQ(r.decision.allowed, index % 2 == 0);
    }
  }
  EXPECT_TRUE(index_of.empty());
  EXPECT_EQ(order.front(), kCount - 1);
  EXPECT_EQ(order.back(), 0);
  EXPECT_EQ(sluice_in_flight(client_), 0u);
  sluice_response r;
  EXPECT_EQ(sluice_recv(client_, 0, &r), SLUICE_EINVAL);
}

// Verifies that sluice_recv flushes queued requests itself and times out
// without losing anything when no answer has come yet.
TEST_F(ClientTest, RecvFlushesAndTimesOutWithoutLosingRequests) {
  std::mutex mu;
  std::condition_variable cv;
  bool release_answer = false;
  FakeServer s(path_, [&](Conn& conn, int) {
    auto req = conn.read();
    if (!req) {
      return;
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return release_answer; });
    conn.send(decisionReply(req->msgid));
    while (conn.read()) {
    }
  });
  connect();
  uint32_t msgid = 0;
  ASSERT_EQ(sluice_send_peek(client_, "api", "k", 1, &msgid), 0);
  sluice_response r;
  EXPECT_EQ(sluice_recv(client_, 10, &r), SLUICE_ETIMEDOUT);
  EXPECT_EQ(sluice_in_flight(client_), 1u);
  {
    std::lock_guard<std::mutex> lock(mu);
    release_answer = true;
  }
  cv.notify_all();
  ASSERT_EQ(sluice_recv(client_, kTimeoutMs, &r), 0);
  EXPECT_EQ(r.msgid, msgid);
  EXPECT_EQ(r.status, 0);
}

// Verifies that after the daemon restarts, the next call reconnects and succeeds.
TEST_F(ClientTest, ReconnectsAfterTheServerRestarts) {
  auto first = std::make_unique<FakeServer>(path_, answerAll());
  connect();
  sluice_decision d;
  ASSERT_EQ(sluice_acquire(client_, "api", "k", 1, 1, kTimeoutMs, &d), 0);
  first.reset();  // closes the client's connection and the listener

  FakeServer second(path_, answerAll());
  ASSERT_EQ(sluice_acquire(client_, "api", "k", 1, 1, kTimeoutMs, &d), 0);
  EXPECT_EQ(d.allowed, 1);
  EXPECT_EQ(second.requests().size(), 1u);
}

// Verifies that a request the daemon received but never answered is reported
// as a failure and not re-sent; the next call reconnects.
TEST_F(ClientTest, RequestLostWithTheConnectionIsNotResent) {
  FakeServer s(path_, [](Conn& conn, int index) {
    while (auto req = conn.read()) {
      if (index == 0) {
        return;  // the daemon "crashes" after reading the first request
      }
      conn.send(decisionReply(req->msgid));
    }
  });
  connect();
  sluice_decision d;
  EXPECT_EQ(sluice_acquire(client_, "api", "k", 1, 1, kTimeoutMs, &d), SLUICE_ECLOSED);
  EXPECT_EQ(s.requests().size(), 1u);
  ASSERT_EQ(sluice_acquire(client_, "api", "k", 1, 1, kTimeoutMs, &d), 0);
  EXPECT_EQ(s.requests().size(), 2u);
}

// Verifies that a response cut off by the daemon closing is an error.
TEST_F(ClientTest, TruncatedResponseIsAnError) {
  FakeServer s(path_, [](Conn& conn, int) {
    if (auto req = conn.read()) {
      std::string reply = decisionReply(req->msgid);
      conn.send(reply.substr(0, reply.size() / 2));
    }
  });
  connect();
  sluice_decision d;
  EXPECT_EQ(sluice_acquire(client_, "api", "k", 1, 1, kTimeoutMs, &d), SLUICE_ECLOSED);
}

// Verifies that a response declaring more bytes than the cap fails at once,
// without waiting for the bytes or the timeout.
TEST_F(ClientTest, OversizedResponseIsRefusedWithoutWaiting) {
  FakeServer s(path_, [](Conn& conn, int) {
    while (auto req = conn.read()) {
      msgpack::sbuffer buf;
      msgpack::packer<msgpack::sbuffer> pk(buf);
      pk.pack_array(4).pack(1).pack(req->msgid).pack_nil().pack_str(SLUICE_MAX_RESPONSE_BYTES);
      conn.send(std::string(buf.data(), buf.size()));
    }
  });
  connect();
  sluice_decision d;
  EXPECT_EQ(sluice_acquire(client_, "api", "k", 1, 1, -1, &d), SLUICE_ETOOLARGE);
}

// Verifies that well-framed but wrongly shaped responses are protocol errors.
TEST_F(ClientTest, MalformedResponsesAreProtocolErrors) {
  FakeServer s(path_, [](Conn& conn, int) {
    while (auto req = conn.read()) {
      msgpack::sbuffer buf;
      msgpack::packer<msgpack::sbuffer> pk(buf);
      if (req->key == "not-a-map") {
        pk.pack_array(4).pack(1).pack(req->msgid).pack_nil().pack(std::string("yes"));
      } else if (req->key == "no-allowed") {
        pk.pack_array(4).pack(1).pack(req->msgid).pack_nil().pack_map(1).pack(std::string("limit")).pack(5);
      } else if (req->key == "wrong-msgid") {
        pk.pack_array(4).pack(1).pack(req->msgid + 100).pack_nil().pack_nil();
      } else {
        buf.write("\xc1", 1);
      }
      conn.send(std::string(buf.data(), buf.size()));
    }
  });
  connect();
  sluice_decision d;
  for (const char* key : {"not-a-map", "no-allowed", "wrong-msgid", "garbage"}) {
    EXPECT_EQ(sluice_acquire(client_, "api", key, strlen(key), 1, kTimeoutMs, &d), SLUICE_EPROTO) << key;
  }
}

// Verifies that sluice_recv, which decodes responses in one pass, waits out
// a frame arriving one byte at a time, gives a well-framed answer of the
// wrong shape its own SLUICE_EPROTO status and keeps the connection, and
// refuses an oversized frame.
TEST_F(ClientTest, RecvDecodesFramesCutAnywhereAndKeepsShapeErrorsPerResponse) {
  FakeServer s(path_, [](Conn& conn, int) {
    while (auto req = conn.read()) {
      msgpack::sbuffer buf;
      msgpack::packer<msgpack::sbuffer> pk(buf);
      std::string reply;
      if (req->key == "no-allowed") {
        pk.pack_array(4).pack(1).pack(req->msgid).pack_nil().pack_map(1).pack(std::string("limit")).pack(5);
        reply.assign(buf.data(), buf.size());
      } else if (req->key == "huge") {
        pk.pack_array(4).pack(1).pack(req->msgid).pack_nil().pack_str(SLUICE_MAX_RESPONSE_BYTES);
        reply.assign(buf.data(), buf.size());
      } else {
        Decision d;
        d.remaining = 7;
        reply = decisionReply(req->msgid, d);
      }
      for (char byte : reply) {
        conn.send(std::string(1, byte));
      }
    }
  });
  connect();
  uint32_t first = 0, second = 0;
  ASSERT_EQ(sluice_send_acquire(client_, "api", "no-allowed", 10, 1, &first), 0);
  ASSERT_EQ(sluice_send_acquire(client_, "api", "k", 1, 1, &second), 0);
  sluice_response r;
  ASSERT_EQ(sluice_recv(client_, kTimeoutMs, &r), 0);
  EXPECT_EQ(r.msgid, first);
  EXPECT_EQ(r.status, SLUICE_EPROTO);
  ASSERT_EQ(sluice_recv(client_, kTimeoutMs, &r), 0);
  EXPECT_EQ(r.msgid, second);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.decision.remaining, 7);
  ASSERT_EQ(sluice_send_acquire(client_, "api", "huge", 4, 1, nullptr), 0);
  EXPECT_EQ(sluice_recv(client_, -1, &r), SLUICE_ETOOLARGE);
  EXPECT_EQ(sluice_in_flight(client_), 0u);
}

// Verifies that bad arguments are refused before anything is sent.
TEST_F(ClientTest, BadArgumentsAreRefused) {
  FakeServer s(path_, answerAll());
  connect();
  sluice_decision d;
  EXPECT_EQ(sluice_acquire(client_, nullptr, "k", 1, 1, kTimeoutMs, &d), SLUICE_EINVAL);
  EXPECT_EQ(sluice_acquire(client_, "api", nullptr, 1, 1, kTimeoutMs, &d), SLUICE_EINVAL);
  EXPECT_EQ(sluice_acquire(client_, "api", "k", 1, 1, kTimeoutMs, nullptr), SLUICE_EINVAL);
  EXPECT_EQ(sluice_acquire_all(client_, nullptr, 0, kTimeoutMs, nullptr, nullptr), SLUICE_EINVAL);
  EXPECT_EQ(sluice_acquire(nullptr, "api", "k", 1, 1, kTimeoutMs, &d), SLUICE_EINVAL);
  EXPECT_TRUE(s.requests().empty());
}

std::string notification() {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(3).pack(2).pack(std::string("event")).pack_array(0);
  return std::string(buf.data(), buf.size());
}

// Verifies that a pipeline far deeper than both sockets' buffers completes
// against a daemon that answers each request with a blocking write before it
// reads the next: the client must keep reading answers while it writes, or
// each side waits on the other forever.
TEST_F(ClientTest, DeepPipelineAgainstABlockingServerDeliversEveryReply) {
  constexpr uint32_t kCount = 400000;
  FakeServer s(path_, [](Conn& conn, int) {
    while (auto req = conn.read()) {
      conn.send(decisionReply(req->msgid));
    }
  });
  connect();
  for (uint32_t i = 0; i < kCount; i++) {
    ASSERT_EQ(sluice_send_peek(client_, "api", "k", 1, nullptr), 0);
  }
  std::vector<bool> seen(kCount + 1, false);
  uint32_t got = 0;
  while (sluice_in_flight(client_) > 0) {
    sluice_response r;
    int rc = sluice_recv(client_, kTimeoutMs, &r);
    ASSERT_EQ(rc, 0) << sluice_err_name(rc) << " after " << got << " replies";
    ASSERT_EQ(r.status, 0);
    ASSERT_TRUE(r.msgid >= 1 && r.msgid <= kCount && !seen[r.msgid]) << r.msgid;
    seen[r.msgid] = true;
    got++;
  }
  EXPECT_EQ(got, kCount);
}

// Verifies that answers which arrived before the daemon closed the
// connection are handed out even though requests were still being written
// (the write fails with EPIPE), and only then the connection error.
TEST_F(ClientTest, AnswersReceivedBeforeTheServerClosesAreDeliveredFirst) {
  constexpr int kCount = 200000;  // megabytes: far more than a socket buffers
  constexpr int kAnswered = 3;
  FakeServer s(path_, [](Conn& conn, int index) {
    if (index > 0) {
      return;
    }
    for (int i = 0; i < kAnswered; i++) {
      auto req = conn.read();
      if (!req) {
        return;
      }
      conn.send(decisionReply(req->msgid));
    }
    // Returning closes the connection with most requests unread.
  });
  connect();
  for (int i = 0; i < kCount; i++) {
    ASSERT_EQ(sluice_send_peek(client_, "api", "k", 1, nullptr), 0);
  }
  for (uint32_t i = 1; i <= kAnswered; i++) {
    sluice_response r;
    ASSERT_EQ(sluice_recv(client_, kTimeoutMs, &r), 0) << i;
    EXPECT_EQ(r.msgid, i);
    EXPECT_EQ(r.status, 0);
    EXPECT_TRUE(r.decision.allowed);
  }
  sluice_response r;
  EXPECT_EQ(sluice_recv(client_, kTimeoutMs, &r), SLUICE_ECLOSED);
  EXPECT_EQ(sluice_in_flight(client_), 0u);
}

// Verifies that notifications are skipped (pipelined and synchronous), and
// that a reply whose msgid is not in flight (unknown, or a duplicate) is a
// protocol error for that reply alone: the count stays right, the
// connection stays open and the real answers still arrive.
TEST_F(ClientTest, NotificationsAreSkippedAndStrayRepliesDoNotCountAsAnswers) {
  FakeServer s(path_, [](Conn& conn, int) {
    while (auto req = conn.read()) {
      std::string reply = decisionReply(req->msgid);
      if (req->key == "noisy") {
        conn.send(notification() + decisionReply(req->msgid + 1000) + reply + reply);
      } else {
        conn.send(notification() + reply);
      }
    }
  });
  connect();
  uint32_t noisy, quiet;
  ASSERT_EQ(sluice_send_peek(client_, "api", "noisy", 5, &noisy), 0);
  ASSERT_EQ(sluice_send_peek(client_, "api", "quiet", 5, &quiet), 0);
  sluice_response r;
  ASSERT_EQ(sluice_recv(client_, kTimeoutMs, &r), SLUICE_EPROTO);  // unknown msgid
  EXPECT_EQ(r.msgid, noisy + 1000);
  EXPECT_EQ(sluice_in_flight(client_), 2u);
  ASSERT_EQ(sluice_recv(client_, kTimeoutMs, &r), 0);
  EXPECT_EQ(r.msgid, noisy);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(sluice_in_flight(client_), 1u);
  ASSERT_EQ(sluice_recv(client_, kTimeoutMs, &r), SLUICE_EPROTO);  // its duplicate
  EXPECT_EQ(r.msgid, noisy);
  EXPECT_EQ(sluice_in_flight(client_), 1u);
  ASSERT_EQ(sluice_recv(client_, kTimeoutMs, &r), 0);
  EXPECT_EQ(r.msgid, quiet);
  EXPECT_EQ(sluice_in_flight(client_), 0u);
  EXPECT_EQ(sluice_recv(client_, kTimeoutMs, &r), SLUICE_EINVAL);

  // The same connection serves a synchronous call, its notification skipped.
  sluice_decision d;
  ASSERT_EQ(sluice_peek(client_, "api", "quiet", 5, kTimeoutMs, &d), 0);
  EXPECT_TRUE(d.allowed);
  ASSERT_EQ(sluice_send_peek(client_, "api", "quiet", 5, &quiet), 0);
  ASSERT_EQ(sluice_recv(client_, kTimeoutMs, &r), 0);
  EXPECT_EQ(r.msgid, quiet);
}

// Verifies that the window of msgids in flight slides and grows correctly:
// answers in any order, over many rounds, with a straggler held back.
TEST_F(ClientTest, MsgidWindowTracksOutOfOrderAnswersAcrossRounds) {
  FakeServer s(path_, [](Conn& conn, int) {
    std::vector<uint32_t> held;
    while (auto req = conn.read()) {
      if (req->key == "later") {
        held.push_back(req->msgid);
      } else if (req->key == "now") {
        conn.send(decisionReply(req->msgid));
      } else {  // "flush": answer it, then everything held, newest first
        std::string out = decisionReply(req->msgid);
        for (auto it = held.rbegin(); it != held.rend(); ++it) {
          out += decisionReply(*it);
        }
        held.clear();
        conn.send(out);
      }
    }
  });
  connect();
  std::set<uint32_t> outstanding;
  for (int round = 0; round < 20; round++) {
    for (int i = 0; i < 300; i++) {
      uint32_t id;
      const char* key = i == 0 ? "later" : (i % 3 == 0 ? "later" : "now");
      ASSERT_EQ(sluice_send_peek(client_, "api", key, strlen(key), &id), 0);
      outstanding.insert(id);
    }
    if (round % 4 == 3) {
      uint32_t id;
      ASSERT_EQ(sluice_send_peek(client_, "api", "flush", 5, &id), 0);
      outstanding.insert(id);
    }
    // Take the answers that come now; held ones stay in flight.
    while (sluice_in_flight(client_) > 0) {
      sluice_response r;
      int rc = sluice_recv(client_, round % 4 == 3 ? kTimeoutMs : 20, &r);
      if (rc == SLUICE_ETIMEDOUT) {
        break;
      }
      ASSERT_EQ(rc, 0) << sluice_err_name(rc);
      ASSERT_EQ(outstanding.erase(r.msgid), 1u) << r.msgid;
    }
    EXPECT_EQ(sluice_in_flight(client_), outstanding.size());
  }
}

// ---- sluicectl --------------------------------------------------------------------

struct RunResult {
  int exit_code = -1;
  std::string out;
};

// Runs sluicectl with `args` and a timeout generous enough for a loaded CI
// machine (its default of 2 s is an interactive user's patience).
RunResult runSluicectl(const std::string& args) {
  std::string tool = sluice::test::sluicectlPath();
  RunResult result;
  std::string command = tool + " --timeout " + std::to_string(kSluicectlTimeoutMs) + " " + args;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) {
    return result;
  }
  char chunk[512];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, pipe)) > 0) {
    result.out.append(chunk, n);
  }
  int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// Verifies sluicectl's output and exit codes: 0 allowed, 1 denied, 2 usage,
// 3 server error.
TEST_F(ClientTest, SluicectlPrintsDecisionsAndExitsByOutcome) {
  FakeServer s(path_, [](Conn& conn, int) {
    while (auto req = conn.read()) {
      if (req->rule == "nope") {
        conn.send(errorReply(req->msgid, "UNKNOWN_RULE", "no such rule"));
      } else {
        Decision d;
        d.allowed = req->key != "denied";
        d.remaining = d.allowed ? 4 : 0;
        d.retry_after_ms = d.allowed ? 0 : 200;
        conn.send(decisionReply(req->msgid, d));
      }
    }
  });
  RunResult allowed = runSluicectl("--socket " + path_ + " acquire api user 1");
  EXPECT_EQ(allowed.exit_code, 0) << allowed.out;
  EXPECT_EQ(allowed.out, "allowed  remaining=4 limit=5 reset_after_ms=800 retry_after_ms=0 mode=local\n");
  RunResult denied = runSluicectl("--socket=" + path_ + " --json acquire api denied");
  EXPECT_EQ(denied.exit_code, 1) << denied.out;
  EXPECT_EQ(denied.out,
            "{\"allowed\":false,\"remaining\":0,\"limit\":5,\"reset_after_ms\":800,"
            "\"retry_after_ms\":200,\"mode\":\"local\"}\n");
  RunResult error = runSluicectl("--socket " + path_ + " peek nope user");
  EXPECT_EQ(error.exit_code, 3) << error.out;
  EXPECT_EQ(error.out, "sluicectl: UNKNOWN_RULE: no such rule\n");
  EXPECT_EQ(runSluicectl("--socket " + path_ + " acquire api").exit_code, 2);
  EXPECT_EQ(runSluicectl("--socket " + path_ + " acquire api k notanumber").exit_code, 2);
  EXPECT_EQ(runSluicectl("--socket " + dir_.file("absent") + " health").exit_code, 3);
  EXPECT_EQ(runSluicectl("--help").exit_code, 0);
}

// Verifies `sluicectl reload` (0 on success, 3 with the daemon's error) and
// that `health` costs one request, its exit status read from what it prints.
TEST_F(ClientTest, SluicectlReloadsAndChecksHealthInOneRequest) {
  FakeServer s(path_, [](Conn& conn, int index) {
    while (auto req = conn.read()) {
      msgpack::sbuffer buf;
      msgpack::packer<msgpack::sbuffer> pk(buf);
      if (req->method == "reload" && index == 1) {
        conn.send(errorReply(req->msgid, "FORBIDDEN", "reload needs root"));
        continue;
      }
      pk.pack_array(4).pack(1).pack(req->msgid).pack_nil();
      if (req->method == "reload") {
        pk.pack_map(1).pack(std::string("rules")).pack(3);
      } else {
        // A nested "status" must not count; the top-level one decides.
        pk.pack_map(2).pack(std::string("redis")).pack_map(1);
        pk.pack(std::string("status")).pack(std::string("ok"));
        pk.pack(std::string("status")).pack(std::string(index == 2 ? "ok" : "degraded"));
      }
      conn.send(std::string(buf.data(), buf.size()));
    }
  });
  RunResult ok = runSluicectl("--socket " + path_ + " --json reload");
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
  EXPECT_EQ(ok.out, "{\"rules\":3}\n");
  RunResult forbidden = runSluicectl("--socket " + path_ + " reload");
  EXPECT_EQ(forbidden.exit_code, 3) << forbidden.out;
  EXPECT_EQ(forbidden.out, "sluicectl: FORBIDDEN: reload needs root\n");
  RunResult healthy = runSluicectl("--socket " + path_ + " --json health");
  EXPECT_EQ(healthy.exit_code, 0) << healthy.out;
  EXPECT_EQ(healthy.out, "{\"redis\":{\"status\":\"ok\"},\"status\":\"ok\"}\n");
  RunResult degraded = runSluicectl("--socket " + path_ + " --json health");
  EXPECT_EQ(degraded.exit_code, 1) << degraded.out;
  EXPECT_EQ(degraded.out, "{\"redis\":{\"status\":\"ok\"},\"status\":\"degraded\"}\n");
  EXPECT_EQ(runSluicectl("--socket " + path_ + " reload now").exit_code, 2);
  s.stop();
  std::vector<std::string> methods;
  for (const auto& req : s.requests()) {
    methods.push_back(req.method);
  }
  EXPECT_EQ(methods, (std::vector<std::string>{"reload", "reload", "health", "health"}));
}

}  // namespace
