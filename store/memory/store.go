package memory

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prefixd/prefixd/store"
)

// MaxPods is how many pods a Store knows at once: pod ids are 12 bits.
const MaxPods = 1 << podBits

// ErrTooManyPods is returned by Apply and SetStale for a pod the store
// does not know when it knows MaxPods pods already.
var ErrTooManyPods = errors.New("memory: too many pods")

// Store is the in-memory block index, built for millions of blocks held by
// up to a few thousand pods, lookups of hundreds of keys from many
// goroutines, and a steady stream of batches of adds and removes.
//
// # Locking
//
// Locks are taken in this order, never against it, and an operation holds
// at most one of each kind:
//
//  1. podState.mu, one pod's: Apply, ForgetPod, SetStale and EngineKeys
//     hold it throughout, so that one pod's batches apply one at a time
//     while other pods' go on. It also keeps the pod's id the pod's:
//     only ForgetPod and dropIfEmpty, which hold it, take an id away.
//  2. mu, the store's, which guards the pod table (ids, names, states,
//     live): held for reading to find a pod (lockState, AppliedSeq) and
//     throughout Lookup, Pods and Stats, so that an id they read cannot
//     be handed to another pod before they end, and never twice at once
//     (a writer waiting in between would deadlock the reader); for
//     writing, briefly, to give a pod an id or take it away. Apply does
//     not hold it while it applies ops: the pod's lock keeps its id, and
//     what other pods share the shards guard.
//  3. shard.mu, one shard at a time.
//  4. arena.mu.
//
// models.mu is apart: nothing is taken under it, and it is taken under
// nothing.
type Store struct {
	shards    []paddedShard
	arena     arena
	shift     uint   // 64 - log2(len(shards)), 64 for one shard
	shardMask uint64 // len(shards) - 1
	capacity  int
	metrics   *metrics

	pressured atomic.Int32 // shards under pressure (shard.pressure)
	evicted   atomic.Int64 // holdings evicted to stay within capacity
	skipped   atomic.Int64 // keys not added for lack of room or pod ids

	mu     sync.RWMutex      // guards the pod table below
	ids    map[string]uint16 // known pods by name
	names  []string          // by id; "" for ids not in use
	states []*podState       // by id; nil for ids not in use
	live   [MaxPods / 64]uint64
	free   []uint16 // ids to reuse
	// cacheSizes are the sizes SetCacheBlocks set, by pod name, whether
	// the pod is known or not; at most MaxPods.
	cacheSizes map[string]int64

	pods podStats // by id: holdings, cache sizes, evictions, stale marks

	models models // key modes and adapters
}

var _ store.Store = (*Store)(nil)

// New returns an empty Store.
func New(opts Options) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	n := opts.shards()
	shardBits := uint(bits.TrailingZeros(uint(n)))
	s := &Store{
		shards:    make([]paddedShard, n),
		shift:     64 - shardBits,
		shardMask: uint64(n - 1),
		capacity:  opts.CapacityBlocks,
		ids:       make(map[string]uint16),
	}
	s.cacheSizes = make(map[string]int64)
	s.pods.capacity = int64(opts.CapacityBlocks)
	s.arena.init()
	for i := range s.shards {
		c := opts.CapacityBlocks / n
		if i < opts.CapacityBlocks%n {
			c++
		}
		s.shards[i].init(&s.arena, shardBits, c, &s.pressured, &s.pods)
	}
	m, err := newMetrics(opts.Registerer, s)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	return s, nil
}

// CapacityBlocks returns the most (pod, key) pairs the store holds.
func (s *Store) CapacityBlocks() int { return s.capacity }

// shard returns the shard of mixed key h: its high bits. (The mask makes
// one shard, shift 64, work with a shift the CPU does in one instruction.)
func (s *Store) shard(h uint64) *shard { return &s.shards[h>>(s.shift&63)&s.shardMask].shard }

// check returns ctx's error, or ErrInvalidPod for an empty pod name.
func check(ctx context.Context, pod string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: %w", err)
	}
	if pod == "" {
		return store.ErrInvalidPod
	}
	return nil
}

// compact moves the live records of one sparse segment to the head, in
// order, and frees the segment. Apply runs it, one segment at a time after
// each add or remove, while a quarter or more of all records are dead: its
// adds and removes make the garbage it collects; clears run it until that
// is no longer so.
//
// It reports whether it compacted a segment.
func (s *Store) compact() bool {
	seg := s.arena.takeSparse()
	if seg == nil {
		return false
	}
	done := true
	for off := range segSize {
		r := &seg.r[off]
		if empty(atomic.LoadUint64(&r.w)) {
			continue // dead for good: a segment taken for compaction gains no records
		}
		h := atomic.LoadUint64(&r.k)
		sh := s.shard(h)
		sh.lock()
		ok := sh.move(h, seg, off)
		sh.unlock()
		if !ok {
			done = false
			break
		}
	}
	s.arena.dropped(seg, done)
	return done
}

// keep makes x look used, so that the loads that computed it stay.
func keep(x uint64) {
	if x == 0x5eed_5eed_5eed_5eed {
		keepSink.Add(1)
	}
}

var keepSink atomic.Int64

// countsLocked returns every id's block count; mu must be held.
func (s *Store) countsLocked() []int {
	counts := make([]int, len(s.names))
	for i := range s.shards {
		sh := &s.shards[i].shard
		sh.mu.Lock()
		for id, c := range sh.count {
			counts[id] += int(c)
		}
		sh.mu.Unlock()
	}
	return counts
}

// Pods lists the pods holding at least one block, with an applied seq,
// marked stale, or whose blocks were evicted since they were last cleared,
// sorted by name.
func (s *Store) Pods(ctx context.Context) ([]store.PodInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memory: %w", err)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	counts := s.countsLocked()
	out := make([]store.PodInfo, 0, len(s.ids))
	for name, id := range s.ids {
		p := store.PodInfo{Name: name, Blocks: counts[id], Evicted: int(s.pods.evicted[id].Load()), Stale: s.pods.stale[id].Load()}
		if st := s.states[id]; st.hasSeq.Load() {
			p.AppliedSeq, p.HasSeq = st.seq.Load(), true
		}
		if p.Blocks > 0 || p.Evicted > 0 || p.HasSeq || p.Stale {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b store.PodInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// SetCacheBlocks sets the size of pod's own KV cache in blocks; 0 clears
// it. A pod holding more than its cache size plus an eighth is the first
// to lose blocks when a shard is full (see the package documentation). The
// size is kept by name, before the pod is known and after it is
// forgotten, for at most MaxPods pods: beyond that, sizes of pods the
// store does not know make room, and a size that finds none is not kept.
func (s *Store) SetCacheBlocks(pod string, blocks int) {
	if pod == "" {
		return
	}
	n := int64(min(max(blocks, 0), MaxCapacityBlocks))
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, ok := s.ids[pod]; ok {
		s.pods.cache[id].Store(n)
		s.pods.checkOver(id)
	}
	switch _, known := s.cacheSizes[pod]; {
	case n == 0:
		delete(s.cacheSizes, pod)
	case known || len(s.cacheSizes) < MaxPods || s.dropCacheSizeLocked():
		s.cacheSizes[pod] = n
	}
}

// dropCacheSizeLocked forgets the cache size of a pod the store does not
// know, if there is one, and reports whether it did; mu is held for
// writing.
func (s *Store) dropCacheSizeLocked() bool {
	for name := range s.cacheSizes {
		if _, ok := s.ids[name]; !ok {
			delete(s.cacheSizes, name)
			return true
		}
	}
	return false
}

// forEachEvicted calls f for every pod with evictions counted, under mu.
func (s *Store) forEachEvicted(f func(pod string, n int64)) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for name, id := range s.ids {
		if n := s.pods.evicted[id].Load(); n > 0 {
			f(name, n)
		}
	}
}

// Stats is a snapshot of a Store's size and counters.
type Stats struct {
	// Pods is the number of pods known (each has an id), holding blocks
	// or not.
	Pods int
	// Keys is the number of distinct keys; Blocks the (pod, key) pairs.
	Keys, Blocks   int
	CapacityBlocks int
	// EnginePairs counts the entries of all pods' engine-hash maps,
	// including those whose key the pod no longer holds and a sweep has
	// not yet deleted.
	EnginePairs int
	// Evicted counts the blocks evicted to stay within capacity, Skipped the
	// keys Apply could not store, since New.
	Evicted, Skipped int64
	// Bytes estimates the memory of the records, index tables, holder sets,
	// per-pod ownership lists and engine-hash maps.
	Bytes int64
}

// enginePairBytes estimates the memory of one entry of an engine-hash
// map: 16 bytes and a control byte in a table from 7/16 to 7/8 full;
// BenchmarkMemoryEnginePairs measured 33.
const enginePairBytes = 32

// Stats returns the store's current size and counters.
func (s *Store) Stats() Stats {
	s.mu.RLock()
	st := Stats{Pods: len(s.ids), CapacityBlocks: s.capacity, Evicted: s.evicted.Load(), Skipped: s.skipped.Load()}
	for _, ps := range s.states {
		if ps != nil {
			st.EnginePairs += int(ps.pairs.Load())
		}
	}
	s.mu.RUnlock()
	st.Bytes += int64(st.EnginePairs) * enginePairBytes
	for i := range s.shards {
		sh := &s.shards[i].shard
		sh.mu.Lock()
		st.Keys += sh.n
		st.Blocks += sh.holdings
		st.Bytes += sh.bytes()
		sh.mu.Unlock()
	}
	st.Bytes += s.arena.bytes()
	return st
}
