// Question: the names of the seam's methods and error codes; see question.h.
#include "question.h"

#include <cstring>

namespace sluice {

std::string_view errorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kBadRequest: return "BAD_REQUEST";
    case ErrorCode::kUnknownRule: return "UNKNOWN_RULE";
    case ErrorCode::kUnknownMethod: return "UNKNOWN_METHOD";
    case ErrorCode::kOverloaded: return "OVERLOADED";
    case ErrorCode::kForbidden: return "FORBIDDEN";
    case ErrorCode::kTooLarge: return "TOO_LARGE";
    case ErrorCode::kInternal: return "INTERNAL";
    case ErrorCode::kUnknownReservation: return "UNKNOWN_RESERVATION";
  }
  return "INTERNAL";
}

Method methodFromName(std::string_view name) {
  if (name == "acquire") return Method::kAcquire;
  if (name == "acquire_all") return Method::kAcquireAll;
  if (name == "peek") return Method::kPeek;
  if (name == "release") return Method::kRelease;
  if (name == "reserve") return Method::kReserve;
  if (name == "settle") return Method::kSettle;
  if (name == "cancel") return Method::kCancel;
  if (name == "health") return Method::kHealth;
  if (name == "stats") return Method::kStats;
  if (name == "rules") return Method::kRules;
  if (name == "reload") return Method::kReload;
  if (name == "reset") return Method::kReset;
  return Method::kUnknown;
}

void HeldQuestion::assign(const Question& question) {
  method_ = question.method;
  bytes_.resize(bytesOf(question));
  items_.clear();
  char* at = bytes_.data();
  auto copy = [&at](std::string_view text) {
    if (!text.empty()) std::memcpy(at, text.data(), text.size());
    std::string_view held(at, text.size());
    at += text.size();
    return held;
  };
  for (const Item& item : question.items) {
    Item held = item;
    held.rule = copy(item.rule);
    held.key = copy(item.key);
    items_.push_back(held);
  }
}

}  // namespace sluice
