"""errors.py: the exceptions of the sluice client, one class per failure of
libsluice's error table (client/include/sluice.h) that a Python caller can
meet. Every one is a SluiceError, whose `code` is a stable string: the
daemon's own code ("UNKNOWN_RULE", "BAD_REQUEST", ...) for a ServerError, the
libsluice name without its prefix ("ETIMEDOUT", ...) for the others.
Invalid arguments raise ValueError or TypeError, as Python code expects.

Which failures mean "the daemon is unreachable" (UNREACHABLE below) matters:
those are the ones a client's on_unreachable policy answers for acquires.
"""


class SluiceError(Exception):
    """Base class; `code` says which failure it is."""

    code = "EUNKNOWN"


class ConnectError(SluiceError, ConnectionError):
    """The daemon's socket cannot be connected to (missing, refused)."""

    code = "ECONNECT"


class CallTimeout(SluiceError, TimeoutError):
    """The call was not answered within its timeout. The connection stays
    open: a late answer is matched by its msgid and discarded."""

    code = "ETIMEDOUT"


class ConnectionClosed(SluiceError, ConnectionError):
    """The connection died (the daemon restarted, closed it, or a socket
    error) after some byte of the request was written, so the request is not
    sent again: the daemon may have acted on it. The next call reconnects."""

    code = "ECLOSED"


class ProtocolError(SluiceError):
    """The daemon's answer is not a well-formed response of the contract."""

    code = "EPROTO"


class ServerError(SluiceError):
    """The daemon answered with an error map: `code` and `message` are its."""

    def __init__(self, code, message):
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message


class UnknownReservation(ServerError):
    """settle or cancel of an id the daemon holds no open reservation under
    (settled, cancelled, expired, never opened, or another daemon's): the
    daemon's UNKNOWN_RESERVATION."""


# The daemon's codes that raise a subclass of ServerError.
SERVER_ERRORS = {"UNKNOWN_RESERVATION": UnknownReservation}

UNREACHABLE = (ConnectError, CallTimeout, ConnectionClosed)
