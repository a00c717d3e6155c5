/* json.c: MessagePack to JSON text (see json.h). */
#include "json.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>

void sluice_json_append_string(sluice_buf* out, const uint8_t* bytes, size_t len) {
  static const char hex[] = "0123456789abcdef";
  sluice_buf_append(out, "\"", 1);
  for (size_t i = 0; i < len; i++) {
    uint8_t c = bytes[i];
    if (c == '"' || c == '\\') {
      char esc[2] = {'\\', (char)c};
      sluice_buf_append(out, esc, 2);
    } else if (c >= 0x20 && c < 0x7f) {
      sluice_buf_append(out, &c, 1);
    } else {
      char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
      sluice_buf_append(out, esc, sizeof esc);
    }
  }
  sluice_buf_append(out, "\"", 1);
}

int sluice_json_append(mp_reader* r, sluice_buf* out, int depth) {
  if (depth > SLUICE_JSON_MAX_DEPTH) {
    return -1;
  }
  mp_value v;
  if (mp_read(r, &v) != 0) {
    return -1;
  }
  char number[40];
  switch (v.type) {
    case MP_NIL:
    case MP_EXT: /* no JSON form; the daemon sends none */
      sluice_buf_append_str(out, "null");
      return 0;
    case MP_BOOL:
      sluice_buf_append_str(out, v.v.boolean ? "true" : "false");
      return 0;
    case MP_UINT:
      snprintf(number, sizeof number, "%" PRIu64, v.v.u);
      sluice_buf_append_str(out, number);
      return 0;
    case MP_INT:
      snprintf(number, sizeof number, "%" PRId64, v.v.i);
      sluice_buf_append_str(out, number);
      return 0;
    case MP_FLOAT:
      if (isfinite(v.v.f)) {
        snprintf(number, sizeof number, "%.17g", v.v.f);
        sluice_buf_append_str(out, number);
      } else {
        sluice_buf_append_str(out, "null");
      }
      return 0;
    case MP_STR:
    case MP_BIN:
      sluice_json_append_string(out, v.v.bytes.ptr, v.v.bytes.len);
      return 0;
    case MP_ARRAY:
      sluice_buf_append(out, "[", 1);
      for (uint32_t i = 0; i < v.v.count; i++) {
        if (i > 0) {
          sluice_buf_append(out, ",", 1);
        }
        if (sluice_json_append(r, out, depth + 1) != 0) {
          return -1;
        }
      }
      sluice_buf_append(out, "]", 1);
      return 0;
    case MP_MAP:
      sluice_buf_append(out, "{", 1);
      for (uint32_t i = 0; i < v.v.count; i++) {
        if (i > 0) {
          sluice_buf_append(out, ",", 1);
        }
        const uint8_t* key;
        uint32_t key_len;
        if (mp_read_bytes(r, &key, &key_len) == 0) {
          sluice_json_append_string(out, key, key_len);
        } else {
          /* A non-string key: its JSON text, quoted, so the object stays valid. */
          r->error = 0;
          sluice_buf key_json = {0};
          int rc = sluice_json_append(r, &key_json, depth + 1);
          int failed = key_json.failed;
          if (rc == 0 && !failed) {
            sluice_json_append_string(out, key_json.data, key_json.len);
          }
          sluice_buf_free(&key_json);
          if (rc != 0) {
            return -1;
          }
          if (failed) {
            out->failed = 1;
          }
        }
        sluice_buf_append(out, ":", 1);
        if (sluice_json_append(r, out, depth + 1) != 0) {
          return -1;
        }
      }
      sluice_buf_append(out, "}", 1);
      return 0;
  }
  return -1;
}
