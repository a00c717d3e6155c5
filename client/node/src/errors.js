// errors.js: the errors sluice-client rejects with. One table of codes, the
// same as libsluice's (client/include/sluice.h, SLUICE_ERRNO_MAP): a
// SluiceError carries `code`, the name there without its SLUICE_ prefix, and
// `status`, its number. A ServerError is the daemon's own answer: its `code`
// is the daemon's stable code ("UNKNOWN_RULE", "BAD_REQUEST", ...).

/** @type {Readonly<Record<string, number>>} */
export const ERROR_STATUS = Object.freeze({
  EINVAL: -1,
  ENOMEM: -2,
  ECONNECT: -3,
  ETIMEDOUT: -4,
  ECLOSED: -5,
  EIO: -6,
  EPROTO: -7,
  ETOOLARGE: -8,
  ESERVER: -9,
});

// The codes of a call that got no answer from the daemon: the connection
// could not be made, died, timed out or carried bytes that are not an answer.
// The unreachable-daemon policy (fail_open, fail_closed) applies to these.
const UNREACHABLE_CODES = new Set(["ECONNECT", "ETIMEDOUT", "ECLOSED", "EIO", "EPROTO", "ETOOLARGE"]);

export class SluiceError extends Error {
  /**
   * @param {string} code a key of ERROR_STATUS
   * @param {string} message
   * @param {{cause?: unknown}} [options]
   */
  constructor(code, message, options) {
    super(message, options);
    this.name = "SluiceError";
    this.code = code;
    this.status = ERROR_STATUS[code] ?? ERROR_STATUS.EIO;
  }

  /** Whether the call got no answer, so the unreachable-daemon policy applies. */
  get unreachable() {
    return UNREACHABLE_CODES.has(this.code);
  }
}

// The daemon answered the request with an error map {code, message}.
export class ServerError extends SluiceError {
  /**
   * @param {string} code the daemon's code, e.g. "UNKNOWN_RULE"
   * @param {string} message the daemon's message
   */
  constructor(code, message) {
    super("ESERVER", `${code}: ${message}`);
    this.name = "ServerError";
    this.code = code;
    this.serverMessage = message;
  }

  get unreachable() {
    return false;
  }
}

// settle or cancel of an id the daemon holds no open reservation under
// (settled, cancelled, expired, never opened, or another daemon's).
export class UnknownReservationError extends ServerError {
  constructor(code, message) {
    super(code, message);
    this.name = "UnknownReservationError";
  }
}
