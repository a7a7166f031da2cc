// Package memory is the in-memory block index, the default store.Store: a
// bounded map from block keys to the pods holding them, for one prefixd
// process.
//
// # Basics
//
//	s, err := memory.New(memory.Options{CapacityBlocks: 10_000_000, Registerer: reg})
//	err = s.Add(ctx, "10.0.0.7:8000", store.TierGPU, keys)
//	matches, err := s.Lookup(ctx, queryKeys, nil, matches)
//
// Each block is a 16-byte record in an arena: its (mixed) key and a
// holders word. The holders word keeps up to four holders inline, each a
// 12-bit pod id and a tier mask; blocks held by more pods point to an
// immutable set. Pods are interned to those ids; there is no string,
// pointer or list node per entry. The keys of one Add get consecutive
// records, so a prompt's blocks lie together in the order lookups walk
// them; AddAfter (store.Chainer) puts keys that continue a chain right
// after their parent's when those records are free, and a short run added
// that way leaves 16 records free after it, so that the blocks a request
// decodes one at a time, between other requests' blocks, still lie
// together. Records live in segments of 4096; a segment left less than 3/4
// live is compacted (its live records move, in order, to the segment being
// filled) once a quarter of all records are dead, oldest segment first.
//
// The index is split into a power-of-two number of shards by the high bits
// of each key. A shard's index is an open-addressing table of 8-byte
// entries, a 32-bit fraction of the key and the record's location, eight
// to a cache line, kept in fraction order (ordered linear probing, no
// tombstones); the key itself is read from the record.
//
// Writers take a shard's mutex, for the index and for the records of its
// keys. Lookups take no lock per key. A lookup first reads the record
// after the last one it matched: a record holds one key for the life of
// its segment, so one with the key sought and a live word is the answer.
// Otherwise it asks the index, under the shard's sequence counter (a
// seqlock) that it reads before and after, retrying (and after a few tries,
// locking) when a writer was there. A prompt stored whole costs one probe
// of the index and a sequential read of its records; a prompt stored in
// many pieces is probed a chunk at a time in passes whose cache misses
// overlap. The walk follows the candidate pods and stops as soon as none
// still matches. It allocates nothing.
//
// Each shard also keeps, per pod, the keys it holds there (as 32-bit
// fractions of the key), in the order the pod gained them, so that
// ClearPod costs the pod's own blocks plus one lock per shard, and so that
// eviction can take back a pod's least recently used keys. Those lists may
// hold stale entries, which are compacted away once they are a third of a
// list.
//
// # Capacity
//
// Capacity is counted in holdings, (pod, key) pairs, and split evenly
// between shards. A shard that is full makes room for a new holding by
// evicting one of a pod over its limit, or else one of the adder's own,
// so that a pod within its limit loses blocks only to its own adds. A
// pod's limit is its fair share, the capacity divided by the number of
// pods holding blocks (counted across all shards), or its cache size plus
// an eighth when one is known and that is lower. The cache size is what
// SetCacheBlocks set (the caller knows it per model), or what the store
// learned from the pod's own events, whichever is larger: a pod that
// removes blocks from its GPU tier has a full cache, so the blocks it held
// just before are a lower bound on its size, and the store keeps the
// largest such figure (the eighth allows for that bound being low). The
// room is taken from, in this order:
//
//   - the adder, when it is over its limit;
//   - else the pod most over its limit among those with blocks in the
//     shard: the shard keeps that choice until the pod is no longer over
//     or has nothing left there, and looks again among the pods the store
//     has marked as maybe over (a bit a pod, set when its count grows past
//     its limit and, for all pods, when the share shrinks), the one the
//     store saw most over first;
//   - else, nobody being over, the adder.
//
// The pod chosen loses its least recently used holding: its keys are
// taken from the front of its list in the shard, with a second chance.
// Each block has a 2-bit age: it is stored at 1 and set to 3 when a
// lookup matches it below 2; a key whose block is above 0 has its age
// counted down and goes to the back of the list, and the first at 0 is
// evicted. The pod loses the key on every tier; the block goes with its
// last holder. The key being added is never evicted. Lookups keep ages
// only in shards over 3/4 full, where eviction is near: elsewhere they
// write nothing. Blocks that lookups keep reaching (the shared starts of
// popular prompts) stay; blocks nobody has matched go first, tails of
// prompts before their heads, since a lookup stops at the first block a
// pod lacks.
//
// A key for which no room can be made (the adder holds nothing in its
// shard to give up and no pod there is over its limit) is skipped. Every
// holding evicted and every key skipped counts against its pod until the
// pod is cleared: the pod's matches are Incomplete, Pods reports the
// count as Evicted, and prefixd_store_pod_evicted_blocks{pod} shows it
// (for such pods only). Evictions are counted in
// prefixd_store_evicted_blocks_total by reason, over_cache_size,
// over_fair_share or own (nobody over: the adder's own); skipped keys in
// prefixd_store_dropped_blocks_total{reason="capacity"}.
//
// # Memory
//
// BenchmarkMemory measures the heap in use after storing 10M blocks with
// one holder each: about 37 bytes a block (a 16-byte record,
// index tables 56% to 70% full at 8 bytes an entry, plus 4 bytes and some
// slack per holder in the ownership lists). Under churn, dead records wait
// for compaction: about a quarter of the records at most, plus a segment.
// The per-pod counts, cache sizes and eviction counts are arrays of
// MaxPods, about 130 KB in all.
//
// # Caveats
//
//   - MaxPods (4096) pods can hold blocks at once. Ids of pods that were
//     cleared, or whose last block went, are reused; beyond that Add
//     returns ErrTooManyPods.
//   - Capacity is per shard (CapacityBlocks/shards each), so a store holds
//     slightly less than its capacity before it starts evicting; small
//     capacities get fewer shards to keep that loss small. Limits are
//     store-wide, so a shard that fills before the others, its keys not
//     spread quite evenly, evicts from the adder even when no pod is over
//     its limit.
//   - Limits are exact between operations, not during them: an Add counts
//     what it gained once every 256 keys (and before it evicts), and
//     shards decide on counts other shards are changing. When many pods
//     are over their limit by a block or two, a shard takes the most over
//     of the first eight it finds, not of all of them.
//   - Cache sizes set by SetCacheBlocks are kept by name, for at most
//     MaxPods pods; a learned size is the pod's until it is cleared.
//   - A pod whose blocks were all evicted is listed by Pods with its count
//     until it is cleared or, when every id is taken, its id is reused.
//   - A lookup sees each key as it was at some instant, not the whole
//     query at one instant. A block held by more pods than a shard's
//     capacity cannot be stored whole; Add skips and counts such keys.
//   - A lookup reads each record whole, but a compaction that moves a
//     record it is about to read sends it to the index for that key.
//   - Every operation holds a store-wide RWMutex for reading. Interning a
//     new pod and ClearPod take it for writing briefly, so a ClearPod
//     waits for the Adds in flight and delays the lookups behind it.
//   - Keys are mixed with a fixed multiplicative hash, not a keyed one:
//     they are expected from engines or from prefixd's own hashing, not
//     from adversaries.
package memory
