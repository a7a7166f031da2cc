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

// ErrTooManyPods is returned by Add when MaxPods pods already hold blocks.
var ErrTooManyPods = errors.New("memory: too many pods")

// Store is the in-memory block index, built for millions of blocks held by
// up to a few thousand pods, lookups of hundreds of keys from many
// goroutines, and a steady stream of adds and removes.
//
// Locking: every operation holds mu for reading while it runs, and takes
// shard locks one at a time inside it. Interning a new pod and the start
// and end of ClearPod take mu for writing, so a pod id seen by an operation
// cannot be freed and handed to another pod before that operation ends.
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

	mu    sync.RWMutex      // guards the pod table below
	ids   map[string]uint16 // live pods by name
	names []string          // by id; "" for ids not in use
	live  [MaxPods / 64]uint64
	free  []uint16 // ids to reuse
	// cacheSizes are the sizes SetCacheBlocks set, by pod name, whether
	// the pod has an id or not; at most MaxPods.
	cacheSizes map[string]int64

	pods podStats // by id: holdings, cache sizes, evictions
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

func check(ctx context.Context, pod string, tier store.Tier) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: %w", err)
	}
	if pod == "" {
		return store.ErrInvalidPod
	}
	if tier >= store.NumTiers {
		return fmt.Errorf("%w: %d", store.ErrInvalidTier, tier)
	}
	return nil
}

// Add records that pod holds keys on tier. When a shard is full it evicts
// a holding first from a pod over its cache size or fair share (see the
// package documentation); a key that still does not fit is skipped. Both
// count against the pod they take from: its matches are Incomplete until
// it is cleared.
func (s *Store) Add(ctx context.Context, pod string, tier store.Tier, keys []uint64) error {
	return s.add(ctx, pod, tier, keys, 0, false)
}

// AddAfter is Add for keys that continue a chain whose last block is
// parent: their records go right after parent's when they are free, so
// that a lookup walking the chain reads them in one run.
func (s *Store) AddAfter(ctx context.Context, pod string, tier store.Tier, parent uint64, keys []uint64) error {
	return s.add(ctx, pod, tier, keys, parent, true)
}

var _ store.Chainer = (*Store)(nil)

func (s *Store) add(ctx context.Context, pod string, tier store.Tier, keys []uint64, parent uint64, chained bool) error {
	if err := check(ctx, pod, tier); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	s.mu.RLock()
	id, ok := s.ids[pod]
	for !ok {
		s.mu.RUnlock()
		if err := s.intern(pod); err != nil {
			s.skipped.Add(int64(len(keys)))
			s.metrics.dropped.WithLabelValues(dropPods).Add(float64(len(keys)))
			return err
		}
		s.mu.RLock()
		id, ok = s.ids[pod] // a ClearPod may have raced in between
	}
	bit := uint64(1) << tier
	ad := adder{id: id}
	skipped := 0 // for want of records
	for start := 0; start < len(keys); start += maxRun {
		part := keys[start:min(start+maxRun, len(keys))]
		// The keys get consecutive records, those already stored excepted:
		// after their parent's if they can, else from the head. Short
		// runs that continue a chain, as decoding stores, leave room for
		// the blocks that follow.
		reserve := 0
		if chained && len(part) <= chainReserve {
			reserve = chainReserve
		}
		var (
			seg *segment
			off int
			ok  bool
		)
		if chained && start == 0 {
			ph := mix(parent)
			if _, _, pseg, poff, found := s.shard(ph).get(ph); found && s.arena.claim(pseg, poff, len(part), reserve) {
				seg, off, ok = pseg, poff+1, true
			}
		}
		if !ok {
			if seg, off, ok = s.arena.alloc(len(part), reserve); !ok {
				skipped += len(part)
				continue
			}
		}
		used, filled := 0, 0 // records used: up to the last one, and in all
		for i, k := range part {
			if i%maxChunk == 0 && len(part) > 1 {
				keep(s.touch(part[i:min(i+maxChunk, len(part))]))
			}
			h := mix(k)
			sh := s.shard(h)
			sh.lock()
			u := sh.add(h, &ad, bit, seg, off+i)
			sh.unlock()
			if u {
				used = i + 1
				filled++
			}
		}
		// Counted once for the run, not a locked add a key.
		s.arena.filled(seg, filled)
		s.arena.finish(seg, off, used, len(part), reserve)
		s.pods.addHeld(id, ad.gained)
		ad.gained = 0
	}
	if skipped += ad.skipped; skipped > 0 {
		// Under mu, while id is still the pod's.
		s.pods.evicted[id].Add(int64(skipped))
	}
	if s.arena.nsparse.Load() > 0 && s.arena.wasteful() {
		s.compact()
	}
	s.mu.RUnlock()
	evicted := 0
	for why, n := range ad.evicted {
		if n > 0 {
			evicted += n
			s.metrics.evictions[why].Add(float64(n))
		}
	}
	if evicted > 0 {
		s.evicted.Add(int64(evicted))
	}
	if skipped > 0 {
		s.skipped.Add(int64(skipped))
		s.metrics.dropped.WithLabelValues(dropCapacity).Add(float64(skipped))
	}
	return nil
}

// maxRun is the most keys of one Add given consecutive records: a run
// never spans segments, and the head segment wastes at most this many
// records when it fills.
const maxRun = 256

// chainReserve is how many records an AddAfter of at most as many keys
// leaves free after them, for the next AddAfter to continue the chain in:
// decoding stores a request's blocks one at a time, between other
// requests' blocks.
const chainReserve = 16

// compact moves the live records of one sparse segment to the head, in
// order, and frees the segment. Add and Remove run it, one segment at a
// time, while a quarter or more of all records are dead: they make the
// garbage it collects; ClearPod runs it until that is no longer so.
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

// intern gives pod an id.
func (s *Store) intern(pod string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.ids[pod]; ok {
		return nil
	}
	if len(s.free) == 0 && len(s.names) == MaxPods {
		s.reclaimLocked()
	}
	var id uint16
	switch n := len(s.free); {
	case n > 0:
		id = s.free[n-1]
		s.free = s.free[:n-1]
		s.names[id] = pod
	case len(s.names) < MaxPods:
		id = uint16(len(s.names))
		s.names = append(s.names, pod)
	default:
		return fmt.Errorf("%w: %d pods hold blocks, cannot add %q", ErrTooManyPods, MaxPods, pod)
	}
	s.ids[pod] = id
	s.live[id/64] |= 1 << (id % 64)
	s.pods.reset(id, s.cacheSizes[pod])
	return nil
}

// reclaimLocked frees the ids of pods that hold no blocks any more. It
// runs only when every id is taken; mu is held for writing, so no other
// operation is using an id.
func (s *Store) reclaimLocked() {
	counts := s.countsLocked()
	for name, id := range s.ids {
		if counts[id] != 0 {
			continue
		}
		for i := range s.shards {
			sh := &s.shards[i].shard
			sh.mu.Lock()
			sh.forget(id)
			sh.mu.Unlock()
		}
		delete(s.ids, name)
		s.live[id/64] &^= 1 << (id % 64)
		s.names[id] = ""
		s.free = append(s.free, id)
	}
}

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

// Remove records that pod no longer holds keys on tier and returns how
// many it held there.
func (s *Store) Remove(ctx context.Context, pod string, tier store.Tier, keys []uint64) (int, error) {
	if err := check(ctx, pod, tier); err != nil {
		return 0, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	id, ok := s.ids[pod]
	if !ok {
		return 0, nil
	}
	bit := uint64(1) << tier
	var held int64
	if tier == store.TierGPU {
		held = s.pods.held[id].Load()
	}
	removed, lost := 0, 0
	var rel release
	for i, k := range keys {
		if i%maxChunk == 0 && len(keys) > 1 {
			keep(s.touch(keys[i:min(i+maxChunk, len(keys))]))
		}
		h := mix(k)
		sh := s.shard(h)
		sh.lock()
		r, l := sh.unset(h, id, bit, true, &rel)
		sh.unlock()
		if r {
			removed++
		}
		if l {
			lost++
		}
	}
	rel.flush(&s.arena)
	s.pods.addHeld(id, -int64(lost))
	if tier == store.TierGPU && removed > 0 {
		// The engine evicted from a full cache: it holds at least what it
		// held before.
		s.pods.learn(id, held)
	}
	if s.arena.nsparse.Load() > 0 && s.arena.wasteful() {
		s.compact()
	}
	return removed, nil
}

// ClearPod removes every block of pod. It costs the pod's own blocks plus
// one lock per shard. The pod disappears from lookups and Pods at once;
// its id is reused only after every shard has dropped its blocks.
func (s *Store) ClearPod(ctx context.Context, pod string) error {
	if err := check(ctx, pod, 0); err != nil {
		return err
	}
	s.mu.Lock()
	id, ok := s.ids[pod]
	if ok {
		delete(s.ids, pod)
		s.live[id/64] &^= 1 << (id % 64)
	}
	s.mu.Unlock()
	if !ok {
		return nil
	}
	n := 0
	for i := range s.shards {
		sh := &s.shards[i].shard
		sh.lock()
		n += sh.clearPod(id)
		sh.unlock()
	}
	s.pods.addHeld(id, -int64(n))
	for s.arena.nsparse.Load() > 0 && s.arena.wasteful() && s.compact() {
	}
	s.mu.Lock()
	s.names[id] = ""
	s.free = append(s.free, id)
	s.mu.Unlock()
	return nil
}

// Pods lists the pods holding at least one block, or whose blocks were
// evicted since they were last cleared, sorted by name.
func (s *Store) Pods(ctx context.Context) ([]store.PodInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memory: %w", err)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	counts := s.countsLocked()
	out := make([]store.PodInfo, 0, len(s.ids))
	for name, id := range s.ids {
		if ev := s.pods.evicted[id].Load(); counts[id] > 0 || ev > 0 {
			out = append(out, store.PodInfo{Name: name, Blocks: counts[id], Evicted: int(ev)})
		}
	}
	slices.SortFunc(out, func(a, b store.PodInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// SetCacheBlocks sets the size of pod's own KV cache in blocks; 0 clears
// it. A pod holding more than its cache size plus an eighth is the first
// to lose blocks when a shard is full (see the package documentation). The
// size is kept by name, before the pod holds any block and after it is
// cleared, for at most MaxPods pods: beyond that, sizes of pods that hold
// no blocks make room, and a size that finds none is not kept.
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

// dropCacheSizeLocked forgets the cache size of a pod without an id, if
// there is one, and reports whether it did; mu is held for writing.
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
	// Pods is the number of pods with an id, holding blocks or not.
	Pods int
	// Keys is the number of distinct keys; Blocks the (pod, key) pairs.
	Keys, Blocks   int
	CapacityBlocks int
	// Evicted counts the blocks evicted to stay within capacity, Skipped the
	// keys Add could not store, since New.
	Evicted, Skipped int64
	// Bytes estimates the memory of the records, index tables, holder sets
	// and per-pod ownership lists.
	Bytes int64
}

// Stats returns the store's current size and counters.
func (s *Store) Stats() Stats {
	s.mu.RLock()
	st := Stats{Pods: len(s.ids), CapacityBlocks: s.capacity, Evicted: s.evicted.Load(), Skipped: s.skipped.Load()}
	s.mu.RUnlock()
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
