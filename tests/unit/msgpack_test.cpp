// Tests for msgpack::Reader and msgpack::Writer, cross-checked against
// msgpack-c's packer (Debian libmsgpack-cxx-dev, header-only).
#include "msgpack.h"

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

// msgpack-c only needs Boost for a few adaptors we do not use; without this
// the header fails on hosts that lack Boost.
#define MSGPACK_NO_BOOST
#include <msgpack.hpp>

namespace sluice::msgpack {
namespace {

using Bytes = std::vector<uint8_t>;

Bytes toBytes(const ::msgpack::sbuffer& buffer) {
  const auto* data = reinterpret_cast<const uint8_t*>(buffer.data());
  return Bytes(data, data + buffer.size());
}

Bytes toBytes(const std::string& text) { return Bytes(text.begin(), text.end()); }

// What msgpack-c's packer writes for one value.
template <typename Pack>
Bytes packed(Pack pack) {
  ::msgpack::sbuffer buffer;
  ::msgpack::packer<::msgpack::sbuffer> packer(&buffer);
  pack(packer);
  return toBytes(buffer);
}

// What our Writer writes for one value.
template <typename Write>
Bytes written(Write write) {
  std::string out;
  Writer writer(&out);
  write(writer);
  return toBytes(out);
}

Reader readerOf(const Bytes& bytes, size_t max_bytes = 1 << 30) {
  return Reader(bytes.data(), bytes.size(), max_bytes);
}

constexpr int64_t kIntBoundaries[] = {
    0,         1,       127,        128,         255,        256,        65535, 65536, int64_t{UINT32_MAX},
    int64_t{UINT32_MAX} + 1, -1,    -32,         -33,        -128,       -129,  -32768, -32769,
    int64_t{INT32_MIN},      int64_t{INT32_MIN} - 1, INT64_MIN, INT64_MAX,
};

// Verifies that every integer encoding boundary is written in the same
// (smallest) form as msgpack-c and reads back to the same value.
TEST(MsgpackTest, IntegersAtEveryBoundaryMatchMsgpackCAndRoundTrip) {
  for (int64_t value : kIntBoundaries) {
    SCOPED_TRACE(value);
    const Bytes bytes = written([&](Writer& w) { w.writeInt(value); });
    EXPECT_EQ(bytes, packed([&](auto& p) { p.pack_int64(value); }));
    Reader reader = readerOf(bytes);
    EXPECT_EQ(reader.peekType(), Type::kInt);
    int64_t read = 0;
    ASSERT_TRUE(reader.readInt(&read));
    EXPECT_EQ(read, value);
    EXPECT_EQ(reader.offset(), bytes.size());
  }
}

// Verifies that unsigned values, up to UINT64_MAX, match msgpack-c.
TEST(MsgpackTest, UnsignedIntegersMatchMsgpackC) {
  for (uint64_t value : {uint64_t{0}, uint64_t{127}, uint64_t{128}, uint64_t{255}, uint64_t{256}, uint64_t{65535},
                         uint64_t{65536}, uint64_t{UINT32_MAX}, uint64_t{UINT32_MAX} + 1, uint64_t{INT64_MAX},
                         uint64_t{INT64_MAX} + 1, UINT64_MAX}) {
    SCOPED_TRACE(value);
    EXPECT_EQ(written([&](Writer& w) { w.writeUint(value); }), packed([&](auto& p) { p.pack_uint64(value); }));
  }
}

// Verifies that readInt reads the non-canonical encodings other packers use
// (e.g. 1 as int64, -1 as int8).
TEST(MsgpackTest, ReadIntAcceptsWideEncodingsOfSmallValues) {
  const struct {
    Bytes bytes;
    int64_t value;
  } cases[] = {
      {{0xd3, 0, 0, 0, 0, 0, 0, 0, 1}, 1},
      {{0xcf, 0, 0, 0, 0, 0, 0, 0, 1}, 1},
      {{0xd0, 0xff}, -1},
      {{0xd1, 0x00, 0x05}, 5},
      {{0xce, 0, 0, 0, 0}, 0},
  };
  for (const auto& c : cases) {
    Reader reader = readerOf(c.bytes);
    int64_t value = 0;
    ASSERT_TRUE(reader.readInt(&value));
    EXPECT_EQ(value, c.value);
  }
}

// Verifies that a uint64 above INT64_MAX is refused by readInt (it does not
// fit) but can still be skipped.
TEST(MsgpackTest, ReadIntRejectsUint64AboveInt64Max) {
  const Bytes bytes = packed([](auto& p) { p.pack_uint64(uint64_t{INT64_MAX} + 1); });
  Reader reader = readerOf(bytes);
  int64_t value = 0;
  EXPECT_FALSE(reader.readInt(&value));
  EXPECT_EQ(reader.status(), Status::kInvalid);
  Reader skipper = readerOf(bytes);
  EXPECT_TRUE(skipper.skip(1, 1));
  EXPECT_EQ(skipper.offset(), bytes.size());
}

constexpr size_t kLengthBoundaries[] = {0, 1, 31, 32, 255, 256, 65535, 65536};

// Verifies that strings at every length boundary match msgpack-c and read
// back as views of the exact bytes.
TEST(MsgpackTest, StringsAtEveryLengthBoundaryMatchMsgpackCAndRoundTrip) {
  for (size_t length : kLengthBoundaries) {
    SCOPED_TRACE(length);
    std::string text(length, 'x');
    if (length > 0) text[length / 2] = '\0';
    const Bytes bytes = written([&](Writer& w) { w.writeStr(text); });
    EXPECT_EQ(bytes, packed([&](auto& p) {
                p.pack_str(static_cast<uint32_t>(length));
                p.pack_str_body(text.data(), static_cast<uint32_t>(length));
              }));
    Reader reader = readerOf(bytes);
    EXPECT_EQ(reader.peekType(), Type::kStr);
    std::string_view view;
    ASSERT_TRUE(reader.readStr(&view));
    EXPECT_EQ(view, text);
    EXPECT_EQ(reader.offset(), bytes.size());
  }
}

// Verifies that bins at every length boundary match msgpack-c; readStrOrBin
// accepts them and readStr does not.
TEST(MsgpackTest, BinsMatchMsgpackCAndOnlyReadStrOrBinAcceptsThem) {
  for (size_t length : kLengthBoundaries) {
    SCOPED_TRACE(length);
    const std::string data(length, '\x01');
    const Bytes bytes = written([&](Writer& w) { w.writeBin(data); });
    EXPECT_EQ(bytes, packed([&](auto& p) {
                p.pack_bin(static_cast<uint32_t>(length));
                p.pack_bin_body(data.data(), static_cast<uint32_t>(length));
              }));
    Reader reader = readerOf(bytes);
    EXPECT_EQ(reader.peekType(), Type::kBin);
    std::string_view view;
    ASSERT_TRUE(reader.readStrOrBin(&view));
    EXPECT_EQ(view, data);
    Reader strict = readerOf(bytes);
    EXPECT_FALSE(strict.readStr(&view));
    EXPECT_EQ(strict.status(), Status::kInvalid);
  }
}

// Verifies that readStrOrBin accepts a str too.
TEST(MsgpackTest, ReadStrOrBinAcceptsAStr) {
  const Bytes bytes = written([](Writer& w) { w.writeStr("user:{42}"); });
  Reader reader = readerOf(bytes);
  std::string_view view;
  ASSERT_TRUE(reader.readStrOrBin(&view));
  EXPECT_EQ(view, "user:{42}");
}

// Verifies that array and map headers at every count boundary match
// msgpack-c, and that a complete container reads back its count and skips
// whole.
TEST(MsgpackTest, ArraysAndMapsAtEveryCountBoundaryMatchMsgpackCAndRoundTrip) {
  for (uint32_t count : {0u, 1u, 15u, 16u, 65535u, 65536u}) {
    SCOPED_TRACE(count);
    Bytes array = written([&](Writer& w) { w.writeArrayHeader(count); });
    EXPECT_EQ(array, packed([&](auto& p) { p.pack_array(count); }));
    array.insert(array.end(), count, 0xc0);
    Reader reader = readerOf(array);
    uint32_t read = 0;
    ASSERT_TRUE(reader.readArrayHeader(&read));
    EXPECT_EQ(read, count);
    Reader skipper = readerOf(array);
    ASSERT_TRUE(skipper.skip(1, count));
    EXPECT_EQ(skipper.offset(), array.size());

    Bytes map = written([&](Writer& w) { w.writeMapHeader(count); });
    EXPECT_EQ(map, packed([&](auto& p) { p.pack_map(count); }));
    map.insert(map.end(), 2 * size_t{count}, 0x01);
    Reader map_reader = readerOf(map);
    ASSERT_TRUE(map_reader.readMapHeader(&read));
    EXPECT_EQ(read, count);
    Reader map_skipper = readerOf(map);
    ASSERT_TRUE(map_skipper.skip(1, count));
    EXPECT_EQ(map_skipper.offset(), map.size());
  }
}

// Verifies nil, booleans and doubles against msgpack-c and the typed reads.
TEST(MsgpackTest, NilBoolAndDoubleMatchMsgpackC) {
  EXPECT_EQ(written([](Writer& w) { w.writeNil(); }), packed([](auto& p) { p.pack_nil(); }));
  EXPECT_EQ(written([](Writer& w) { w.writeBool(true); }), packed([](auto& p) { p.pack_true(); }));
  EXPECT_EQ(written([](Writer& w) { w.writeBool(false); }), packed([](auto& p) { p.pack_false(); }));
  // msgpack-c packs an integral double as an int; a Writer's double is
  // always float64, so compare fractional values only.
  for (double value : {-1.5, 0.1, 3.25e-10, std::numeric_limits<double>::infinity()}) {
    EXPECT_EQ(written([&](Writer& w) { w.writeDouble(value); }), packed([&](auto& p) { p.pack_double(value); }));
  }
  EXPECT_EQ(written([](Writer& w) { w.writeDouble(2.0); }), (Bytes{0xcb, 0x40, 0, 0, 0, 0, 0, 0, 0}));
  const Bytes bytes = {0xc0, 0xc3, 0xc2};
  Reader reader = readerOf(bytes);
  bool value = false;
  EXPECT_TRUE(reader.readNil());
  EXPECT_TRUE(reader.readBool(&value));
  EXPECT_TRUE(value);
  EXPECT_TRUE(reader.readBool(&value));
  EXPECT_FALSE(value);
  EXPECT_EQ(reader.peekType(), Type::kEnd);
}

// Verifies peekType for the first byte of every family.
TEST(MsgpackTest, PeekTypeNamesEveryFamily) {
  const struct {
    uint8_t byte;
    Type type;
  } cases[] = {
      {0x00, Type::kInt},   {0x7f, Type::kInt},   {0xe0, Type::kInt},   {0xcc, Type::kInt},   {0xd3, Type::kInt},
      {0x80, Type::kMap},   {0xde, Type::kMap},   {0xdf, Type::kMap},   {0x90, Type::kArray}, {0xdc, Type::kArray},
      {0xdd, Type::kArray}, {0xa0, Type::kStr},   {0xbf, Type::kStr},   {0xd9, Type::kStr},   {0xdb, Type::kStr},
      {0xc4, Type::kBin},   {0xc6, Type::kBin},   {0xc7, Type::kExt},   {0xd4, Type::kExt},   {0xd8, Type::kExt},
      {0xca, Type::kFloat}, {0xcb, Type::kFloat}, {0xc0, Type::kNil},   {0xc2, Type::kBool},  {0xc1, Type::kInvalid},
  };
  for (const auto& c : cases) {
    const Bytes bytes = {c.byte};
    EXPECT_EQ(readerOf(bytes).peekType(), c.type) << std::hex << int{c.byte};
  }
}

// One value with every encoding in it, packed by msgpack-c.
Bytes everyEncoding() {
  return packed([](auto& p) {
    p.pack_array(23);
    p.pack_nil();
    p.pack_true();
    p.pack_int64(5);
    p.pack_int64(-5);
    p.pack_int64(200);
    p.pack_int64(-200);
    p.pack_int64(70000);
    p.pack_int64(-70000);
    p.pack_int64(INT64_MIN);
    p.pack_uint64(UINT64_MAX);
    p.pack_float(1.5f);
    p.pack_double(2.5);
    p.pack_str(40);
    p.pack_str_body(std::string(40, 's').data(), 40);
    p.pack_str(300);
    p.pack_str_body(std::string(300, 't').data(), 300);
    p.pack_bin(3);
    p.pack_bin_body("\x00\x01\x02", 3);
    for (uint32_t length : {1u, 2u, 4u, 8u, 16u, 3u, 300u}) {  // fixext 1..16, ext8, ext16
      p.pack_ext(length, 7);
      p.pack_ext_body(std::string(length, 'e').data(), length);
    }
    p.pack_map(2);
    p.pack_str(1);
    p.pack_str_body("k", 1);
    p.pack_array(17);
    for (int i = 0; i < 17; ++i) p.pack_int64(i);
    p.pack_str(1);
    p.pack_str_body("m", 1);
    p.pack_map(0);
  });
}

// Verifies that skip() walks every encoding, ext types included, and stops
// exactly at the end of the value.
TEST(MsgpackTest, SkipWalksEveryEncodingExactly) {
  Bytes bytes = everyEncoding();
  const size_t size = bytes.size();
  bytes.push_back(0x2a);  // the next value must not be touched
  Reader reader = readerOf(bytes);
  ASSERT_TRUE(reader.skip(3, 100));
  EXPECT_EQ(reader.offset(), size);
  int64_t next = 0;
  ASSERT_TRUE(reader.readInt(&next));
  EXPECT_EQ(next, 42);
}

// Verifies that every strict prefix of a valid value reports kIncomplete,
// never kOk and never a read past the end (each prefix is its own heap
// allocation so ASan sees an over-read).
TEST(MsgpackTest, EveryPrefixOfAValidValueIsIncomplete) {
  const Bytes bytes = everyEncoding();
  for (size_t length = 0; length < bytes.size(); ++length) {
    const Bytes prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(length));
    Reader reader = readerOf(prefix);
    EXPECT_FALSE(reader.skip(3, 100)) << length;
    EXPECT_EQ(reader.status(), Status::kIncomplete) << length;
  }
}

// Verifies that skipResumable, fed one more byte at a time, keeps its place:
// it is incomplete until the last byte, never goes backwards, and ends exactly
// where skip() ends, so a trickling frame is walked once, not once per byte.
TEST(MsgpackTest, SkipResumableFedByteByByteEndsWhereSkipEnds) {
  const Bytes bytes = everyEncoding();
  SkipState state;
  size_t last_offset = 0;
  for (size_t length = 0; length < bytes.size(); ++length) {
    const Bytes prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(length));
    Reader reader = readerOf(prefix);
    ASSERT_FALSE(reader.skipResumable(&state, 3, 100)) << length;
    ASSERT_EQ(reader.status(), Status::kIncomplete) << length;
    EXPECT_GE(state.offset, last_offset) << length;
    last_offset = state.offset;
  }
  EXPECT_GT(last_offset, bytes.size() / 2);  // progress was kept, not redone
  Reader reader = readerOf(bytes);
  ASSERT_TRUE(reader.skipResumable(&state, 3, 100));
  EXPECT_EQ(reader.offset(), bytes.size());
}

// Verifies that every strict prefix of each scalar encoding is kIncomplete
// for the typed reads too.
TEST(MsgpackTest, EveryPrefixOfAScalarIsIncompleteForTypedReads) {
  for (int64_t value : kIntBoundaries) {
    const Bytes bytes = written([&](Writer& w) { w.writeInt(value); });
    for (size_t length = 0; length < bytes.size(); ++length) {
      const Bytes prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(length));
      Reader reader = readerOf(prefix);
      int64_t read = 0;
      EXPECT_FALSE(reader.readInt(&read));
      EXPECT_EQ(reader.status(), Status::kIncomplete) << value << " cut at " << length;
    }
  }
  for (size_t text_length : {3u, 40u, 300u, 70000u}) {
    const Bytes bytes = written([&](Writer& w) { w.writeStr(std::string(text_length, 'a')); });
    for (size_t length : {size_t{0}, size_t{1}, size_t{2}, bytes.size() - 1}) {
      const Bytes prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(length));
      Reader reader = readerOf(prefix);
      std::string_view view;
      EXPECT_FALSE(reader.readStr(&view));
      EXPECT_EQ(reader.status(), Status::kIncomplete) << text_length << " cut at " << length;
    }
  }
}

// Verifies that a declared length or count of ~4 GiB in five bytes is
// refused as kTooLarge at once, before any allocation or walk, by the
// typed reads and by skip().
TEST(MsgpackTest, DeclaredLengthsOfFourGibAreTooLarge) {
  const Bytes cases[] = {
      {0xdb, 0xff, 0xff, 0xff, 0xff},        // str32
      {0xc6, 0xff, 0xff, 0xff, 0xff},        // bin32
      {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01},  // ext32
      {0xdd, 0xff, 0xff, 0xff, 0xff},        // array32
      {0xdf, 0xff, 0xff, 0xff, 0xff},        // map32
      {0xdf, 0x80, 0x00, 0x00, 0x00},        // map32 of 2^31 entries: 2^32 bytes at least
  };
  for (const Bytes& bytes : cases) {
    SCOPED_TRACE(std::hex);
    SCOPED_TRACE(int{bytes[0]});
    Reader skipper = readerOf(bytes, 64 * 1024);
    EXPECT_FALSE(skipper.skip(16, UINT32_MAX));
    EXPECT_EQ(skipper.status(), Status::kTooLarge);
    Reader typed = readerOf(bytes, 64 * 1024);
    std::string_view view;
    uint32_t count = 0;
    switch (bytes[0]) {
      case 0xdb:
      case 0xc6: EXPECT_FALSE(typed.readStrOrBin(&view)); break;
      case 0xdd: EXPECT_FALSE(typed.readArrayHeader(&count)); break;
      case 0xdf: EXPECT_FALSE(typed.readMapHeader(&count)); break;
      default: EXPECT_FALSE(typed.skip(1, 1)); break;
    }
    EXPECT_EQ(typed.status(), Status::kTooLarge);
  }
}

// Verifies where kTooLarge starts: a value may end exactly at max_bytes; one
// byte more is too large even when the bytes are all there; a shorter value
// that is merely cut off is kIncomplete.
TEST(MsgpackTest, MaxBytesBoundsTheEndOfEveryValue) {
  const Bytes bytes = written([](Writer& w) { w.writeStr(std::string(100, 'a')); });  // 102 bytes
  std::string_view view;
  Reader fits = readerOf(bytes, 102);
  EXPECT_TRUE(fits.readStr(&view));
  Reader too_large = readerOf(bytes, 101);
  EXPECT_FALSE(too_large.readStr(&view));
  EXPECT_EQ(too_large.status(), Status::kTooLarge);
  const Bytes cut(bytes.begin(), bytes.begin() + 50);
  Reader incomplete = readerOf(cut, 102);
  EXPECT_FALSE(incomplete.readStr(&view));
  EXPECT_EQ(incomplete.status(), Status::kIncomplete);
  // An array header claiming more elements than bytes left: wait, or refuse
  // when even one byte per element cannot fit.
  const Bytes array = {0xdc, 0x00, 0x64, 0xc0};  // 100 elements, 1 present
  uint32_t count = 0;
  Reader waits = readerOf(array, 103);
  EXPECT_FALSE(waits.readArrayHeader(&count));
  EXPECT_EQ(waits.status(), Status::kIncomplete);
  Reader refuses = readerOf(array, 102);
  EXPECT_FALSE(refuses.readArrayHeader(&count));
  EXPECT_EQ(refuses.status(), Status::kTooLarge);
}

// Verifies that 0xc1 (never used) is kInvalid wherever it appears.
TEST(MsgpackTest, ByteC1IsInvalidEverywhere) {
  const Bytes alone = {0xc1};
  int64_t value = 0;
  std::string_view view;
  Reader as_int = readerOf(alone);
  EXPECT_FALSE(as_int.readInt(&value));
  EXPECT_EQ(as_int.status(), Status::kInvalid);
  Reader as_str = readerOf(alone);
  EXPECT_FALSE(as_str.readStr(&view));
  EXPECT_EQ(as_str.status(), Status::kInvalid);
  Reader skipped = readerOf(alone);
  EXPECT_FALSE(skipped.skip(4, 4));
  EXPECT_EQ(skipped.status(), Status::kInvalid);
  const Bytes inside = {0x92, 0x01, 0x81, 0xa1, 'k', 0xc1};
  Reader deep = readerOf(inside);
  EXPECT_FALSE(deep.skip(4, 4));
  EXPECT_EQ(deep.status(), Status::kInvalid);
}

// Verifies that reading the wrong type is kInvalid and that the first
// failure sticks.
TEST(MsgpackTest, AWrongTypeIsInvalidAndTheFailureSticks) {
  const Bytes bytes = {0x05, 0x06};
  Reader reader = readerOf(bytes);
  std::string_view view;
  EXPECT_FALSE(reader.readStr(&view));
  EXPECT_EQ(reader.status(), Status::kInvalid);
  int64_t value = 0;
  EXPECT_FALSE(reader.readInt(&value));
  EXPECT_EQ(reader.peekType(), Type::kInvalid);
  EXPECT_EQ(reader.status(), Status::kInvalid);
}

Bytes nested(size_t depth) {
  Bytes bytes(depth, 0x91);  // [[[...]]]
  bytes.push_back(0xc0);
  return bytes;
}

// Verifies the depth rule of skip(): max_depth containers pass, one more is
// kTooDeep, even when the innermost one is empty.
TEST(MsgpackTest, SkipAllowsExactlyMaxDepthContainers) {
  const Bytes one = {0x01};
  Reader scalar = readerOf(one);
  EXPECT_TRUE(scalar.skip(0, 0));
  const Bytes depth16 = nested(16);
  Reader fits = readerOf(depth16);
  EXPECT_TRUE(fits.skip(16, 100));
  const Bytes depth17 = nested(17);
  Reader too_deep = readerOf(depth17);
  EXPECT_FALSE(too_deep.skip(16, 100));
  EXPECT_EQ(too_deep.status(), Status::kTooDeep);
  const Bytes empty_inner_bytes = {0x91, 0x90};  // [[]]
  Reader empty_inner = readerOf(empty_inner_bytes);
  EXPECT_FALSE(empty_inner.skip(1, 100));
  EXPECT_EQ(empty_inner.status(), Status::kTooDeep);
  // Depth comes back down after a container closes: [[1], [2]] is depth 2.
  const Bytes siblings_bytes = {0x92, 0x91, 0x01, 0x91, 0x02};
  Reader siblings = readerOf(siblings_bytes);
  EXPECT_TRUE(siblings.skip(2, 100));
  EXPECT_EQ(siblings.offset(), 5u);
}

// Verifies that 100,000-deep nesting is refused after reading only
// max_depth + 1 headers, quickly, without recursion.
TEST(MsgpackTest, SkipRefusesHundredThousandDeepNestingQuickly) {
  const Bytes bytes = nested(100'000);
  const auto start = std::chrono::steady_clock::now();
  Reader reader = readerOf(bytes);
  EXPECT_FALSE(reader.skip(16, UINT32_MAX));
  EXPECT_EQ(reader.status(), Status::kTooDeep);
  EXPECT_LE(reader.offset(), 17u);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
  // A larger max_depth is capped, so the walk stays bounded.
  Reader capped = readerOf(bytes);
  EXPECT_FALSE(capped.skip(UINT32_MAX, UINT32_MAX));
  EXPECT_EQ(capped.status(), Status::kTooDeep);
  EXPECT_LE(capped.offset(), Reader::kMaxSkipDepth + 1);
}

// Verifies that skip() counts array elements plus map entries across all
// levels against max_items.
TEST(MsgpackTest, SkipCountsElementsAndEntriesAgainstMaxItems) {
  // [1, 2, {"a": 3}] holds 3 elements plus 1 entry.
  const Bytes bytes = {0x93, 0x01, 0x02, 0x81, 0xa1, 'a', 0x03};
  Reader fits = readerOf(bytes);
  EXPECT_TRUE(fits.skip(4, 4));
  EXPECT_EQ(fits.offset(), bytes.size());
  Reader too_many = readerOf(bytes);
  EXPECT_FALSE(too_many.skip(4, 3));
  EXPECT_EQ(too_many.status(), Status::kTooLarge);
}

// Verifies that a Writer appends and never clears what is already there.
TEST(MsgpackTest, WriterAppendsToTheCallersString) {
  std::string out = "x";
  Writer writer(&out);
  writer.writeArrayHeader(2);
  writer.writeInt(-1);
  writer.writeStr("ab");
  EXPECT_EQ(out, std::string("x\x92\xff\xa2" "ab"));
}

}  // namespace
}  // namespace sluice::msgpack
