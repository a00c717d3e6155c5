// Question and Answer: the decision seam's words, the same for every front.
//
// A front (MessagePack-RPC on the Unix socket, HTTP, the Redis protocol,
// Envoy's rate limit service) turns what its client sent into a Question:
// a method and its items (rule, key, cost, how long it may wait). The
// dispatcher (dispatch.h) decides it and fills an Answer: a decision per
// item, or an error with a stable code. The front encodes the Answer in its
// own protocol. A Question that cannot be answered yet waits (waiting.h);
// its Answer goes later to its Recipient, with the tag the front gave it.
//
// Plain values; a Question's views point into the front's buffer and live
// as long as it does (HeldQuestion keeps a copy that owns its bytes).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "decision.h"

namespace sluice {

// Stable error codes, sent as the `code` of an error. Extend, never rename.
enum class ErrorCode {
  kBadRequest,     // BAD_REQUEST: the request's shape or a value is wrong
  kUnknownRule,    // UNKNOWN_RULE: no rule has that name
  kUnknownMethod,  // UNKNOWN_METHOD
  kOverloaded,     // OVERLOADED: a bound was reached (keys, waiters, ...)
  kForbidden,      // FORBIDDEN: the caller may not use this method
  kTooLarge,       // TOO_LARGE: frame, key or item count over its limit
  kInternal,       // INTERNAL: a bug; logged
  kUnknownReservation,  // UNKNOWN_RESERVATION: no open reservation has that id
};
std::string_view errorCodeName(ErrorCode code);

// The methods of the wire contract; a Question carries one of the first
// seven (the decisions and the reservations' settling), the rest are the
// admin methods (admin.h).
enum class Method {
  kAcquire,
  kAcquireAll,
  kPeek,
  kRelease,
  kReserve,  // spends an estimate now, settled later (reservations.h)
  kSettle,   // settles a reservation at its actual cost
  kCancel,   // gives a reservation back whole
  kHealth,
  kStats,
  kRules,
  kReload,
  kReset,
  kUnknown,
};
Method methodFromName(std::string_view name);
// Whether a Question may carry `method`: acquire, acquire_all, peek,
// release, reserve, settle, cancel.
constexpr bool decides(Method method) {
  return method == Method::kAcquire || method == Method::kAcquireAll ||
         method == Method::kPeek || method == Method::kRelease || method == Method::kReserve ||
         method == Method::kSettle || method == Method::kCancel;
}
// Whether `method` names a reservation rather than a (rule, key).
constexpr bool settles(Method method) {
  return method == Method::kSettle || method == Method::kCancel;
}

// One (rule, key, cost) of a question. reserve: cost is the estimate;
// settle: cost is the actual cost and `reservation` the id, with no rule or
// key; cancel: the id alone.
struct Item {
  std::string_view rule;
  std::string_view key;
  int64_t cost = 1;  // peek: 0
  // acquire: how long the request may wait for its units (bounded waiting);
  // -1 when it does not say, and the rule's max_wait applies.
  int64_t max_wait_ms = -1;
  // reserve: how long the reservation stays open before it settles at its
  // estimate; -1 for the default (kDefaultReservationTtlMs).
  int64_t ttl_ms = -1;
  uint64_t reservation = 0;  // settle, cancel: the id reserve answered
};
inline constexpr int64_t kDefaultReservationTtlMs = 60'000;
inline constexpr int64_t kMaxReservationTtlMs = 86'400'000;  // a day

// The tag a front gives a question, echoed with its answer: for
// MessagePack-RPC the msgid as the client wrote it (any MessagePack integer,
// -2^63 to 2^64-1, so a client that counts ids past 2^32 without wrapping is
// answered like any other); other fronts number their questions.
struct MsgId {
  uint64_t bits = 0;      // the value, in two's complement when negative
  bool negative = false;  // written back as a signed integer

  constexpr MsgId() = default;
  // Implicit: ids are counted as integers.
  constexpr MsgId(uint64_t value) : bits(value) {}  // NOLINT(google-explicit-constructor)
  static constexpr MsgId ofSigned(int64_t value) {
    MsgId id(static_cast<uint64_t>(value));
    id.negative = value < 0;
    return id;
  }
  friend constexpr bool operator==(MsgId, MsgId) = default;
};

// acquire, peek and release have one item; acquire_all one or more.
struct Question {
  Method method = Method::kAcquire;
  std::span<const Item> items;
};

// What the dispatcher answers: an error, or a decision and its mode per
// item (in the question's order). `allowed` is whether every item was.
struct Answer {
  Method method = Method::kAcquire;  // the question's
  bool failed = false;
  ErrorCode error = ErrorCode::kInternal;
  std::string message;  // the error's text
  bool allowed = false;
  std::vector<Decision> decisions;
  std::vector<Mode> modes;
  // A one-item acquire that was allowed to wait: how long it waited (ms);
  // -1 otherwise.
  int64_t waited_ms = -1;
  // reserve, allowed: the reservation's id; settle, cancel: the id settled.
  uint64_t reservation = 0;
  // settle, cancel: units given back, units charged past the estimate, and
  // units of the excess not charged: past the key's debt bound (debtBound).
  int64_t refunded = 0;
  int64_t debt = 0;
  int64_t unpaid = 0;

  // Empties it for the next question, keeping the vectors' capacity.
  void clear() {
    method = Method::kAcquire;
    failed = false;
    error = ErrorCode::kInternal;
    message.clear();
    allowed = false;
    decisions.clear();
    modes.clear();
    waited_ms = -1;
    reservation = 0;
    refunded = 0;
    debt = 0;
    unpaid = 0;
  }
  // Answers one item.
  void decide(const Decision& decision, Mode mode, int64_t waited = -1) {
    decisions.push_back(decision);
    modes.push_back(mode);
    allowed = decision.allowed;
    waited_ms = waited;
  }
  void fail(ErrorCode code, std::string_view text) {
    failed = true;
    error = code;
    message.assign(text);
  }
};

// Where a question's later answer goes: the front's connection or call that
// asked. Called on the worker thread that decided it.
class Recipient {
 public:
  virtual void receive(MsgId tag, const Answer& answer) = 0;

 protected:
  ~Recipient() = default;
};

// A Question that owns its bytes: kept while it waits, or handed to another
// thread. Movable (its views stay valid), not copyable.
class HeldQuestion {
 public:
  HeldQuestion() = default;
  explicit HeldQuestion(const Question& question) { assign(question); }
  HeldQuestion(HeldQuestion&&) noexcept = default;
  HeldQuestion& operator=(HeldQuestion&&) noexcept = default;
  HeldQuestion(const HeldQuestion&) = delete;
  HeldQuestion& operator=(const HeldQuestion&) = delete;

  void assign(const Question& question);
  Question question() const { return {method_, items_}; }
  // The bytes it holds, or would hold of `question` (bounds on what waits).
  size_t bytes() const { return bytes_.size(); }
  static size_t bytesOf(const Question& question) {
    size_t size = 0;
    for (const Item& item : question.items) size += item.rule.size() + item.key.size();
    return size;
  }

 private:
  Method method_ = Method::kAcquire;
  std::vector<char> bytes_;  // the rules' and keys' bytes; a move keeps them in place
  std::vector<Item> items_;  // views into bytes_
};

}  // namespace sluice
