// MessagePack reading and writing for the wire protocol, bounded and
// allocation-free on the read side.
//
// Reader is a cursor over bytes that are already in memory (a connection's
// read buffer). It never reads past the end, never allocates, never recurses
// and never trusts a declared length: a value that would end past the bytes
// so far reports kIncomplete (wait for more bytes), and one that would end
// more than `max_bytes` after `data` reports kTooLarge, whether or not the
// bytes are there. An array of n elements (a map of n entries) is taken to
// need at least n (2n) more bytes, so a header that declares 4 Gi elements
// fails at once, before anything is reserved or walked. kTooLarge wins over
// kIncomplete. Strings are returned as views into the buffer. The first
// failure sticks: every later read fails too, and the offset stays where the
// failing value began or inside it.
//
// Writer appends encoded values to a std::string the caller owns, always in
// the smallest encoding, as the MessagePack spec asks (byte for byte what
// msgpack-c's packer writes; doubles are always float64). Strings, bins,
// arrays and maps must be shorter than 2^32. The put* functions below are
// its encodings, into a buffer the caller sized (a message of bounded size
// staged on the stack and appended once); Writer appends what they write.
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

class Reader;

// Progress of Reader::skipResumable() through one value, so that a frame
// arriving a few bytes at a time is looked at once in all, not once per read.
struct SkipState {
  bool started = false;
  size_t offset = 0;        // where the next value header starts
  uint32_t depth = 0;       // containers open
  uint64_t items_left = 0;  // of max_items
  uint64_t values_left[128];  // per open container; 128 = Reader::kMaxSkipDepth
};

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
  // Any integer encoding at all: its value is *bits, in two's complement
  // when *negative.
  bool readAnyInt(uint64_t* bits, bool* negative);
  bool readArrayHeader(uint32_t* count);
  bool readMapHeader(uint32_t* count);
  bool readStr(std::string_view* value);
  // A str or a bin value: keys may be sent either way.
  bool readStrOrBin(std::string_view* value);
  // Skips one whole value of any type (ext and float included) without
  // recursion. Depth counts containers: a scalar has depth 0, [1] depth 1,
  // [[]] depth 2; a container that would make the depth exceed max_depth
  // fails with kTooDeep even when it is empty. More than max_items array
  // elements plus map entries in all fails with kTooLarge. max_depth is
  // capped at kMaxSkipDepth.
  bool skip(uint32_t max_depth, uint32_t max_items);

  // skip() in steps: when the value is cut off (kIncomplete), `state` keeps
  // how far it got, and a later call with a Reader over the same bytes plus
  // more goes on from there. The Reader must start where the value starts.
  // Returns true once the value is complete (offset() is then its end).
  bool skipResumable(SkipState* state, uint32_t max_depth, uint32_t max_items);

  // The deepest nesting skip() walks (its stack is fixed, on the C++ stack).
  static constexpr uint32_t kMaxSkipDepth = 128;

 private:
  // One decoded value header. Scalars (nil, bool, int, float) are consumed
  // whole; for str, bin and ext the cursor stops at the payload, whose
  // `length` bytes are known to be present; for array and map it stops at
  // the first element and `length` is the element or entry count.
  struct Header {
    Type type = Type::kInvalid;
    uint64_t length = 0;
    int64_t int_value = 0;   // kInt (when !int_overflow), kBool (0 or 1)
    bool int_overflow = false;  // a uint64 above INT64_MAX
  };

  bool fail(Status status);
  // Whether `bytes` more bytes from offset() are present; fails otherwise.
  bool need(uint64_t bytes);
  bool readHeader(Header* header);

  const uint8_t* data_;
  size_t size_;
  size_t max_bytes_;
  size_t offset_ = 0;
  Status status_ = Status::kOk;
};

// The most bytes one put*() of an integer or a header writes.
inline constexpr size_t kMaxScalarBytes = 9;

// Writes `tag` and the low `width` bytes of `value`, big-endian, at `at`;
// returns the end.
inline char* putTagged(char* at, uint8_t tag, uint64_t value, int width) {
  at[0] = static_cast<char>(tag);
  for (int i = 0; i < width; ++i) {
    at[1 + i] = static_cast<char>(value >> (8 * (width - 1 - i)));
  }
  return at + 1 + width;
}

// A str, bin, array or map header: the fixed form when `fix_limit` > 0 and
// length < fix_limit, else the 8 (when tag8 != 0), 16 or 32-bit form.
inline char* putLength(char* at, uint64_t length, uint8_t fix_tag, uint64_t fix_limit,
                       uint8_t tag8, uint8_t tag16, uint8_t tag32) {
  if (length < fix_limit) {
    *at = static_cast<char>(fix_tag | length);
    return at + 1;
  }
  if (tag8 != 0 && length <= 0xff) return putTagged(at, tag8, length, 1);
  if (length <= 0xffff) return putTagged(at, tag16, length, 2);
  return putTagged(at, tag32, length, 4);
}

inline char* putUint(char* at, uint64_t value) {
  if (value <= 0x7f) {
    *at = static_cast<char>(value);
    return at + 1;
  }
  if (value <= 0xff) return putTagged(at, 0xcc, value, 1);
  if (value <= 0xffff) return putTagged(at, 0xcd, value, 2);
  if (value <= 0xffffffff) return putTagged(at, 0xce, value, 4);
  return putTagged(at, 0xcf, value, 8);
}

inline char* putInt(char* at, int64_t value) {
  if (value >= 0) return putUint(at, static_cast<uint64_t>(value));
  if (value >= -32) {
    *at = static_cast<char>(value);  // negative fixint: 0xe0..0xff
    return at + 1;
  }
  if (value >= INT8_MIN) return putTagged(at, 0xd0, static_cast<uint64_t>(value), 1);
  if (value >= INT16_MIN) return putTagged(at, 0xd1, static_cast<uint64_t>(value), 2);
  if (value >= INT32_MIN) return putTagged(at, 0xd2, static_cast<uint64_t>(value), 4);
  return putTagged(at, 0xd3, static_cast<uint64_t>(value), 8);
}

inline char* putBool(char* at, bool value) {
  *at = static_cast<char>(value ? 0xc3 : 0xc2);
  return at + 1;
}

inline char* putNil(char* at) {
  *at = static_cast<char>(0xc0);
  return at + 1;
}

inline char* putStrHeader(char* at, uint64_t length) {
  return putLength(at, length, 0xa0, 32, 0xd9, 0xda, 0xdb);
}
inline char* putBinHeader(char* at, uint64_t length) {
  return putLength(at, length, 0, 0, 0xc4, 0xc5, 0xc6);
}
inline char* putArrayHeader(char* at, uint32_t count) {
  return putLength(at, count, 0x90, 16, 0, 0xdc, 0xdd);
}
inline char* putMapHeader(char* at, uint32_t count) {
  return putLength(at, count, 0x80, 16, 0, 0xde, 0xdf);
}

// A str of `value` (its header and its bytes): room for
// kMaxScalarBytes + value.size() bytes at `at`.
inline char* putStr(char* at, std::string_view value) {
  at = putStrHeader(at, value.size());
  for (char c : value) *at++ = c;
  return at;
}

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
