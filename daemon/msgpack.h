// MessagePack reading and writing for the wire protocol, bounded and
// allocation-free on the read side.
//
// Reader is a cursor over bytes that are already in memory (a connection's
// read buffer). It never reads past the end, never allocates and never trusts
// a declared length: a string, array or map header that claims more than the
// bytes left reports kIncomplete (wait for more bytes), and one that could
// never fit in `max_bytes` reports kTooLarge. Strings are returned as views
// into the buffer. The first failure sticks: every later read fails too.
//
// Writer appends encoded values to a std::string the caller owns, always in
// the smallest encoding, as the MessagePack spec asks.
//
// Neither class is thread-safe; each connection has its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sluice::msgpack {

enum class Status {
  kOk,
  kIncomplete,  // the value continues past the end of the bytes so far
  kInvalid,     // bytes that are not MessagePack (0xc1), or a wrong type was read
  kTooLarge,    // a declared length or count that can never fit in max_bytes
  kTooDeep,     // nesting deeper than the limit given to skip()
};

// The family of the next value, from its first byte.
enum class Type { kNil, kBool, kInt, kFloat, kStr, kBin, kArray, kMap, kExt, kInvalid, kEnd };

class Reader {
 public:
  // max_bytes bounds every declared length (a frame cannot be larger).
  Reader(const uint8_t* data, size_t size, size_t max_bytes);

  Status status() const { return status_; }
  bool ok() const { return status_ == Status::kOk; }
  size_t offset() const { return offset_; }
  Type peekType() const;

  // Each read returns false and sets status() when the next value is not of
  // the asked type (kInvalid), is cut off (kIncomplete) or too large.
  bool readNil();
  bool readBool(bool* value);
  // Any integer encoding whose value fits in int64_t.
  bool readInt(int64_t* value);
  bool readArrayHeader(uint32_t* count);
  bool readMapHeader(uint32_t* count);
  bool readStr(std::string_view* value);
  // A str or a bin value: keys may be sent either way.
  bool readStrOrBin(std::string_view* value);
  // Skips one whole value of any type, nested at most max_depth deep, with at
  // most max_items array elements plus map entries in all.
  bool skip(uint32_t max_depth, uint32_t max_items);

 private:
  bool fail(Status status);
  bool need(size_t bytes);
  bool readLength(uint8_t tag, size_t* length);

  const uint8_t* data_;
  size_t size_;
  size_t max_bytes_;
  size_t offset_ = 0;
  Status status_ = Status::kOk;
};

class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}

  void writeNil();
  void writeBool(bool value);
  void writeInt(int64_t value);
  void writeUint(uint64_t value);
  void writeDouble(double value);
  void writeStr(std::string_view value);
  void writeBin(std::string_view value);
  void writeArrayHeader(uint32_t count);
  void writeMapHeader(uint32_t count);

 private:
  std::string* out_;
};

}  // namespace sluice::msgpack
