// Slice: the words of a leasing global rule's key entry, and every
// transition of them (docs/design.md, "The lease path").
//
// A global rule's key holds a slice: units this node has leased from the
// rule's global state in Redis and may hand out on its own. The slice is the
// first kWords atomic words of the key's key-table entry (entry.h lays the
// entry out; a holding, holding.h, extends the same words), so workers
// decide on it without a lock, exactly as on a local rule's state:
//
//  - take() spends from the slice, or says why it cannot: the key is
//    negatively cached ("nothing left in Redis until t"), a lease failed and
//    the key follows its on_redis_down policy for a moment, or the slice is
//    empty and a lease is on its way (the caller may wait for it).
//  - At most one lease per key is in flight: the in-flight bit is claimed by
//    compare-and-swap, and only the claimer sends a LeaseRequest (lease.h).
//  - A refill is asked for when the slice falls under its low-water mark (a
//    quarter of the last batch), so a hot key does not run dry.
//  - The batch adapts to demand: the units asked for per lease interval,
//    measured over at least one interval (a hot key leases every few ms, and
//    the few units asked for since the last lease say nothing of its rate),
//    never more than the node's share (the rule's capacity / N) and never
//    less than the cost asked for.
//  - While Redis has plenty left after each grant (kRoomyFactor times what
//    it granted), or each grant finds the key's state untouched by other
//    nodes (untouched(): a bucket full, a fixed window as this node left
//    it; a lone key at or under its limit, whose burst or window holds
//    fewer than kRoomyFactor batches), the batch covers twice as many lease
//    intervals each lease, up to 2^kMaxBoost; the first grant that does
//    neither resets it. An uncontended key then costs Redis one lease per
//    16 intervals instead of one per interval, which is what lets 10,000
//    busy keys lease at all; a contended one leases small batches, so no
//    node sits on units another needs. A key whose leases are stamped
//    (sliding_log) never boosts: the units its slice holds are its
//    overshoot bound (overshoot.h). Unless the log's last answer left room
//    for kRoomyFactor batches of every node, it leases a tenth of an
//    interval's demand at a time (kTightStampedParts): a unit leaves the
//    log one period after its lease, so the sooner it is spent after it,
//    the closer the fleet's admissions in any period come to the limit.
//  - A hot key of a token bucket or gcra rule may hold a rate lease instead
//    (rate_lease.h): "spend up to r units per period until t". Its slice
//    then refills here at r, one unit per kRateNsPerUnit ns, up to
//    kRateCap units (rate_lease::capUnits; tokens a lease brings may sit
//    above it), and asks Redis for nothing but the rate's renewal, due at
//    kRateRenewAt; an empty slice denies until its next units refill (a
//    cost past kRateCap, which the refill never reaches, leases tokens). At
//    kRateUntil the rate ends and the key leases tokens again. A key asks
//    for a rate only once a lease found Redis's bucket drained (kDrained).
//    While Redis is unreachable the rate is spent until it ends (and past
//    it within rate_lease::kFallbackHoldNs of the outage's beginning), at
//    63/64 of itself from the breaker's opening (takeOnRate, Outage,
//    kFallbackRateParts),
//    and what it admits then is counted (kRateFallback) to
//    be debited with the fallback shares' admissions: a master that took
//    over meanwhile may not know the rate.
//  - Every lease's answer also says what Redis had left after it; the slice
//    keeps that in the spare bits of kFlags (kRedisLeftShift), so that a
//    decision can report the fleet's remaining, not only this node's units
//    (redisLeft(), below), at no cost in memory.
//
// Invariant: no file but slice.cpp and holding.cpp reads or writes these
// words by index; everyone else goes through the functions below.
//
// Thread-safety: every function may run on any thread at once on the same
// words (workers, the control thread, the main thread's sweep); atomics
// only, no lock, no allocation, no clock read. The control thread applies
// replies through KeyTable::find() under its own ReadGuard, never through
// a kept pointer. Time: monotonic ns of this host, passed in as now_ns.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

#include "rules.h"

namespace sluice::slice {

using Words = std::span<std::atomic<uint64_t>>;
using ConstWords = std::span<const std::atomic<uint64_t>>;

// The words of a slice entry.
enum Word : size_t {
  kUnits = 0,      // units held, spendable now (int64)
  kFlags,          // kInFlight | kWarm | kRoomy | kRedisLeftKnown | kLine | the boost
                   // (kBoostMask) | Redis's left (bits kRedisLeftShift and up)
  kDenyUntil,      // ns: Redis had nothing for us; deny locally until then
  kDemand,         // units asked for since kDemandSince (an estimate)
  kDemandSince,    // ns: start of the demand measurement under way; 0: none yet
  kExpires,        // ns after which the units may not be spent (windows); 0: never
  kFallbackUntil,  // ns: a lease failed; the key follows on_redis_down until then
  kLeaseNowMs,     // Redis's clock (ms) at the last granting lease: its window
  kBatch,          // units asked for by the last lease request
  kRate,           // demand per lease interval in kRateParts-ths of a unit, last measured over one or more
  kRecheckAt,      // ns: while kDenyUntil stands, when to ask Redis again anyway
  kRateNsPerUnit,  // a rate lease's refill: one unit per this many ns (0: none)
  kRateCap,        // units the rate's refill fills the slice to, at most
  kRateUntil,      // ns: the rate lease ends (0: none held)
  kRateRenewAt,    // ns: when a take asks for the rate's renewal
  kRateRefilledAt, // ns: the rate has refilled the slice up to this time
  kRateMovedSince, // ns: the start of the window demandMoved measures
  kRateMovedSpan,  // ns: one lease interval, kRate's unit (0: not measuring)
  kRateMovedDemand,    // kDemand at kRateMovedSince
  kRateMoreNsPerUnit,  // demand above one unit per this many ns: twice what it asked (0: none)
  kRateLessNsPerUnit,  // demand below one unit per this many ns: half what it asked
  kRateFallback,   // units the rate admitted while Redis was unreachable, not debited yet
  kRateShortSince, // ns: since when its rate ops got less than asked while demand was unmet (0: not)
  kWords
};
constexpr uint64_t kInFlight = 1;
constexpr uint64_t kWarm = 2;   // a lease has granted units at least once
// The last grant left Redis kRoomyFactor times as much, or found the key's
// state untouched by other nodes (noteGrant, untouched()).
constexpr uint64_t kRoomy = 4;
// Bits kRedisLeftShift and up hold a lease's answer (noteRedisLeft).
constexpr uint64_t kRedisLeftKnown = 8;
// Requests of this node wait in line for the key's units (wait_lines.h):
// only the first in line may spend them. May outlive the line
// (WaitLines::standing).
constexpr uint64_t kLine = 16;
// The last lease (of tokens, or the tokens beside a rate) granted fewer
// units than it asked for: Redis's bucket ran dry (noteShort). A key may
// start a rate lease only then (rate_lease::wants), so that its burst is
// spent from Redis first.
constexpr uint64_t kDrained = 32;
// kRate's parts of a unit. A rate lease asks for the demand per period
// (rate_lease::askedRate): in whole units per lease interval of 100 ms, a
// node at 85.7/s would ask 90/s, and seven such nodes beside a hot one
// would leave 30/s of the limit unspent.
constexpr int64_t kRateParts = 1'000;
// Bits 8..11 of kFlags: log2 of how many lease intervals of demand the last
// batch covered.
constexpr int kBoostShift = 8;
constexpr uint64_t kBoostMask = uint64_t{0xF} << kBoostShift;
constexpr int kMaxBoost = 4;
// Bits 12..63 of kFlags (52 bits): what Redis had left at the last lease's
// answer, as noteRedisLeft encodes it.
constexpr int kRedisLeftShift = 12;
constexpr int64_t kRoomyFactor = 4;
// A stamped lease's batch (sliding_log) while Redis's log has no room for
// kRoomyFactor batches of every node: a this-many-th of an interval's
// demand.
constexpr int64_t kTightStampedParts = 10;

// A global rule's penalty block (one this node counted, or one a lease reply
// reported) is held by the node until it ends (its penalty words), and
// while leasing it is asked of Redis again this long after it was last
// learned (kDenyUntil is then the time to recheck): the key's next acquire
// after that leases, and Redis says whether the block still stands. So a
// block lifted anywhere (the admin reset) ends on every node within about
// this, at the cost of one lease per blocked key, node and interval while
// the key is still being asked for. While Redis is unreachable a node holds
// the blocks it knows of in full.
constexpr int64_t kBlockRecheckNs = 1'000'000'000;

// Redis's "nothing until t" is believed for this long at most: the other
// nodes give back what they leased and did not spend (idle keys, a stop,
// a learning node's surplus), and Redis may have those units long before
// t. Denials still tell callers t (Redis's best word on it), but the first
// take() after the recheck time also claims a lease, whose answer replaces
// the cache. Asking again costs one lease per refused key, node and recheck
// while the key is still being asked for.
constexpr int64_t kEmptyRecheckNs = 1'000'000'000;

// The slice of a key entry: its first kWords words.
inline Words of(Words entry) { return entry.first(kWords); }

enum class Outcome {
  kTaken,     // spent; `left` units remain
  kDenied,    // negatively cached until `until_ns` (must_request: the cache
              // is due for its recheck, and this caller claimed the lease)
  kEmpty,     // nothing to spend; a lease is in flight (maybe claimed now)
  kFallback,  // a lease failed lately: decide by on_redis_down
  kQueued,    // requests wait in line for the units; `until_ns` is when Redis
              // has units again (0: a lease is on its way or just came)
};

struct TakeResult {
  Outcome outcome = Outcome::kEmpty;
  int64_t left = 0;      // kTaken: units left in the slice
  int64_t until_ns = 0;  // kDenied
  // The caller claimed the in-flight bit and must send a LeaseRequest.
  bool must_request = false;
  bool cold = false;  // no lease has ever granted this key units
  int64_t dropped = 0;  // units dropped because their window had ended
};

// --- Workers ------------------------------------------------------------------

// Spends `cost` from the slice when it holds that many. Lock-free. A
// request asked again (it waited for a lease, or for its units) passes
// `again`: its units were counted in the key's demand the first time. While
// requests wait in line for the key (kLine), only the first of them may
// spend (`first_in_line`); any other is told kQueued.
TakeResult take(Words words, int64_t now_ns, int64_t cost, bool again = false,
                bool first_in_line = false);

// Where Redis's outage stands for takeOnRate and lookOnRate (monotonic ns;
// LeasePath::outage reads it off the breaker).
struct Outage {
  // The breaker's opening this key spends from; 0: it is not open. The
  // first take since drops what the slice held, and the fallback's refill
  // starts there.
  int64_t opened_ns = 0;
  // When the outage began: opened_ns, or the opening before it when a
  // recovery failed in between (LeaseBroker::lastOpenedNs). A rate that
  // held then is spent past its end until hold_until_ns (that plus
  // rate_lease::kFallbackHoldNs).
  int64_t began_ns = 0;
  int64_t hold_until_ns = 0;
};

// Redis is unreachable: spends `cost` from what the key's rate lease
// refills while the rate holds at now_ns, and past its end until
// outage.hold_until_ns when it still held when the outage began (the
// demand-weighted share in fallback); kDenied with the time of its next
// units when they are short, kFallback when no rate holds (the equal share
// decides). With outage.opened_ns, the refill is the fallback's
// (kFallbackRateParts), from that opening, and the first take since it
// drops what the slice held. The caller counts what it keeps
// (noteRateFallback). Claims no lease, counts no demand. Lock-free. See
// LeasePath::acquireOnRate.
TakeResult takeOnRate(Words words, int64_t now_ns, int64_t cost, const Outage& outage = {});

// While Redis is unreachable a rate refills at this many parts less one of
// kFallbackRateParts of the rate (fallbackNsPerUnit), from the breaker's
// opening, with what the slice held then dropped (takeOnRate): the rates
// held never sum past the limit, so what the fleet's rates admit from the
// opening over any span T is at most (1 - 1/kFallbackRateParts) x limit x T,
// and the part left over covers what the nodes spent of their slices
// between Redis's end and their breakers' opening (docs/design.md,
// "Fallback"): a fleet that spent the limit to the unit would otherwise sit
// on the limit's edge, and a unit of timing either way would put it over.
constexpr int64_t kFallbackRateParts = 64;

// The fallback's refill of a rate that refills one unit per ns_per_unit:
// one unit per ns_per_unit * kFallbackRateParts / (kFallbackRateParts - 1),
// rounded up (never faster).
int64_t fallbackNsPerUnit(int64_t ns_per_unit);

// Reports what take() would answer, spending and claiming nothing.
TakeResult look(ConstWords words, int64_t now_ns, int64_t cost);

// Reports what takeOnRate() would answer, spending nothing.
TakeResult lookOnRate(ConstWords words, int64_t now_ns, int64_t cost, const Outage& outage = {});

// Gives up the in-flight bit take() claimed, for a lease that will not be
// sent after all. The control thread calls it too, once it has applied a
// lease's answer.
void unclaim(Words words);

// Puts back units taken by take() (an all-or-nothing group that failed, or
// a holding's return that was not sent).
void refund(Words words, int64_t cost);

// Whether the window of a windowed rule's slice (its units' expiry) ends
// before the key, at its measured demand (demandPerInterval), would ask for
// another unit; false for a rule that is not windowed, or once the window
// is over. A slice running low then asks for no refill ahead
// (LeasePath::afterTake): its units would expire unspent, counted in a
// window whose other nodes are denied for them, and the request that finds
// the slice empty asks for itself.
bool windowEndsFirst(ConstWords words, const Rule& rule, int64_t now_ns, int64_t lease_interval_ns);

// --- Reservations (reservations.h): a settle on a leasing key ----------------

// Gives back `units` a reserve took from the slice at spent_ns: into the
// slice, so a hot tenant's settles cost Redis no call. A windowed slice
// (its units expire) takes them back only while the window they were spent
// in is the slice's, window_ns long and ending at its expiry; otherwise
// they were counted in a window that is over, and nothing comes back.
void refundSpent(Words words, int64_t units, int64_t spent_ns, int64_t now_ns, int64_t window_ns);

// Spends `units` past what the slice holds: a settle's debt. Past zero the
// slice carries it (negative units): nothing is taken until a lease has
// paid it (nextBatch asks for it on top of the cost), and the sweep does
// not give it away. It carries at most max_debt (debtBound): returns the
// units charged, the rest of `units` is unpaid.
int64_t charge(Words words, int64_t units, int64_t max_debt);

// The units the slice owes at now_ns (a debt it carries, while its window
// lasts); 0 when it owes none. For the overshoot bound (overshoot.h).
int64_t owed(ConstWords words, int64_t now_ns);

// The slice's units at now_ns, negative while it carries a debt; 0 once a
// window's units have expired.
int64_t balance(ConstWords words, int64_t now_ns);

// The size of the next lease, for a caller that has claimed the in-flight
// bit of a key of `rule` (leasable): {n, need}. Once a measurement of demand
// spans a lease interval, it becomes the key's rate and a new one starts.
// A warm bucket key asks for at least a quarter batch, but never for more
// than refills in one lease interval, so a spent bucket is not leased unit
// by unit and a slow one is not left holding units no node may take.
struct Batch {
  int64_t n = 1;
  int64_t need = 1;
};
Batch nextBatch(Words words, int64_t now_ns, int64_t cost, const Rule& rule, uint32_t nodes,
                int64_t lease_interval_ns);

// --- Rate leases (rate_lease.h) -------------------------------------------------

// Whether the key holds a rate lease at now_ns.
bool holdsRate(ConstWords words, int64_t now_ns);

// A worker: `units` taken by takeOnRate were kept (admitted), to be debited
// once Redis answers again (kRateFallback). Lock-free.
void noteRateFallback(Words words, int64_t units);
// A worker: `units` came back to the slice (a reservation's refund) while
// Redis was unreachable; the count drops by as much (not below 0).
void unnoteRateFallback(Words words, int64_t units);
// The control thread: what noteRateFallback counted, now 0.
int64_t takeRateFallback(Words words);

// Whether the key's last lease granted fewer units than it asked for
// (kDrained).
bool drained(ConstWords words);

// A measurement under way spans at least this many ns before its count
// is scaled to a whole lease interval (demandPerInterval below): over a
// shorter span one request more or less would swing the estimate.
constexpr int64_t kDemandMinSpanNs = 10'000'000;

// The key's demand per lease interval as a rate lease asks for it at
// now_ns, in units and their fractions: the last full measurement (kRate,
// to kRateParts of a unit), or the measurement under way
// scaled from its span (at least kDemandMinSpanNs) to a whole interval
// when that is more. A fleet's start is where this matters: the first rate
// ask comes a few ms into the key's first measurement, and its count alone
// (7 units in 8 ms at 750/s) would ask for a tenth of the key's demand,
// leaving the rest of the limit to refill a bucket nobody leases from until
// the key's demand is seen to move (slice::demandMoved), some 45 ms later.
double demandPerInterval(ConstWords words, int64_t now_ns, int64_t lease_interval_ns);

// The refill of the rate the key holds at now_ns: one unit per this many
// ns (kRateNsPerUnit); 0 when it holds none.
int64_t rateNsPerUnit(ConstWords words, int64_t now_ns);

// When the rate op behind the rate the key holds at now_ns was sent: the
// rate's end less lease_ns, the lease's length (applyRate holds it until
// then); 0 when it holds none.
int64_t rateSentNs(ConstWords words, int64_t now_ns, int64_t lease_ns);

// The units a rate lease's slice refills to (kRateCap) while it holds a
// rate at now_ns, else 0. For the overshoot bound (overshoot.h).
int64_t rateCapUnits(ConstWords words, int64_t now_ns);

// The units the key's last rate refills in period_ns (rounded up), held or
// ended; 0 when it was granted none. For the overshoot bound in fallback
// (overshoot.h): takeOnRate may spend it past the rate's end.
int64_t ratePerPeriod(ConstWords words, int64_t period_ns);

// The control thread: Redis granted a rate refilling one unit per
// ns_per_unit (0: no rate; the key leases tokens again) up to cap units
// until until_ns, to be renewed from renew_at_ns. A rate held already
// keeps refilling from where it was; a new one refills from now_ns.
void applyRate(Words words, int64_t ns_per_unit, int64_t cap, int64_t until_ns, int64_t renew_at_ns,
               int64_t now_ns);

// The control thread: the key's rate ends at now_ns (a new master may not
// know it: LeaseManager::endRates), if it held on; its refill is kept, so
// that learning may ask the new state for it again within the fallback's
// hold (LeasePath::learnedRate), and the refill up to now_ns is dropped:
// the token path adds nothing of an ended rate's past.
void endRate(Words words, int64_t now_ns);

// The control thread: the key's rates are to be divided again (Redis's
// `renew` channel, redis_keys.h, LeaseManager::renewHeard): a rate
// held at now_ns is renewed at the key's next take (kRateRenewAt moves to
// now_ns when it was later), and a key that holds none and waits to ask
// Redis again (a rate op granted it nothing, or its bucket was empty:
// kDenyUntil) asks at its next take (kRecheckAt moves to now_ns), so the
// rate another node gave up goes to a short node within a take, not
// after its wait (a quarter lease interval). Returns whether it moved.
bool renewRateNow(Words words, int64_t now_ns);

// The control thread: a rate op asking for a rate refilling one unit per
// ns_per_unit (up to cap units) got no reply, which Redis may have run all
// the same. The key's rate, held or ended, slows to it when it is slower
// (what the refill brought by now_ns stays), keeping its end and renewal
// time; ns_per_unit 0 (the op gave the rate up) ends it. A faster one
// changes nothing: Redis may not have granted it.
void holdAtMostRate(Words words, int64_t ns_per_unit, int64_t cap, int64_t now_ns);

// How long a window of a rate holder's demand lasts (demandMoved): the time
// its rate asked takes to bring kMovedWindowUnits units, but at least a
// kMovedWindowsPerInterval-th of the lease interval and at most
// kMovedMaxIntervals intervals. A short window sees a fall of demand soon
// (the old hot node of a shifting skew gives its rate back 12.5-25 ms
// after the shift at an interval of 100 ms, unless renewals restart the
// window meanwhile: noteAsked; the rate it no longer spends is lost to
// the fleet), at the cost of reading a stall of a hot holder's requests
// of half a window or more as a fall, as the sweep reads one of
// idleAfterNs as idle; the units keep one at a light demand from reading a
// gap between two requests as a fall (at 85/s, one interval of 100 ms
// brings 8 units, and a stall of 50 ms halves them): such a false fall
// records a demand below the key's, and a holder that renews meanwhile
// takes the difference until its next renewal.
constexpr int64_t kMovedWindowUnits = 16;
constexpr int64_t kMovedWindowsPerInterval = 8;
constexpr int64_t kMovedMaxIntervals = 4;

// How long a rate holder goes without a request before the sweep reads its
// demand as gone (claimMovedRenewal), at now less its last use (the key
// entry's, kept to within KeyTable::Entry::kTouchResolutionNs): the time
// kMovedWindowUnits units take at the rate it asked, but at least a
// kIdleWindowsPerInterval-th of the lease interval and at most the window of
// demandMoved. A node whose load stops gives its rate back within about
// that plus a sweep, not at the end of a window that began before the stop
// (up to two windows): the rate stands unspent meanwhile. A stall of its
// callers that long gives the rate up too; the node's next take asks for
// it again, and the holders give it back within a round trip or two
// (the renew word).
constexpr int64_t kIdleWindowsPerInterval = 10;
int64_t idleAfterNs(ConstWords words);

// The control thread: the rate op just answered at now_ns asked for
// `asked` units per period of `limit`. The key's demand is measured over
// windows from now_ns (kMovedWindowUnits), in units per span_ns (one lease
// interval): a take once the demand passed twice what it asked over a
// window (unless it asked the whole limit, which it cannot pass), or at
// the end of a window in which it was below half of it and of the rate
// the key holds, asks for the rate's renewal before kRateRenewAt
// (demandMoved): the recorded demand is stale, and the max-min shares
// follow the new one within two lease intervals. asked 0: never.
void noteAsked(Words words, const Limit& limit, int64_t asked, int64_t span_ns, int64_t now_ns);

// Whether, at now_ns, the key's demand moved from what its rate op asked
// for (noteAsked): above twice that over the window under way already, or
// below half of it (and of the rate held) over a window that has ended; a
// window that ended without is replaced by the next one. When it moved,
// the window's demand becomes the key's (kRate) and a new measurement
// starts, so the renewal asks for what the key wants now
// (demandPerInterval), and the check waits for the renewal's answer
// (noteAsked). True for one taker. Lock-free.
bool demandMoved(Words words, int64_t now_ns);

// The control thread's sweep of rate holders (LeaseManager::sweepIdleRates):
// whether the key, holding a rate at now_ns and last used at last_use_ns,
// saw its demand move (demandMoved: a key that gets no requests at all
// makes no take to see its fall) or has been idle for idleAfterNs (its
// demand becomes none), and this caller claimed its renewal, which it must
// then send.
bool claimMovedRenewal(Words words, int64_t now_ns, int64_t last_use_ns);

// The earliest time claimMovedRenewal can find the key, last used at
// last_use_ns, moved: its idle time from then (idleAfterNs), or the end
// of demandMoved's window under way (a fall is read only there; a rise is
// seen by the key's takes). Max while the check is disarmed (noteAsked
// re-arms it). Takes only put it later (a use, the next window); a rate
// op's answer (noteAsked) may bring it sooner.
int64_t moveCheckDueNs(ConstWords words, int64_t last_use_ns);

// The control thread: a rate op answered at now_ns, `short_unmet` when it
// granted less than the key asked for while the reply said some recorded
// demand is unmet (the others hold more than their shares: shares are
// moving). Returns whether the key still asks again quickly (rate_lease::
// kQuickRenewIntervals): while it has been so for less than that many
// lease intervals (span_ns each) since it first was. A reply that is not
// so ends the spell.
bool noteRateShort(Words words, bool short_unmet, int64_t now_ns, int64_t span_ns, int64_t intervals);

// Whether a blocked key is due to be asked of Redis again (kBlockRecheckNs)
// at now_ns. When it is, the units a lease granted before the block are
// dropped: the recheck's lease decides what the key may spend.
bool recheckBlock(Words words, int64_t now_ns);

// A penalty block starts at now_ns for block_ns (counted here, or reported
// by Redis): nothing left to spend, and Redis is asked again after
// kBlockRecheckNs at most.
void block(Words words, int64_t now_ns, int64_t block_ns);

// The admin reset: every word starts afresh but the in-flight bit (its
// lease's answer clears it).
void forget(Words words);

// --- Lines (wait_lines.h) -----------------------------------------------------

// Marks the key as having a line (kLine), or clears the mark.
void markLine(Words words);
void clearLine(Words words);

// --- The control thread: a lease's answer -------------------------------------

// Whether a lease sent at sent_ns, which was granted `granted` and left
// `remaining`, found Redis's state of a key of `rule` as no other node had
// drawn on it, as far as this node can tell; called before the answer is
// recorded (noteRedisLeft). A bucket found full, to within the reply's
// rounding (remaining is whole units): it refilled all it gave since this
// node's last lease, so no node drew on it faster than it refills. A fixed
// window found as this node's last answer left it (in the same window), or
// full (a fresh window). Never for the other algorithms: a sliding window's
// room comes back as the previous window's weight decays, which would hide
// another node's draws, and its leased, unspent units weigh on the next
// window; a sliding log never grows its batch.
bool untouched(ConstWords words, const Rule& rule, int64_t sent_ns, int64_t granted,
               int64_t remaining);

// Records what a granting lease left in Redis: whether the next batch may
// grow (kRoomy). It may when the grant left kRoomyFactor times as much, or
// when it found the key's state `untouched` by other nodes (untouched()):
// a lone key at or under its limit, whose bucket or window holds fewer than
// kRoomyFactor batches, still grows its batch. Called with every answer,
// before the key's in-flight bit is cleared.
void noteGrant(Words words, int64_t granted, int64_t remaining, bool untouched);
// Records whether a lease that asked for `asked` units got them all
// (kDrained). Called with every answer of a leasing key, before its
// in-flight bit is cleared.
void noteShort(Words words, int64_t asked, int64_t granted);

// Records what Redis had left after a lease's answer of a key of `rule`:
// `left` whole units (the reply's remaining), read at now_ns, in the 52
// bits of kFlags from kRedisLeftShift. For an algorithm that refills (the
// buckets) they hold the time, in µs of this host's clock plus 2^51, at
// which Redis's state would have been empty had it refilled at the rule's
// rate all along: now - left * interval, the interval the scripts' (period
// / limit in whole µs, rounded up), the span at most 2^50 µs as the scripts
// keep it; so one field says both what was left and when. For the others
// they hold `left` (at most 2^32: algorithm.h's max_limit).
void noteRedisLeft(Words words, const Rule& rule, int64_t left, int64_t now_ns);

// What Redis has left for a key of `rule` at now_ns, as far as this node
// can tell from its last lease's answer (noteRedisLeft), at most the rule's
// capacity (leaseCapacity): for the buckets, what was left plus the whole
// units refilled since; for the windows, what was left, while the window of
// the slice's units lasts (0 after it, or before any grant); for other
// algorithms, what was left. 0 before any answer. Other nodes' leases since
// that answer are not seen (it errs high by what they took), nor are the
// units they hold (it errs low by those); the bound is in
// docs/protocol.md, "Remaining on a global rule".
int64_t redisLeft(ConstWords words, const Rule& rule, int64_t now_ns);

// Redis granted `granted` units at its clock lease_now_ms. A windowed
// rule's units may be spent until expires_ns (0: no window); with
// `new_window` (the grant's window is not that of the slice's last grant,
// leaseNowMs(), as scripts::leaseWindow tells them apart) the units of the
// older window are dropped first. The negative cache ends; the key is warm.
void applyGrant(Words words, int64_t granted, int64_t lease_now_ms, int64_t expires_ns,
                bool new_window);

// Redis had nothing for the key until now_ns + wait_ns: deny locally until
// then, and ask again after kEmptyRecheckNs at most (units other nodes
// return come back into Redis sooner, and only a lease sees them).
void applyEmpty(Words words, int64_t now_ns, int64_t wait_ns);

// How long a key of `rule` denies locally after a lease that granted
// nothing, counted from the lease's send: Redis's retry_after_ms, when
// `need` units come free, which the scripts round up to a ms; at least 1.
// A stamped key (a sliding log) waits a ms less, 0 at the least: it asks
// again no later than the units leave the log. What leaves a full log and
// is leased late is spent late again one period on, and each ms late costs
// a window that spans it, at 3 x the limit, 0.6 % of the limit. An early
// ask is denied again with a wait of 0, and the next request asks anew.
int64_t emptyWaitMs(const Rule& rule, int64_t retry_after_ms);

// Redis's clock at the slice's last grant (ms; its window).
int64_t leaseNowMs(ConstWords words);

// When a blocked key's recheck is due (the negative cache's end).
int64_t deniedUntilNs(ConstWords words);

// A lease got an answer it cannot use: the key follows on_redis_down until
// until_ns.
void failUntil(Words words, int64_t until_ns);

// --- The sweep and the stop: giving units back --------------------------------

// Whether a lease of the key is on the way (the in-flight bit).
bool inFlight(ConstWords words);

// Whether the key is idle for the sweep at now_ns: no lease on the way, no
// negative cache standing (its next lease would be refused for nothing) and
// no rate's fallback admissions waiting for their debit (kRateFallback).
bool idle(ConstWords words, int64_t now_ns);

// Whether the key's flags still carry a line mark (wait_lines.h).
bool lineMarked(ConstWords words);

// Whether the slice holds units (an evicted key gives them back).
bool holdsUnits(ConstWords words);

// The units the slice holds that may still be spent at now_ns: none once
// their window (or a stamped lease's period) has ended. For the overshoot
// bound (overshoot.h).
int64_t heldUnits(ConstWords words, int64_t now_ns);

// Takes every unit out of the slice to give back to Redis: {units,
// lease_now_ms}; units 0 when none were held or their window has ended at
// now_ns (a window that is over counts nothing back). A debt (negative
// units) stays in the slice for the next lease to pay.
struct Taken {
  int64_t units = 0;
  int64_t lease_now_ms = 0;
};
Taken takeBack(Words words, int64_t now_ns);

}  // namespace sluice::slice
