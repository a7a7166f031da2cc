package memory

import (
	"math/bits"
	"sync/atomic"
)

// podStats are the per-pod figures, by pod id and across all shards, that
// choose whose holding a full shard gives up. Shards update them under
// their own locks and read the other shards' updates, so they are atomics.
type podStats struct {
	capacity int64        // the store's
	ids      atomic.Int32 // ids handed out so far: the others are all 0
	holding  atomic.Int32 // pods with held above 0
	// held counts each pod's holdings. An OpAdd adds what it gained once a
	// run of keys, and before it evicts (adder).
	held [MaxPods]atomic.Int64
	// cache is the pod's cache size set by SetCacheBlocks (0 for none),
	// learned the most blocks it held just before it removed GPU blocks.
	cache, learned [MaxPods]atomic.Int64
	// over has a bit set for every pod that may be over its limit
	// (excess): set when the pod's count grows past its limit, and for
	// every pod past its share when the share shrinks; cleared by the
	// shards that find it is not. So a shard looks for pods over their
	// limit among a few, not among every pod.
	over [MaxPods / 64]atomic.Uint64
	// top is the pod most over its limit when one last grew past the one
	// top named, or when a shard found one further over: the first a
	// shard looks at.
	top atomic.Uint32
	// evicted counts the pod's holdings evicted to make room, and the keys
	// it added that could not be stored, since it was last cleared or given
	// its id. It has its own array so that the lookups that read it do not
	// share cache lines with the writes to held.
	evicted [MaxPods]atomic.Int64
	// stale is the pod's stale mark (Store.SetStale), which every match
	// reports: one load.
	stale [MaxPods]atomic.Bool
}

// addHeld adds n to pod id's holdings, keeping holding and over up to
// date. Each atomic add sees its own before and after, so concurrent adds
// that cross zero count right.
func (p *podStats) addHeld(id uint16, n int64) {
	if n == 0 {
		return
	}
	v := p.held[id].Add(n)
	switch was := v - n; {
	case was <= 0 && v > 0:
		p.markOver(p.capacity / max(int64(p.holding.Add(1)), 1))
	case was > 0 && v <= 0:
		p.holding.Add(-1)
	}
	if n > 0 {
		p.checkOver(id)
	}
}

// checkOver marks pod id in over if it holds more than its limit, and
// makes it top if it is further over than top.
func (p *podStats) checkOver(id uint16) {
	share := p.capacity / max(int64(p.holding.Load()), 1)
	if ex, _ := p.excess(id, share); ex > 0 {
		p.over[id/64].Or(1 << (id % 64))
		p.raiseTop(id, ex, share)
	}
}

// raiseTop makes pod id, ex over its limit, top if top is less over.
func (p *podStats) raiseTop(id uint16, ex, share int64) {
	for {
		t := p.top.Load()
		if t == uint32(id) {
			return
		}
		if tex, _ := p.excess(uint16(t), share); tex >= ex || p.top.CompareAndSwap(t, uint32(id)) {
			return
		}
	}
}

// markOver marks in over the pods holding more than share.
func (p *podStats) markOver(share int64) {
	for id := range int(p.ids.Load()) {
		if p.held[id].Load() > share {
			p.over[id/64].Or(1 << (id % 64))
		}
	}
}

// learn raises pod id's learned cache size to n.
func (p *podStats) learn(id uint16, n int64) {
	for {
		old := p.learned[id].Load()
		if n <= old || p.learned[id].CompareAndSwap(old, n) {
			return
		}
	}
}

// reset starts the figures of an id given to a pod whose configured cache
// size is cache. It holds nothing yet.
func (p *podStats) reset(id uint16, cache int64) {
	p.cache[id].Store(cache)
	p.stale[id].Store(false)
	p.cleared(id)
	if int32(id) >= p.ids.Load() {
		p.ids.Store(int32(id) + 1)
	}
}

// cleared forgets what pod id's blocks taught: its learned cache size and
// its evictions. Its blocks are gone (OpClear), or it has none yet.
func (p *podStats) cleared(id uint16) {
	p.learned[id].Store(0)
	p.evicted[id].Store(0)
	p.over[id/64].And(^(1 << (id % 64)))
}

// share returns the fair share of the store's capacity when pod id adds a
// block: the capacity split between the pods holding blocks, id counted.
func (p *podStats) share(id uint16) int64 {
	n := int64(p.holding.Load())
	if p.held[id].Load() <= 0 {
		n++
	}
	return p.capacity / max(n, 1)
}

// excess returns how many holdings pod id has beyond its limit (0 or less
// when it is within it), and which limit that is. The limit is the fair
// share, or the pod's cache size plus an eighth when one is known and that
// is lower: a learned size is only a lower bound, and the eighth spares a
// pod whose events run a little ahead of its evictions.
func (p *podStats) excess(id uint16, share int64) (int64, reason) {
	held := p.held[id].Load()
	if c := max(p.cache[id].Load(), p.learned[id].Load()); c > 0 && c+c/8 < share {
		return held - (c + c/8), reasonCacheSize
	}
	return held - share, reasonFairShare
}

// adder is one OpAdd's state, which the shards it adds to share: the pod,
// the holdings it gained and has not yet added to podStats.held, and what
// it evicted and skipped.
type adder struct {
	id      uint16
	gained  int64
	evicted [numReasons]int
	skipped int
	// counted is set once the adder, holding nothing, has marked the pods
	// over the share that counts it (makeRoom).
	counted bool
}

// noVictim is shard.victim when there is none: not a pod id.
const noVictim = MaxPods

// makeRoom evicts holdings, of keys other than skip, until one more fits,
// for the pod adding, ad. The holding given up is the least recently used
// one (evictOwn) of, in this order:
//
//   - the adder, when it holds more than its cache size or its fair share
//     (excess);
//   - else the pod most over its limit of those holding blocks here;
//   - else, nobody being over, the adder.
//
// So a pod within its limits loses holdings only to its own adds. It
// reports false when no room could be made: the adder holds nothing here
// to give up and nobody else is over.
func (sh *shard) makeRoom(skip uint64, ad *adder) bool {
	p := sh.pods
	for sh.holdings >= sh.capacity {
		if ad.gained != 0 {
			// The adder's figure is exact when it decides.
			p.addHeld(ad.id, ad.gained)
			ad.gained = 0
		}
		share := p.share(ad.id)
		if !ad.counted && p.held[ad.id].Load() <= 0 {
			// A pod's first block shrinks everyone's share.
			ad.counted = true
			p.markOver(share)
		}
		ex, why := p.excess(ad.id, share)
		if ex > 0 && sh.evictOwn(ad.id, skip) {
			ad.evicted[why]++
			continue
		}
		if v, why, ok := sh.overPod(ad.id, share); ok {
			if sh.evictOwn(v, skip) {
				ad.evicted[why]++
				continue
			}
			sh.victim = noVictim
		}
		if ex <= 0 && sh.evictOwn(ad.id, skip) {
			ad.evicted[reasonOwn]++
			continue
		}
		return false
	}
	return true
}

// overPod returns a pod other than adder over its limit (excess) among
// those holding blocks in the shard, and which limit: the one most over,
// or nearly. It keeps its answer in victim, which it checks first, so
// that a pod far over its limit costs one look, not one an eviction. Then
// it tries podStats.top, the pod most over in the store. Failing both, it
// looks at the pods marked in podStats.over, clearing the marks of those
// no longer over, and takes the most over of the first overLook with
// blocks here, from a word of over that moves on with each look: when
// many pods hover about their share (many pods with a block or two each
// here) most are over by a block or two, and looking at all of them for
// every eviction would cost more than the eviction.
func (sh *shard) overPod(adder uint16, share int64) (uint16, reason, bool) {
	p := sh.pods
	here := func(id uint16) bool { return id != adder && int(id) < len(sh.count) && sh.count[id] > 0 }
	if v := sh.victim; v != noVictim && here(v) {
		if ex, why := p.excess(v, share); ex > 0 {
			return v, why, true
		}
	}
	if t := uint16(p.top.Load()); here(t) {
		if ex, why := p.excess(t, share); ex > 0 {
			sh.victim = t
			return t, why, true
		}
	}
	var (
		best    uint16 = noVictim
		bestEx  int64
		bestWhy reason
		found   int
	)
	words := (int(p.ids.Load()) + 63) / 64
	for k := 0; k < words && found < overLook; k++ {
		i := (sh.overFrom + k) % words
		for m := p.over[i].Load(); m != 0 && found < overLook; m &= m - 1 {
			id := uint16(i*64 + bits.TrailingZeros64(m))
			if !here(id) {
				continue
			}
			ex, why := p.excess(id, share)
			if ex <= 0 {
				// Not over at this share, so at none: the share counts
				// the adder whether it holds blocks yet or not.
				p.over[i].And(^(1 << (id % 64)))
				continue
			}
			if found++; ex > bestEx {
				best, bestEx, bestWhy = id, ex, why
			}
		}
	}
	if words > 0 {
		sh.overFrom = (sh.overFrom + 1) % words
	}
	sh.victim = best
	if best == noVictim {
		return 0, 0, false
	}
	p.raiseTop(best, bestEx, share)
	return best, bestWhy, true
}

// overLook is how many pods over their limit overPod compares when the
// pod it last chose and the store's top are not.
const overLook = 8

// evictOwn evicts pod id's least recently used holding in the shard, of a
// key other than skip, and reports whether it found one. It takes the
// pod's keys in the order the pod gained them, from the front of its
// ownership list, with a second chance for blocks lookups matched: a key
// whose block has an age above 0 has its age counted down and goes to the
// back of the list; the first at age 0 is evicted. Blocks are stored at
// age 1 and set to 3 when a lookup matches them below 2 (while the shard
// is under pressure), so a block stored and never matched goes on the
// second pass over the list, and a block lookups keep matching stays: it
// needs three passes without them. Blocks near the root of popular
// prompts are matched by every lookup that reaches them and stay; the
// tails of prompts nobody asks for again go first. The pod loses the key
// on every tier; the block goes when it has no holder left.
//
// Ages count down within four passes, which bound the walk; stale entries
// met on the way are dropped from the list.
func (sh *shard) evictOwn(id uint16, skip uint64) bool {
	if int(id) >= len(sh.count) || sh.count[id] == 0 {
		return false
	}
	t := sh.tbl.Load()
	l := sh.list(id)
	// The home lines of the first keys in line, loaded together: their
	// cache misses overlap, where the walk would take them one by one.
	var sink uint64
	for _, f := range l[:min(len(l), evictAhead)] {
		sink += t.at(t.fracHome(f))
	}
	sh.sink += sink
	for n := (ageMask>>ageShift+1)*len(l) + 1; n > 0; n-- {
		l := sh.list(id)
		if len(l) == 0 {
			return false
		}
		f := l[0]
		sh.pop(id)
		r, w, ok, skipHeld := sh.heldOther(t, f, id, skip)
		switch {
		case !ok:
			if skipHeld {
				sh.own(id, f) // still skip's entry
			}
		case w&ageMask != 0:
			atomic.StoreUint64(&r.w, w-1<<ageShift)
			sh.own(id, f)
		default:
			sh.unset(atomic.LoadUint64(&r.k), id, allTiers, true, nil)
			sh.pods.addHeld(id, -1)
			sh.pods.evicted[id].Add(1)
			return true
		}
	}
	return false
}

// evictAhead is how many keys' home lines evictOwn loads before it walks:
// it takes two keys an eviction on average, one whose age it counts down
// and one it evicts, and the next eviction the next two.
const evictAhead = 4

// heldOther returns the record and word of the first key with fraction f,
// other than skip, that pod id holds, and whether it holds skip (when skip
// has fraction f).
func (sh *shard) heldOther(t *table, f uint32, id uint16, skip uint64) (r *rec, w uint64, ok, skipHeld bool) {
	for j := t.fracHome(f); j < t.end(); j++ {
		e := t.at(j)
		if e == 0 || entryFrac(e) > f {
			break
		}
		if entryFrac(e) != f {
			continue
		}
		r := sh.a.rec(entryLoc(e))
		w := atomic.LoadUint64(&r.w)
		if !sh.holdsIn(w, id) {
			continue
		}
		if atomic.LoadUint64(&r.k) == skip {
			skipHeld = true
			continue
		}
		return r, w, true, skipHeld
	}
	return nil, 0, false, skipHeld
}
