package dev.sluice.client;

/**
 * A failed call: {@link #code()} is one of libsluice's codes; for
 * {@link ErrorCode#ESERVER} the daemon's error map is in
 * {@link #serverCode()} (e.g. "UNKNOWN_RULE") and {@link #serverMessage()}.
 * Unchecked, so that it travels through {@code CompletableFuture} stages and
 * lambdas as it is.
 */
public final class SluiceException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** The daemon's code for a settle or cancel of an id that is not open. */
  public static final String UNKNOWN_RESERVATION = "UNKNOWN_RESERVATION";

  private final ErrorCode code;
  private final String serverCode;
  private final String serverMessage;

  public SluiceException(ErrorCode code, String detail) {
    this(code, detail, "", "", null);
  }

  public SluiceException(ErrorCode code, String detail, Throwable cause) {
    this(code, detail, "", "", cause);
  }

  SluiceException(ErrorCode code, String detail, String serverCode, String serverMessage,
      Throwable cause) {
    super(code.cName() + ": " + (detail == null || detail.isEmpty() ? code.text() : detail), cause);
    this.code = code;
    this.serverCode = serverCode;
    this.serverMessage = serverMessage;
  }

  static SluiceException server(String serverCode, String serverMessage) {
    return new SluiceException(ErrorCode.ESERVER, serverCode + ": " + serverMessage, serverCode,
        serverMessage, null);
  }

  public ErrorCode code() {
    return code;
  }

  /** The daemon's `code` for ESERVER ("" otherwise or when it sent none). */
  public String serverCode() {
    return serverCode;
  }

  /**
   * Whether the daemon answered UNKNOWN_RESERVATION: the id of a settle or
   * cancel is not open (settled, cancelled, expired, never opened, or
   * another daemon's).
   */
  public boolean unknownReservation() {
    return code == ErrorCode.ESERVER && UNKNOWN_RESERVATION.equals(serverCode);
  }

  /** The daemon's `message` for ESERVER ("" otherwise or when it sent none). */
  public String serverMessage() {
    return serverMessage;
  }
}
