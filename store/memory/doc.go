// Package memory is the in-memory block index, the default store.Store: a
// bounded map from block keys to the pods holding them, for one prefixd
// process.
//
// # Basics
//
//	s, err := memory.New(memory.Options{CapacityBlocks: 10_000_000, Registerer: reg})
//	res, err := s.Apply(ctx, "10.0.0.7:8000", &store.Batch{Seq: seq, Ops: []store.Op{
//		{Kind: store.OpAdd, Tier: store.TierGPU, Keys: keys},
//	}})
//	matches, err := s.Lookup(ctx, queryKeys, nil, matches)
//
// Each block is a 16-byte record in an arena: its (mixed) key and a
// holders word. The holders word keeps up to four holders inline, each a
// 12-bit pod id and a tier mask; blocks held by more pods point to an
// immutable set. Pods are interned to those ids; there is no string,
// pointer or list node per entry. The keys of one OpAdd get consecutive
// records, so a prompt's blocks lie together in the order lookups walk
// them; an OpAdd with a Parent puts keys that continue a chain right
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
// clearing or forgetting a pod costs its own blocks plus one lock per
// shard, and so that eviction can take back a pod's least recently used
// keys. Those lists may hold stale entries, which are compacted away once
// they are a third of a list.
//
// # Pods and batches
//
// A pod is known from its first Apply (or SetStale(true)) until
// ForgetPod, and has one 12-bit id for all that time: the id names it in
// holders words and indexes what the store keeps of it, its block
// counts, cache size, evictions and stale mark (atomics, read by lookups
// and eviction without locks) and its state (applied seq, engine-hash map
// and a mutex). So MaxPods bounds the pods known, with blocks or without:
// a pod that holds nothing still has a seq to remember. Apply and
// SetStale(true) of another pod fail with ErrTooManyPods, changing
// nothing. An OpClear keeps the pod and its id; ForgetPod takes both
// away, and the id is reused once every shard has dropped the pod's
// blocks. A pod left with nothing to remember (no block, seq, stale mark
// or eviction: a first batch that failed before it changed anything, a
// stale mark lifted from a pod known by it alone) is forgotten at once.
//
// Each Apply holds its pod's mutex throughout: a pod's batches apply one
// at a time and the seq check, the ops and the new seq are one step for
// that pod, while other pods' batches run beside it, meeting only on the
// shards' locks. A batch is validated whole before its pod is looked up.
// The lock order is written down at Store.
//
// The engine-hash map of tokens key mode is a Go map per pod, from engine
// hash to key. It resolves a hash only while the pod holds the key on
// some tier (a read of the index, as a lookup makes), so a pair whose key
// was removed by key, cleared or evicted resolves nothing. An OpRemove by
// engine hash that takes a key off its last tier deletes that pair at
// once; other pairs whose key went (evictions above all, which no
// BlockRemoved follows) are swept: once a pod's map has more than twice
// its blocks plus 256 entries, and half again what the last sweep left,
// an OpAdd with pairs deletes every pair whose key the pod no longer
// holds (copying the rest into a map of their size when that is under
// half). Each sweep reads the index once an entry and happens after at
// least a third of its entries were added since the last, so it costs a
// bounded number of reads per pair added, and a pod's map never holds
// more than about three times its blocks, however long it runs.
//
// # Capacity
//
// Capacity is counted in holdings, (pod, key) pairs, and split evenly
// between shards (engine-hash maps are not counted: they follow the
// blocks, see above). A shard that is full makes room for a new holding by
// evicting one of a pod over its limit, or else one of the adder's own,
// so that a pod within its limit loses blocks only to its own adds. A
// pod's limit is its fair share, the capacity divided by the number of
// pods holding blocks (counted across all shards), or its cache size plus
// an eighth when one is known and that is lower. The cache size is what
// SetCacheBlocks set (the caller knows it per model), or what the store
// learned from the pod's own events, whichever is larger: a pod whose
// batch removes blocks from its GPU tier (an OpRemove) has a full cache,
// so the blocks it held just before are a lower bound on its size, and
// the store keeps the largest such figure (the eighth allows for that
// bound being low). The room is taken from, in this order:
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
// pod is cleared (OpClear) or forgotten: the pod's matches are
// Incomplete, Pods reports the count as Evicted, and
// prefixd_store_pod_evicted_blocks{pod} shows it (for such pods only).
// Evictions are counted in
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
// The per-pod counts, cache sizes, eviction counts and stale marks are
// arrays of MaxPods, about 135 KB in all; each known pod adds its state,
// about 250 bytes with its name. In tokens key mode each pair of an
// engine-hash map costs about 33 bytes (BenchmarkMemoryEnginePairs): one
// a block, and up to about three a block for a pod whose blocks are
// evicted, until its map is swept.
//
// # Caveats
//
//   - MaxPods (4096) pods are known at once, those with a seq or a stale
//     mark and no blocks included; only ForgetPod makes room. Beyond,
//     Apply and SetStale(true) of a new pod return ErrTooManyPods.
//     MaxModels (1024) models and MaxLoRAs (65536) adapters are kept;
//     beyond, DecideKeyMode and AddLoRA of new ones return
//     ErrTooManyModels and ErrTooManyLoRAs.
//   - Capacity is per shard (CapacityBlocks/shards each), so a store holds
//     slightly less than its capacity before it starts evicting; small
//     capacities get fewer shards to keep that loss small. Limits are
//     store-wide, so a shard that fills before the others, its keys not
//     spread quite evenly, evicts from the adder even when no pod is over
//     its limit.
//   - Limits are exact between ops, not during them: an OpAdd counts what
//     it gained once every 256 keys (and before it evicts), and shards
//     decide on counts other shards are changing. When many pods are over
//     their limit by a block or two, a shard takes the most over of the
//     first eight it finds, not of all of them.
//   - Cache sizes set by SetCacheBlocks are kept by name, for at most
//     MaxPods pods; a learned size is the pod's until it is cleared.
//   - A pod whose blocks were all evicted is listed by Pods with its count
//     until it is cleared or forgotten.
//   - A lookup sees each key as it was at some instant, not the whole
//     query at one instant; one running while an OpClear applies may see
//     some of the pod's blocks still there (ForgetPod hides the pod from
//     lookups at once). A block held by more pods than a shard's capacity
//     cannot be stored whole; an OpAdd skips and counts such keys.
//   - A lookup reads each record whole, but a compaction that moves a
//     record it is about to read sends it to the index for that key.
//   - Lookups, Pods and finding a pod hold a store-wide RWMutex for
//     reading. Making a pod known and ForgetPod take it for writing
//     briefly, so they wait for the lookups in flight, and the lookups
//     behind them wait too. Batches being applied hold only their pod's
//     lock and the shards'.
//   - An engine-hash pair whose key the pod stopped holding other than by
//     an OpRemove by that hash (removed by key, evicted) stays until a
//     sweep: should the pod hold the key again by an OpAdd without
//     Engine, the pair resolves again until then.
//   - Keys are mixed with a fixed multiplicative hash, not a keyed one:
//     they are expected from engines or from prefixd's own hashing, not
//     from adversaries.
package memory
