// A response frame of the daemon, decoded for tests: [1, msgid, error,
// result] with an error map or a flat result map (a decision, health).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "msgpack.h"

namespace sluice {

// One decoded response: an error's code and message, or a result map's
// integers, booleans and strings by name.
struct Response {
  uint32_t msgid = 0;
  std::string error;  // the error's code; "" for a result
  std::string message;
  std::map<std::string, int64_t> ints;
  std::map<std::string, bool> bools;
  std::map<std::string, std::string> strs;

  bool allowed() const { return bools.at("allowed"); }
  int64_t remaining() const { return ints.at("remaining"); }
  const std::string& mode() const { return strs.at("mode"); }
};

inline Response decode(std::string_view bytes) {
  Response answer;
  msgpack::Reader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), bytes.size());
  uint32_t count = 0;
  int64_t type = 0;
  int64_t msgid = 0;
  EXPECT_TRUE(r.readArrayHeader(&count) && count == 4);
  EXPECT_TRUE(r.readInt(&type) && type == 1);
  EXPECT_TRUE(r.readInt(&msgid));
  answer.msgid = static_cast<uint32_t>(msgid);
  bool is_error = r.peekType() == msgpack::Type::kMap;
  if (!is_error) {
    EXPECT_TRUE(r.readNil());
  }
  uint32_t entries = 0;
  EXPECT_TRUE(r.readMapHeader(&entries));
  for (uint32_t i = 0; i < entries; ++i) {
    std::string_view name;
    EXPECT_TRUE(r.readStr(&name));
    switch (r.peekType()) {
      case msgpack::Type::kBool: {
        bool value = false;
        r.readBool(&value);
        answer.bools[std::string(name)] = value;
        break;
      }
      case msgpack::Type::kInt: {
        int64_t value = 0;
        r.readInt(&value);
        answer.ints[std::string(name)] = value;
        break;
      }
      case msgpack::Type::kStr: {
        std::string_view value;
        r.readStr(&value);
        if (is_error && name == "code") answer.error = value;
        if (is_error && name == "message") answer.message = value;
        answer.strs[std::string(name)] = value;
        break;
      }
      default: r.skip(16, 1024);
    }
  }
  EXPECT_TRUE(r.ok());
  return answer;
}

}  // namespace sluice
