/* json.h: MessagePack to JSON text, for sluice_call_json and sluicectl (internal). */
#ifndef SLUICE_JSON_H
#define SLUICE_JSON_H

#include "codec.h"

/* The deepest nesting converted; deeper input is refused rather than
 * risking the stack on hostile bytes. */
#define SLUICE_JSON_MAX_DEPTH 64

/* Appends one value read from `r` to `out` as JSON. Returns 0, or -1 when the
 * input is malformed or too deep (out->failed reports memory exhaustion). */
int sluice_json_append(mp_reader* r, sluice_buf* out, int depth);

/* Appends `len` bytes as a quoted JSON string: printable ASCII as is, '"'
 * and '\' escaped, everything else as \u00XX (bytes, not code points). */
void sluice_json_append_string(sluice_buf* out, const uint8_t* bytes, size_t len);

#endif /* SLUICE_JSON_H */
