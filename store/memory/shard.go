package memory

import (
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"
)

// mix spreads a block key over 64 bits. Engine keys are usually good
// hashes already, but FNV-1a (the llm-d chain) has weak low bits and keys
// computed by other schemes need not be uniform. It is a bijection, so the
// tables store mixed keys and never need the original back.
func mix(k uint64) uint64 { return (k ^ k>>32) * 0x9e3779b97f4a7c15 }

// optimisticTries is how many times a lookup re-reads a key a writer keeps
// changing before it takes the shard's lock.
const optimisticTries = 4

// ownedSlack is how many stale entries a pod's ownership list in one shard
// may carry beyond half its live keys before it is compacted.
const ownedSlack = 16

// shard is one stripe of the index. Writers take mu and make seq odd while
// they change the table; lookups take no lock: they read seq, the table
// and seq again, and retry when seq moved (a seqlock), so reads never
// contend with each other or write to shared memory, except to set the
// age of a block they match when it is not already at its top.
type shard struct {
	mu  sync.Mutex    // serialises writers; guards the fields below dir
	seq atomic.Uint64 // odd while a writer changes tbl, its records or the sets
	tbl atomic.Pointer[table]
	dir atomic.Pointer[setDir]
	a   *arena // the store's, where the shard's keys have their records

	freeSets []uint32 // unused indexes of dir
	nsets    int      // sets in use
	n        int      // keys
	holdings int      // (pod, key) pairs
	capacity int      // most holdings
	// owned[id] lists the keys pod id holds in this shard, in the order it
	// gained them (the order eviction takes them back in), so that
	// clearing a pod costs its own blocks. It keeps 32-bit fractions
	// (table.frac), not 64-bit keys, which halves its size: a fraction
	// leads to its keys, in its home line or just after, and the rare keys
	// that share one are all examined. It may also list keys the pod no
	// longer holds, and a fraction twice; compactOwned bounds that. The
	// list is owned[id][head[id]:]: the entries before head were taken from
	// the front, and own reuses their room.
	owned [][]uint32
	head  []int32
	count []int32 // by pod id: keys the pod holds here
	sink  uint64  // keeps the loads that warm the cache

	// pods are the store's per-pod totals, which choose whose holding
	// goes when the shard is full (makeRoom).
	pods *podStats
	// victim is the pod most over its limit when the shard last looked
	// (noVictim for none), taken from until it is no longer over or holds
	// nothing here; overFrom is the word of podStats.over the next look
	// starts at (overPod).
	victim   uint16
	overFrom int

	// pressure is set while the shard is over pressureOn of its capacity,
	// until it falls under pressureOff. Only then do lookups keep ages up
	// to date: ages matter only to eviction, and keeping them costs a
	// locked write per block matched.
	pressure atomic.Bool
	// pressured counts the store's shards under pressure, so that a lookup
	// skips ages altogether while none is (one load, not one a block).
	pressured *atomic.Int32
}

// A shard is under pressure from 3/4 of its capacity, so that lookups have
// marked the blocks they match by the time eviction first counts ages
// down, and until it falls back to 1/2.
const (
	pressureOnNum  = 3
	pressureOnDen  = 4
	pressureOffNum = 1
	pressureOffDen = 2
)

// paddedShard rounds a shard up to 256 bytes: a lookup finds its shard
// with a shift instead of a multiplication, and neighbouring shards' locks
// and sequence counters are on different cache lines.
type paddedShard struct {
	shard
	_ [(256 - unsafe.Sizeof(shard{})%256) % 256]byte
}

func (sh *shard) init(a *arena, shardBits uint, capacity int, pressured *atomic.Int32, pods *podStats) {
	sh.a = a
	sh.pressured = pressured
	sh.pods = pods
	sh.victim = noVictim
	sh.tbl.Store(newTable(minLines, shardBits))
	sh.dir.Store(&setDir{})
	sh.capacity = capacity
}

// lock and unlock bracket every change.
func (sh *shard) lock() {
	sh.mu.Lock()
	sh.seq.Add(1)
}

func (sh *shard) unlock() {
	sh.seq.Add(1)
	sh.mu.Unlock()
}

// get returns the holders of h (the word and, for a block with more than
// four holders, its set) and its record's segment and offset, without
// marking it referenced. It runs without the lock while writers leave the
// shard alone, and takes it when they keep changing it.
func (sh *shard) get(h uint64) (uint64, *holderSet, *segment, int, bool) {
	for range optimisticTries {
		v := sh.seq.Load()
		if v&1 != 0 {
			continue
		}
		w, s, seg, off, ok := sh.read(h)
		if sh.seq.Load() != v || (ok && (empty(w) || w&ovfFlag != 0 && s == nil)) {
			continue
		}
		return w, s, seg, off, ok
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.read(h)
}

// read is get's work, whole only under the lock or an unchanged seq.
func (sh *shard) read(h uint64) (uint64, *holderSet, *segment, int, bool) {
	t := sh.tbl.Load()
	j, r, ok := t.find(sh.a, h)
	if !ok {
		return 0, nil, nil, 0, false
	}
	w := atomic.LoadUint64(&r.w)
	var s *holderSet
	if w&ovfFlag != 0 {
		s = sh.loadSet(w)
	}
	loc := entryLoc(t.at(j))
	seg := sh.a.segOf(loc)
	if seg == nil || &seg.r[loc&segMask] != r {
		return 0, nil, nil, 0, false // a writer moved it: seq tells
	}
	return w, s, seg, int(loc & segMask), true
}

// loadSet returns the set an overflow word points to, or nil when a
// concurrent writer left the word and the directory disagreeing.
func (sh *shard) loadSet(w uint64) *holderSet {
	d := sh.dir.Load()
	i := w & setIdxMask
	if i >= uint64(len(d.sets)) {
		return nil
	}
	return d.sets[i].Load()
}

// newSet stores s in the directory and returns its index.
func (sh *shard) newSet(s *holderSet) uint64 {
	sh.nsets++
	if n := len(sh.freeSets); n > 0 {
		i := sh.freeSets[n-1]
		sh.freeSets = sh.freeSets[:n-1]
		sh.dir.Load().sets[i].Store(s)
		return uint64(i)
	}
	d := sh.dir.Load()
	i := len(d.sets)
	nd := &setDir{sets: make([]atomic.Pointer[holderSet], max(2*i, 16))}
	for j := range d.sets {
		nd.sets[j].Store(d.sets[j].Load())
	}
	for j := len(nd.sets) - 1; j > i; j-- {
		sh.freeSets = append(sh.freeSets, uint32(j))
	}
	nd.sets[i].Store(s)
	sh.dir.Store(nd)
	return uint64(i)
}

func (sh *shard) replaceSet(w uint64, s *holderSet) { sh.dir.Load().sets[w&setIdxMask].Store(s) }

func (sh *shard) freeSet(w uint64) {
	i := uint32(w & setIdxMask)
	sh.nsets--
	sh.dir.Load().sets[i].Store(nil)
	sh.freeSets = append(sh.freeSets, i)
}

// add records that pod ad.id holds h on the tiers in bit; when h is new,
// its record is record off of segment seg, which the caller took for it
// (and counts as filled). It counts in ad the holding gained, the holdings
// evicted to make room, or h skipped because no room could be made, and
// reports whether it used the record.
func (sh *shard) add(h uint64, ad *adder, bit uint64, seg *segment, off int) (used bool) {
	id := ad.id
	t := sh.tbl.Load()
	_, r, ok := t.find(sh.a, h)
	if !ok {
		if sh.holdings >= sh.capacity {
			if !sh.makeRoom(h, ad) {
				ad.skipped++
				return false
			}
			t = sh.tbl.Load() // evictions may have shrunk it
		}
		if uint64(sh.n+1)*maxLoadDen > t.nSlots*maxLoadNum {
			t = sh.resize(t.nLines * growNum / growDen)
		}
		// The record first: the entry makes it reachable.
		nr := &seg.r[off]
		atomic.StoreUint64(&nr.k, h)
		atomic.StoreUint64(&nr.w, ageNew|holder(id, bit))
		e := entry(t.frac(h), seg.loc(off))
		for !t.insert(e) {
			t = sh.resize(t.nLines * growNum / growDen)
		}
		sh.n++
		sh.gained(id, h)
		ad.gained++
		return true
	}
	w := atomic.LoadUint64(&r.w)
	if w&ovfFlag == 0 {
		if shift, m, found := inlineFind(w, id); found {
			if m&bit == 0 {
				atomic.StoreUint64(&r.w, w|bit<<(podBits+shift))
			}
			return false
		}
	} else {
		s := sh.loadSet(w)
		if i, m := s.find(id); i >= 0 {
			if m&bit == 0 {
				sh.replaceSet(w, s.with(i, id, m|bit))
			}
			return false
		}
	}
	// A new holder of a stored key.
	if sh.holdings >= sh.capacity {
		if !sh.makeRoom(h, ad) {
			ad.skipped++
			return false
		}
		w = atomic.LoadUint64(&r.w) // eviction skips h, but its record stays
	}
	if w&ovfFlag != 0 {
		sh.replaceSet(w, sh.loadSet(w).with(-1, id, bit))
	} else if shift, ok := inlineFree(w); ok {
		atomic.StoreUint64(&r.w, w|holder(id, bit)<<shift)
	} else {
		s := &holderSet{h: make([]uint16, 0, inline+1)}
		for shift := uint(0); shift < inline*holderBits; shift += holderBits {
			s.h = append(s.h, uint16(w>>shift&holderMask))
		}
		s.h = append(s.h, uint16(holder(id, bit)))
		atomic.StoreUint64(&r.w, w&ageMask|ovfFlag|sh.newSet(s))
	}
	sh.gained(id, h)
	ad.gained++
	return false
}

// addTier sets the tiers in bit of pod id's holding of h, if the pod
// holds h, and reports whether it does. It never adds a holding.
func (sh *shard) addTier(h uint64, id uint16, bit uint64) bool {
	_, r, ok := sh.tbl.Load().find(sh.a, h)
	if !ok {
		return false
	}
	w := atomic.LoadUint64(&r.w)
	if w&ovfFlag == 0 {
		shift, m, found := inlineFind(w, id)
		if found && m&bit == 0 {
			atomic.StoreUint64(&r.w, w|bit<<(podBits+shift))
		}
		return found
	}
	s := sh.loadSet(w)
	i, m := s.find(id)
	if i >= 0 && m&bit == 0 {
		sh.replaceSet(w, s.with(i, id, m|bit))
	}
	return i >= 0
}

// drop deletes entry j of t, which the caller has emptied of holders, and
// frees its record: counted in rel when it is not nil (see release), at
// once otherwise.
func (sh *shard) drop(t *table, j uint64, rel *release) {
	loc := entryLoc(t.at(j))
	seg := sh.a.segOf(loc) // an entry always names a live segment
	t.delete(j)
	atomic.StoreUint64(&seg.r[loc&segMask].w, 0)
	sh.n--
	if rel == nil {
		sh.a.released(seg, 1)
		return
	}
	rel.add(sh.a, seg)
}

// release counts records freed in a row of the same segment, so that
// their segment's count changes once for the row rather than with a
// locked add a record: blocks removed in the order they were stored have
// consecutive records.
type release struct {
	seg *segment
	n   int
}

func (r *release) add(a *arena, seg *segment) {
	if r.seg != seg {
		r.flush(a)
		r.seg = seg
	}
	r.n++
}

func (r *release) flush(a *arena) {
	if r.n > 0 {
		a.released(r.seg, r.n)
	}
	r.seg, r.n = nil, 0
}

// move moves the live record of h, record off of seg, to the arena's head,
// for compaction. It reports false when the arena has no room.
func (sh *shard) move(h uint64, seg *segment, off int) bool {
	t := sh.tbl.Load()
	j, r, ok := t.find(sh.a, h)
	if !ok || r != &seg.r[off] {
		return true // not live any more
	}
	ns, noff, ok := sh.a.alloc(1, 0)
	if !ok {
		return false
	}
	nr := &ns.r[noff]
	atomic.StoreUint64(&nr.k, h)
	atomic.StoreUint64(&nr.w, atomic.LoadUint64(&r.w))
	sh.a.filled(ns, 1)
	sh.a.finish(ns, noff, 1, 1, 0)
	t.set(j, entry(t.frac(h), ns.loc(noff)))
	atomic.StoreUint64(&r.w, 0)
	sh.a.moved(seg)
	return true
}

// unset clears the tiers in bits of pod id's holding of h and reports
// whether any of them was set, and whether the pod, left holding h on no
// tier, lost the key. compact says whether its ownership list may be
// compacted (not while a caller walks it).
func (sh *shard) unset(h uint64, id uint16, bits uint64, compact bool, rel *release) (removed, lost bool) {
	t := sh.tbl.Load()
	j, r, ok := t.find(sh.a, h)
	if !ok {
		return false, false
	}
	if w := atomic.LoadUint64(&r.w); w&ovfFlag == 0 {
		shift, m, found := inlineFind(w, id)
		if !found || m&bits == 0 {
			return false, false
		}
		if m&^bits != 0 {
			atomic.StoreUint64(&r.w, w&^(bits<<(podBits+shift)))
			return true, false
		}
		if w &^= holderMask << shift; empty(w) {
			sh.drop(t, j, rel)
		} else {
			atomic.StoreUint64(&r.w, w)
		}
	} else {
		s := sh.loadSet(w)
		i, m := s.find(id)
		if i < 0 || m&bits == 0 {
			return false, false
		}
		m &^= bits
		s = s.with(i, id, m)
		if m != 0 || len(s.h) > inline {
			sh.replaceSet(w, s)
		} else {
			// Four holders left: back inline.
			nw := w & ageMask
			for k, hd := range s.h {
				nw |= uint64(hd) << (uint(k) * holderBits)
			}
			atomic.StoreUint64(&r.w, nw)
			sh.freeSet(w)
		}
		if m != 0 {
			return true, false
		}
	}
	if compact {
		sh.disown(t, id, h)
	}
	sh.lost(id, compact)
	sh.maybeShrink()
	return true, true
}

// disown drops h's fraction from the front or the back of pod id's
// ownership list, where removals in the order blocks were stored (or the
// reverse) find it, unless the pod holds another key of that fraction.
// Lists then need compacting only for blocks removed out of order.
func (sh *shard) disown(t *table, id uint16, h uint64) {
	l := sh.list(id)
	n := len(l)
	f := t.frac(h)
	if n == 0 || l[0] != f && l[n-1] != f {
		return
	}
	if _, _, held := sh.firstHeld(t, f, id); held {
		return
	}
	if l[0] == f {
		sh.pop(id)
	} else {
		sh.owned[id] = sh.owned[id][:len(sh.owned[id])-1]
		if n == 1 {
			sh.owned[id], sh.head[id] = sh.owned[id][:0], 0
		}
	}
}

// list returns pod id's ownership list.
func (sh *shard) list(id uint16) []uint32 { return sh.owned[id][sh.head[id]:] }

// pop drops the first entry of pod id's ownership list.
func (sh *shard) pop(id uint16) {
	if sh.head[id]++; int(sh.head[id]) == len(sh.owned[id]) {
		sh.owned[id], sh.head[id] = sh.owned[id][:0], 0
	}
}

// gained and lost keep the per-pod bookkeeping of a holding.
func (sh *shard) gained(id uint16, h uint64) {
	if int(id) >= len(sh.count) {
		sh.count = append(sh.count, make([]int32, int(id)+1-len(sh.count))...)
		sh.head = append(sh.head, make([]int32, int(id)+1-len(sh.head))...)
		sh.owned = append(sh.owned, make([][]uint32, int(id)+1-len(sh.owned))...)
	}
	sh.holdings++
	if sh.holdings*pressureOnDen >= sh.capacity*pressureOnNum && !sh.pressure.Load() {
		sh.pressure.Store(true)
		sh.pressured.Add(1)
	}
	sh.count[id]++
	sh.own(id, sh.tbl.Load().frac(h))
}

// own appends fraction f to pod id's ownership list. A full list moves
// back to the start of its array when an eighth of it or more was taken
// from the front, as eviction does, so that a list that evicts as much as
// it gains allocates nothing; else it grows.
func (sh *shard) own(id uint16, f uint32) {
	l, head := sh.owned[id], int(sh.head[id])
	if len(l) == cap(l) {
		live := l[head:]
		if head > len(live)/8 {
			l = l[:copy(l, live)]
		} else {
			// Grow by an eighth, not append's half or double: these lists
			// are a quarter of the store's memory.
			n := make([]uint32, len(live), len(live)+len(live)/8+8)
			copy(n, live)
			l = n
		}
		sh.head[id] = 0
	}
	sh.owned[id] = append(l, f)
}

func (sh *shard) lost(id uint16, compact bool) {
	sh.holdings--
	if sh.holdings*pressureOffDen < sh.capacity*pressureOffNum && sh.pressure.Load() {
		sh.pressure.Store(false)
		sh.pressured.Add(-1)
	}
	sh.count[id]--
	c := int(sh.count[id])
	if compact && len(sh.list(id)) > c+c/2+ownedSlack {
		sh.compactOwned(id)
	}
}

// compactOwned drops from pod id's ownership list the fractions of keys it
// no longer holds and the duplicates. It runs when at least a third of the
// list is stale, so the removals that made it stale pay for it. The home
// lines are loaded first in a loop whose misses overlap; duplicates are
// found with markBit, set on the first key of a kept fraction and cleared
// after.
func (sh *shard) compactOwned(id uint16) {
	t := sh.tbl.Load()
	l := sh.list(id)
	var sink uint64
	for _, f := range l {
		sink += t.at(t.fracHome(f))
	}
	sh.sink += sink
	out := l[:0]
	for _, f := range l {
		if r, w, ok := sh.firstHeld(t, f, id); ok && w&markBit == 0 {
			atomic.StoreUint64(&r.w, w|markBit)
			out = append(out, f)
		}
	}
	for _, f := range out {
		r, w, _ := sh.firstHeld(t, f, id)
		atomic.StoreUint64(&r.w, w&^markBit)
	}
	switch {
	case len(out) == 0:
		out = nil
	case cap(out) > 2*len(out)+ownedSlack:
		out = slices.Clip(slices.Clone(out))
	}
	sh.owned[id], sh.head[id] = out, 0
}

// firstHeld returns the record and word of the first key with fraction f
// that pod id holds.
func (sh *shard) firstHeld(t *table, f uint32, id uint16) (*rec, uint64, bool) {
	for j := t.fracHome(f); j < t.end(); j++ {
		e := t.at(j)
		if e == 0 || entryFrac(e) > f {
			break
		}
		if entryFrac(e) == f {
			r := sh.a.rec(entryLoc(e))
			if w := atomic.LoadUint64(&r.w); sh.holdsIn(w, id) {
				return r, w, true
			}
		}
	}
	return nil, 0, false
}

// holdsIn reports whether pod id is among the holders in word w.
func (sh *shard) holdsIn(w uint64, id uint16) bool {
	if w&ovfFlag == 0 {
		_, _, found := inlineFind(w, id)
		return found
	}
	i, _ := sh.loadSet(w).find(id)
	return i >= 0
}

// clearPod removes every holding of pod id, walking its ownership list,
// and returns how many there were.
func (sh *shard) clearPod(id uint16) int {
	if int(id) >= len(sh.count) {
		return 0
	}
	n := int(sh.count[id])
	l := sh.list(id)
	sh.owned[id], sh.head[id] = nil, 0
	for _, f := range l {
		for {
			r, _, ok := sh.firstHeld(sh.tbl.Load(), f, id)
			if !ok {
				break
			}
			sh.unset(atomic.LoadUint64(&r.k), id, allTiers, false, nil)
		}
	}
	sh.count[id] = 0
	return n
}

// forget drops the bookkeeping of a pod that holds nothing here.
func (sh *shard) forget(id uint16) {
	if int(id) < len(sh.count) {
		sh.owned[id], sh.head[id] = nil, 0
		sh.count[id] = 0
	}
}

// resize rehashes the table into one of nLines home lines (or more, should
// its keys run past the end) and publishes it. The caller holds the lock
// with seq odd and leaves the table whole, so seq is made even while the
// new table is built: lookups go on reading the old one, which does not
// change, and only retry for the switch.
func (sh *shard) resize(nLines uint64) *table {
	old := sh.tbl.Load()
	sh.seq.Add(1)
	var t *table
	for ok := false; !ok; nLines = nLines * growNum / growDen {
		t = newTable(nLines, old.shardBits)
		ok = true
		from := uint64(0)
		for j := range old.end() {
			if e := old.at(j); e != 0 && !t.rehash(&from, e) {
				ok = false
				break
			}
		}
	}
	sh.seq.Add(1)
	sh.tbl.Store(t)
	return t
}

// maybeShrink shrinks a table that fell below 1/shrinkDen full to one half
// full.
func (sh *shard) maybeShrink() {
	t := sh.tbl.Load()
	if uint64(sh.n)*shrinkDen >= t.nSlots || t.nLines <= minLines {
		return
	}
	sh.resize(max(minLines, uint64(2*sh.n+lineSlots-1)/lineSlots))
}

// bytes estimates the memory the shard holds.
func (sh *shard) bytes() int64 {
	b := int64(len(sh.tbl.Load().s))*8 + int64(len(sh.dir.Load().sets))*8 + int64(cap(sh.freeSets))*4
	b += int64(cap(sh.count))*4 + int64(cap(sh.head))*4 + int64(cap(sh.owned))*24
	for _, l := range sh.owned {
		b += int64(cap(l)) * 4
	}
	if sh.nsets > 0 {
		d := sh.dir.Load()
		for i := range d.sets {
			if s := d.sets[i].Load(); s != nil {
				b += 32 + int64(cap(s.h))*2
			}
		}
	}
	return b
}
