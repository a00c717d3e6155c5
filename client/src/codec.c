/* codec.c: the MessagePack encoder and bounded decoder of libsluice (see codec.h). */
#include "codec.h"

#include <stdlib.h>
#include <string.h>

/* ---- sluice_buf ---------------------------------------------------------- */

uint8_t* sluice_buf_reserve(sluice_buf* buf, size_t extra) {
  if (buf->failed) {
    return NULL;
  }
  if (extra > SIZE_MAX / 2 - buf->len) {
    buf->failed = 1;
    return NULL;
  }
  if (buf->cap - buf->len < extra) {
    size_t cap = buf->cap ? buf->cap : 256;
    while (cap - buf->len < extra) {
      cap *= 2;
    }
    uint8_t* data = (uint8_t*)realloc(buf->data, cap);
    if (data == NULL) {
      buf->failed = 1;
      return NULL;
    }
    buf->data = data;
    buf->cap = cap;
  }
  return buf->data + buf->len;
}

void sluice_buf_append(sluice_buf* buf, const void* bytes, size_t n) {
  uint8_t* p = sluice_buf_reserve(buf, n);
  if (p != NULL && n > 0) {
    memcpy(p, bytes, n);
    buf->len += n;
  }
}

void sluice_buf_append_str(sluice_buf* buf, const char* text) {
  sluice_buf_append(buf, text, strlen(text));
}

void sluice_buf_free(sluice_buf* buf) {
  free(buf->data);
  memset(buf, 0, sizeof *buf);
}

/* ---- encoder ------------------------------------------------------------- */

static uint8_t* put_be(uint8_t* p, uint64_t value, int bytes) {
  for (int i = bytes - 1; i >= 0; i--) {
    *p++ = (uint8_t)(value >> (8 * i));
  }
  return p;
}

uint8_t* mp_put_nil(uint8_t* p) {
  *p++ = 0xc0;
  return p;
}

uint8_t* mp_put_bool(uint8_t* p, int value) {
  *p++ = value ? 0xc3 : 0xc2;
  return p;
}

uint8_t* mp_put_uint(uint8_t* p, uint64_t value) {
  if (value < 128) {
    *p++ = (uint8_t)value;
  } else if (value <= UINT8_MAX) {
    *p++ = 0xcc;
    p = put_be(p, value, 1);
  } else if (value <= UINT16_MAX) {
    *p++ = 0xcd;
    p = put_be(p, value, 2);
  } else if (value <= UINT32_MAX) {
    *p++ = 0xce;
    p = put_be(p, value, 4);
  } else {
    *p++ = 0xcf;
    p = put_be(p, value, 8);
  }
  return p;
}

uint8_t* mp_put_int(uint8_t* p, int64_t value) {
  if (value >= 0) {
    return mp_put_uint(p, (uint64_t)value);
  }
  if (value >= -32) {
    *p++ = (uint8_t)(int8_t)value;
  } else if (value >= INT8_MIN) {
    *p++ = 0xd0;
    p = put_be(p, (uint64_t)value, 1);
  } else if (value >= INT16_MIN) {
    *p++ = 0xd1;
    p = put_be(p, (uint64_t)value, 2);
  } else if (value >= INT32_MIN) {
    *p++ = 0xd2;
    p = put_be(p, (uint64_t)value, 4);
  } else {
    *p++ = 0xd3;
    p = put_be(p, (uint64_t)value, 8);
  }
  return p;
}

static uint8_t* put_container(uint8_t* p, uint32_t count, uint8_t fix, uint8_t c16) {
  if (count < 16) {
    *p++ = (uint8_t)(fix | count);
  } else if (count <= UINT16_MAX) {
    *p++ = c16;
    p = put_be(p, count, 2);
  } else {
    *p++ = (uint8_t)(c16 + 1);
    p = put_be(p, count, 4);
  }
  return p;
}

uint8_t* mp_put_array(uint8_t* p, uint32_t count) { return put_container(p, count, 0x90, 0xdc); }

uint8_t* mp_put_map(uint8_t* p, uint32_t count) { return put_container(p, count, 0x80, 0xde); }

uint8_t* mp_put_str(uint8_t* p, const void* bytes, uint32_t len) {
  if (len < 32) {
    *p++ = (uint8_t)(0xa0 | len);
  } else if (len <= UINT8_MAX) {
    *p++ = 0xd9;
    p = put_be(p, len, 1);
  } else if (len <= UINT16_MAX) {
    *p++ = 0xda;
    p = put_be(p, len, 2);
  } else {
    *p++ = 0xdb;
    p = put_be(p, len, 4);
  }
  if (len > 0) {
    memcpy(p, bytes, len);
  }
  return p + len;
}

uint8_t* mp_put_bin(uint8_t* p, const void* bytes, uint32_t len) {
  if (len <= UINT8_MAX) {
    *p++ = 0xc4;
    p = put_be(p, len, 1);
  } else if (len <= UINT16_MAX) {
    *p++ = 0xc5;
    p = put_be(p, len, 2);
  } else {
    *p++ = 0xc6;
    p = put_be(p, len, 4);
  }
  if (len > 0) {
    memcpy(p, bytes, len);
  }
  return p + len;
}

int mp_is_utf8(const uint8_t* s, size_t len) {
  size_t i = 0;
  while (i < len) {
    uint8_t c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t n;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      n = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return 0;
    }
    if (len - i <= n) {
      return 0;
    }
    for (size_t k = 1; k <= n; k++) {
      if ((s[i + k] & 0xc0) != 0x80) {
        return 0;
      }
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    /* Overlong forms, surrogates and values past U+10FFFF are not UTF-8. */
    static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      return 0;
    }
    i += n + 1;
  }
  return 1;
}

/* ---- decoder ------------------------------------------------------------- */

static uint64_t get_be(const uint8_t* p, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; i++) {
    value = (value << 8) | p[i];
  }
  return value;
}

/* Decodes the header at p. Returns 1 with *header (bytes of the header) and
 * *payload (bytes of str/bin/ext data that follow it), 0 when avail is too
 * short for the header, -1 for the never-used byte 0xc1. */
static int parse_header(const uint8_t* p, size_t avail, mp_value* v, size_t* header,
                        uint32_t* payload) {
  if (avail == 0) {
    return 0;
  }
  uint8_t b = p[0];
  *payload = 0;
  v->ext_type = 0;
  if (b <= 0x7f) {
    v->type = MP_UINT;
    v->v.u = b;
    *header = 1;
    return 1;
  }
  if (b >= 0xe0) {
    v->type = MP_INT;
    v->v.i = (int8_t)b;
    *header = 1;
    return 1;
  }
  if (b >= 0x80 && b <= 0x8f) {
    v->type = MP_MAP;
    v->v.count = b & 0x0f;
    *header = 1;
    return 1;
  }
  if (b >= 0x90 && b <= 0x9f) {
    v->type = MP_ARRAY;
    v->v.count = b & 0x0f;
    *header = 1;
    return 1;
  }
  if (b >= 0xa0 && b <= 0xbf) {
    v->type = MP_STR;
    *payload = b & 0x1f;
    *header = 1;
    return 1;
  }
  /* Every other type: a fixed-size field of `width` bytes after the type byte. */
  int width;
  switch (b) {
    case 0xc0: case 0xc2: case 0xc3: width = 0; break;
    case 0xc4: case 0xcc: case 0xd0: case 0xd9: width = 1; break;
    case 0xc5: case 0xcd: case 0xd1: case 0xda: case 0xdc: case 0xde: width = 2; break;
    case 0xc6: case 0xca: case 0xce: case 0xd2: case 0xdb: case 0xdd: case 0xdf: width = 4; break;
    case 0xcb: case 0xcf: case 0xd3: width = 8; break;
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: width = 1; break; /* fixext: type */
    case 0xc7: width = 2; break;                                             /* ext8: len, type */
    case 0xc8: width = 3; break;
    case 0xc9: width = 5; break;
    default: return -1; /* 0xc1 */
  }
  if (avail < (size_t)1 + (size_t)width) {
    return 0;
  }
  *header = 1 + (size_t)width;
  const uint8_t* f = p + 1;
  switch (b) {
    case 0xc0: v->type = MP_NIL; break;
    case 0xc2: case 0xc3: v->type = MP_BOOL; v->v.boolean = b == 0xc3; break;
    case 0xcc: case 0xcd: case 0xce: case 0xcf:
      v->type = MP_UINT;
      v->v.u = get_be(f, width);
      break;
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
      uint64_t raw = get_be(f, width);
      int shift = 64 - 8 * width;
      /* Sign-extend the width-byte two's-complement value. */
      int64_t value = (int64_t)(raw << shift) >> shift;
      if (value >= 0) {
        v->type = MP_UINT;
        v->v.u = (uint64_t)value;
      } else {
        v->type = MP_INT;
        v->v.i = value;
      }
      break;
    }
    case 0xca: {
      uint32_t bits = (uint32_t)get_be(f, 4);
      float value;
      memcpy(&value, &bits, sizeof value);
      v->type = MP_FLOAT;
      v->v.f = value;
      break;
    }
    case 0xcb: {
      uint64_t bits = get_be(f, 8);
      double value;
      memcpy(&value, &bits, sizeof value);
      v->type = MP_FLOAT;
      v->v.f = value;
      break;
    }
    case 0xc4: case 0xc5: case 0xc6:
      v->type = MP_BIN;
      *payload = (uint32_t)get_be(f, width);
      break;
    case 0xd9: case 0xda: case 0xdb:
      v->type = MP_STR;
      *payload = (uint32_t)get_be(f, width);
      break;
    case 0xdc: case 0xdd:
      v->type = MP_ARRAY;
      v->v.count = (uint32_t)get_be(f, width);
      break;
    case 0xde: case 0xdf:
      v->type = MP_MAP;
      v->v.count = (uint32_t)get_be(f, width);
      break;
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
      v->type = MP_EXT;
      v->ext_type = (int8_t)f[0];
      *payload = 1u << (b - 0xd4);
      break;
    default: /* ext 8/16/32: length, then type */
      v->type = MP_EXT;
      *payload = (uint32_t)get_be(f, width - 1);
      v->ext_type = (int8_t)f[width - 1];
      break;
  }
  return 1;
}

void mp_reader_init(mp_reader* r, const void* data, size_t len) {
  r->p = (const uint8_t*)data;
  r->end = r->p + len;
  r->error = 0;
}

int mp_read(mp_reader* r, mp_value* out) {
  size_t header;
  uint32_t payload;
  size_t avail = (size_t)(r->end - r->p);
  if (r->error || parse_header(r->p, avail, out, &header, &payload) != 1 ||
      avail - header < payload) {
    r->error = 1;
    return -1;
  }
  if (out->type == MP_STR || out->type == MP_BIN || out->type == MP_EXT) {
    out->v.bytes.ptr = r->p + header;
    out->v.bytes.len = payload;
  }
  r->p += header + payload;
  return 0;
}

int mp_skip(mp_reader* r) {
  /* Values still to skip; each takes at least one byte, so a count larger
   * than the bytes left is malformed input, not a reason to loop. */
  uint64_t pending = 1;
  while (pending > 0) {
    mp_value v;
    if (mp_read(r, &v) != 0) {
      return -1;
    }
    pending--;
    if (v.type == MP_ARRAY) {
      pending += v.v.count;
    } else if (v.type == MP_MAP) {
      pending += 2 * (uint64_t)v.v.count;
    }
    if (pending > (uint64_t)(r->end - r->p)) {
      r->error = 1;
      return -1;
    }
  }
  return 0;
}

/* The typed reads below first try the one-byte forms a decision is made of
 * (positive fixint, fixstr), checked against the end like any other read. */

int mp_read_int(mp_reader* r, int64_t* out) {
  if (!r->error && r->p < r->end && *r->p <= 0x7f) {
    *out = *r->p++;
    return 0;
  }
  const uint8_t* start = r->p;
  mp_value v;
  if (mp_read(r, &v) != 0) {
    return -1;
  }
  if (v.type == MP_INT) {
    *out = v.v.i;
    return 0;
  }
  if (v.type == MP_UINT && v.v.u <= (uint64_t)INT64_MAX) {
    *out = (int64_t)v.v.u;
    return 0;
  }
  r->p = start;
  r->error = 1;
  return -1;
}

int mp_read_uint(mp_reader* r, uint64_t* out) {
  if (!r->error && r->p < r->end && *r->p <= 0x7f) {
    *out = *r->p++;
    return 0;
  }
  const uint8_t* start = r->p;
  mp_value v;
  if (mp_read(r, &v) != 0) {
    return -1;
  }
  if (v.type == MP_UINT) {
    *out = v.v.u;
    return 0;
  }
  r->p = start;
  r->error = 1;
  return -1;
}

int mp_read_bytes(mp_reader* r, const uint8_t** ptr, uint32_t* len) {
  if (!r->error && r->p < r->end && (*r->p & 0xe0) == 0xa0 &&
      (size_t)(r->end - r->p) > (size_t)(*r->p & 0x1f)) {
    *len = *r->p & 0x1f; /* fixstr: the bytes follow the type byte */
    *ptr = r->p + 1;
    r->p += 1 + *len;
    return 0;
  }
  const uint8_t* start = r->p;
  mp_value v;
  if (mp_read(r, &v) != 0) {
    return -1;
  }
  if (v.type == MP_STR || v.type == MP_BIN) {
    *ptr = v.v.bytes.ptr;
    *len = v.v.bytes.len;
    return 0;
  }
  r->p = start;
  r->error = 1;
  return -1;
}

int mp_frame_size(const uint8_t* data, size_t len, size_t max_size, size_t* size) {
  size_t pos = 0;
  uint64_t pending = 1;
  while (pending > 0) {
    mp_value v;
    size_t header;
    uint32_t payload;
    int rc = parse_header(data + pos, len - pos, &v, &header, &payload);
    if (rc < 0) {
      return -1;
    }
    if (rc == 0) {
      /* Even the rest of this header would not fit under the cap. */
      return pos + pending > max_size ? -2 : 0;
    }
    pending--;
    if (v.type == MP_ARRAY) {
      pending += v.v.count;
    } else if (v.type == MP_MAP) {
      pending += 2 * (uint64_t)v.v.count;
    }
    /* The value ends at least here: header, payload, one byte per pending value. */
    uint64_t least_end = (uint64_t)pos + header + payload + pending;
    if (least_end > max_size) {
      return -2;
    }
    if (pos + header + payload > len) {
      return 0;
    }
    pos += header + payload;
  }
  *size = pos;
  return 1;
}
