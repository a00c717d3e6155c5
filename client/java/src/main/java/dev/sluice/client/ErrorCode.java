package dev.sluice.client;

/**
 * The error codes of libsluice (sluice.h's SLUICE_ERRNO_MAP), with the same
 * values and texts, so that logs read alike across languages.
 */
public enum ErrorCode {
  EINVAL(-1, "invalid argument"),
  ENOMEM(-2, "out of memory"),
  ECONNECT(-3, "cannot connect to the daemon socket"),
  ETIMEDOUT(-4, "timed out"),
  ECLOSED(-5, "connection closed by the daemon"),
  EIO(-6, "socket I/O error"),
  EPROTO(-7, "malformed response from the daemon"),
  ETOOLARGE(-8, "response larger than SLUICE_MAX_RESPONSE_BYTES"),
  ESERVER(-9, "the daemon answered with an error"),
  EBUSY(-10, "a synchronous call while pipelined requests are in flight"),
  ENOSPC(-11, "output buffer too small");

  private final int value;
  private final String text;

  ErrorCode(int value, String text) {
    this.value = value;
    this.text = text;
  }

  /** The C value, e.g. -4 for ETIMEDOUT. */
  public int value() {
    return value;
  }

  /** sluice_strerror's text. */
  public String text() {
    return text;
  }

  /** sluice_err_name's name, e.g. "SLUICE_ETIMEDOUT". */
  public String cName() {
    return "SLUICE_" + name();
  }

  /**
   * Whether the code means the daemon could not be reached or did not answer
   * (the failures the unreachable-daemon policy decides for): ECONNECT,
   * ETIMEDOUT, ECLOSED, EIO, EPROTO, ETOOLARGE.
   */
  public boolean unreachable() {
    switch (this) {
      case ECONNECT:
      case ETIMEDOUT:
      case ECLOSED:
      case EIO:
      case EPROTO:
      case ETOOLARGE:
        return true;
      default:
        return false;
    }
  }
}
