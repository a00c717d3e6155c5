// sluice-client: the Node.js client of the sluiced rate-limiting daemon.
export {
  Client, DEFAULT_SOCKET, DEFAULT_TIMEOUT_MS, DEFAULT_TTL_MS, MAX_RESPONSE_BYTES, MAX_UNSENT_BYTES,
} from "./src/client.js";
export { ERROR_STATUS, ServerError, SluiceError, UnknownReservationError } from "./src/errors.js";
export { formatHeaders } from "./src/headers.js";
export { rateLimit } from "./src/middleware.js";
