package sluice

// The concurrency model. A Client has one connection at a time and three
// kinds of goroutines around it:
//   - callers encode their request into `out` (the queue of requests not
//     one byte of which was written), register a call under its msgid in
//     `pending`, wake the writer and wait for their call's `done` or their
//     context, whichever comes first;
//   - one writer goroutine per Client takes the whole queue at once and
//     writes it, so requests of concurrent callers share a write(); it opens
//     the connection when there is none (the reconnection rule) and is the
//     only goroutine that dials or writes;
//   - one reader goroutine per connection decodes responses, takes each
//     call out of `pending` by msgid and completes it.
// Whoever takes a call out of `pending` (the reader with its answer, a
// failure that drops the connection) is the one that completes it, so a call
// completes at most once; a caller whose context ended takes its call out
// and returns without it. Every field below `mu` is guarded by it; the
// socket I/O and dialing run without it.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Options configure a Client; the zero value is the default everywhere.
type Options struct {
	// Timeout bounds each call whose context has no deadline; 0 leaves such
	// a call to its context alone.
	Timeout time.Duration
	// DialTimeout bounds each attempt to connect; 0 is one second.
	DialTimeout time.Duration
	// OnUnreachable is what Allow decides when the daemon cannot be asked:
	// FailOpen (the default) or FailClosed.
	OnUnreachable Policy
	// MaxQueuedBytes bounds the requests queued that the socket has not
	// taken yet (the daemon stopped reading); a call beyond it fails with
	// ErrBusy. 0 is 16 MiB.
	MaxQueuedBytes int
	// FirstMsgID is the msgid of the first request; 0 starts at 1. Msgids
	// wrap within 32 bits; tests start near 2^32 to watch them wrap.
	FirstMsgID uint32
}

const (
	defaultDialTimeout    = time.Second
	defaultMaxQueuedBytes = 16 << 20
	readBufferBytes       = 64 << 10
	// maxGatherRounds bounds the yields of the writer gathering requests.
	maxGatherRounds = 4
)

// Client is a connection to sluiced shared by any number of goroutines.
// All its methods are safe for concurrent use.
type Client struct {
	path       string
	opts       Options
	wake       chan struct{} // capacity 1: the writer has work
	quit       chan struct{} // closed by Close
	writerDone chan struct{}
	allowed    atomic.Uint64 // Stats.UnreachableAllowed
	denied     atomic.Uint64 // Stats.UnreachableDenied

	mu         sync.Mutex
	nc         *net.UnixConn // nil while disconnected
	gen        uint64        // counts connections opened; a reader knows its own
	pending    map[uint32]*call
	out        *bytes.Buffer // queued requests, not one byte of them written
	outCalls   []*call       // the calls of `out`, in order
	spare      *bytes.Buffer // the other buffer, swapped with `out` per write
	spareCalls []*call
	enc        *msgpack.Encoder // writes into `out`
	nextID     uint32
	closed     bool
	written    uint64 // bytes the sockets took, for tests to see a request out
}

// call is one request from its queueing to its answer.
type call struct {
	id      uint32
	kind    resultKind
	written bool // a byte of it may have reached a socket
	done    chan struct{}
	// answer counts the answers its connection's reader had read when this
	// one came, so tests can see the order of the answers on the wire.
	answer uint64
	err    error
	// The result, by kind; the reader allocates the rarer ones.
	decision Decision
	extras   extras // reserve's id; settle's id, refunded, debt and unpaid
	all      *AllDecision
	health   *Health
}

// extras is what a reservation's decision map carries besides the decision.
type extras struct {
	id       uint64
	refunded int64
	debt     int64
	unpaid   int64
}

type resultKind uint8

const (
	kindDecision resultKind = iota
	kindRelease
	kindAll
	kindHealth
	kindReserve // a decision map with id
	kindSettle  // a decision map with id, refunded, debt and unpaid
)

func (k *call) finish(err error) {
	k.err = err
	k.done <- struct{}{}
}

// New returns a Client of the daemon at socketPath without connecting: the
// first call connects. Close it when done.
func New(socketPath string, opts *Options) *Client {
	c := &Client{
		path:       socketPath,
		wake:       make(chan struct{}, 1),
		quit:       make(chan struct{}),
		writerDone: make(chan struct{}),
		pending:    make(map[uint32]*call),
		out:        new(bytes.Buffer),
		spare:      new(bytes.Buffer),
		nextID:     1,
	}
	if opts != nil {
		c.opts = *opts
	}
	if c.opts.DialTimeout <= 0 {
		c.opts.DialTimeout = defaultDialTimeout
	}
	if c.opts.MaxQueuedBytes <= 0 {
		c.opts.MaxQueuedBytes = defaultMaxQueuedBytes
	}
	if c.opts.FirstMsgID != 0 {
		c.nextID = c.opts.FirstMsgID
	}
	c.enc = msgpack.NewEncoder(c.out)
	go c.writeLoop()
	return c
}

// Connect is New followed by connecting at once, so that a wrong path or a
// daemon that is not running shows up here (ErrConnect).
func Connect(ctx context.Context, socketPath string, opts *Options) (*Client, error) {
	c := New(socketPath, opts)
	c.mu.Lock()
	err := c.dialLocked(ctx)
	c.mu.Unlock()
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Close closes the connection; calls waiting for an answer fail with
// ErrClosed. Close waits for the writer goroutine to end.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	if c.nc != nil {
		c.nc.Close()
		c.nc = nil
	}
	closing := &Error{Code: CodeClosed, Message: "the client was closed"}
	for id, k := range c.pending {
		delete(c.pending, id)
		k.finish(closing)
	}
	c.mu.Unlock()
	close(c.quit)
	<-c.writerDone
	return nil
}

// Stats returns what the Policy decided so far.
func (c *Client) Stats() Stats {
	return Stats{UnreachableAllowed: c.allowed.Load(), UnreachableDenied: c.denied.Load()}
}

// ---- requests ---------------------------------------------------------------

// request is what a call sends: [0, msgid, method, params], where params is
// one item [rule, key, ...] unless items, noParams or settleID say
// otherwise. reserve's item is [rule, key, estimate, ttl_ms]: cost and
// maxWaitMs carry them.
type request struct {
	method     string
	rule       string
	key        string
	withCost   bool
	cost       uint32
	maxWaitMs  int64  // < 0: not sent, the rule's max_wait applies
	items      []Item // acquire_all's, sent as [[item, ...]]
	noParams   bool   // params []: health
	settleID   uint64 // settle's [id, actual], cancel's [id]
	withActual bool
	actual     uint32
}

// A key goes out as str when it is UTF-8 and as bin otherwise, as libsluice
// sends it; the daemon accepts both.
func encodeKey(enc *msgpack.Encoder, key string) {
	if utf8.ValidString(key) {
		_ = enc.EncodeString(key)
	} else {
		_ = enc.EncodeBytes([]byte(key))
	}
}

// encodeItem writes [rule, key], [rule, key, cost] or [rule, key, cost,
// max_wait_ms].
func encodeItem(enc *msgpack.Encoder, rule, key string, withCost bool, cost uint32, maxWaitMs int64) {
	n := 2
	if withCost {
		n = 3
		if maxWaitMs >= 0 {
			n = 4
		}
	}
	_ = enc.EncodeArrayLen(n)
	_ = enc.EncodeString(rule)
	encodeKey(enc, key)
	if withCost {
		_ = enc.EncodeUint(uint64(cost))
		if maxWaitMs >= 0 {
			_ = enc.EncodeUint(uint64(maxWaitMs))
		}
	}
}

// encodeLocked appends the request to `out`. Writes into a bytes.Buffer
// cannot fail, hence the ignored errors.
func (c *Client) encodeLocked(id uint32, r *request) {
	e := c.enc
	_ = e.EncodeArrayLen(4)
	_ = e.EncodeUint(0)
	_ = e.EncodeUint(uint64(id))
	_ = e.EncodeString(r.method)
	switch {
	case r.items != nil:
		_ = e.EncodeArrayLen(1)
		_ = e.EncodeArrayLen(len(r.items))
		for i := range r.items {
			encodeItem(e, r.items[i].Rule, r.items[i].Key, true, r.items[i].Cost, -1)
		}
	case r.noParams:
		_ = e.EncodeArrayLen(0)
	case r.settleID != 0:
		if r.withActual {
			_ = e.EncodeArrayLen(2)
			_ = e.EncodeUint(r.settleID)
			_ = e.EncodeUint(uint64(r.actual))
		} else {
			_ = e.EncodeArrayLen(1)
			_ = e.EncodeUint(r.settleID)
		}
	default:
		encodeItem(e, r.rule, r.key, r.withCost, r.cost, r.maxWaitMs)
	}
}

func timeoutError(err error) error {
	return &Error{Code: CodeTimedOut, Err: err}
}

// start queues a request and wakes the writer; the call's answer comes on
// its `done`. k is the call to use, or nil for a new one.
func (c *Client) start(ctx context.Context, k *call, kind resultKind, r *request) (*call, error) {
	if err := ctx.Err(); err != nil {
		return nil, timeoutError(err)
	}
	if k == nil {
		k = new(call)
	}
	k.kind = kind
	k.done = make(chan struct{}, 1)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, &Error{Code: CodeClosed, Message: "the client was closed"}
	}
	if c.out.Len() >= c.opts.MaxQueuedBytes {
		c.mu.Unlock()
		return nil, &Error{Code: CodeBusy}
	}
	k.id = c.nextID
	c.nextID++ // wraps from 2^32-1 to 0
	c.encodeLocked(k.id, r)
	c.pending[k.id] = k
	c.outCalls = append(c.outCalls, k)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default: // already woken: it takes the whole queue
	}
	return k, nil
}

// timers are reused for Options.Timeout: a timer per call costs less than a
// derived context, and one from the pool less still.
var timers sync.Pool

// wait returns once the call is answered, ctx ends or Options.Timeout
// passes (when ctx has no deadline). A call given up on stays where it is on
// the wire; its answer is dropped when it comes.
func (c *Client) wait(ctx context.Context, k *call) error {
	select {
	case <-k.done: // pipelined: often answered already
		return k.err
	default:
	}
	var expired <-chan time.Time
	if c.opts.Timeout > 0 {
		if _, ok := ctx.Deadline(); !ok {
			t, _ := timers.Get().(*time.Timer)
			if t == nil {
				t = time.NewTimer(c.opts.Timeout)
			} else {
				t.Reset(c.opts.Timeout)
			}
			defer func() {
				if !t.Stop() {
					select {
					case <-t.C:
					default:
					}
				}
				timers.Put(t)
			}()
			expired = t.C
		}
	}
	var cause error
	select {
	case <-k.done:
		return k.err
	case <-ctx.Done():
		cause = ctx.Err()
	case <-expired:
		cause = context.DeadlineExceeded
	}
	select {
	case <-k.done: // answered as time ran out: the answer wins
		return k.err
	default:
	}
	// Given up on: whoever holds the call (the reader, part way through
	// its answer) completes it into `done`, which nobody reads any more.
	c.mu.Lock()
	if c.pending[k.id] == k {
		delete(c.pending, k.id)
	}
	c.mu.Unlock()
	return timeoutError(cause)
}

func (c *Client) do(ctx context.Context, kind resultKind, r *request) (*call, error) {
	k, err := c.start(ctx, nil, kind, r)
	if err != nil {
		return nil, err
	}
	if err := c.wait(ctx, k); err != nil {
		return nil, err
	}
	return k, nil
}

// ---- the writer -------------------------------------------------------------

func (c *Client) writeLoop() {
	defer close(c.writerDone)
	for {
		select {
		case <-c.wake:
		case <-c.quit:
			return
		}
		// Let the callers that are ready to run queue their requests first,
		// while the queue keeps growing (a few rounds at most): one write()
		// then carries many of them, and the daemon reads them in one go,
		// instead of a write per request when the writer is the fastest
		// goroutine. With nothing else to run, Gosched returns at once.
		runtime.Gosched()
		c.mu.Lock()
		for round, queued := 0, -1; round < maxGatherRounds && len(c.outCalls) > queued; round++ {
			queued = len(c.outCalls)
			c.mu.Unlock()
			runtime.Gosched()
			c.mu.Lock()
		}
		c.flushLocked()
		c.mu.Unlock()
	}
}

// flushLocked writes everything queued, connecting first when there is no
// connection. mu is released around dialing and writing.
func (c *Client) flushLocked() {
	reconnected := false
	for c.out.Len() > 0 && !c.closed {
		if c.nc == nil {
			if err := c.dialLocked(context.Background()); err != nil {
				c.failQueuedLocked(err)
				return
			}
		}
		batch, calls := c.out, c.outCalls
		c.out, c.outCalls = c.spare, c.spareCalls[:0]
		c.enc.Reset(c.out)
		for _, k := range calls {
			k.written = true
		}
		nc, gen := c.nc, c.gen
		c.mu.Unlock()
		n, err := nc.Write(batch.Bytes())
		c.mu.Lock()
		if err != nil && n == 0 && !reconnected && peerGone(err) && gen == c.gen && c.nc != nil &&
			!c.closed {
			// The daemon went away before it took one byte of the batch
			// (a restart the reader has not noticed yet): none of these
			// requests reached it, so they go first on a new connection.
			// (Had the reader noticed first, it failed them already.)
			reconnected = true
			for _, k := range calls {
				k.written = false
			}
			c.dropLocked(gen, &Error{Code: CodeClosed, Err: err})
			batch.Write(c.out.Bytes())
			calls = append(calls, c.outCalls...)
			c.out.Reset()
			c.spare, c.spareCalls = c.out, clearCalls(c.outCalls)
			c.out, c.outCalls = batch, calls
			c.enc.Reset(c.out)
			continue
		}
		c.written += uint64(n)
		if err != nil {
			c.dropLocked(gen, ioError(err))
		}
		batch.Reset()
		c.spare, c.spareCalls = batch, clearCalls(calls)
	}
}

// clearCalls empties a slice for reuse without keeping its calls alive.
func clearCalls(calls []*call) []*call {
	for i := range calls {
		calls[i] = nil
	}
	return calls[:0]
}

func peerGone(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ENOTCONN)
}

func ioError(err error) *Error {
	if peerGone(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return &Error{Code: CodeClosed, Err: err}
	}
	return &Error{Code: CodeIO, Err: err}
}

// dialLocked opens a connection and starts its reader; mu is released while
// dialing, which only the writer (or Connect, before any call) does.
func (c *Client) dialLocked(ctx context.Context) error {
	c.mu.Unlock()
	d := net.Dialer{Timeout: c.opts.DialTimeout}
	conn, err := d.DialContext(ctx, "unix", c.path)
	c.mu.Lock()
	if err != nil {
		return &Error{Code: CodeConnect, Err: err}
	}
	if c.closed {
		conn.Close()
		return &Error{Code: CodeClosed, Message: "the client was closed"}
	}
	c.gen++
	c.nc = conn.(*net.UnixConn)
	go c.readLoop(c.nc, c.gen)
	return nil
}

// failQueuedLocked fails every queued call (none was written).
func (c *Client) failQueuedLocked(err error) {
	for _, k := range c.outCalls {
		if c.pending[k.id] == k {
			delete(c.pending, k.id)
			k.finish(err)
		}
	}
	c.out.Reset()
	c.outCalls = clearCalls(c.outCalls)
}

// dropLocked closes connection `gen` if it is still the current one and
// fails the calls that were written on it; queued calls stay for the next.
func (c *Client) dropLocked(gen uint64, err error) {
	if c.gen != gen || c.nc == nil {
		return
	}
	c.nc.Close()
	c.nc = nil
	for id, k := range c.pending {
		if k.written {
			delete(c.pending, id)
			k.finish(err)
		}
	}
	if c.out.Len() > 0 {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// ---- the reader -------------------------------------------------------------

var errTooLarge = errors.New("response frame over MaxResponseBytes")

// frameReader bounds the bytes one response frame may take.
type frameReader struct {
	r    *bufio.Reader
	left int
}

func (f *frameReader) Read(p []byte) (int, error) {
	if f.left <= 0 {
		return 0, errTooLarge
	}
	if len(p) > f.left {
		p = p[:f.left]
	}
	n, err := f.r.Read(p)
	f.left -= n
	return n, err
}

func (f *frameReader) ReadByte() (byte, error) {
	if f.left <= 0 {
		return 0, errTooLarge
	}
	b, err := f.r.ReadByte()
	if err == nil {
		f.left--
	}
	return b, err
}

func (f *frameReader) UnreadByte() error {
	err := f.r.UnreadByte()
	if err == nil {
		f.left++
	}
	return err
}

func (c *Client) readLoop(nc *net.UnixConn, gen uint64) {
	fr := &frameReader{r: bufio.NewReaderSize(nc, readBufferBytes)}
	rd := reader{dec: msgpack.NewDecoder(fr)}
	for {
		fr.left = MaxResponseBytes
		k, err := c.readResponse(&rd)
		if err == nil {
			continue
		}
		var failure *Error
		switch {
		case errors.Is(err, errTooLarge):
			failure = &Error{Code: CodeTooLarge}
		case errors.As(err, &failure):
		case isNetError(err):
			failure = ioError(err)
		default:
			failure = &Error{Code: CodeProto, Err: err}
		}
		c.mu.Lock()
		if k != nil {
			k.finish(failure)
		}
		c.dropLocked(gen, failure)
		c.mu.Unlock()
		return
	}
}

func isNetError(err error) bool {
	var ne net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne) ||
		peerGone(err)
}

// readResponse reads one frame. A response completes its call, or is
// dropped when its call was given up on; a notification is skipped. An
// error means the stream cannot be read on; the call returned with it (if
// any) was taken out of pending and the caller completes it.
func (c *Client) readResponse(r *reader) (*call, error) {
	r.bad = false
	n, err := r.dec.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	kind, err := r.dec.DecodeInt64()
	if err != nil {
		return nil, err
	}
	if n == 3 && kind == 2 { // a notification [2, method, params]: no answer
		if err := r.dec.Skip(); err != nil {
			return nil, err
		}
		return nil, r.dec.Skip()
	}
	if n != 4 || kind != 1 {
		return nil, &Error{Code: CodeProto, Message: "a frame that is not a response"}
	}
	id, err := r.dec.DecodeUint64()
	if err != nil {
		return nil, err
	}
	if id > 0xFFFFFFFF {
		return nil, &Error{Code: CodeProto, Message: "a msgid beyond 32 bits"}
	}
	serverErr := r.serverError()
	if r.err != nil {
		return nil, r.err
	}
	r.answers++
	c.mu.Lock()
	k := c.pending[uint32(id)]
	if k != nil {
		delete(c.pending, uint32(id))
		k.answer = r.answers
	}
	c.mu.Unlock()
	if k == nil || serverErr != nil {
		if err := r.dec.Skip(); err != nil {
			return k, err
		}
		if k != nil {
			k.finish(serverErr)
		}
		return nil, nil
	}
	switch k.kind {
	case kindDecision:
		r.decision(&k.decision)
	case kindRelease:
		r.decision(&k.decision)
		if r.bad { // release's result is left open: anything but a decision means done
			r.bad = false
			k.decision = Decision{Allowed: true}
		}
	case kindAll:
		k.all = new(AllDecision)
		r.allDecision(k.all)
	case kindHealth:
		k.health = new(Health)
		r.health(k.health)
	case kindReserve, kindSettle:
		r.decisionWith(&k.decision, &k.extras)
	}
	if r.err != nil {
		return k, r.err
	}
	if r.bad {
		k.finish(&Error{Code: CodeProto, Message: "a result of the wrong shape"})
	} else {
		k.finish(nil)
	}
	return nil, nil
}

// reader decodes the values of a response. A value of the wrong type is
// skipped whole and marks the result bad (the stream stays in step); a
// stream error is kept in err, and every later read is then a no-op.
type reader struct {
	dec     *msgpack.Decoder
	answers uint64 // responses read
	bad     bool
	err     error
	buf     [64]byte
}

func (r *reader) peek() byte {
	if r.err != nil {
		return 0
	}
	code, err := r.dec.PeekCode()
	if err != nil {
		r.err = err
	}
	return code
}

func (r *reader) skip() {
	if r.err == nil {
		r.err = r.dec.Skip()
	}
}

func (r *reader) wrong() {
	r.bad = true
	r.skip()
}

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Uint64) ||
		(c >= msgpcode.Int8 && c <= msgpcode.Int64)
}

func isText(c byte) bool {
	return msgpcode.IsFixedString(c) || c == msgpcode.Str8 || c == msgpcode.Str16 ||
		c == msgpcode.Str32 || c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func (r *reader) int() int64 {
	if !isInt(r.peek()) {
		r.wrong()
		return 0
	}
	v, err := r.dec.DecodeInt64()
	if err != nil {
		r.err = err
	}
	return v
}

func (r *reader) bool() bool {
	c := r.peek()
	if c != msgpcode.True && c != msgpcode.False {
		r.wrong()
		return false
	}
	v, err := r.dec.DecodeBool()
	if err != nil {
		r.err = err
	}
	return v
}

// text reads a str or bin; the slice is valid until the next read.
func (r *reader) text() []byte {
	if !isText(r.peek()) {
		r.wrong()
		return nil
	}
	n, err := r.dec.DecodeBytesLen()
	if err != nil {
		r.err = err
		return nil
	}
	b := r.buf[:0]
	if n > len(r.buf) {
		b = make([]byte, n)
	}
	b = b[:n]
	if err := r.dec.ReadFull(b); err != nil {
		r.err = err
	}
	return b
}

func (r *reader) mapLen() int {
	if !isMap(r.peek()) {
		r.wrong()
		return 0
	}
	n, err := r.dec.DecodeMapLen()
	if err != nil {
		r.err = err
	}
	return n
}

func (r *reader) arrayLen() int {
	if !isArray(r.peek()) {
		r.wrong()
		return 0
	}
	n, err := r.dec.DecodeArrayLen()
	if err != nil {
		r.err = err
	}
	return n
}

// serverError reads the error element: nil, or the daemon's error map
// {"code", "message"} (a bare string is taken as the message).
func (r *reader) serverError() *Error {
	c := r.peek()
	switch {
	case r.err != nil:
		return nil
	case c == msgpcode.Nil:
		r.err = r.dec.DecodeNil()
		return nil
	case isText(c):
		return &Error{Code: CodeServer, Message: string(r.text())}
	case !isMap(c):
		r.skip()
		return &Error{Code: CodeServer}
	}
	e := &Error{Code: CodeServer}
	n := r.mapLen()
	for i := 0; i < n && r.err == nil; i++ {
		switch string(r.text()) {
		case "code":
			e.ServerCode = string(r.text())
		case "message":
			e.Message = string(r.text())
		default:
			r.skip()
		}
	}
	r.bad = false // an odd error map is still an error answer
	return e
}

// modeOf turns a wire name into a Mode without allocating for known names.
func modeOf(name []byte) Mode {
	for _, m := range [...]Mode{ModeLocal, ModeNormal, ModeFallback, ModeOpen, ModeClosed,
		ModeShadow, ModeBlocked} {
		if string(name) == string(m) {
			return m
		}
	}
	return Mode(name)
}

// decision reads a decision map; keys this library does not know are
// skipped, and a map without "allowed" is bad.
func (r *reader) decision(d *Decision) {
	r.decisionWith(d, nil)
}

// decisionWith is decision that also stores a reservation's keys in x when
// x is not nil.
func (r *reader) decisionWith(d *Decision, x *extras) {
	*d = Decision{}
	if x != nil {
		*x = extras{}
	}
	sawAllowed := false
	n := r.mapLen()
	for i := 0; i < n && r.err == nil; i++ {
		key := r.text()
		switch string(key) {
		case "allowed":
			d.Allowed = r.bool()
			sawAllowed = true
		case "remaining":
			d.Remaining = r.int()
		case "limit":
			d.Limit = r.int()
		case "reset_after_ms":
			d.ResetAfterMs = r.int()
		case "retry_after_ms":
			d.RetryAfterMs = r.int()
		case "waited_ms":
			d.WaitedMs = r.int()
		case "mode":
			d.Mode = modeOf(r.text())
		case "reason":
			d.Reason = string(r.text())
		default:
			r.extra(key, x)
		}
	}
	if !sawAllowed {
		r.bad = true
	}
}

// extra reads the value of a decision map's key that decision does not know
// (key, valid until the next read): a reservation's field when x is not
// nil; else it skips the value.
func (r *reader) extra(key []byte, x *extras) {
	if x == nil {
		r.skip()
		return
	}
	switch string(key) {
	case "id":
		if !isInt(r.peek()) {
			r.wrong()
			return
		}
		v, err := r.dec.DecodeUint64()
		if err != nil {
			r.err = err
		}
		x.id = v
	case "refunded":
		x.refunded = r.int()
	case "debt":
		x.debt = r.int()
	case "unpaid":
		x.unpaid = r.int()
	default:
		r.skip()
	}
}

func (r *reader) allDecision(a *AllDecision) {
	sawAllowed, sawResults := false, false
	n := r.mapLen()
	for i := 0; i < n && r.err == nil; i++ {
		switch string(r.text()) {
		case "allowed":
			a.Allowed = r.bool()
			sawAllowed = true
		case "results":
			count := r.arrayLen()
			a.Results = make([]Decision, count)
			for j := 0; j < count && r.err == nil; j++ {
				r.decision(&a.Results[j])
			}
			sawResults = true
		default:
			r.skip()
		}
	}
	if !sawAllowed || !sawResults {
		r.bad = true
	}
}

func (r *reader) health(h *Health) {
	if !isMap(r.peek()) {
		r.wrong()
		return
	}
	v, err := r.dec.DecodeInterface()
	if err != nil {
		r.err = err
		return
	}
	fields, ok := v.(map[string]interface{})
	if !ok {
		r.bad = true
		return
	}
	h.Fields = fields
	h.Status, _ = fields["status"].(string)
	h.Redis, _ = fields["redis"].(string)
	if h.Status == "" {
		r.bad = true
	}
}
