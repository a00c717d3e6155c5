// MessagePack reading and writing: the bounded Reader and the smallest-form
// Writer declared in msgpack.h. Every tag of the spec is decoded in one
// place, Reader::readHeader, so the typed reads and skip() agree on lengths
// and bounds.
#include "msgpack.h"

#include <bit>

namespace sluice::msgpack {
namespace {

uint16_t load16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }

uint32_t load32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) << 24 | static_cast<uint32_t>(p[1]) << 16 |
         static_cast<uint32_t>(p[2]) << 8 | static_cast<uint32_t>(p[3]);
}

uint64_t load64(const uint8_t* p) { return static_cast<uint64_t>(load32(p)) << 32 | load32(p + 4); }

}  // namespace

Reader::Reader(const uint8_t* data, size_t size, size_t max_bytes)
    : data_(data), size_(size), max_bytes_(max_bytes) {}

bool Reader::fail(Status status) {
  if (status_ == Status::kOk) status_ = status;
  return false;
}

bool Reader::need(uint64_t bytes) {
  // kTooLarge first: a value that can never fit must not wait for bytes.
  if (offset_ > max_bytes_ || bytes > max_bytes_ - offset_) return fail(Status::kTooLarge);
  if (bytes > size_ - offset_) return fail(Status::kIncomplete);
  return true;
}

Type Reader::peekType() const {
  if (status_ != Status::kOk) return Type::kInvalid;
  if (offset_ >= size_) return Type::kEnd;
  const uint8_t tag = data_[offset_];
  if (tag <= 0x7f || tag >= 0xe0) return Type::kInt;
  if (tag <= 0x8f) return Type::kMap;
  if (tag <= 0x9f) return Type::kArray;
  if (tag <= 0xbf) return Type::kStr;
  switch (tag) {
    case 0xc0: return Type::kNil;
    case 0xc2:
    case 0xc3: return Type::kBool;
    case 0xc4:
    case 0xc5:
    case 0xc6: return Type::kBin;
    case 0xc7:
    case 0xc8:
    case 0xc9: return Type::kExt;
    case 0xca:
    case 0xcb: return Type::kFloat;
    case 0xd4:
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8: return Type::kExt;
    case 0xd9:
    case 0xda:
    case 0xdb: return Type::kStr;
    case 0xdc:
    case 0xdd: return Type::kArray;
    case 0xde:
    case 0xdf: return Type::kMap;
    default: break;
  }
  if (tag >= 0xcc && tag <= 0xd3) return Type::kInt;
  return Type::kInvalid;  // 0xc1, never used
}

bool Reader::readHeader(Header* header) {
  if (status_ != Status::kOk || !need(1)) return false;
  const uint8_t* p = data_ + offset_;
  const uint8_t tag = p[0];
  header->int_overflow = false;

  // Fixed-size families first: they are the common case on the wire.
  if (tag <= 0x7f) {
    header->type = Type::kInt;
    header->int_value = tag;
    offset_ += 1;
    return true;
  }
  if (tag >= 0xe0) {
    header->type = Type::kInt;
    header->int_value = static_cast<int8_t>(tag);
    offset_ += 1;
    return true;
  }
  if (tag <= 0xbf) {
    if (tag <= 0x8f) {
      header->type = Type::kMap;
      header->length = tag & 0x0f;
    } else if (tag <= 0x9f) {
      header->type = Type::kArray;
      header->length = tag & 0x0f;
    } else {
      header->type = Type::kStr;
      header->length = tag & 0x1f;
    }
    offset_ += 1;
  } else {
    // Scalars with a body: `body` bytes after the tag, consumed here.
    size_t body = 0;
    // Lengths and counts: a `width`-byte big-endian field after the tag, plus
    // `extra` payload bytes (the ext type byte).
    size_t width = 0;
    uint64_t extra = 0;
    switch (tag) {
      case 0xc0: header->type = Type::kNil; break;
      case 0xc2:
      case 0xc3:
        header->type = Type::kBool;
        header->int_value = tag & 1;
        break;
      case 0xc4: header->type = Type::kBin; width = 1; break;
      case 0xc5: header->type = Type::kBin; width = 2; break;
      case 0xc6: header->type = Type::kBin; width = 4; break;
      case 0xc7: header->type = Type::kExt; width = 1; extra = 1; break;
      case 0xc8: header->type = Type::kExt; width = 2; extra = 1; break;
      case 0xc9: header->type = Type::kExt; width = 4; extra = 1; break;
      case 0xca: header->type = Type::kFloat; body = 4; break;
      case 0xcb: header->type = Type::kFloat; body = 8; break;
      case 0xcc: header->type = Type::kInt; body = 1; break;
      case 0xcd: header->type = Type::kInt; body = 2; break;
      case 0xce: header->type = Type::kInt; body = 4; break;
      case 0xcf: header->type = Type::kInt; body = 8; break;
      case 0xd0: header->type = Type::kInt; body = 1; break;
      case 0xd1: header->type = Type::kInt; body = 2; break;
      case 0xd2: header->type = Type::kInt; body = 4; break;
      case 0xd3: header->type = Type::kInt; body = 8; break;
      // fixext 1, 2, 4, 8, 16: a type byte and 2^(tag-0xd4) data bytes.
      case 0xd4:
      case 0xd5:
      case 0xd6:
      case 0xd7:
      case 0xd8:
        header->type = Type::kExt;
        extra = 1 + (uint64_t{1} << (tag - 0xd4));
        break;
      case 0xd9: header->type = Type::kStr; width = 1; break;
      case 0xda: header->type = Type::kStr; width = 2; break;
      case 0xdb: header->type = Type::kStr; width = 4; break;
      case 0xdc: header->type = Type::kArray; width = 2; break;
      case 0xdd: header->type = Type::kArray; width = 4; break;
      case 0xde: header->type = Type::kMap; width = 2; break;
      case 0xdf: header->type = Type::kMap; width = 4; break;
      default: return fail(Status::kInvalid);  // 0xc1
    }
    if (body != 0) {
      if (!need(1 + body)) return false;
      const uint8_t* b = p + 1;
      switch (tag) {
        case 0xcc: header->int_value = b[0]; break;
        case 0xcd: header->int_value = load16(b); break;
        case 0xce: header->int_value = load32(b); break;
        case 0xcf: {
          const uint64_t value = load64(b);
          header->int_overflow = value > static_cast<uint64_t>(INT64_MAX);
          header->int_value = static_cast<int64_t>(value);
          break;
        }
        case 0xd0: header->int_value = static_cast<int8_t>(b[0]); break;
        case 0xd1: header->int_value = static_cast<int16_t>(load16(b)); break;
        case 0xd2: header->int_value = static_cast<int32_t>(load32(b)); break;
        case 0xd3: header->int_value = static_cast<int64_t>(load64(b)); break;
        default: break;  // floats: the value is never needed
      }
      offset_ += 1 + body;
      return true;
    }
    if (width == 0 && extra == 0) {  // nil, bool
      offset_ += 1;
      return true;
    }
    if (!need(1 + width)) return false;
    uint64_t length = 0;
    switch (width) {
      case 1: length = p[1]; break;
      case 2: length = load16(p + 1); break;
      case 4: length = load32(p + 1); break;
      default: break;
    }
    header->length = length + extra;
    offset_ += 1 + width;
  }

  // A declared length is checked against the bytes before anyone uses it. An
  // array element takes at least one byte, a map entry two.
  uint64_t least_bytes = header->length;
  if (header->type == Type::kMap) least_bytes *= 2;
  return need(least_bytes);
}

bool Reader::readNil() {
  Header header;
  if (!readHeader(&header)) return false;
  return header.type == Type::kNil || fail(Status::kInvalid);
}

bool Reader::readBool(bool* value) {
  Header header;
  if (!readHeader(&header)) return false;
  if (header.type != Type::kBool) return fail(Status::kInvalid);
  *value = header.int_value != 0;
  return true;
}

bool Reader::readInt(int64_t* value) {
  Header header;
  if (!readHeader(&header)) return false;
  if (header.type != Type::kInt || header.int_overflow) return fail(Status::kInvalid);
  *value = header.int_value;
  return true;
}

bool Reader::readAnyInt(uint64_t* bits, bool* negative) {
  Header header;
  if (!readHeader(&header)) return false;
  if (header.type != Type::kInt) return fail(Status::kInvalid);
  *bits = static_cast<uint64_t>(header.int_value);
  *negative = !header.int_overflow && header.int_value < 0;
  return true;
}

bool Reader::readArrayHeader(uint32_t* count) {
  Header header;
  if (!readHeader(&header)) return false;
  if (header.type != Type::kArray) return fail(Status::kInvalid);
  *count = static_cast<uint32_t>(header.length);
  return true;
}

bool Reader::readMapHeader(uint32_t* count) {
  Header header;
  if (!readHeader(&header)) return false;
  if (header.type != Type::kMap) return fail(Status::kInvalid);
  *count = static_cast<uint32_t>(header.length);
  return true;
}

bool Reader::readStr(std::string_view* value) {
  Header header;
  if (!readHeader(&header)) return false;
  if (header.type != Type::kStr) return fail(Status::kInvalid);
  *value = std::string_view(reinterpret_cast<const char*>(data_ + offset_), header.length);
  offset_ += header.length;
  return true;
}

bool Reader::readStrOrBin(std::string_view* value) {
  Header header;
  if (!readHeader(&header)) return false;
  if (header.type != Type::kStr && header.type != Type::kBin) return fail(Status::kInvalid);
  *value = std::string_view(reinterpret_cast<const char*>(data_ + offset_), header.length);
  offset_ += header.length;
  return true;
}

bool Reader::skip(uint32_t max_depth, uint32_t max_items) {
  SkipState state;
  return skipResumable(&state, max_depth, max_items);
}

bool Reader::skipResumable(SkipState* state, uint32_t max_depth, uint32_t max_items) {
  static_assert(sizeof(state->values_left) / sizeof(state->values_left[0]) == kMaxSkipDepth);
  if (max_depth > kMaxSkipDepth) max_depth = kMaxSkipDepth;
  if (!state->started) {
    *state = SkipState{};
    state->started = true;
    state->offset = offset_;
    state->items_left = max_items;
  }
  offset_ = state->offset;
  // values_left[i]: values still to skip in the container open at depth i+1.
  uint64_t* values_left = state->values_left;
  for (;;) {
    Header header;
    if (!readHeader(&header)) return false;
    switch (header.type) {
      case Type::kStr:
      case Type::kBin:
      case Type::kExt:
        offset_ += header.length;  // present: readHeader checked
        break;
      case Type::kArray:
      case Type::kMap:
        if (state->depth >= max_depth) return fail(Status::kTooDeep);
        if (header.length > state->items_left) return fail(Status::kTooLarge);
        state->items_left -= header.length;
        if (header.length != 0) {
          values_left[state->depth++] =
              header.type == Type::kMap ? header.length * 2 : header.length;
        }
        break;
      default: break;  // scalars are consumed by readHeader
    }
    while (state->depth > 0 && values_left[state->depth - 1] == 0) --state->depth;
    state->offset = offset_;
    if (state->depth == 0) return true;
    --values_left[state->depth - 1];
  }
}

// Writer: each value is staged in a small stack buffer (the put* encodings,
// msgpack.h) and appended once.

void Writer::writeNil() { out_->push_back(static_cast<char>(0xc0)); }

void Writer::writeBool(bool value) { out_->push_back(static_cast<char>(value ? 0xc3 : 0xc2)); }

void Writer::writeUint(uint64_t value) {
  char buffer[kMaxScalarBytes];
  out_->append(buffer, static_cast<size_t>(putUint(buffer, value) - buffer));
}

void Writer::writeInt(int64_t value) {
  char buffer[kMaxScalarBytes];
  out_->append(buffer, static_cast<size_t>(putInt(buffer, value) - buffer));
}

void Writer::writeDouble(double value) {
  char buffer[kMaxScalarBytes];
  out_->append(buffer, static_cast<size_t>(
                           putTagged(buffer, 0xcb, std::bit_cast<uint64_t>(value), 8) - buffer));
}

void Writer::writeStr(std::string_view value) {
  char buffer[kMaxScalarBytes];
  out_->append(buffer, static_cast<size_t>(putStrHeader(buffer, value.size()) - buffer));
  out_->append(value);
}

void Writer::writeBin(std::string_view value) {
  char buffer[kMaxScalarBytes];
  out_->append(buffer, static_cast<size_t>(putBinHeader(buffer, value.size()) - buffer));
  out_->append(value);
}

void Writer::writeArrayHeader(uint32_t count) {
  char buffer[kMaxScalarBytes];
  out_->append(buffer, static_cast<size_t>(putArrayHeader(buffer, count) - buffer));
}

void Writer::writeMapHeader(uint32_t count) {
  char buffer[kMaxScalarBytes];
  out_->append(buffer, static_cast<size_t>(putMapHeader(buffer, count) - buffer));
}

}  // namespace sluice::msgpack
