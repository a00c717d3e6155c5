/* codec.h: libsluice's own MessagePack encoder and bounded decoder (internal).
 *
 * The encoder writes into memory the caller has already reserved: each
 * mp_put_* takes a write pointer and returns it advanced, so a request is
 * encoded with one capacity check and no per-value branches. MP_MAX_HEADER
 * bounds what one header (the type byte plus its length or integer) needs.
 *
 * The decoder never trusts a length from the wire: every read is checked
 * against the end of the buffer, and mp_frame_size() finds where one value
 * ends without recursion, refusing values larger than the given cap.
 *
 * Pure functions over bytes: no I/O, no allocation except in sluice_buf.
 * Symbols here are hidden from libsluice.so (see client/CMakeLists.txt).
 */
#ifndef SLUICE_CODEC_H
#define SLUICE_CODEC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A growable byte buffer. `failed` is sticky: once a growth fails, later
 * appends are dropped and the owner reports SLUICE_ENOMEM. */
typedef struct sluice_buf {
  uint8_t* data;
  size_t len;
  size_t cap;
  int failed;
} sluice_buf;

/* Makes room for `extra` more bytes; returns a pointer to data + len, or
 * NULL (and sets `failed`) when memory runs out. */
uint8_t* sluice_buf_reserve(sluice_buf* buf, size_t extra);
void sluice_buf_append(sluice_buf* buf, const void* bytes, size_t n);
void sluice_buf_append_str(sluice_buf* buf, const char* text);
void sluice_buf_free(sluice_buf* buf);

/* --- encoder ------------------------------------------------------------ */

/* The most bytes any single header or scalar takes (uint64: 1 + 8). */
#define MP_MAX_HEADER 9u

uint8_t* mp_put_nil(uint8_t* p);
uint8_t* mp_put_bool(uint8_t* p, int value);
uint8_t* mp_put_uint(uint8_t* p, uint64_t value);
uint8_t* mp_put_int(uint8_t* p, int64_t value);
uint8_t* mp_put_array(uint8_t* p, uint32_t count);
uint8_t* mp_put_map(uint8_t* p, uint32_t count);
uint8_t* mp_put_str(uint8_t* p, const void* bytes, uint32_t len);
uint8_t* mp_put_bin(uint8_t* p, const void* bytes, uint32_t len);

/* 1 when bytes[0..len) is well-formed UTF-8 (NUL included), else 0. */
int mp_is_utf8(const uint8_t* bytes, size_t len);

/* --- decoder ------------------------------------------------------------ */

typedef enum mp_type {
  MP_NIL,
  MP_BOOL,
  MP_UINT, /* non-negative integer, in v.u */
  MP_INT,  /* negative integer, in v.i */
  MP_FLOAT,
  MP_STR,
  MP_BIN,
  MP_ARRAY, /* v.count elements follow */
  MP_MAP,   /* v.count key/value pairs follow */
  MP_EXT    /* v.bytes holds the data; ext_type the type */
} mp_type;

typedef struct mp_value {
  mp_type type;
  int8_t ext_type;
  union {
    int boolean;
    uint64_t u;
    int64_t i;
    double f;
    uint32_t count;
    struct {
      const uint8_t* ptr;
      uint32_t len;
    } bytes;
  } v;
} mp_value;

/* A read cursor over [p, end). Any failed read sets `error` and leaves the
 * cursor where it was; callers may check `error` once at the end. */
typedef struct mp_reader {
  const uint8_t* p;
  const uint8_t* end;
  int error;
} mp_reader;

void mp_reader_init(mp_reader* r, const void* data, size_t len);
/* Reads one value's header: scalars whole, str/bin/ext with their bytes,
 * arrays and maps as their count only. Returns 0, or -1 on bad/short input. */
int mp_read(mp_reader* r, mp_value* out);
/* Skips one complete value, nested ones included. Returns 0 or -1. */
int mp_skip(mp_reader* r);
/* Typed reads; -1 (and `error`) when the next value has another type. An
 * integer read accepts either sign encoding that fits. */
int mp_read_int(mp_reader* r, int64_t* out);
int mp_read_uint(mp_reader* r, uint64_t* out);
/* A str or bin value. */
int mp_read_bytes(mp_reader* r, const uint8_t** ptr, uint32_t* len);
/* 1 when bytes ptr[0..len) spell the non-empty string literal `lit`, else 0
 * (the "" makes anything but a literal a compile error). Its length is
 * sizeof(lit) - 1, a compile-time constant, so the check costs a length
 * compare, then a first-byte compare, and only when both match a fixed-size
 * memcmp that the compiler inlines. */
#define MP_BYTES_ARE(ptr, len, lit)                                    \
  ((len) == sizeof("" lit) - 1 && (ptr)[0] == (uint8_t)(lit)[0] && \
   memcmp((ptr), (lit), sizeof(lit) - 1) == 0)

/* Where the first complete value in data[0..len) ends.
 * Returns 1 and *size when complete, 0 when more bytes are needed, -1 when
 * the bytes are not MessagePack, -2 when the value is or must become larger
 * than max_size bytes. Never reads past len; iterative, so depth cannot
 * exhaust the stack. */
int mp_frame_size(const uint8_t* data, size_t len, size_t max_size, size_t* size);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_CODEC_H */
