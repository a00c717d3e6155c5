// Key table: the daemon's concurrent map from (rule id, key bytes) to the
// limiter state of that key.
//
// Invariant: at most `max_keys` entries, and about `max_bytes` bytes of them
// (racing inserts may each overshoot by one entry), are linked at any time;
// every linked
// entry is reachable from exactly one bucket, and an entry's memory is freed
// only after every reader that could have seen it has left its ReadGuard.
// Each entry holds its state as an array of 64-bit atomic words, all zero when
// the entry is created; the limiter (limiter.h) runs compare-and-swap loops on
// them. The table knows nothing about rules or algorithms beyond a rule's id.
//
// Time: now_ns is the daemon's monotonic clock in nanoseconds, passed in; the
// table never reads a clock.
//
// Ownership: the table owns every entry. An Entry* returned by find() or
// findOrInsert() stays valid until the caller's ReadGuard ends, even if the
// entry is unlinked meanwhile; it must not be kept beyond the guard.
//
// ---------------------------------------------------------------------------
// Concurrency model
//
// Who calls what:
//  - Worker threads (one libuv loop each) call registerReader() once at
//    start-up, then wrap each batch of lookups and decisions in a ReadGuard
//    and call find() and findOrInsert() inside it. A ReaderId belongs to one
//    thread; guards do not nest.
//  - One maintenance thread (not a worker) calls sweep() periodically. It
//    needs no guard: it only walks chains under their stripe lock. visit()
//    walks the same way, from any thread.
//  - stats() and size() may be called from any thread at any time.
//  - The constructor and destructor run with no other call in progress and no
//    guard alive.
//
// What protects each field:
//  - Bucket heads and Entry::next_ are atomics. Lookups read them without a
//    lock; they are written only by a thread holding the bucket's stripe
//    mutex (insert, replace, unlink), so writers never race each other.
//    Unlinking leaves the unlinked entry's own next_ intact, so a reader
//    standing on it still reaches the rest of the chain.
//  - An entry's hash, rule id, key bytes and state word count are written
//    before the entry is published and never change afterwards.
//  - An entry's state words belong to the limiter (atomic, lock-free).
//  - An entry's last-used time is a relaxed atomic: it only steers eviction,
//    so a stale value costs at most a less good choice of victim.
//  - The retired list is guarded by retire_mutex_; the counters are relaxed
//    atomics (monitoring values, no ordering implied).
//
// Inserts take the bucket's stripe mutex (inserts are rare next to lookups)
// and re-check the chain under it. Capacity is reserved before that lock by
// incrementing size_ below max_keys; when the table is full, the inserter
// evicts the least recently used entry of a small sample (a few buckets at a
// moving cursor, never the whole table) and takes over that entry's slot, so
// racing inserters cannot take it first. Two threads inserting the same new
// key into a full table, or a key replaced because its rule changed shape,
// may therefore evict one entry more than strictly needed (rare paths).
//
// Memory reclamation (epoch-based):
//  - A global epoch (starting at 1) only grows; each reader has a slot on its
//    own cache line holding 0 when outside a guard, or the epoch it read on
//    entering its guard.
//  - ReadGuard: load the epoch, store it in the slot (both seq_cst), then
//    look up; on exit store 0 (release).
//  - Unlinking stores the new pointer (seq_cst), then reads the epoch E
//    (seq_cst) and retires the entry tagged with E.
//  - Reclaiming (in sweep(), and on the insert path when many entries or
//    many bytes wait: max_keys / 16 entries or max_bytes / 16 bytes more
//    than the last reclaim kept, so that unlinked long keys hold at most
//    about an eighth of max_bytes beyond it)
//    advances the epoch, reads every slot (seq_cst) and frees the entries
//    tagged E when every slot is 0 or holds an epoch greater than E.
//  Why this is safe: every operation above is seq_cst, hence in one total
//  order S, and lock-free traversal loads are seq_cst too (a plain load on
//  x86-64 and the same ldar as acquire on AArch64, so this costs nothing on
//  the hot path). If the reclaimer read a reader's slot before the reader's
//  announcing store in S, the unlink precedes that store in S, so the
//  reader's traversal sees the entry unlinked and cannot reach it. If it read
//  an announced epoch a > E, the reader loaded the epoch after the retirer
//  read E, so again after the unlink. If it read 0 written by a guard's exit,
//  that release store synchronises with the reclaimer's load, so everything
//  the reader did in the guard happens before the free. A reader standing on
//  an already unlinked entry can walk on to an entry unlinked later; that
//  later unlink comes after the reader's announcement in S (the two unlinks
//  are ordered by the stripe mutex), so its tag is at least the reader's
//  epoch and it is kept.
//  No fences are used, so ThreadSanitizer understands all of it.
//
// Known races, accepted by design:
//  - An entry that sweep() unlinks at the moment a worker has just found it
//    loses that worker's spend: the worker decides on the unlinked entry, and
//    the next request creates a fresh one. sweep() only unlinks entries that
//    have been unused for sweep_min_idle_ns and whose state is back to a fresh
//    key's (the limiter's whole horizon), so at most one request's cost is
//    lost per eviction, and only at the edge of a key's idle period.
//  - Forced eviction (table full) loses the victim's state by design, as
//    nginx's limit_req zone does: the key starts afresh when it comes back.
//
// Memory per key (x86-64, glibc): sizeof(Entry) is 40 bytes; one allocation
// per entry holds the header, the state words (8-byte aligned, right after
// the header) and the key bytes. A 24-byte key with 2 state words needs
// 40 + 16 + 24 = 80 bytes, a 96-byte malloc chunk; the bucket array adds
// 8 to 16 bytes per key. key_table_test measures about 107 bytes per key
// all-in (200,000 keys, mallinfo2), against a target of 256.
#pragma once

#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

namespace sluice {

struct KeyTableOptions {
  // Most entries linked at once; the bucket array has the next power of two
  // at or above this many buckets and is never resized.
  size_t max_keys = 1'000'000;
  // Most bytes of linked entries (header, state words and key bytes) at once:
  // long keys hit this bound before max_keys does.
  size_t max_bytes = 256u << 20;
  // Most registerReader() calls over the table's life (one per worker).
  size_t max_readers = 64;
  // sweep() leaves alone any entry used within this long of its now_ns.
  int64_t sweep_min_idle_ns = 1'000'000'000;  // 1 s
  // Called on the inserting thread for each entry a full table evicts (its
  // rule id, key and state), after it is unlinked and before it is retired,
  // so its words may still be read and changed. May be empty.
  std::function<void(uint32_t rule_id, std::string_view key,
                     std::span<std::atomic<uint64_t>> state)>
      on_forced_eviction;
};

// Counter snapshot; each value is read on its own, so they need not add up
// exactly while other threads work.
struct KeyTableStats {
  size_t size = 0;              // linked entries (plus inserts in flight)
  size_t bytes = 0;             // bytes of linked entries (header, state, key)
  uint64_t inserts = 0;         // new keys linked
  uint64_t replacements = 0;    // entries replaced because the state shape changed
  uint64_t idle_evictions = 0;  // entries unlinked by sweep()
  uint64_t forced_evictions = 0;  // entries unlinked because the table was full
  size_t retired = 0;           // unlinked entries not yet freed
  size_t retired_bytes = 0;     // their bytes (header, state, key)
};

class KeyTable {
 public:
  // One key's entry. Thread-safe: every accessor may be called from any
  // thread holding a ReadGuard (or from sweep()'s callback).
  class Entry {
   public:
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;

    uint32_t ruleId() const { return rule_id_; }
    std::string_view key() const { return {keyData(), key_bytes_}; }
    // The limiter's state words; all zero when the entry was created.
    std::span<std::atomic<uint64_t>> state() { return {stateWords(), state_words_}; }
    std::span<const std::atomic<uint64_t>> state() const { return {stateWords(), state_words_}; }

    int64_t lastUsedNs() const { return last_used_ns_.load(std::memory_order_relaxed); }
    // Records a use at now_ns. Skips the store when the stored time is within
    // kTouchResolutionNs, so a hot key's cache line is not written on every
    // request by every worker.
    void touch(int64_t now_ns) {
      int64_t last_ns = last_used_ns_.load(std::memory_order_relaxed);
      if (now_ns - last_ns >= kTouchResolutionNs) {
        last_used_ns_.store(now_ns, std::memory_order_relaxed);
      }
    }

    static constexpr int64_t kTouchResolutionNs = 1'000'000;  // 1 ms

   private:
    friend class KeyTable;
    Entry(uint64_t hash, uint32_t rule_id, uint32_t key_bytes, uint32_t state_words,
          int64_t now_ns)
        : hash_(hash),
          last_used_ns_(now_ns),
          rule_id_(rule_id),
          key_bytes_(key_bytes),
          state_words_(state_words) {}

    std::atomic<uint64_t>* stateWords() const {
      // The words start right after the header (see create() in key_table.cpp).
      return reinterpret_cast<std::atomic<uint64_t>*>(
          const_cast<char*>(reinterpret_cast<const char*>(this)) + sizeof(Entry));
    }
    char* keyData() const { return reinterpret_cast<char*>(stateWords() + state_words_); }

    std::atomic<Entry*> next_{nullptr};
    const uint64_t hash_;
    std::atomic<int64_t> last_used_ns_;
    const uint32_t rule_id_;
    const uint32_t key_bytes_;
    const uint32_t state_words_;
    // Followed in the same allocation by state_words_ atomic words, then
    // key_bytes_ key bytes.
  };

  // A registered reader: an index into the table's reader slots.
  struct ReaderId {
    uint32_t index = 0;
  };

  // RAII critical section of one reader. Entries found inside stay valid
  // until it ends. Cheap (one seq_cst store on entry, one store on exit), so
  // wrap a batch of requests, not a whole loop iteration that may block.
  class ReadGuard {
   public:
    ReadGuard(KeyTable& table, ReaderId reader);
    ~ReadGuard() { slot_.store(0, std::memory_order_release); }
    ReadGuard(const ReadGuard&) = delete;
    ReadGuard& operator=(const ReadGuard&) = delete;

   private:
    std::atomic<uint64_t>& slot_;
  };

  // May change the entry's state words (e.g. to hand leased units back).
  using IdlePredicate = std::function<bool(Entry&)>;

  explicit KeyTable(const KeyTableOptions& options);
  // Frees every entry, linked or retired.
  ~KeyTable();
  KeyTable(const KeyTable&) = delete;
  KeyTable& operator=(const KeyTable&) = delete;

  // Registers the calling worker as a reader. Thread-safe. Throws
  // std::length_error after max_readers registrations.
  ReaderId registerReader();

  // The entry of (rule_id, key), or nullptr; never inserts, never touches.
  // Returns the entry whatever its state word count: callers compare
  // state().size() with what the rule needs. Lock-free, no allocation.
  // Caller holds a ReadGuard.
  Entry* find(uint32_t rule_id, std::string_view key) const;

  // The entry of (rule_id, key) with `state_words` state words, created
  // (all zero) when missing, replaced by a fresh one when its word count
  // differs; touched at now_ns. Lock-free and allocation-free when the key
  // exists; otherwise takes one stripe mutex and allocates once. Returns
  // nullptr when the table is full and no entry could be evicted (the caller
  // answers OVERLOADED). Caller holds a ReadGuard. Throws std::length_error
  // when the key or the word count does not fit in 32 bits.
  Entry* findOrInsert(uint32_t rule_id, std::string_view key, size_t state_words, int64_t now_ns);

  // Unlinks every entry unused for sweep_min_idle_ns at now_ns for which
  // `idle` returns true (its state is a fresh key's, or its rule is gone),
  // then frees retired entries whose grace period has passed and gives back
  // the retired list's spare capacity (a large sweep's). `idle` runs
  // under a stripe mutex and must not call back into the table. Walks the
  // whole bucket array (skipping empty buckets without locking), so call it
  // every second or so, from one maintenance thread only. Returns the number
  // of entries unlinked.
  size_t sweep(int64_t now_ns, const IdlePredicate& idle);

  // Calls `visit` on every linked entry, each under its stripe mutex (so
  // `visit` must not call back into the table). Walks the whole bucket array:
  // for rare, whole-table work (returning leases at stop, debiting after a
  // Redis outage). Any thread; needs no guard.
  void visit(const std::function<void(Entry&)>& visit);

  // Thread-safe, relaxed.
  size_t size() const { return size_.load(std::memory_order_relaxed); }
  KeyTableStats stats() const;

 private:
  struct alignas(64) ReaderSlot {
    std::atomic<uint64_t> epoch{0};  // 0: outside any guard
  };
  struct alignas(64) Stripe {
    std::mutex mutex;
  };
  struct Retired {
    Entry* entry;
    uint64_t epoch;
  };

  uint64_t hashOf(uint32_t rule_id, std::string_view key) const;
  Entry* findHashed(uint64_t hash, uint32_t rule_id, std::string_view key) const;
  std::mutex& stripeOf(uint64_t hash) const {
    return stripes_[hash & bucket_mask_ & stripe_mask_].mutex;
  }
  Entry* insertSlow(uint64_t hash, uint32_t rule_id, std::string_view key, uint32_t state_words,
                    int64_t now_ns);
  bool reserveSlot(size_t bytes);
  static size_t entryBytes(size_t key_bytes, size_t state_words) {
    return sizeof(Entry) + state_words * sizeof(std::atomic<uint64_t>) + key_bytes;
  }
  static size_t bytesOf(const Entry* entry) {
    return entryBytes(entry->key_bytes_, entry->state_words_);
  }
  bool evictOne();
  void retire(std::span<Entry* const> entries);
  // Reclaims when more than the thresholds of entries or bytes wait.
  void reclaimIfBacklogged();
  void reclaim();
  // Shrinks the retired list's capacity to its size plus a little (sweep()).
  void releaseRetiredCapacity();
  static Entry* create(uint64_t hash, uint32_t rule_id, std::string_view key,
                       uint32_t state_words, int64_t now_ns);
  static void destroy(Entry* entry);

  // Read on every lookup; never written after construction.
  const uint64_t seed0_;
  const uint64_t seed1_;
  const size_t bucket_mask_;
  const size_t stripe_mask_;
  const size_t max_keys_;
  const size_t max_bytes_;
  const size_t max_readers_;
  const int64_t sweep_min_idle_ns_;
  const decltype(KeyTableOptions::on_forced_eviction) on_forced_eviction_;
  const size_t reclaim_threshold_;
  const size_t reclaim_threshold_bytes_;
  std::unique_ptr<std::atomic<Entry*>[]> buckets_;
  std::unique_ptr<Stripe[]> stripes_;
  std::unique_ptr<ReaderSlot[]> readers_;

  alignas(64) std::atomic<uint64_t> epoch_{1};
  std::atomic<uint32_t> registered_readers_{0};
  std::atomic<size_t> evict_cursor_{0};

  alignas(64) std::atomic<size_t> size_{0};
  std::atomic<size_t> linked_bytes_{0};  // bytes of the entries counted in size_
  std::atomic<uint64_t> inserts_{0};
  std::atomic<uint64_t> replacements_{0};
  std::atomic<uint64_t> idle_evictions_{0};
  std::atomic<uint64_t> forced_evictions_{0};
  std::atomic<size_t> retired_count_{0};
  std::atomic<size_t> retired_bytes_{0};
  // The insert path reclaims when more entries, or more bytes, than these wait.
  std::atomic<size_t> reclaim_at_{0};
  std::atomic<size_t> reclaim_at_bytes_{0};

  std::mutex retire_mutex_;
  std::vector<Retired> retired_;  // guarded by retire_mutex_
};

inline KeyTable::ReadGuard::ReadGuard(KeyTable& table, ReaderId reader)
    : slot_(table.readers_[reader.index].epoch) {
  assert(slot_.load(std::memory_order_relaxed) == 0 && "ReadGuards do not nest");
  slot_.store(table.epoch_.load(std::memory_order_seq_cst), std::memory_order_seq_cst);
}

}  // namespace sluice
