// frame.js: where a MessagePack value ends in a byte buffer. A response
// frame has no length prefix: it ends where its value ends. frameEnd() finds
// that end by reading headers only (no decoding, no allocation, no
// recursion), trusting no declared length beyond `maxBytes`, so a frame can
// be handed whole to the decoder and a partial one left for the next read.

import { SluiceError } from "./errors.js";

/**
 * The offset just past the MessagePack value that starts at `start`, or -1
 * when bytes up to `end` hold only part of it.
 * Throws SluiceError EPROTO on a byte that starts no value (0xc1), and
 * ETOOLARGE when the value is, or declares itself, over `maxBytes`.
 * @param {Uint8Array} buf
 * @param {number} start
 * @param {number} end
 * @param {number} maxBytes
 * @returns {number}
 */
export function frameEnd(buf, start, end, maxBytes) {
  let pos = start;
  let values = 1; // values still to read, counting the elements of open containers
  const limit = start + maxBytes;
  while (values > 0) {
    if (pos >= end) {
      return -1;
    }
    const b = buf[pos];
    values--;
    if (b <= 0x7f || b >= 0xe0) { // positive and negative fixint
      pos += 1;
    } else if (b <= 0x8f) { // fixmap
      values += 2 * (b & 0x0f);
      pos += 1;
    } else if (b <= 0x9f) { // fixarray
      values += b & 0x0f;
      pos += 1;
    } else if (b <= 0xbf) { // fixstr
      pos += 1 + (b & 0x1f);
    } else {
      const size = sizedHeader(b);
      if (size === undefined) {
        throw new SluiceError("EPROTO", `malformed response from the daemon: byte 0x${b.toString(16)}`);
      }
      const [headerBytes, lengthBytes, kind] = size;
      if (pos + headerBytes > end) {
        return -1;
      }
      const n = lengthBytes === 0 ? 0 : readLength(buf, pos + 1, lengthBytes);
      if (kind === COUNT) {
        values += n;
      } else if (kind === PAIRS) {
        values += 2 * n;
      }
      pos += headerBytes + (kind === BYTES ? n : 0);
      if (values > maxBytes) {
        throw new SluiceError("ETOOLARGE", `response declares over ${maxBytes} elements`);
      }
    }
    if (pos > limit) {
      throw new SluiceError("ETOOLARGE", `response larger than ${maxBytes} bytes`);
    }
  }
  return pos <= end ? pos : -1;
}

const FIXED = 0; // header and payload of a fixed size
const BYTES = 1; // str, bin, ext: a length of payload bytes follows the header
const COUNT = 2; // array: a count of elements
const PAIRS = 3; // map: a count of key-value pairs

// For each header byte 0xc0..0xdf: [bytes of the header (with a fixed
// payload), bytes of its length field, kind]; undefined for 0xc1.
const SIZED = (() => {
  const t = new Array(0x20);
  const set = (b, header, length, kind) => { t[b - 0xc0] = [header, length, kind]; };
  set(0xc0, 1, 0, FIXED); set(0xc2, 1, 0, FIXED); set(0xc3, 1, 0, FIXED); // nil, false, true
  set(0xc4, 2, 1, BYTES); set(0xc5, 3, 2, BYTES); set(0xc6, 5, 4, BYTES); // bin 8/16/32
  set(0xc7, 3, 1, BYTES); set(0xc8, 4, 2, BYTES); set(0xc9, 6, 4, BYTES); // ext 8/16/32 (+ type)
  set(0xca, 5, 0, FIXED); set(0xcb, 9, 0, FIXED); // float 32/64
  set(0xcc, 2, 0, FIXED); set(0xcd, 3, 0, FIXED); set(0xce, 5, 0, FIXED); set(0xcf, 9, 0, FIXED);
  set(0xd0, 2, 0, FIXED); set(0xd1, 3, 0, FIXED); set(0xd2, 5, 0, FIXED); set(0xd3, 9, 0, FIXED);
  set(0xd4, 3, 0, FIXED); set(0xd5, 4, 0, FIXED); set(0xd6, 6, 0, FIXED); set(0xd7, 10, 0, FIXED);
  set(0xd8, 18, 0, FIXED); // fixext 1/2/4/8/16 (+ type)
  set(0xd9, 2, 1, BYTES); set(0xda, 3, 2, BYTES); set(0xdb, 5, 4, BYTES); // str 8/16/32
  set(0xdc, 3, 2, COUNT); set(0xdd, 5, 4, COUNT); // array 16/32
  set(0xde, 3, 2, PAIRS); set(0xdf, 5, 4, PAIRS); // map 16/32
  return t;
})();

function sizedHeader(b) {
  return SIZED[b - 0xc0];
}

function readLength(buf, at, bytes) {
  if (bytes === 1) {
    return buf[at];
  }
  if (bytes === 2) {
    return (buf[at] << 8) | buf[at + 1];
  }
  return ((buf[at] << 24) >>> 0) + ((buf[at + 1] << 16) | (buf[at + 2] << 8) | buf[at + 3]);
}
