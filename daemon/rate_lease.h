// Rate lease: a node's lease of a rate on a hot key of a global rule whose
// algorithm leases rates (algorithm.h, leases_rate: token_bucket and gcra),
// "spend up to r units per period until t" (see docs/design.md,
// "Rate leases on hot keys"). The global state stays in Redis, written only
// by the rule's script (lua/token_bucket.lua, lua/gcra.lua) with Redis
// TIME: beside the bucket's empty time T (GCRA's TAT, which is T + burst *
// interval), in the same key, the rates held (node -> rate, until, demand).
// The script charges the held rates into T span by span between their ends,
// so the bucket refills at the limit minus the held rates, and grants a node
// min(its demand, its max-min fair share of the limit among the recorded
// demands, the limit minus the rates the others hold): the rates held never
// sum past the limit, and a crashed node's rate ends at its until.
//
// This header holds the script's maths in C++ (cross-tested against the Lua
// on a real Redis, tests/unit/rate_lease_test.cpp), the rate op's ARGV and
// reply, and the daemon's rule for when a key leases a rate, how much it
// asks for, and how its slice refills (slice.h holds the words).
//
// Units: rates in units per the limit's period; Redis times in µs; the
// daemon's times in monotonic ns. Pure functions, no I/O, no clock: any
// thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rules.h"
#include "scripts.h"

namespace sluice::rate_lease {

// The longest rate lease the script grants (ARGV lease_ms), and so the
// longest a crashed node's rate stays held.
constexpr int64_t kMaxLeaseMs = 60'000;

// A held rate whose last reply said every recorded demand is met is renewed
// at most this long after that renewal was sent (halfway through the lease
// when that is sooner). One whose reply said some demand is unmet (Reply::
// unmet) is renewed one lease interval after it was sent (renewAtNs): the
// renewal is how a holder gives up what it holds beyond its share, so a
// node that asked while the others held everything gets its share within
// about two lease intervals, and a node alone on a key pays one call per
// this long (slice::demandMoved renews sooner when the key's own demand
// moves).
constexpr int64_t kMaxRenewNs = 2'500'000'000;

// While Redis is unreachable, a key whose rate held when the breaker
// opened spends it until the rate's end, and past that end until this
// long after the opening (slice::takeOnRate): the demand-weighted share
// stands in for the equal one through an outage as long as a failover
// takes, whatever the time left of the rate when it began. What a rate
// admits while Redis is unreachable is debited on recovery
// (slice::rateFallback), past its end as before it, and the overshoot
// bound counts a period of the rate for what it spends past the end.
// Past this, a demand that moved during the outage gets its equal share.
constexpr int64_t kFallbackHoldNs = 10'000'000'000;

// One rate held on a key (an entry of its state's rates).
struct Held {
  std::string node;
  int64_t rate = 0;      // units per period (0: asked, got nothing)
  int64_t until_us = 0;  // Redis clock
  int64_t demand = 0;    // units per period the node asked for
};

// A rate's share of the burst: burst * rate / limit, floored. Its holder's
// slice refills to at least this much (capUnits), and Redis's bucket holds
// that much less while the rate is held (bucketCapUnits), so a pause saves
// the burst once, not twice.
int64_t burstShare(const Limit& limit, int64_t rate);

// The units Redis's bucket fills to while the rates `held` (those above 0)
// are held: the burst less their shares of it (burstShare), at least 0.
int64_t bucketCapUnits(std::span<const Held> held, const Limit& limit);

// The script's charge: T (stored_us; nullopt: a full bucket) as it stood at
// at_us, charged with the rates `held` over [at_us, now_us], one span
// between their ends at a time, each span dt at rates R moving T by
// ceil(dt * R / limit) and keeping it >= span start and end - cap_us, where
// cap_us is the span's bucketCapUnits * interval (interval = ceil(period_us
// / limit), the period in whole ms as the scripts get it). nullopt when
// nothing was held (T unchanged). GCRA's TAT is T + burst * interval.
std::optional<int64_t> charge(std::optional<int64_t> stored_us, int64_t at_us, int64_t now_us,
                              std::span<const Held> held, const Limit& limit);

// Max-min fairness: the share of a node asking `mine` among `demands` (its
// own included) of `capacity`: demands are met smallest first while an
// equal split (floored) of what is left covers them; the rest get that split.
int64_t fairShare(std::vector<int64_t> demands, int64_t capacity, int64_t mine);

// The rate the script grants `node` asking `asked` (> 0) among the live
// entries `live` (its own old entry, if any, is replaced).
int64_t grant(std::span<const Held> live, std::string_view node, int64_t asked, int64_t limit);

// A rate asks for its demand as measured, to a unit per period, and the
// measurements wander (a node at 85.7/s asks 86/s, then 87/s, then 85/s).
// A rate or share that moves by at most a kNoiseParts-th of itself and by
// less than a kNoiseOfLimit-th of the limit moves within that noise, and
// makes no holder renew early: not as a share unmet (unmet), nor as a rate
// freed (the script's `renew` word, lua/rate_lease.lua, which has the same
// test), nor as a rise (rose, kNoiseParts only). Renewing for it, every
// holder of the N = 8 shifting skew in bench/fleet.py renewed every lease
// interval: three times the Redis calls.
constexpr int64_t kNoiseParts = 8;
constexpr int64_t kNoiseOfLimit = 32;

// Whether `rate` (or a share) of `limit` falling (or falling short) by
// `by` units moves past its noise: by more than rate / kNoiseParts, or by
// limit / kNoiseOfLimit or more; never when `by` <= 0.
bool pastNoise(int64_t rate, int64_t by, int64_t limit);

// Whether some entry of `live` (after the op) holds less than its max-min
// share (fairShare) of `limit` among every entry's demand, by more than
// the share's noise (pastNoise): the script's `unmet`. An entry that asked
// and got 0 while its share is above 0 is unmet.
bool unmet(std::span<const Held> live, int64_t limit);

// The wait (µs) for units that a full-rate refill would bring in wait_us,
// while `held_rate` of `limit` is held: wait_us * limit / (limit -
// held_rate) (rounded up, in doubles as the script has it), or with all of
// it held, until first_end_us (the first held rate's end) and then wait_us.
int64_t heldWaitUs(int64_t wait_us, int64_t held_rate, int64_t limit, int64_t first_end_us,
                   int64_t now_us);

// The script's retry hint, µs from now_us, for `need` units (1 <= need <=
// burst) of a bucket whose empty time is empty_us at now_us while the rates
// `live` (those after now_us) are held. The bucket fills only to its cap
// (bucketCapUnits): while that is below need, the wait starts at the first
// end of a held rate after which it is not, with empty_us charged until
// then (charge); from there, heldWaitUs with the rates still held. So a
// denied lease never retries before its units can be in the bucket.
int64_t retryWaitUs(int64_t empty_us, int64_t need, std::span<const Held> live, const Limit& limit,
                    int64_t now_us);

// ARGV of the rate op: {"rate", rate, tokens, limit, period_ms, burst,
// now_us, deadline_us, node, lease_ms}. rate 0 gives the node's rate up.
std::vector<std::string> rateArgv(int64_t rate, int64_t tokens, const Limit& limit, int64_t deadline_us,
                                  std::string_view node, int64_t lease_ms, int64_t now_us = 0);

// The rate op's reply: the lease reply's six integers, then the rate, then
// unmet (0 or 1).
struct Reply {
  scripts::LeaseReply lease;
  int64_t rate = 0;    // units per period granted until the lease's end
  bool unmet = false;  // some node's recorded demand is below its share (unmet())
};
// nullopt unless 8 integers in the scripts' ranges, 0 <= rate <= limit and
// unmet 0 or 1.
std::optional<Reply> parseReply(std::span<const int64_t> values, int64_t limit);

// A key whose rate op got less than it asked while some demand is unmet
// asks again after a kQuickRenewsPerInterval-th of the lease interval, not
// a whole one, for its first kQuickRenewIntervals intervals of being so
// (slice::noteRateShort): the holders above their shares give up the rest
// at their renewals, which fall anywhere within the next interval, and
// the rate they free would otherwise wait, unspent, until the short nodes'
// next asks (a fleet's start lost up to 5 % of its first second so). After
// that span, a holder that keeps more than its share (a crashed node's
// rate, held until its end) costs one ask per interval, as before.
constexpr int64_t kQuickRenewsPerInterval = 4;
constexpr int64_t kQuickRenewIntervals = 2;

// A holder granted less than it asked (and less than the limit) renews
// once its demand has brought this many units since its rate op was sent,
// but not sooner than one lease interval (shortRenewNs): a renewal is how
// it learns of rate another node freed (a node that stopped and gave its
// rate up, a holder whose demand fell) when the `renew` channel's word of
// it (redis_keys.h, LeaseManager::renewHeard) was lost. Its demand is at
// least its ask, so this costs at most one Redis call per this many of its
// decisions (0.001 per decision), whatever the fleet's size: at 2,000/s
// and N = 3 (each asking 2,000/s) a short holder renews every 500 ms, at
// N = 8 (750/s) every 1.33 s. A holder of the whole limit, or of all it
// asked, is not short and renews as before.
constexpr int64_t kShortRenewUnits = 1'000;

// How long after its rate op a holder granted `granted` (> 0) of the
// `asked` units per period renews because it is short (kShortRenewUnits):
// the time its ask takes to bring kShortRenewUnits units, at least
// lease_interval_ns; 0 when it is not short (granted >= asked, granted >=
// the limit, or granted 0: a key granted none asks again on its own
// schedule, reaskAfterMs).
int64_t shortRenewNs(const Limit& limit, int64_t asked, int64_t granted, int64_t lease_interval_ns);

// A holder whose reply neither raised its rate nor said some demand is
// unmet renews no later than this many times the time between its previous
// rate op and this one, and no sooner than one lease interval after this
// one (settleNs). Each op ends the key's demand measurement once it spans
// a lease interval (slice::nextBatch), so an ask rests on about the
// requests since the op before: one asked from a few ms or one interval of
// them (a key's first asks) is asked again from a measurement this many
// times as long, and only an ask that rested on kMaxRenewNs /
// kSettleFactor or more is held for kMaxRenewNs. Without it the seven
// cold nodes of an N = 8 skewed start (bench/fleet.py, 171/s each) held
// the 180-200/s of their first asks for 2.5 s, and the fleet admitted
// 0.85-0.95 of the limit until their renewals. A holder that renews every
// kMaxRenewNs pays nothing more.
constexpr int64_t kSettleFactor = 4;

// How long after its rate op a holder renews because its ask may not have
// settled (kSettleFactor): kSettleFactor times previous_gap_ns, the time
// from its previous rate op's send to this one's, within [lease_interval_ns,
// kMaxRenewNs]; kMaxRenewNs when previous_gap_ns <= 0 (none known).
int64_t settleNs(int64_t previous_gap_ns, int64_t lease_interval_ns);

// When a key whose rate op was sent at sent_ns, granting a lease of
// lease_ns, asks for its renewal: a kQuickRenewsPerInterval-th of a lease
// interval after sent_ns when `quick` (above), one lease interval after
// it when the reply said some demand is unmet (so holders shrink to their
// shares and a node granted less asks again within two lease intervals),
// sooner_ns after it when that is sooner (shortRenewNs, settleNs; 0: none),
// else kMaxRenewNs after it; never later than halfway through the lease.
int64_t renewAtNs(int64_t sent_ns, int64_t lease_ns, bool unmet, int64_t lease_interval_ns,
                  bool quick = false, int64_t sooner_ns = 0);

// Whether a key's rate rose with a grant: it held none (held_ns_per_unit
// 0) or its slice refills faster now by more than a kNoiseParts-th of its
// ns per unit (granted_ns_per_unit; 0: granted none). A holder whose rate
// rose renews one lease interval after it sent the op, as one that heard
// `unmet` does: it got more while the others' demands may not be
// recorded yet (a fleet's start, where the first nodes to ask get what
// the others have not asked for yet), so it hears of them before it has
// held more than its share for long. A smaller rise is noise
// (kNoiseParts).
bool rose(int64_t held_ns_per_unit, int64_t granted_ns_per_unit);

// How long a key granted no rate and no tokens waits before it asks again:
// Redis's wait (retry_ms, at least 1 ms), but at most one lease interval
// (a kQuickRenewsPerInterval-th of it when `quick`, as renewAtNs): its
// demand is recorded, and the holders that hear so give up their share of
// it by then.
int64_t reaskAfterMs(int64_t retry_ms, int64_t lease_interval_ms, bool quick = false);

// --- The daemon's rule ---------------------------------------------------------

// Whether keys of `rule` may hold rate leases: a global rule of one limit
// whose algorithm leases rates (algorithm.h, leases_rate), not paced, with
// no calendar window, and a limit and burst that keep the script's maths
// exact (limit * 6e7 and burst * limit below 2^53).
bool eligible(const Rule& rule);

// Whether a key of an eligible rule that holds no rate asks for one with
// its next lease. Both of:
//  - drained: its last lease granted fewer tokens than it asked for
//    (slice::drained), so Redis's bucket is empty and the rule's burst is
//    spent: a rate never stands in for a burst the bucket still holds, and
//    the key's demand is above what the bucket gives it. A node that is
//    cold beside a hot one asks too: its demand is then recorded, and the
//    rates follow the max-min division of every node's demand (a node on
//    token leases beside a holder of the whole rate would get nothing);
//  - the rule refills at least one unit per lease interval: a slower rule
//    (8 an hour) gains nothing from a rate, whose slice refills one lease
//    interval of it at most, and keeps token leases, which carry its burst.
// demand_per_interval (slice::demandPerInterval) must be above 0.
bool wants(const Limit& limit, double demand_per_interval, bool drained, int64_t lease_interval_ns);

// The rate a key asks for: its demand per interval scaled to the period,
// rounded up, within [1, limit].
int64_t askedRate(const Limit& limit, double demand_per_interval, int64_t lease_interval_ns);

// The local refill of a rate: one unit per this many ns. The script charges
// the bucket `rate` / limit of its refill, one unit per interval µs
// (ceil(period_us / limit)), so the slice refills at rate units per limit *
// interval µs, rounded up: never faster than Redis counts it.
int64_t nsPerUnit(const Limit& limit, int64_t rate);

// The least rate whose refill is one unit per ns_per_unit (nsPerUnit's
// inverse: never above the rate that gave it); 0 when ns_per_unit <= 0.
int64_t rateOfNsPerUnit(const Limit& limit, int64_t ns_per_unit);

// The most units a rate's refill fills the slice to: one lease interval of
// the rate, or the rate's share of the burst (burstShare) when that is more,
// at least one. So a key that holds the rule's whole rate and pauses gets
// its burst back, as a bucket of the rule would (Redis's bucket holds the
// burst less the holders' shares, bucketCapUnits: none of it while the
// whole rate is held). Tokens a lease brings may sit above it; the refill
// adds nothing while the slice holds this many. It bounds what a rate lease
// may admit beyond its rate in any span (overshoot.h), its burst share
// included, which Redis's bucket no longer holds.
int64_t capUnits(const Limit& limit, int64_t rate, int64_t lease_interval_ns);

}  // namespace sluice::rate_lease
