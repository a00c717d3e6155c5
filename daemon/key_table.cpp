// Key table: lock-free lookup, striped-mutex insert, epoch-based reclamation.
// The concurrency model and its memory orderings are written down in
// key_table.h; this file follows it and says why where a line is subtle.
#include "key_table.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <stdexcept>
#include <type_traits>

namespace sluice {

namespace {

// Stripe mutexes serialising writers of a bucket's chain. Inserts are rare,
// so a few hundred stripes make contention negligible at small cost.
constexpr size_t kStripes = 256;

// Forced eviction looks at most this many buckets from a moving cursor and
// takes the least recently used of at most this many entries found there
// (Redis's maxmemory-samples uses 5 too).
constexpr size_t kEvictionProbeBuckets = 16;
// A sparse table (long keys fill max_bytes long before max_keys) may have no
// entry in the first buckets probed: keep going, up to this many, until one
// is found.
constexpr size_t kEvictionMaxProbeBuckets = 4096;
constexpr size_t kEvictionSampleEntries = 5;

// The insert path reclaims once max_keys / 16 more retired entries, or
// max_bytes / 16 more of their bytes, wait than the last reclaim kept (but
// never for fewer than these). A reclaim frees what was retired before the
// previous one, so about an eighth of the budget waits beyond max_bytes at
// most, and there is one reclaim per that many evictions.
constexpr size_t kMinReclaimEntries = 64;
constexpr size_t kMinReclaimBytes = 64 * 1024;

// The retired list keeps at most this much capacity beyond its size after a
// sweep (entries of 16 bytes): enough for a forced eviction to retire without
// allocating most of the time.
constexpr size_t kRetiredSpareCapacity = 1024;

// An insert into a full table tries this many times to evict and reserve a
// slot before answering "full": other inserters may take the freed slot.
constexpr int kReserveAttempts = 8;

static_assert(sizeof(KeyTable::Entry) % alignof(std::atomic<uint64_t>) == 0,
              "state words follow the header and must stay aligned");
static_assert(sizeof(void*) != 8 || sizeof(KeyTable::Entry) == 40,
              "key_table.h states the per-entry overhead; update it");
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::is_trivially_destructible_v<KeyTable::Entry>);
static_assert(std::is_trivially_destructible_v<std::atomic<uint64_t>>);
static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t));

uint64_t randomSeed() {
  std::random_device device;
  return (uint64_t{device()} << 32) ^ device();
}

// SipHash-1-3 (the keyed hash Rust's HashMap uses against hash flooding) of
// the 8-byte rule id followed by the key bytes. A keyed PRF, unlike
// Murmur-style hashes with a seed, leaves a local client that cannot read the
// secret seed no way to build keys that collide. Only this process compares
// the values, so words are read in native byte order.
class SipHasher {
 public:
  SipHasher(uint64_t k0, uint64_t k1)
      : v0_(k0 ^ 0x736f6d6570736575ULL),
        v1_(k1 ^ 0x646f72616e646f6dULL),
        v2_(k0 ^ 0x6c7967656e657261ULL),
        v3_(k1 ^ 0x7465646279746573ULL) {}

  void word(uint64_t m) {
    v3_ ^= m;
    round();
    v0_ ^= m;
  }

  uint64_t finish(std::string_view tail_and_more, size_t total_bytes) {
    const char* p = tail_and_more.data();
    size_t n = tail_and_more.size();
    for (; n >= 8; p += 8, n -= 8) {
      uint64_t m;
      std::memcpy(&m, p, 8);
      word(m);
    }
    uint64_t last = uint64_t{total_bytes & 0xff} << 56;
    for (size_t i = 0; i < n; ++i) last |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
    word(last);
    v2_ ^= 0xff;
    round();
    round();
    round();
    return v0_ ^ v1_ ^ v2_ ^ v3_;
  }

 private:
  void round() {
    v0_ += v1_;
    v1_ = std::rotl(v1_, 13);
    v1_ ^= v0_;
    v0_ = std::rotl(v0_, 32);
    v2_ += v3_;
    v3_ = std::rotl(v3_, 16);
    v3_ ^= v2_;
    v0_ += v3_;
    v3_ = std::rotl(v3_, 21);
    v3_ ^= v0_;
    v2_ += v1_;
    v1_ = std::rotl(v1_, 17);
    v1_ ^= v2_;
    v2_ = std::rotl(v2_, 32);
  }

  uint64_t v0_, v1_, v2_, v3_;
};

}  // namespace

KeyTable::KeyTable(const KeyTableOptions& options)
    : seed0_(randomSeed()),
      seed1_(randomSeed()),
      bucket_mask_(std::bit_ceil(std::max<size_t>(options.max_keys, 1)) - 1),
      stripe_mask_(kStripes - 1),
      max_keys_(options.max_keys),
      max_bytes_(options.max_bytes),
      max_readers_(options.max_readers),
      sweep_min_idle_ns_(options.sweep_min_idle_ns),
      on_forced_eviction_(options.on_forced_eviction),
      reclaim_threshold_(std::max(kMinReclaimEntries, options.max_keys / 16)),
      reclaim_threshold_bytes_(std::max(kMinReclaimBytes, options.max_bytes / 16)),
      buckets_(new std::atomic<Entry*>[bucket_mask_ + 1]),
      stripes_(new Stripe[kStripes]),
      readers_(new ReaderSlot[options.max_readers]) {
  // std::atomic value-initialises (C++20), so every bucket starts empty.
  reclaim_at_.store(reclaim_threshold_, std::memory_order_relaxed);
  reclaim_at_bytes_.store(reclaim_threshold_bytes_, std::memory_order_relaxed);
}

KeyTable::~KeyTable() {
  for (size_t b = 0; b <= bucket_mask_; ++b) {
    Entry* entry = buckets_[b].load(std::memory_order_relaxed);
    while (entry != nullptr) {
      Entry* next = entry->next_.load(std::memory_order_relaxed);
      destroy(entry);
      entry = next;
    }
  }
  for (const Retired& retired : retired_) destroy(retired.entry);
}

KeyTable::ReaderId KeyTable::registerReader() {
  uint32_t index = registered_readers_.fetch_add(1, std::memory_order_relaxed);
  if (index >= max_readers_) {
    registered_readers_.fetch_sub(1, std::memory_order_relaxed);
    throw std::length_error("key table: more readers than max_readers");
  }
  return ReaderId{index};
}

uint64_t KeyTable::hashOf(uint32_t rule_id, std::string_view key) const {
  SipHasher hasher(seed0_, seed1_);
  hasher.word(rule_id);
  return hasher.finish(key, key.size() + 8);
}

KeyTable::Entry* KeyTable::findHashed(uint64_t hash, uint32_t rule_id,
                                      std::string_view key) const {
  // seq_cst loads: see "Why this is safe" in key_table.h.
  for (Entry* entry = buckets_[hash & bucket_mask_].load(std::memory_order_seq_cst);
       entry != nullptr; entry = entry->next_.load(std::memory_order_seq_cst)) {
    if (entry->hash_ == hash && entry->rule_id_ == rule_id && entry->key() == key) return entry;
  }
  return nullptr;
}

KeyTable::Entry* KeyTable::find(uint32_t rule_id, std::string_view key) const {
  return findHashed(hashOf(rule_id, key), rule_id, key);
}

KeyTable::Entry* KeyTable::findOrInsert(uint32_t rule_id, std::string_view key,
                                        size_t state_words, int64_t now_ns) {
  if (key.size() > std::numeric_limits<uint32_t>::max() ||
      state_words > std::numeric_limits<uint32_t>::max()) {
    throw std::length_error("key table: key or state too large");
  }
  uint64_t hash = hashOf(rule_id, key);
  Entry* entry = findHashed(hash, rule_id, key);
  if (entry != nullptr && entry->state_words_ == state_words) {
    entry->touch(now_ns);
    return entry;
  }
  return insertSlow(hash, rule_id, key, static_cast<uint32_t>(state_words), now_ns);
}

KeyTable::Entry* KeyTable::insertSlow(uint64_t hash, uint32_t rule_id, std::string_view key,
                                      uint32_t state_words, int64_t now_ns) {
  const size_t bytes = entryBytes(key.size(), state_words);
  if (!reserveSlot(bytes)) {
    reclaimIfBacklogged();  // the failed attempts may have evicted
    return nullptr;
  }
  // Allocate before taking the stripe lock to keep it short; the entry is
  // thrown away in the rare case another thread inserted the key first.
  Entry* fresh = create(hash, rule_id, key, state_words, now_ns);
  Entry* replaced = nullptr;
  Entry* found = nullptr;
  {
    std::lock_guard lock(stripeOf(hash));
    std::atomic<Entry*>* link = &buckets_[hash & bucket_mask_];
    // Under the stripe lock no one else writes this chain: relaxed loads.
    for (Entry* entry = link->load(std::memory_order_relaxed); entry != nullptr;
         link = &entry->next_, entry = link->load(std::memory_order_relaxed)) {
      if (entry->hash_ == hash && entry->rule_id_ == rule_id && entry->key() == key) {
        found = entry;
        break;
      }
    }
    if (found != nullptr && found->state_words_ == state_words) {
      // Someone inserted it meanwhile; use theirs.
    } else if (found != nullptr) {
      fresh->next_.store(found->next_.load(std::memory_order_relaxed), std::memory_order_relaxed);
      link->store(fresh, std::memory_order_seq_cst);  // publishes fresh, unlinks found
      replaced = found;
    } else {
      Entry* head = buckets_[hash & bucket_mask_].load(std::memory_order_relaxed);
      fresh->next_.store(head, std::memory_order_relaxed);
      buckets_[hash & bucket_mask_].store(fresh, std::memory_order_seq_cst);  // publishes fresh
    }
  }
  if (found != nullptr) {
    // The key was counted already: give back one reservation, the replaced
    // entry's or the unpublished fresh one's.
    size_.fetch_sub(1, std::memory_order_relaxed);
    linked_bytes_.fetch_sub(replaced != nullptr ? bytesOf(replaced) : bytes,
                            std::memory_order_relaxed);
  }
  if (found != nullptr && replaced == nullptr) {
    destroy(fresh);  // never published
    found->touch(now_ns);
    return found;
  }
  if (replaced != nullptr) {
    replacements_.fetch_add(1, std::memory_order_relaxed);
    retire({&replaced, 1});
  } else {
    inserts_.fetch_add(1, std::memory_order_relaxed);
  }
  reclaimIfBacklogged();
  return fresh;
}

void KeyTable::reclaimIfBacklogged() {
  if (retired_count_.load(std::memory_order_relaxed) > reclaim_at_.load(std::memory_order_relaxed) ||
      retired_bytes_.load(std::memory_order_relaxed) >
          reclaim_at_bytes_.load(std::memory_order_relaxed)) {
    reclaim();
  }
}

bool KeyTable::reserveSlot(size_t bytes) {
  // A slot freed by our own eviction stays counted in size_ and is ours: were
  // it freed for anyone, racing inserters could take it each time before we
  // got to it, and a full table would refuse us.
  bool holding = false;
  for (int attempt = 0; attempt < kReserveAttempts; ++attempt) {
    // The byte check and the add are not one atomic step, so racing inserters
    // may overshoot max_bytes by one entry each: a bound, not an exact cap.
    if (holding) {
      if (linked_bytes_.load(std::memory_order_relaxed) + bytes <= max_bytes_) {
        linked_bytes_.fetch_add(bytes, std::memory_order_relaxed);
        return true;
      }
    } else {
      size_t size = size_.load(std::memory_order_relaxed);
      while (size < max_keys_ &&
             linked_bytes_.load(std::memory_order_relaxed) + bytes <= max_bytes_) {
        if (size_.compare_exchange_weak(size, size + 1, std::memory_order_relaxed)) {
          linked_bytes_.fetch_add(bytes, std::memory_order_relaxed);
          return true;
        }
      }
    }
    if (!evictOne()) continue;
    // A long key may need several victims' bytes; only one slot is ours.
    if (holding) size_.fetch_sub(1, std::memory_order_relaxed);
    holding = true;
  }
  if (holding) size_.fetch_sub(1, std::memory_order_relaxed);
  return false;
}

// Evicts the least recently used entry among a few found from the cursor on;
// returns whether it did. The victim's bytes leave linked_bytes_, but its
// slot stays counted in size_: the caller takes it over or gives it back.
// Runs inside the caller's ReadGuard, so the sampled entries stay readable
// even if another thread unlinks them meanwhile; the victim is re-found under
// its stripe lock before it is unlinked.
bool KeyTable::evictOne() {
  size_t start = evict_cursor_.fetch_add(kEvictionProbeBuckets, std::memory_order_relaxed);
  Entry* victim = nullptr;
  int64_t oldest_ns = std::numeric_limits<int64_t>::max();
  size_t sampled = 0;
  size_t probes = std::min(kEvictionMaxProbeBuckets, bucket_mask_ + 1);
  size_t probed = 0;
  for (; probed < probes && sampled < kEvictionSampleEntries &&
         (probed < kEvictionProbeBuckets || sampled == 0);
       ++probed) {
    for (Entry* entry = buckets_[(start + probed) & bucket_mask_].load(std::memory_order_seq_cst);
         entry != nullptr && sampled < kEvictionSampleEntries;
         entry = entry->next_.load(std::memory_order_seq_cst)) {
      ++sampled;
      if (entry->lastUsedNs() < oldest_ns) {
        oldest_ns = entry->lastUsedNs();
        victim = entry;
      }
    }
  }
  // In a sparse table the walk went past its kEvictionProbeBuckets: move the
  // cursor past all it walked. Left behind, the cursor would fall further
  // behind the entries each eviction removes ahead of it, until whole walks
  // found only emptied buckets and inserts failed (OVERLOADED) in a table
  // that had entries to evict.
  if (probed > kEvictionProbeBuckets) {
    evict_cursor_.fetch_add(probed - kEvictionProbeBuckets, std::memory_order_relaxed);
  }
  if (victim == nullptr) return false;
  {
    std::lock_guard lock(stripeOf(victim->hash_));
    std::atomic<Entry*>* link = &buckets_[victim->hash_ & bucket_mask_];
    Entry* entry = link->load(std::memory_order_relaxed);
    while (entry != nullptr && entry != victim) {
      link = &entry->next_;
      entry = link->load(std::memory_order_relaxed);
    }
    if (entry == nullptr) return false;  // already unlinked by someone else
    link->store(victim->next_.load(std::memory_order_relaxed), std::memory_order_seq_cst);
  }
  linked_bytes_.fetch_sub(bytesOf(victim), std::memory_order_relaxed);
  forced_evictions_.fetch_add(1, std::memory_order_relaxed);
  if (on_forced_eviction_) on_forced_eviction_(victim->ruleId(), victim->key(), victim->state());
  retire({&victim, 1});
  return true;
}

size_t KeyTable::sweep(int64_t now_ns, const IdlePredicate& idle) {
  std::vector<Entry*> unlinked;
  for (size_t b = 0; b <= bucket_mask_; ++b) {
    // An empty bucket needs no lock: an entry inserted meanwhile is not idle.
    if (buckets_[b].load(std::memory_order_relaxed) == nullptr) continue;
    std::lock_guard lock(stripeOf(b));
    std::atomic<Entry*>* link = &buckets_[b];
    Entry* entry = link->load(std::memory_order_relaxed);
    while (entry != nullptr) {
      Entry* next = entry->next_.load(std::memory_order_relaxed);
      if (now_ns - entry->lastUsedNs() >= sweep_min_idle_ns_ && idle(*entry)) {
        link->store(next, std::memory_order_seq_cst);
        linked_bytes_.fetch_sub(bytesOf(entry), std::memory_order_relaxed);
        unlinked.push_back(entry);
      } else {
        link = &entry->next_;
      }
      entry = next;
    }
  }
  if (!unlinked.empty()) {
    size_.fetch_sub(unlinked.size(), std::memory_order_relaxed);
    idle_evictions_.fetch_add(unlinked.size(), std::memory_order_relaxed);
    retire(unlinked);
  }
  reclaim();
  releaseRetiredCapacity();
  return unlinked.size();
}

void KeyTable::releaseRetiredCapacity() {
  // The retired list grows to the most entries one sweep unlinked and would
  // keep that capacity for the daemon's life: 16 bytes per key of the largest
  // sweep, resident (144 KiB after a sweep of 9,000 keys, whenever in the
  // daemon's life that sweep came: a step in bench/soak's RSS). Given back
  // here, off the insert path.
  std::lock_guard lock(retire_mutex_);
  if (retired_.capacity() > retired_.size() + kRetiredSpareCapacity) {
    std::vector<Retired> kept;
    kept.reserve(retired_.size() + kRetiredSpareCapacity);
    kept.assign(retired_.begin(), retired_.end());
    retired_.swap(kept);
  }
}

void KeyTable::visit(const std::function<void(Entry&)>& visit) {
  for (size_t b = 0; b <= bucket_mask_; ++b) {
    if (buckets_[b].load(std::memory_order_relaxed) == nullptr) continue;
    std::lock_guard lock(stripeOf(b));
    for (Entry* entry = buckets_[b].load(std::memory_order_relaxed); entry != nullptr;
         entry = entry->next_.load(std::memory_order_relaxed)) {
      visit(*entry);
    }
  }
}

void KeyTable::retire(std::span<Entry* const> entries) {
  std::lock_guard lock(retire_mutex_);
  // Read after the unlinking stores (seq_cst), which is what the safety
  // argument in key_table.h needs; one read covers every entry passed in.
  uint64_t epoch = epoch_.load(std::memory_order_seq_cst);
  size_t bytes = 0;
  for (Entry* entry : entries) {
    retired_.push_back({entry, epoch});
    bytes += bytesOf(entry);
  }
  retired_count_.store(retired_.size(), std::memory_order_relaxed);
  retired_bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

void KeyTable::reclaim() {
  std::unique_lock lock(retire_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // someone else is reclaiming right now
  // Advancing lets readers entering from now on announce a newer epoch, so
  // what is retired now can be freed once current guards have ended.
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  uint64_t oldest_active = std::numeric_limits<uint64_t>::max();
  for (size_t i = 0; i < max_readers_; ++i) {
    uint64_t epoch = readers_[i].epoch.load(std::memory_order_seq_cst);
    if (epoch != 0) oldest_active = std::min(oldest_active, epoch);
  }
  auto keep = std::partition(retired_.begin(), retired_.end(), [&](const Retired& retired) {
    return retired.epoch >= oldest_active;
  });
  size_t freed_bytes = 0;
  for (auto it = keep; it != retired_.end(); ++it) {
    freed_bytes += bytesOf(it->entry);
    destroy(it->entry);
  }
  retired_.erase(keep, retired_.end());
  retired_count_.store(retired_.size(), std::memory_order_relaxed);
  // Only retire() and reclaim() change it, both under retire_mutex_.
  size_t kept_bytes = retired_bytes_.load(std::memory_order_relaxed) - freed_bytes;
  retired_bytes_.store(kept_bytes, std::memory_order_relaxed);
  // Entries still pinned by a long guard are not rescanned on every insert.
  reclaim_at_.store(retired_.size() + reclaim_threshold_, std::memory_order_relaxed);
  reclaim_at_bytes_.store(kept_bytes + reclaim_threshold_bytes_, std::memory_order_relaxed);
}

KeyTableStats KeyTable::stats() const {
  KeyTableStats stats;
  stats.size = size_.load(std::memory_order_relaxed);
  stats.bytes = linked_bytes_.load(std::memory_order_relaxed);
  stats.inserts = inserts_.load(std::memory_order_relaxed);
  stats.replacements = replacements_.load(std::memory_order_relaxed);
  stats.idle_evictions = idle_evictions_.load(std::memory_order_relaxed);
  stats.forced_evictions = forced_evictions_.load(std::memory_order_relaxed);
  stats.retired = retired_count_.load(std::memory_order_relaxed);
  stats.retired_bytes = retired_bytes_.load(std::memory_order_relaxed);
  return stats;
}

KeyTable::Entry* KeyTable::create(uint64_t hash, uint32_t rule_id, std::string_view key,
                                  uint32_t state_words, int64_t now_ns) {
  size_t bytes = entryBytes(key.size(), state_words);
  void* memory = ::operator new(bytes);
  Entry* entry = new (memory) Entry(hash, rule_id, static_cast<uint32_t>(key.size()),
                                    state_words, now_ns);
  std::atomic<uint64_t>* words = entry->stateWords();
  for (uint32_t i = 0; i < state_words; ++i) new (words + i) std::atomic<uint64_t>(0);
  if (!key.empty()) std::memcpy(entry->keyData(), key.data(), key.size());
  return entry;
}

void KeyTable::destroy(Entry* entry) {
  // Entry and std::atomic<uint64_t> are trivially destructible.
  ::operator delete(static_cast<void*>(entry));
}

}  // namespace sluice
