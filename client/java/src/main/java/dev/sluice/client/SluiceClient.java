package dev.sluice.client;

import java.io.IOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.math.BigInteger;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.ClosedSelectorException;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.LongAdder;
import org.msgpack.core.MessageFormat;
import org.msgpack.core.MessageInsufficientBufferException;
import org.msgpack.core.MessageIntegerOverflowException;
import org.msgpack.core.MessagePack;
import org.msgpack.core.MessagePackException;
import org.msgpack.core.MessageUnpacker;
import org.msgpack.core.buffer.MessageBuffer;
import org.msgpack.core.buffer.MessageBufferInput;
import org.msgpack.value.ValueType;

/**
 * A client of the sluiced daemon over its Unix socket, with libsluice's
 * contract (client/include/sluice.h): acquire, acquire_all, peek, release,
 * reset, reserve, settle, cancel, health, typed results and errors carrying
 * the daemon's code.
 *
 * <p>Thread-safety and pipelining: one instance is shared by any number of
 * threads. Every call is a request on one connection; many are in flight at
 * once and each answer is matched to its call by msgid (a 32-bit counter
 * that wraps). The {@code *Async} methods return a {@link CompletableFuture};
 * the others wait for it.
 *
 * <p>Threads: a caller encodes its request, then under {@code lock} takes a
 * msgid and appends the request to the connection's output. If no thread
 * is writing, a lone call (nothing else in flight) writes the output
 * itself; otherwise, and always for a call made in a callback on a reader
 * thread, the client's writer thread ("sluice-writer", started when
 * needed) writes, so that requests queued while it writes go out
 * together. A caller whose write is not done by its deadline (the daemon
 * is not reading) leaves the rest to the writer thread. Each connection has a reader thread
 * ("sluice-reader") that decodes answers and completes their futures (so
 * callbacks run there: do not block inside them); one timer thread per
 * client ("sluice-timeouts") fails calls whose timeout passed. The table
 * of calls in flight is read without the lock (see `table`); everything
 * else shared is guarded by {@code lock}, and futures are completed outside
 * it. close() ends every thread of the client.
 *
 * <p>Time: every call has a timeout in milliseconds (the options' default,
 * or its own); it bounds the wait for the answer, and a negative timeout
 * waits without bound. A call that times out fails with ETIMEDOUT and its
 * late answer, if one comes, is discarded: the connection stays open for the
 * other calls in flight.
 *
 * <p>Reconnection rule (libsluice's): a client whose connection has died
 * (the daemon restarted, or a read or write failed) reconnects once, at the
 * start of the next call, before anything is written. A request is sent
 * again, once, on a new connection only when not one byte of it reached the
 * socket; once any byte was written it is never re-sent, because the daemon
 * may have acted on it (an acquire spends quota): requests in flight when a
 * connection dies fail with ECLOSED (or EIO, EPROTO, ETOOLARGE), and the
 * caller decides whether to retry them.
 *
 * <p>Unreachable daemon: {@code acquire}, {@code acquireAll} and
 * {@code reserve} complete with a decision of the options'
 * {@link UnreachablePolicy} instead of failing when the code of the failure
 * is {@link ErrorCode#unreachable()}, and count it (a policy's reservation
 * has id 0, which settle and cancel do not send). The other calls fail with
 * the error.
 */
public final class SluiceClient implements AutoCloseable {
  /** The socket sluiced listens on by default. */
  public static final String DEFAULT_SOCKET = "/run/sluice/sluice.sock";
  /** The largest response frame accepted; a bigger one fails with ETOOLARGE. */
  public static final int MAX_RESPONSE_BYTES = 4 * 1024 * 1024;
  /** The deepest nesting of a generic result ({@link #call}) accepted. */
  static final int MAX_VALUE_DEPTH = 64;

  private static final int READ_CHUNK_BYTES = 64 * 1024;
  private static final long MAX_COST = 0xffff_ffffL;
  /** Timeouts above this (about 100 years) wait without bound. */
  private static final long MAX_TIMEOUT_MS = 100L * 365 * 24 * 3600 * 1000;
  // Method names, encoded once.
  private static final byte[] ACQUIRE = "acquire".getBytes(StandardCharsets.US_ASCII);
  private static final byte[] PEEK = "peek".getBytes(StandardCharsets.US_ASCII);
  private static final byte[] RELEASE = "release".getBytes(StandardCharsets.US_ASCII);
  private static final byte[] RESET = "reset".getBytes(StandardCharsets.US_ASCII);
  /** A write deadline (deadlineNs) that never passes. */
  private static final long NO_DEADLINE = Long.MIN_VALUE;
  private static final int MIN_TABLE_SLOTS = 1024;
  private static final int MAX_TABLE_SLOTS = 64 * 1024;
  private static final VarHandle SLOTS = MethodHandles.arrayElementVarHandle(Pending[].class);
  private static final VarHandle CLAIMED;

  static {
    try {
      CLAIMED = MethodHandles.lookup().findVarHandle(Pending.class, "claimed", boolean.class);
    } catch (ReflectiveOperationException e) {
      throw new ExceptionInInitializerError(e);
    }
  }

  /** The options of a client; setters return this. */
  public static final class Options {
    private String socketPath = DEFAULT_SOCKET;
    private long timeoutMs = 1000;
    private UnreachablePolicy unreachablePolicy = UnreachablePolicy.FAIL_OPEN;
    private long firstMsgid = 1;

    /** The daemon's socket path (default {@link SluiceClient#DEFAULT_SOCKET}). */
    public Options socketPath(String path) {
      this.socketPath = path;
      return this;
    }

    /** The default timeout of every call in ms, negative for none (default 1000). */
    public Options timeoutMs(long ms) {
      this.timeoutMs = ms;
      return this;
    }

    /** What acquire answers when the daemon is unreachable (default FAIL_OPEN). */
    public Options unreachablePolicy(UnreachablePolicy policy) {
      this.unreachablePolicy = policy;
      return this;
    }

    /**
     * The msgid of the first request, 0 to 2^32-1 (default 1); msgids then
     * count up and wrap from 2^32-1 to 0. For tests of the wraparound.
     */
    public Options firstMsgid(long msgid) {
      if (msgid < 0 || msgid > 0xffff_ffffL) {
        throw new SluiceException(ErrorCode.EINVAL, "firstMsgid must be 0 to 2^32-1");
      }
      this.firstMsgid = msgid;
      return this;
    }
  }

  /** What a request's result is decoded into. */
  private enum Kind { DECISION, RELEASE, ALL, HEALTH, VALUE, RESERVE, SETTLE }

  private static final int QUEUED = 0; // in its connection's output, not one byte written
  private static final int SENDING = 1; // taken by the writer: bytes may be written
  private static final int SENT = 2;

  /**
   * A request in flight, and the future its caller holds (one object per
   * call). `state`, `conn` and `start` are guarded by `lock`; `claimed` is
   * set once, by the thread that takes the call out of the calls in flight
   * ({@link #claim}) and so answers or fails it.
   */
  private final class Pending extends CompletableFuture<Object> {
    final Kind kind;
    final boolean policyApplies;
    final int items; // acquire_all: how many results the policy makes
    final byte[] tail; // method and params, encoded
    int msgid;
    Conn conn;
    int state = QUEUED;
    int start; // offset in its connection's output buffer
    long deadlineNs; // System.nanoTime() when it times out, if it has a timeout
    volatile boolean claimed;
    volatile boolean overflowed; // in `overflow`, not in `table`

    Pending(Kind kind, boolean policyApplies, int items, byte[] tail) {
      this.kind = kind;
      this.policyApplies = policyApplies;
      this.items = items;
      this.tail = tail;
    }

    void fail(SluiceException e) {
      if (policyApplies && e.code().unreachable()) {
        (policy == UnreachablePolicy.FAIL_OPEN ? failedOpen : failedClosed).increment();
        Decision decision = Decision.ofPolicy(policy, e);
        if (kind == Kind.ALL) {
          complete(new AcquireAllResult(decision.allowed(),
              java.util.Collections.nCopies(items, decision)));
        } else if (kind == Kind.RESERVE) {
          complete(new Reservation(decision, 0));
        } else {
          complete(decision);
        }
      } else {
        completeExceptionally(e);
      }
    }
  }

  /** A growable byte buffer of encoded requests. */
  private static final class OutBuf {
    byte[] data = new byte[4096];
    int len;
    final ArrayList<Pending> entries = new ArrayList<>();

    void append(Pending p) {
      int need = len + 7 + p.tail.length;
      if (need > data.length) {
        data = java.util.Arrays.copyOf(data, Math.max(need, data.length * 2));
      }
      p.start = len;
      data[len] = (byte) 0x94; // array of 4: [0, msgid, method, params]
      data[len + 1] = 0x00;
      data[len + 2] = (byte) 0xce; // msgid as a uint32, whatever its value
      data[len + 3] = (byte) (p.msgid >>> 24);
      data[len + 4] = (byte) (p.msgid >>> 16);
      data[len + 5] = (byte) (p.msgid >>> 8);
      data[len + 6] = (byte) p.msgid;
      System.arraycopy(p.tail, 0, data, len + 7, p.tail.length);
      len = need;
      entries.add(p);
    }

    void clear() {
      len = 0;
      entries.clear();
    }
  }

  /**
   * One connection: a non-blocking channel, read by its reader thread
   * (waiting on readSelector) and written by whichever thread is draining
   * `out` (waiting on writeSelector, made when a write first has to wait).
   * `out`, `spare`, `writing` and `dead` are guarded by `lock`.
   */
  private static final class Conn {
    final SocketChannel channel;
    final Selector readSelector;
    volatile Selector writeSelector;
    OutBuf out = new OutBuf();
    OutBuf spare = new OutBuf();
    boolean writing; // a thread is draining `out`; `out` is empty otherwise
    volatile boolean dead;

    Conn(SocketChannel channel, Selector readSelector) {
      this.channel = channel;
      this.readSelector = readSelector;
    }
  }

  /**
   * The reader's input: what the channel has, waiting on readSelector when
   * it has nothing; null at the end of the stream.
   */
  private static final class SelectingInput implements MessageBufferInput {
    private final Conn conn;
    private final byte[] bytes = new byte[READ_CHUNK_BYTES];
    private final MessageBuffer buffer = MessageBuffer.wrap(bytes);

    SelectingInput(Conn conn) {
      this.conn = conn;
    }

    @Override
    public MessageBuffer next() throws IOException {
      for (;;) {
        int n = conn.channel.read(ByteBuffer.wrap(bytes));
        if (n < 0) {
          return null;
        }
        if (n > 0) {
          return buffer.slice(0, n);
        }
        conn.readSelector.select();
        conn.readSelector.selectedKeys().clear();
      }
    }

    @Override
    public void close() {}
  }

  private final String socketPath;
  private final long timeoutMs;
  private final UnixDomainSocketAddress address;
  private final UnreachablePolicy policy;
  private final Object lock = new Object();
  /**
   * The calls in flight (queued, sent, not yet answered, failed or timed
   * out), by msgid: call m sits at table[m & (table.length - 1)]. Written
   * under `lock` (placed by {@link #place}); read without it by the reader
   * thread, which takes its call with {@link #claim}. A slot whose call is
   * claimed is free. When a new call's slot holds a call still in flight,
   * the table doubles, up to MAX_TABLE_SLOTS; past that (a call left waiting
   * while msgids ran far ahead) the older call moves to `overflow`.
   */
  private volatile Pending[] table = new Pending[MIN_TABLE_SLOTS];
  /** Calls in flight that lost their slot in `table`, by msgid. Guarded by `lock`. */
  private final HashMap<Integer, Pending> overflow = new HashMap<>();
  private final AtomicInteger inFlight = new AtomicInteger();
  /**
   * Calls with a timeout, one queue per distinct timeout, so deadlines rise
   * along each queue: the timer thread looks at the heads only. Answered
   * calls leave lazily (at the head, when a call is queued or the timer
   * looks). Guarded by `lock`.
   */
  private final HashMap<Long, ArrayDeque<Pending>> deadlines = new HashMap<>();
  /** The queue of the last timeout used, for the common case of one timeout. */
  private long lastTimeoutMs = -1;
  private ArrayDeque<Pending> lastQueue;
  /**
   * The timer thread's state, guarded by `lock`: scanning (awake), waiting
   * until timerWakeNs (System.nanoTime()), or waiting for a call to time.
   */
  private boolean timerAwake = true;
  private boolean timerHasWake;
  private long timerWakeNs;
  private final java.util.concurrent.ThreadPoolExecutor writer;
  private final LongAdder failedOpen = new LongAdder();
  private final LongAdder failedClosed = new LongAdder();
  private final LongAdder staleResponses = new LongAdder();
  private final LongAdder connects = new LongAdder();
  private Conn conn; // guarded by lock; null before the first call
  private int nextMsgid; // guarded by lock
  private boolean closed; // guarded by lock

  private static final ThreadLocal<Encoder> ENCODERS = ThreadLocal.withInitial(Encoder::new);

  /**
   * A request's method and params, encoded by hand into a thread's scratch
   * buffer and copied out at their exact size. (msgpack-java's buffer packer
   * allocates a fresh 8 KiB buffer after every clear(): one per call.) The
   * encodings are msgpack-java's: the smallest header for each length and
   * the smallest int for each non-negative number.
   */
  private static final class Encoder {
    private static final int KEEP_BYTES = 64 * 1024;
    byte[] buf = new byte[256];
    int len;

    Encoder reset() {
      if (buf.length > KEEP_BYTES) {
        buf = new byte[256]; // an acquire_all of many items: do not keep its buffer
      }
      len = 0;
      return this;
    }

    private void ensure(int n) {
      if (len + n > buf.length) {
        buf = java.util.Arrays.copyOf(buf, Math.max(len + n, buf.length * 2));
      }
    }

    private void put1(int b) {
      buf[len++] = (byte) b;
    }

    private void put2(int v) {
      buf[len++] = (byte) (v >>> 8);
      buf[len++] = (byte) v;
    }

    private void put4(long v) {
      buf[len++] = (byte) (v >>> 24);
      buf[len++] = (byte) (v >>> 16);
      buf[len++] = (byte) (v >>> 8);
      buf[len++] = (byte) v;
    }

    void arrayHeader(int n) {
      ensure(5);
      if (n < 16) {
        put1(0x90 | n);
      } else if (n < 0x10000) {
        put1(0xdc);
        put2(n);
      } else {
        put1(0xdd);
        put4(n);
      }
    }

    void strHeader(int n) {
      ensure(5);
      if (n < 32) {
        put1(0xa0 | n);
      } else if (n < 0x100) {
        put1(0xd9);
        put1(n);
      } else if (n < 0x10000) {
        put1(0xda);
        put2(n);
      } else {
        put1(0xdb);
        put4(n);
      }
    }

    void binHeader(int n) {
      ensure(5);
      if (n < 0x100) {
        put1(0xc4);
        put1(n);
      } else if (n < 0x10000) {
        put1(0xc5);
        put2(n);
      } else {
        put1(0xc6);
        put4(n);
      }
    }

    /** A non-negative integer up to 2^32-1 (costs and waits are checked before). */
    void uint(long v) {
      ensure(5);
      if (v < 0x80) {
        put1((int) v);
      } else if (v < 0x100) {
        put1(0xcc);
        put1((int) v);
      } else if (v < 0x10000) {
        put1(0xcd);
        put2((int) v);
      } else {
        put1(0xce);
        put4(v);
      }
    }

    void raw(byte[] b) {
      ensure(b.length);
      System.arraycopy(b, 0, buf, len, b.length);
      len += b.length;
    }

    /** A String as str, in UTF-8; ASCII (the usual key) without an intermediate array. */
    void string(String s) {
      int n = s.length();
      int mark = len;
      strHeader(n);
      ensure(n);
      for (int i = 0; i < n; i++) {
        char c = s.charAt(i);
        if (c >= 0x80) { // not ASCII: the header may be wrong, start again from UTF-8 bytes
          len = mark;
          byte[] utf8 = s.getBytes(StandardCharsets.UTF_8);
          strHeader(utf8.length);
          raw(utf8);
          return;
        }
        buf[len + i] = (byte) c;
      }
      len += n;
    }

    byte[] toByteArray() {
      return java.util.Arrays.copyOf(buf, len);
    }
  }

  /**
   * A client of the daemon named by `options`. It connects at its first
   * call (so an application may start before its daemon); use
   * {@link #connect} to connect at once.
   */
  public SluiceClient(Options options) {
    this.socketPath = options.socketPath;
    this.timeoutMs = options.timeoutMs;
    this.address = UnixDomainSocketAddress.of(socketPath);
    this.policy = options.unreachablePolicy;
    this.nextMsgid = (int) options.firstMsgid;
    Thread timer = new Thread(this::timeOutCalls, "sluice-timeouts");
    timer.setDaemon(true);
    timer.start();
    this.writer = new java.util.concurrent.ThreadPoolExecutor(0, 1, 1, TimeUnit.SECONDS,
        new java.util.concurrent.LinkedBlockingQueue<>(), r -> {
          Thread t = new Thread(r, "sluice-writer");
          t.setDaemon(true);
          return t;
        });
  }

  /** A client of the daemon at `socketPath`, connected now; ECONNECT when it cannot be. */
  public static SluiceClient connect(String socketPath) {
    return connect(new Options().socketPath(socketPath));
  }

  /** A client with `options`, connected now; ECONNECT when it cannot be. */
  public static SluiceClient connect(Options options) {
    SluiceClient client = new SluiceClient(options);
    try {
      synchronized (client.lock) {
        client.conn = client.open();
      }
    } catch (SluiceException e) {
      client.close();
      throw e;
    }
    return client;
  }

  /** Decisions made FAIL_OPEN by the unreachable policy since the client was made. */
  public long failedOpenCount() {
    return failedOpen.sum();
  }

  /** Decisions made FAIL_CLOSED by the unreachable policy since the client was made. */
  public long failedClosedCount() {
    return failedClosed.sum();
  }

  /** Answers that matched no call in flight (late answers to timed-out calls). */
  public long staleResponseCount() {
    return staleResponses.sum();
  }

  /** Connections opened so far (1 + reconnections, once connected). */
  public long connectCount() {
    return connects.sum();
  }

  /** Calls sent or queued and not yet answered, failed or timed out. */
  public int inFlight() {
    return inFlight.get();
  }

  /** The msgid the next request gets, 0 to 2^32-1. */
  public long nextMsgid() {
    synchronized (lock) {
      return Integer.toUnsignedLong(nextMsgid);
    }
  }

  /** The options' default timeout in ms. */
  public long timeoutMs() {
    return this.timeoutMs;
  }

  // ---- calls ---------------------------------------------------------------------

  /** May `key` spend one unit of `rule` now? Spends it when allowed. */
  public CompletableFuture<Decision> acquireAsync(String rule, String key) {
    return itemCall(ACQUIRE, Kind.DECISION, true, rule, key, true, 1, -1, timeoutMs);
  }

  /** May `key` spend `cost` units of `rule` now? Spends them when allowed. */
  public CompletableFuture<Decision> acquireAsync(String rule, String key, long cost) {
    return itemCall(ACQUIRE, Kind.DECISION, true, rule, key, true, cost, -1, timeoutMs);
  }

  /** {@link #acquireAsync(String, String, long)} with a key of any bytes and its own timeout. */
  public CompletableFuture<Decision> acquireAsync(String rule, byte[] key, long cost,
      long timeoutMs) {
    return itemCall(ACQUIRE, Kind.DECISION, true, rule, key, true, cost, -1, timeoutMs);
  }

  /**
   * Like acquire, but when the units will be there within maxWaitMs (token
   * bucket and GCRA rules) the daemon answers "allowed" once they are, with
   * {@link Decision#waitedMs()}; timeoutMs must cover maxWaitMs. Other rules
   * fail with ESERVER (BAD_REQUEST) for a maxWaitMs above 0.
   */
  public CompletableFuture<Decision> acquireWaitAsync(String rule, byte[] key, long cost,
      long maxWaitMs, long timeoutMs) {
    if (maxWaitMs < 0 || maxWaitMs > MAX_COST) {
      return failed(new SluiceException(ErrorCode.EINVAL, "maxWaitMs must be 0 to 2^32-1"));
    }
    return itemCall(ACQUIRE, Kind.DECISION, true, rule, key, true, cost, maxWaitMs, timeoutMs);
  }

  /** Like acquire with cost 0: the key's state; spends nothing. */
  public CompletableFuture<Decision> peekAsync(String rule, byte[] key, long timeoutMs) {
    return itemCall(PEEK, Kind.DECISION, false, rule, key, false, 0, -1, timeoutMs);
  }

  /**
   * Gives `cost` units of a concurrency rule back. When the daemon's result
   * is not a decision map the decision is allowed with every number 0.
   */
  public CompletableFuture<Decision> releaseAsync(String rule, byte[] key, long cost,
      long timeoutMs) {
    return itemCall(RELEASE, Kind.RELEASE, false, rule, key, true, cost, -1, timeoutMs);
  }

  /** Admin only: forgets `key`'s state under `rule`; the fresh state as peek reports it. */
  public CompletableFuture<Decision> resetAsync(String rule, byte[] key, long timeoutMs) {
    return itemCall(RESET, Kind.DECISION, false, rule, key, false, 0, -1, timeoutMs);
  }

  /** All-or-nothing over `items` (at least one). */
  public CompletableFuture<AcquireAllResult> acquireAllAsync(List<Item> items, long timeoutMs) {
    if (items == null || items.isEmpty()) {
      return failed(new SluiceException(ErrorCode.EINVAL, "acquireAll needs at least one item"));
    }
    byte[] tail;
    try {
      Encoder p = encoder();
      p.string("acquire_all");
      p.arrayHeader(1);
      p.arrayHeader(items.size());
      for (Item item : items) {
        checkCost(item.cost());
        packItem(p, item.rule(), item.key(), true, item.cost(), -1);
      }
      tail = p.toByteArray();
    } catch (SluiceException e) {
      return failed(e);
    }
    return submit(Kind.ALL, true, items.size(), tail, timeoutMs);
  }

  /** The daemon's health. */
  public CompletableFuture<Health> healthAsync(long timeoutMs) {
    return plainCall("health", Kind.HEALTH, timeoutMs);
  }

  /**
   * Calls a method that takes no parameters (health, stats, rules, reload)
   * and returns its result decoded: nil is null, booleans Boolean, integers
   * Long (BigInteger above Long.MAX_VALUE), floats Double, str String, bin
   * byte[], arrays List, maps LinkedHashMap with String keys (other keys
   * as their string form), extension values null.
   */
  public CompletableFuture<Object> callAsync(String method, long timeoutMs) {
    return plainCall(method, Kind.VALUE, timeoutMs);
  }

  // ---- blocking conveniences ------------------------------------------------------

  public Decision acquire(String rule, String key) {
    return await(acquireAsync(rule, key));
  }

  public Decision acquire(String rule, String key, long cost) {
    return await(acquireAsync(rule, key, cost));
  }

  public Decision acquire(String rule, byte[] key, long cost, long timeoutMs) {
    return await(acquireAsync(rule, key, cost, timeoutMs));
  }

  public Decision acquireWait(String rule, String key, long cost, long maxWaitMs) {
    return await(acquireWaitAsync(rule, utf8(key), cost, maxWaitMs,
        timeoutMs < 0 ? -1 : timeoutMs + maxWaitMs));
  }

  public Decision peek(String rule, String key) {
    return await(peekAsync(rule, utf8(key), timeoutMs));
  }

  public Decision release(String rule, String key, long cost) {
    return await(releaseAsync(rule, utf8(key), cost, timeoutMs));
  }

  public Decision reset(String rule, String key) {
    return await(resetAsync(rule, utf8(key), timeoutMs));
  }

  public AcquireAllResult acquireAll(List<Item> items) {
    return await(acquireAllAsync(items, timeoutMs));
  }

  public Health health() {
    return await(healthAsync(timeoutMs));
  }

  public Object call(String method) {
    return await(callAsync(method, timeoutMs));
  }

  // ---- reservations: costs known only when the request ends ------------------------

  /** The TTL a reservation gets when none is given (libsluice's SLUICE_DEFAULT_TTL_MS). */
  public static final long DEFAULT_TTL_MS = 60_000;

  private static final byte[] RESERVE = "reserve".getBytes(StandardCharsets.US_ASCII);

  /**
   * Decides like acquire of `estimate` (at least 1; it never waits) and, when
   * allowed, opens a reservation: {@link Reservation#id()} names it for
   * settle or cancel. Unsettled after ttlMs (1 to 2^32-1) it settles at its
   * estimate. Follows the {@link UnreachablePolicy}, with id 0. Rules that
   * cannot reserve fail with ESERVER (BAD_REQUEST), a full table OVERLOADED.
   */
  public CompletableFuture<Reservation> reserveAsync(String rule, byte[] key, long estimate,
      long ttlMs, long timeoutMs) {
    if (estimate == 0 || ttlMs < 1 || ttlMs > MAX_COST) {
      return failed(new SluiceException(ErrorCode.EINVAL,
          "estimate must be 1 to 2^32-1 and ttlMs 1 to 2^32-1"));
    }
    // [rule, key, estimate, ttl_ms]: an item whose fourth field is the TTL.
    return itemCall(RESERVE, Kind.RESERVE, true, rule, key, true, estimate, ttlMs, timeoutMs);
  }

  /**
   * Settles reservation `id` at `actual` units: gives back estimate - actual
   * ({@link Settlement#refunded()}), or charges the excess past the limit
   * ({@link Settlement#debt()}; the key's remaining goes below 0;
   * {@link Settlement#unpaid()} the part past the rule's max_debt, charged
   * to nobody). An id not
   * open fails with ESERVER, {@link SluiceException#unknownReservation()}.
   * Id 0 completes at once, asking the daemon nothing.
   */
  public CompletableFuture<Settlement> settleAsync(long id, long actual, long timeoutMs) {
    if (actual < 0 || actual > MAX_COST) {
      return failed(new SluiceException(ErrorCode.EINVAL, "actual must be 0 to 2^32-1"));
    }
    return settleCall("settle", id, actual, timeoutMs);
  }

  /** Gives reservation `id` back whole: settle at 0. Id 0 asks the daemon nothing. */
  public CompletableFuture<Settlement> cancelAsync(long id, long timeoutMs) {
    return settleCall("cancel", id, -1, timeoutMs);
  }

  public Reservation reserve(String rule, String key, long estimate) {
    return reserve(rule, key, estimate, DEFAULT_TTL_MS);
  }

  public Reservation reserve(String rule, String key, long estimate, long ttlMs) {
    return await(reserveAsync(rule, utf8(key), estimate, ttlMs, timeoutMs));
  }

  public Settlement settle(long id, long actual) {
    return await(settleAsync(id, actual, timeoutMs));
  }

  public Settlement cancel(long id) {
    return await(cancelAsync(id, timeoutMs));
  }

  /** settle [id, actual], or cancel [id] when actual is -1. */
  private CompletableFuture<Settlement> settleCall(String method, long id, long actual,
      long timeoutMs) {
    if (id == 0) {
      return CompletableFuture.completedFuture(Settlement.NOTHING);
    }
    Encoder p = encoder();
    p.string(method);
    p.arrayHeader(actual < 0 ? 1 : 2);
    // The id as msgpack's uint 64, whatever its value (its top bit may be set).
    byte[] uint64 = new byte[9];
    uint64[0] = (byte) 0xcf;
    for (int i = 0; i < 8; i++) {
      uint64[1 + i] = (byte) (id >>> (56 - 8 * i));
    }
    p.raw(uint64);
    if (actual >= 0) {
      p.uint(actual);
    }
    return submit(Kind.SETTLE, false, 1, p.toByteArray(), timeoutMs);
  }

  /**
   * A reservation's decision map: the decision, `id` (the reservation's
   * unsigned 64 bits), and for a settle `refunded`, `debt` and `unpaid`.
   */
  private static Object readReservation(MessageUnpacker u, boolean settled)
      throws IOException, FatalFrame, BadResult {
    Object value = readValue(u, 0);
    if (!(value instanceof Map)) {
      throw new BadResult("result is not a decision map");
    }
    Map<?, ?> map = (Map<?, ?>) value;
    if (!(map.get("allowed") instanceof Boolean)) {
      throw new BadResult("decision map without allowed");
    }
    Object mode = map.get("mode");
    Object reason = map.get("reason");
    Decision decision = new Decision((Boolean) map.get("allowed"),
        mode instanceof String ? Mode.fromWireName((String) mode) : Mode.UNKNOWN,
        number(map, "remaining"), number(map, "limit"), number(map, "reset_after_ms"),
        number(map, "retry_after_ms"), map.containsKey("waited_ms") ? number(map, "waited_ms") : -1,
        reason instanceof String ? (String) reason : null, null);
    Object id = map.get("id");
    long bits = id instanceof BigInteger ? ((BigInteger) id).longValue()
        : id instanceof Long ? (Long) id : 0;
    if (settled) {
      return new Settlement(decision, bits, number(map, "refunded"), number(map, "debt"),
          number(map, "unpaid"));
    }
    if (decision.allowed() && bits == 0) {
      throw new BadResult("an allowed reservation without an id");
    }
    return new Reservation(decision, decision.allowed() ? bits : 0);
  }

  /** An integer field of a decision map; 0 when absent. */
  private static long number(Map<?, ?> map, String name) throws BadResult {
    Object v = map.get(name);
    if (v == null) {
      return 0;
    }
    if (!(v instanceof Long)) {
      throw new BadResult("decision map's " + name + " is not an integer");
    }
    return (Long) v;
  }

  /**
   * Closes the connection; calls in flight fail with ECLOSED, later calls
   * with EINVAL. Idempotent.
   */
  @Override
  public void close() {
    List<Pending> dropped;
    synchronized (lock) {
      if (closed) {
        return;
      }
      closed = true;
      dropped = conn != null ? kill(conn) : List.of();
      lock.notifyAll(); // the timer thread ends
    }
    failAll(dropped, new SluiceException(ErrorCode.ECLOSED, "the client was closed"));
    writer.shutdown(); // a drain it runs ends: the connection is dead
  }

  // ---- requests ------------------------------------------------------------------------

  private static byte[] utf8(String key) {
    return key == null ? null : key.getBytes(StandardCharsets.UTF_8);
  }

  private static Encoder encoder() {
    return ENCODERS.get().reset();
  }

  private static void checkCost(long cost) {
    if (cost < 0 || cost > MAX_COST) {
      throw new SluiceException(ErrorCode.EINVAL, "cost must be 0 to 2^32-1");
    }
  }

  /**
   * [rule, key], [rule, key, cost] or, with maxWaitMs >= 0, [rule, key, cost,
   * maxWaitMs]; `key` is a String or a byte[].
   */
  private static void packItem(Encoder p, String rule, Object key, boolean withCost,
      long cost, long maxWaitMs) {
    if (rule == null || key == null) {
      throw new SluiceException(ErrorCode.EINVAL, "rule and key must not be null");
    }
    boolean waits = withCost && maxWaitMs >= 0;
    p.arrayHeader(waits ? 4 : withCost ? 3 : 2);
    p.string(rule);
    if (key instanceof String) {
      p.string((String) key);
    } else {
      // A key goes out as str when it is UTF-8 and as bin otherwise, as libsluice does.
      byte[] bytes = (byte[]) key;
      if (isUtf8(bytes)) {
        p.strHeader(bytes.length);
      } else {
        p.binHeader(bytes.length);
      }
      p.raw(bytes);
    }
    if (withCost) {
      p.uint(cost);
    }
    if (waits) {
      p.uint(maxWaitMs);
    }
  }

  /** Whether `b` is well-formed UTF-8 (no overlongs, surrogates or values past U+10FFFF). */
  static boolean isUtf8(byte[] b) {
    int i = 0;
    while (i < b.length) {
      int c = b[i] & 0xff;
      if (c < 0x80) {
        i++;
        continue;
      }
      int n;
      int min;
      if (c >= 0xc2 && c <= 0xdf) {
        n = 1;
        min = 0x80;
      } else if (c >= 0xe0 && c <= 0xef) {
        n = 2;
        min = 0x800;
      } else if (c >= 0xf0 && c <= 0xf4) {
        n = 3;
        min = 0x10000;
      } else {
        return false;
      }
      if (i + n >= b.length) {
        return false;
      }
      int cp = c & (0x3f >> n);
      for (int k = 1; k <= n; k++) {
        int cc = b[i + k] & 0xff;
        if ((cc & 0xc0) != 0x80) {
          return false;
        }
        cp = (cp << 6) | (cc & 0x3f);
      }
      if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
        return false;
      }
      i += n + 1;
    }
    return true;
  }

  /** `key` is a String (sent as str) or a byte[] (str when UTF-8, else bin). */
  private <T> CompletableFuture<T> itemCall(byte[] method, Kind kind, boolean policyApplies,
      String rule, Object key, boolean withCost, long cost, long maxWaitMs, long timeoutMs) {
    byte[] tail;
    try {
      checkCost(cost);
      Encoder p = encoder();
      p.strHeader(method.length);
      p.raw(method);
      // The params array is the item itself: [rule, key, cost, ...].
      packItem(p, rule, key, withCost, cost, maxWaitMs);
      tail = p.toByteArray();
    } catch (SluiceException e) {
      return failed(e);
    }
    return submit(kind, policyApplies, 1, tail, timeoutMs);
  }

  private <T> CompletableFuture<T> plainCall(String method, Kind kind, long timeoutMs) {
    if (method == null || method.isEmpty()) {
      return failed(new SluiceException(ErrorCode.EINVAL, "method must not be empty"));
    }
    Encoder p = encoder();
    p.string(method);
    p.arrayHeader(0);
    byte[] tail = p.toByteArray();
    return submit(kind, false, 0, tail, timeoutMs);
  }

  @SuppressWarnings("unchecked")
  private static <T> CompletableFuture<T> cast(CompletableFuture<Object> f) {
    return (CompletableFuture<T>) (CompletableFuture<?>) f;
  }

  private static <T> CompletableFuture<T> failed(SluiceException e) {
    CompletableFuture<T> f = new CompletableFuture<>();
    f.completeExceptionally(e);
    return f;
  }

  /** Queues a request on the connection (connecting first when there is none). */
  private <T> CompletableFuture<T> submit(Kind kind, boolean policyApplies, int items, byte[] tail,
      long timeoutMs) {
    if (timeoutMs > MAX_TIMEOUT_MS) {
      timeoutMs = -1; // beyond what nanoTime() arithmetic holds: no bound
    }
    Pending p = new Pending(kind, policyApplies, items, tail);
    Conn writeOn = null;
    boolean handOff = false;
    SluiceException failure = null;
    synchronized (lock) {
      if (closed) {
        return failed(new SluiceException(ErrorCode.EINVAL, "the client is closed"));
      }
      if (conn == null || conn.dead) {
        // The reconnection rule: once, at the start of the call, before writing.
        try {
          conn = open();
        } catch (SluiceException e) {
          conn = null;
          failure = e;
        }
      }
      if (failure == null) {
        p.msgid = nextMsgid++;
        p.conn = conn;
        place(p);
        conn.out.append(p);
        if (timeoutMs >= 0) {
          p.deadlineNs = System.nanoTime() + timeoutMs * 1_000_000;
          if (timeoutMs != lastTimeoutMs) {
            lastQueue = deadlines.computeIfAbsent(timeoutMs, t -> new ArrayDeque<>());
            lastTimeoutMs = timeoutMs;
          }
          ArrayDeque<Pending> queue = lastQueue;
          while (!queue.isEmpty() && queue.peekFirst().isDone()) {
            queue.pollFirst();
          }
          queue.addLast(p);
          if (!timerAwake && (!timerHasWake || p.deadlineNs - timerWakeNs < 0)) {
            lock.notifyAll();
          }
        }
        if (!conn.writing) {
          conn.writing = true;
          writeOn = conn;
          // With other calls in flight, the writer thread writes: callers
          // return at once and what they queue meanwhile goes out in its
          // next write, one syscall for many requests. A lone call writes
          // itself, the shortest way to the daemon, unless it is made in a
          // callback: a reader thread must never wait for the socket.
          handOff = inFlight.get() > 1 || Thread.currentThread() instanceof ReaderThread;
        }
      }
    }
    if (failure != null) {
      p.fail(failure);
      return cast(p);
    }
    if (handOff) {
      handOff(writeOn, null, null);
    } else if (writeOn != null) {
      drain(writeOn, timeoutMs >= 0 ? System.nanoTime() + timeoutMs * 1_000_000 : NO_DEADLINE,
          null, null);
    }
    return cast(p);
  }

  /** Puts `p` (its msgid set) in the calls in flight. Caller holds `lock`. */
  private void place(Pending p) {
    inFlight.incrementAndGet();
    for (;;) {
      Pending[] t = table;
      int i = p.msgid & (t.length - 1);
      Pending held = t[i];
      if (held != null && !held.claimed) {
        if (t.length < MAX_TABLE_SLOTS) {
          table = grown(t);
          continue;
        }
        held.overflowed = true;
        overflow.put(held.msgid, held);
        if (held.claimed) { // its claimer may have missed `overflowed`
          overflow.remove(held.msgid, held);
        }
      }
      SLOTS.setRelease(t, i, p);
      return;
    }
  }

  /** `t` doubled, with the calls in flight in it. Caller holds `lock`. */
  private static Pending[] grown(Pending[] t) {
    Pending[] bigger = new Pending[t.length * 2];
    for (Pending p : t) {
      if (p != null && !p.claimed) {
        bigger[p.msgid & (bigger.length - 1)] = p; // distinct mod t.length, so mod 2 t.length
      }
    }
    return bigger;
  }

  /**
   * Takes `p` out of the calls in flight: true for the one thread that
   * does (and must answer or fail it), false when another did. Any thread.
   */
  private boolean claim(Pending p) {
    if (p.claimed || !CLAIMED.compareAndSet(p, false, true)) {
      return false;
    }
    Pending[] t = table;
    SLOTS.compareAndSet(t, p.msgid & (t.length - 1), p, null);
    inFlight.decrementAndGet();
    if (p.overflowed) {
      synchronized (lock) {
        overflow.remove(p.msgid, p);
      }
    }
    return true;
  }

  /** Takes the call in flight with `msgid` (see claim(Pending)); null when there is none. */
  private Pending claim(int msgid) {
    Pending[] t = table;
    Pending p = (Pending) SLOTS.getAcquire(t, msgid & (t.length - 1));
    if (p != null && p.msgid == msgid && claim(p)) {
      return p;
    }
    // Not in the slot the reader saw: in `overflow`, in a table grown
    // meanwhile, or gone (timed out, or never sent on this connection).
    synchronized (lock) {
      t = table;
      p = t[msgid & (t.length - 1)];
      if (p == null || p.msgid != msgid) {
        p = overflow.get(msgid);
      }
    }
    return p != null && p.msgid == msgid && claim(p) ? p : null;
  }

  /** The timer thread: fails each call whose deadline passed, until close(). */
  private void timeOutCalls() {
    List<Pending> expired = new ArrayList<>();
    for (;;) {
      synchronized (lock) {
        for (;;) {
          if (closed) {
            return;
          }
          long nowNs = System.nanoTime();
          long nextNs = Long.MAX_VALUE;
          boolean any = false;
          for (ArrayDeque<Pending> queue : deadlines.values()) {
            while (!queue.isEmpty()) {
              Pending head = queue.peekFirst();
              if (head.isDone()) {
                queue.pollFirst();
              } else if (head.deadlineNs - nowNs <= 0) {
                expired.add(queue.pollFirst());
              } else {
                if (!any || head.deadlineNs - nextNs < 0) {
                  nextNs = head.deadlineNs;
                }
                any = true;
                break;
              }
            }
          }
          if (!expired.isEmpty()) {
            break;
          }
          timerAwake = false;
          timerHasWake = any;
          timerWakeNs = nextNs;
          try {
            if (any) {
              long waitNs = nextNs - nowNs;
              lock.wait(waitNs / 1_000_000, (int) (waitNs % 1_000_000));
            } else {
              lock.wait();
            }
          } catch (InterruptedException e) {
            return;
          }
          timerAwake = true;
        }
      }
      for (Pending p : expired) {
        if (claim(p)) {
          p.fail(new SluiceException(ErrorCode.ETIMEDOUT, "no answer from the daemon in time"));
        }
      }
      expired.clear();
    }
  }

  private static <T> T await(CompletableFuture<T> f) {
    try {
      return f.get();
    } catch (ExecutionException e) {
      if (e.getCause() instanceof SluiceException) {
        SluiceException cause = (SluiceException) e.getCause();
        // A new exception, so that the stack trace shows this call too.
        SluiceException here = new SluiceException(cause.code(), stripName(cause),
            cause.serverCode(), cause.serverMessage(), cause);
        throw here;
      }
      throw new SluiceException(ErrorCode.EIO, String.valueOf(e.getCause()), e.getCause());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new SluiceException(ErrorCode.ETIMEDOUT, "interrupted while waiting", e);
    }
  }

  private static String stripName(SluiceException e) {
    String m = e.getMessage();
    String prefix = e.code().cName() + ": ";
    return m.startsWith(prefix) ? m.substring(prefix.length()) : m;
  }

  // ---- connection ----------------------------------------------------------------------

  /** Opens a connection and starts its reader; caller holds `lock`. */
  private Conn open() {
    SocketChannel channel = null;
    Selector readSelector = null;
    try {
      channel = SocketChannel.open(StandardProtocolFamily.UNIX);
      channel.connect(address);
      channel.configureBlocking(false);
      readSelector = Selector.open();
      channel.register(readSelector, SelectionKey.OP_READ);
    } catch (IOException | RuntimeException e) {
      closeQuietly(channel);
      closeQuietly(readSelector);
      throw new SluiceException(ErrorCode.ECONNECT, socketPath + ": " + e.getMessage(), e);
    }
    Conn c = new Conn(channel, readSelector);
    Thread reader = new ReaderThread(() -> readLoop(c));
    reader.setDaemon(true);
    reader.start();
    connects.increment();
    return c;
  }

  /**
   * Marks `c` dead and closes it; returns the requests in flight on it of
   * which bytes may have been written (removed from `pending`), which the
   * caller fails outside the lock. Requests still queued stay in c.out for
   * its writer. Caller holds `lock`.
   */
  private List<Pending> kill(Conn c) {
    if (c.dead) {
      return List.of();
    }
    c.dead = true;
    closeQuietly(c.channel);
    c.readSelector.wakeup();
    Selector writeSelector = c.writeSelector;
    if (writeSelector != null) {
      writeSelector.wakeup();
    }
    List<Pending> candidates = new ArrayList<>(overflow.values());
    for (Pending p : table) {
      if (p != null) {
        candidates.add(p);
      }
    }
    List<Pending> dropped = new ArrayList<>();
    for (Pending p : candidates) {
      if (p.conn == c && p.state != QUEUED && claim(p)) {
        dropped.add(p);
      }
    }
    return dropped;
  }

  private static void closeQuietly(java.io.Closeable closeable) {
    if (closeable != null) {
      try {
        closeable.close();
      } catch (IOException ignored) {
        // released either way
      }
    }
  }

  private static void failAll(List<Pending> list, SluiceException e) {
    for (Pending p : list) {
      p.fail(e);
    }
  }

  /**
   * Writes c's output until it is empty, in batches: requests queued by
   * other threads meanwhile go out with the next write. When the connection
   * dies, the requests of which no byte was written move to a new connection
   * (opened once per drain) or, when that fails, fail.
   */
  private void drain(Conn c, long deadlineNs, OutBuf resumeBatch, ByteBuffer resumeBuffer) {
    boolean reconnected = false;
    OutBuf batch = resumeBatch;
    ByteBuffer buffer = resumeBuffer;
    for (;;) {
      List<Pending> dropped = List.of();
      SluiceException dropError = null;
      List<Pending> unsent = List.of();
      SluiceException unsentError = null;
      if (batch == null) { // take the next batch (after a handoff, the batch is given)
        synchronized (lock) {
          if (c.dead) {
            closeQuietly(c.writeSelector);
            // Every request left in c.out is wholly unwritten: send it elsewhere.
            List<Pending> queued = new ArrayList<>();
            for (Pending p : c.out.entries) {
              if (!p.claimed) {
                queued.add(p);
              }
            }
            c.out.clear();
            c.writing = false;
            if (queued.isEmpty()) {
              return;
            }
            Conn next = conn;
            if (closed) {
              unsentError = new SluiceException(ErrorCode.ECLOSED, "the client was closed");
            } else if (next == null || next.dead) {
              if (reconnected) {
                unsentError = new SluiceException(ErrorCode.ECLOSED, "connection closed by the daemon");
              } else {
                reconnected = true;
                try {
                  next = open();
                  conn = next;
                } catch (SluiceException e) {
                  unsentError = e;
                }
              }
            }
            if (unsentError != null) {
              unsent = new ArrayList<>();
              for (Pending p : queued) {
                if (claim(p)) { // else its timeout took it
                  unsent.add(p);
                }
              }
            } else {
              for (Pending p : queued) {
                p.conn = next;
                p.state = QUEUED;
                next.out.append(p);
              }
              if (next.writing) {
                return; // its writer sends them
              }
              next.writing = true;
              c = next;
            }
          }
          if (unsentError == null) {
            if (c.out.len == 0) {
              c.writing = false;
              return;
            }
            batch = c.out;
            c.out = c.spare;
            c.spare = batch;
            for (Pending p : batch.entries) {
              p.state = SENDING;
            }
          } else {
            batch = null;
          }
        }
        if (batch == null) { // nowhere to send them
          failAll(unsent, unsentError);
          return;
        }
        buffer = ByteBuffer.wrap(batch.data, 0, batch.len);
      }
      IOException failure = null;
      try {
        if (!writeAll(c, buffer, deadlineNs)) {
          // The caller's deadline passed with bytes left (the daemon is not
          // reading): the writer thread finishes the batch and the queue.
          handOff(c, batch, buffer);
          return;
        }
      } catch (IOException e) {
        failure = e;
      } catch (ClosedSelectorException e) {
        failure = new ClosedChannelException();
      }
      int written = buffer.position();
      synchronized (lock) {
        if (failure == null) {
          for (Pending p : batch.entries) {
            p.state = SENT;
          }
        } else {
          // Requests from `written` on never reached the socket: they go back
          // to the front of the queue, where the dead-connection branch finds them.
          OutBuf requeue = new OutBuf();
          for (Pending p : batch.entries) {
            if (p.start >= written) {
              p.state = QUEUED;
              requeue.append(p);
            } else {
              p.state = SENT;
            }
          }
          for (Pending p : c.out.entries) {
            requeue.append(p);
          }
          c.out = requeue;
          dropped = kill(c);
          dropError = new SluiceException(ErrorCode.ECLOSED, "write failed: " + failure.getMessage(),
              failure);
        }
        batch.clear();
      }
      batch = null;
      buffer = null;
      failAll(dropped, dropError);
    }
  }

  /** Has the writer thread drain `c`, starting with what is left of `batch`, if given. */
  private void handOff(Conn c, OutBuf batch, ByteBuffer buffer) {
    try {
      writer.execute(() -> drain(c, NO_DEADLINE, batch, buffer));
    } catch (java.util.concurrent.RejectedExecutionException e) {
      // The client is closing: c is dead, and a drain here only fails what is queued.
      drain(c, System.nanoTime(), batch, buffer);
    }
  }

  /**
   * Writes `buffer` whole, waiting for the socket to take more until
   * `deadlineNs` (System.nanoTime(), or NO_DEADLINE). Returns false when the
   * deadline passed first.
   */
  private static boolean writeAll(Conn c, ByteBuffer buffer, long deadlineNs) throws IOException {
    while (buffer.hasRemaining()) {
      if (c.channel.write(buffer) > 0) {
        continue;
      }
      long waitMs = 0;
      if (deadlineNs != NO_DEADLINE) {
        long leftNs = deadlineNs - System.nanoTime();
        if (leftNs <= 0) {
          return false;
        }
        waitMs = Math.max(1, (leftNs + 999_999) / 1_000_000);
      }
      Selector selector = c.writeSelector;
      if (selector == null) {
        selector = Selector.open();
        c.channel.register(selector, SelectionKey.OP_WRITE);
        c.writeSelector = selector;
      }
      if (c.dead) {
        throw new ClosedChannelException();
      }
      if (waitMs == 0) {
        selector.select();
      } else {
        selector.select(waitMs);
      }
      selector.selectedKeys().clear();
    }
    return true;
  }

  // ---- responses -----------------------------------------------------------------------

  /** The thread that reads a connection's answers and completes their futures. */
  private static final class ReaderThread extends Thread {
    ReaderThread(Runnable body) {
      super(body, "sluice-reader");
    }
  }

  /** A response the library cannot read; the connection is unusable. */
  private static final class FatalFrame extends Exception {
    private static final long serialVersionUID = 1L;
    final ErrorCode code;

    FatalFrame(ErrorCode code, String message) {
      super(message, null, false, false);
      this.code = code;
    }
  }

  /** A result of the wrong shape: only its call fails. */
  private static final class BadResult extends Exception {
    private static final long serialVersionUID = 1L;

    BadResult(String message) {
      super(message, null, false, false);
    }
  }

  private void readLoop(Conn c) {
    MessageUnpacker u = MessagePack.DEFAULT_UNPACKER_CONFIG.newUnpacker(new SelectingInput(c));
    byte[] scratch = new byte[SCRATCH_BYTES];
    // The call whose answer is being read: claimed, not yet answered.
    Pending[] reading = new Pending[1];
    SluiceException end;
    try {
      for (;;) {
        long frameStart = u.getTotalReadBytes();
        if (!u.hasNext()) {
          end = new SluiceException(ErrorCode.ECLOSED, "connection closed by the daemon");
          break;
        }
        readFrame(u, scratch, reading);
        if (u.getTotalReadBytes() - frameStart > MAX_RESPONSE_BYTES) {
          throw new FatalFrame(ErrorCode.ETOOLARGE, "a response frame over 4 MiB");
        }
      }
    } catch (FatalFrame e) {
      end = new SluiceException(e.code, e.getMessage());
    } catch (MessageInsufficientBufferException e) {
      end = new SluiceException(ErrorCode.ECLOSED, "connection closed mid-response", e);
    } catch (MessagePackException e) {
      end = new SluiceException(ErrorCode.EPROTO, "malformed response: " + e.getMessage(), e);
    } catch (IOException e) {
      end = new SluiceException(ErrorCode.ECLOSED, "connection lost: " + e.getMessage(), e);
    } catch (RuntimeException | Error e) {
      end = new SluiceException(ErrorCode.EPROTO, "cannot read a response: " + e, e);
    }
    List<Pending> dropped;
    synchronized (lock) {
      dropped = kill(c);
    }
    closeQuietly(c.readSelector);
    failAll(dropped, end);
    if (reading[0] != null) { // the stream ended or broke inside its answer
      reading[0].fail(end);
    }
  }

  /**
   * Reads one frame: a response, matched to its call, or a notification,
   * skipped. While it reads an answer, its call (claimed, so no longer
   * among the calls in flight that kill() fails) is in reading[0].
   */
  private void readFrame(MessageUnpacker u, byte[] scratch, Pending[] reading)
      throws IOException, FatalFrame {
    if (u.getNextFormat().getValueType() != ValueType.ARRAY) {
      throw new FatalFrame(ErrorCode.EPROTO, "a frame that is not an array");
    }
    int n = u.unpackArrayHeader();
    if (n < 1 || !isInteger(u)) {
      throw new FatalFrame(ErrorCode.EPROTO, "a frame without a type");
    }
    long type = u.unpackLong();
    if (type == 2 && n == 3) {
      u.skipValue(2); // [2, method, params]: nothing answers a request with one
      return;
    }
    if (type != 1 || n != 4 || !isInteger(u)) {
      throw new FatalFrame(ErrorCode.EPROTO, "a frame that is not a response");
    }
    long id = u.unpackLong();
    if (id < 0 || id > 0xffff_ffffL) {
      throw new FatalFrame(ErrorCode.EPROTO, "a msgid outside 32 bits");
    }
    SluiceException error = readError(u);
    Pending p = claim((int) id);
    if (p == null) {
      u.skipValue(); // a late answer to a call that timed out
      staleResponses.increment();
      return;
    }
    reading[0] = p;
    if (error != null) {
      u.skipValue();
      reading[0] = null;
      p.fail(error);
      return;
    }
    Object result;
    try {
      result = readResult(u, p, scratch);
    } catch (BadResult e) {
      reading[0] = null;
      p.fail(new SluiceException(ErrorCode.EPROTO, e.getMessage()));
      return;
    }
    reading[0] = null;
    p.complete(result);
  }

  private static boolean isInteger(MessageUnpacker u) throws IOException {
    return u.hasNext() && u.getNextFormat().getValueType() == ValueType.INTEGER;
  }

  /** The error element: null for nil, else the daemon's error (map or str). */
  private static SluiceException readError(MessageUnpacker u) throws IOException, FatalFrame {
    if (u.tryUnpackNil()) {
      return null;
    }
    ValueType t = u.getNextFormat().getValueType();
    if (t == ValueType.STRING) {
      return SluiceException.server("", readText(u));
    }
    if (t != ValueType.MAP) {
      u.skipValue();
      return SluiceException.server("", "");
    }
    int n = u.unpackMapHeader();
    String code = "";
    String message = "";
    for (int i = 0; i < n; i++) {
      String key = readKey(u);
      ValueType vt = u.getNextFormat().getValueType();
      boolean text = vt == ValueType.STRING || vt == ValueType.BINARY;
      if (text && "code".equals(key)) {
        code = readText(u);
      } else if (text && "message".equals(key)) {
        message = readText(u);
      } else {
        u.skipValue();
      }
    }
    return SluiceException.server(code, message);
  }

  /** A str or bin as text (bounded by the frame cap). */
  private static String readText(MessageUnpacker u) throws IOException, FatalFrame {
    MessageFormat f = u.getNextFormat();
    int len = f.getValueType() == ValueType.BINARY ? u.unpackBinaryHeader()
        : u.unpackRawStringHeader();
    if (len < 0 || len > MAX_RESPONSE_BYTES) {
      throw new FatalFrame(ErrorCode.ETOOLARGE, "a string over 4 MiB");
    }
    return new String(u.readPayload(len), StandardCharsets.UTF_8);
  }

  /** A map key as text; a key of another type as its decoded value's string form. */
  private static String readKey(MessageUnpacker u) throws IOException, FatalFrame {
    ValueType t = u.getNextFormat().getValueType();
    if (t == ValueType.STRING || t == ValueType.BINARY) {
      return readText(u);
    }
    return String.valueOf(readValue(u, 1));
  }

  private Object readResult(MessageUnpacker u, Pending p, byte[] scratch)
      throws IOException, FatalFrame, BadResult {
    switch (p.kind) {
      case DECISION:
        return readDecision(u, scratch);
      case RELEASE:
        if (u.getNextFormat().getValueType() == ValueType.MAP) {
          try {
            return readDecision(u, scratch);
          } catch (BadResult e) {
            return new Decision(true, Mode.UNKNOWN, 0, 0, 0, 0, -1, null, null);
          }
        }
        u.skipValue(); // the contract leaves release's result open: anything else means done
        return new Decision(true, Mode.UNKNOWN, 0, 0, 0, 0, -1, null, null);
      case ALL:
        return readAll(u, p.items, scratch);
      case RESERVE:
      case SETTLE:
        return readReservation(u, p.kind == Kind.SETTLE);
      case HEALTH: {
        Object value = readValue(u, 0);
        if (!(value instanceof Map)) {
          throw new BadResult("health result is not a map");
        }
        @SuppressWarnings("unchecked")
        Map<String, Object> map = (Map<String, Object>) value;
        Object status = map.get("status");
        Object redis = map.get("redis");
        if (!(status instanceof String)) {
          throw new BadResult("health result has no status");
        }
        return new Health((String) status, redis instanceof String ? (String) redis : "", map);
      }
      default:
        return readValue(u, 0);
    }
  }

  private static final int SCRATCH_BYTES = 64;
  // A decision map's keys, told apart by their bytes (no String per key).
  private static final int KEY_OTHER = 0;
  private static final int KEY_ALLOWED = 1;
  private static final int KEY_MODE = 2;
  private static final int KEY_REASON = 3;
  private static final int KEY_REMAINING = 4;
  private static final int KEY_LIMIT = 5;
  private static final int KEY_RESET_AFTER_MS = 6;
  private static final int KEY_RETRY_AFTER_MS = 7;
  private static final int KEY_WAITED_MS = 8;
  private static final byte[][] DECISION_KEYS = {
      null, ascii("allowed"), ascii("mode"), ascii("reason"), ascii("remaining"), ascii("limit"),
      ascii("reset_after_ms"), ascii("retry_after_ms"), ascii("waited_ms")};
  private static final Mode[] MODES = Mode.values();
  private static final byte[][] MODE_NAMES = new byte[MODES.length][];

  static {
    for (int i = 0; i < MODES.length; i++) {
      MODE_NAMES[i] = ascii(MODES[i].wireName());
    }
  }

  // The names above by length, so a key is compared with one or two names, not all.
  private static final int[][] DECISION_KEYS_BY_LENGTH = byLength(DECISION_KEYS);
  private static final int[][] MODE_NAMES_BY_LENGTH = byLength(MODE_NAMES);

  /** For each length up to SCRATCH_BYTES, the indexes (from 1) of the names that long. */
  private static int[][] byLength(byte[][] names) {
    int[][] table = new int[SCRATCH_BYTES + 1][];
    for (int len = 0; len <= SCRATCH_BYTES; len++) {
      int count = 0;
      for (int i = 1; i < names.length; i++) {
        count += names[i].length == len ? 1 : 0;
      }
      table[len] = new int[count];
      count = 0;
      for (int i = 1; i < names.length; i++) {
        if (names[i].length == len) {
          table[len][count++] = i;
        }
      }
    }
    return table;
  }

  /** The index of the name scratch[0, len) is (len -1: skipped), 0 for none. */
  private static int lookUp(byte[] scratch, int len, byte[][] names, int[][] byLength) {
    if (len < 0) {
      return 0;
    }
    // Names are a few bytes long: a plain loop beats Arrays.equals's setup.
    next:
    for (int i : byLength[len]) {
      byte[] name = names[i];
      for (int k = 0; k < len; k++) {
        if (scratch[k] != name[k]) {
          continue next;
        }
      }
      return i;
    }
    return 0;
  }

  private static byte[] ascii(String text) {
    return text.getBytes(StandardCharsets.US_ASCII);
  }

  /**
   * Reads a str or bin (its format `f`, already peeked) of at most
   * scratch.length bytes into scratch; -1 (skipped) if longer.
   */
  private static int readShortBytes(MessageUnpacker u, MessageFormat f, byte[] scratch)
      throws IOException, FatalFrame {
    int len = f.getValueType() == ValueType.BINARY ? u.unpackBinaryHeader()
        : u.unpackRawStringHeader();
    if (len < 0 || len > MAX_RESPONSE_BYTES) {
      throw new FatalFrame(ErrorCode.ETOOLARGE, "a string over 4 MiB");
    }
    if (len > scratch.length) {
      u.readPayload(len);
      return -1;
    }
    u.readPayload(scratch, 0, len);
    return len;
  }

  /** Which decision key the next str or bin (a map key) is; KEY_OTHER for any other. */
  private static int readDecisionKey(MessageUnpacker u, MessageFormat f, byte[] scratch)
      throws IOException, FatalFrame {
    int len = readShortBytes(u, f, scratch);
    return lookUp(scratch, len, DECISION_KEYS, DECISION_KEYS_BY_LENGTH); // 0 is KEY_OTHER
  }

  /** The mode the next str or bin names; UNKNOWN for any other name. */
  private static Mode readMode(MessageUnpacker u, MessageFormat f, byte[] scratch)
      throws IOException, FatalFrame {
    int len = readShortBytes(u, f, scratch);
    return MODES[lookUp(scratch, len, MODE_NAMES, MODE_NAMES_BY_LENGTH)]; // 0 is UNKNOWN
  }

  /**
   * Reads a decision map whole (so the stream stays framed even when the
   * map is malformed); keys this library does not know are skipped.
   */
  private static Decision readDecision(MessageUnpacker u, byte[] scratch)
      throws IOException, FatalFrame, BadResult {
    if (u.getNextFormat().getValueType() != ValueType.MAP) {
      u.skipValue();
      throw new BadResult("result is not a decision map");
    }
    int n = u.unpackMapHeader();
    boolean allowed = false;
    boolean sawAllowed = false;
    boolean bad = false;
    Mode mode = Mode.UNKNOWN;
    long remaining = 0;
    long limit = 0;
    long resetAfterMs = 0;
    long retryAfterMs = 0;
    long waitedMs = -1;
    String reason = null;
    // Each key's and value's format is peeked once and passed on.
    for (int i = 0; i < n; i++) {
      MessageFormat kf = u.getNextFormat();
      ValueType kt = kf.getValueType();
      if (kt != ValueType.STRING && kt != ValueType.BINARY) {
        u.skipValue(2);
        bad = true;
        continue;
      }
      int key = readDecisionKey(u, kf, scratch);
      MessageFormat vf = u.getNextFormat();
      ValueType vt = vf.getValueType();
      switch (key) {
        case KEY_ALLOWED:
          if (vt == ValueType.BOOLEAN) {
            allowed = u.unpackBoolean();
            sawAllowed = true;
          } else {
            u.skipValue();
            bad = true;
          }
          break;
        case KEY_MODE:
          if (vt == ValueType.STRING || vt == ValueType.BINARY) {
            mode = readMode(u, vf, scratch);
          } else {
            u.skipValue();
            bad = true;
          }
          break;
        case KEY_REASON:
          if (vt == ValueType.STRING || vt == ValueType.BINARY) {
            reason = readText(u);
          } else {
            u.skipValue();
          }
          break;
        case KEY_REMAINING:
        case KEY_LIMIT:
        case KEY_RESET_AFTER_MS:
        case KEY_RETRY_AFTER_MS:
        case KEY_WAITED_MS:
          if (vt != ValueType.INTEGER) {
            u.skipValue();
            bad = true;
            break;
          }
          // A number of 2^32 or more comes as a uint 64 (a window over 49
          // days resets in more ms than that); only one past Long.MAX_VALUE
          // is wrong, and unpackLong has read it whole when it says so.
          long v;
          try {
            v = u.unpackLong();
          } catch (MessageIntegerOverflowException e) {
            bad = true;
            break;
          }
          switch (key) {
            case KEY_REMAINING:
              remaining = v;
              break;
            case KEY_LIMIT:
              limit = v;
              break;
            case KEY_RESET_AFTER_MS:
              resetAfterMs = v;
              break;
            case KEY_RETRY_AFTER_MS:
              retryAfterMs = v;
              break;
            default:
              waitedMs = v;
              break;
          }
          break;
        default:
          u.skipValue();
          break;
      }
    }
    if (bad || !sawAllowed) {
      throw new BadResult("malformed decision map");
    }
    return new Decision(allowed, mode, remaining, limit, resetAfterMs, retryAfterMs, waitedMs,
        reason, null);
  }

  private static AcquireAllResult readAll(MessageUnpacker u, int count, byte[] scratch)
      throws IOException, FatalFrame, BadResult {
    if (u.getNextFormat().getValueType() != ValueType.MAP) {
      u.skipValue();
      throw new BadResult("acquire_all result is not a map");
    }
    int n = u.unpackMapHeader();
    Boolean allowed = null;
    List<Decision> results = null;
    String bad = null;
    for (int i = 0; i < n; i++) {
      String key = readKey(u);
      ValueType vt = u.getNextFormat().getValueType();
      if ("allowed".equals(key) && vt == ValueType.BOOLEAN) {
        allowed = u.unpackBoolean();
      } else if ("results".equals(key) && vt == ValueType.ARRAY) {
        int m = u.unpackArrayHeader();
        results = new ArrayList<>(m);
        for (int k = 0; k < m; k++) {
          try {
            results.add(readDecision(u, scratch));
          } catch (BadResult e) {
            bad = e.getMessage();
          }
        }
        if (m != count) {
          bad = "acquire_all answered " + m + " results for " + count + " items";
        }
      } else {
        u.skipValue();
      }
    }
    if (bad != null || allowed == null || results == null) {
      throw new BadResult(bad != null ? bad : "malformed acquire_all result");
    }
    return new AcquireAllResult(allowed, results);
  }

  /** Any value, decoded as {@link #callAsync} says. */
  private static Object readValue(MessageUnpacker u, int depth) throws IOException, FatalFrame {
    MessageFormat f = u.getNextFormat();
    switch (f.getValueType()) {
      case NIL:
        u.unpackNil();
        return null;
      case BOOLEAN:
        return u.unpackBoolean();
      case INTEGER:
        if (f == MessageFormat.UINT64) {
          BigInteger big = u.unpackBigInteger();
          return big.bitLength() < 64 ? (Object) big.longValue() : big;
        }
        return u.unpackLong();
      case FLOAT:
        return u.unpackDouble();
      case STRING:
        return readText(u);
      case BINARY: {
        int len = u.unpackBinaryHeader();
        if (len < 0 || len > MAX_RESPONSE_BYTES) {
          throw new FatalFrame(ErrorCode.ETOOLARGE, "a bin over 4 MiB");
        }
        return u.readPayload(len);
      }
      case ARRAY: {
        if (depth >= MAX_VALUE_DEPTH) {
          throw new FatalFrame(ErrorCode.EPROTO, "a result nested too deep");
        }
        int n = u.unpackArrayHeader();
        List<Object> list = new ArrayList<>(Math.min(n, 1024));
        for (int i = 0; i < n; i++) {
          list.add(readValue(u, depth + 1));
        }
        return list;
      }
      case MAP: {
        if (depth >= MAX_VALUE_DEPTH) {
          throw new FatalFrame(ErrorCode.EPROTO, "a result nested too deep");
        }
        int n = u.unpackMapHeader();
        Map<String, Object> map = new LinkedHashMap<>();
        for (int i = 0; i < n; i++) {
          String key = readKey(u);
          map.put(key, readValue(u, depth + 1));
        }
        return map;
      }
      default:
        u.skipValue();
        return null;
    }
  }
}
