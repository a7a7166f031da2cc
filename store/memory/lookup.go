package memory

import (
	"context"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/prefixd/prefixd/store"
)

// A lookup reads its keys in chunks, in three passes. At millions of
// blocks nearly every key is a cache miss (and a TLB miss), so the passes
// are built to overlap the misses: touch loads every key's home line in a
// tight loop; fetch then finds each key in its line and keeps its holders
// word, without branching on where it is; no iteration of either depends
// on another. The walk pass then follows the candidate pods through the
// fetched words. A key pushed out of its full home line is looked up after
// the rest of its chunk, with the others like it, so that these second
// misses overlap too. Chunks start small, so that a query that stops at its
// first keys does not fetch the rest, and grow to maxChunk.
//
// Measured on the benchmark's shape (512-key prompts, one core): touch
// cut the median lookup at 10M blocks by about a third, and deferring the
// keys outside their home line (one in ten, at the tables' 60% load) cut
// it by another tenth. Slower were: a touch that also loaded the next line
// of a full home line (its address waits on the first load), a fetch that
// branched on the matching slot, and one that probed a slot-sized home and
// the next slot (mispredictions, and keys straddling lines).
const (
	firstChunk = 8
	maxChunk   = 128 // a power of two: x&(maxChunk-1) spares bounds checks
)

// scratch is one lookup's working memory, pooled so a lookup allocates
// nothing.
type scratch struct {
	// Per key of the chunk: the mixed key and its holders word (0 when
	// absent); and its set, for a word with ovfFlag.
	hs   [maxChunk]uint64
	ws   [maxChunk]uint64
	sets [maxChunk]*holderSet
	// later lists the keys of the chunk whose home line was full and did
	// not hold them (fetchLater).
	later [maxChunk]uint8
	nsets int    // sets stored since the last clear
	sink  uint64 // the sum of touch's loads, so that they stay

	cand  [MaxPods / 64]uint64
	alive []candidate
	// pos[id] is 1 + the index in alive of pod id, or 0. Entries are reset
	// as pods leave alive, so it is all zero between lookups.
	pos [MaxPods]int32
}

// candidate is a pod that holds every key walked so far.
type candidate struct {
	id    uint16
	seen  int // index of the last key the pod held
	tiers [store.NumTiers]int
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// Lookup walks keys from the first and returns, for each candidate pod, the
// longest run of leading keys it holds. It allocates nothing when out has
// room for the matches.
func (s *Store) Lookup(ctx context.Context, keys []uint64, pods []string, out []store.Match) ([]store.Match, error) {
	out = out[:0]
	if err := ctx.Err(); err != nil {
		return out, fmt.Errorf("memory: %w", err)
	}
	if len(keys) == 0 {
		return out, nil
	}
	sc := scratchPool.Get().(*scratch)
	s.mu.RLock()
	out = s.walk(sc, keys, pods, out)
	s.mu.RUnlock()
	if sc.nsets > 0 {
		clear(sc.sets[:])
		sc.nsets = 0
	}
	scratchPool.Put(sc)
	return out, nil
}

// walk does Lookup's work with mu held for reading.
func (s *Store) walk(sc *scratch, keys []uint64, pods []string, out []store.Match) []store.Match {
	cand := &s.live
	if len(pods) > 0 {
		sc.cand = [MaxPods / 64]uint64{}
		for _, p := range pods {
			if id, ok := s.ids[p]; ok {
				sc.cand[id/64] |= 1 << (id % 64)
			}
		}
		cand = &sc.cand
	}
	alive := sc.alive[:0]
	defer func() { sc.alive = alive[:0] }()
	// stop ends the runs of the pods in alive at i blocks.
	stop := func(i int) []store.Match {
		for _, c := range alive {
			out = append(out, store.Match{Pod: s.names[c.id], Blocks: i, TierBlocks: c.tiers})
			sc.pos[c.id] = 0
		}
		alive = alive[:0]
		return out
	}

	// Ages matter only to eviction: while no shard is near its capacity,
	// matched blocks need not be marked at all.
	ages := s.pressured.Load() > 0
	i := 0 // the key being walked
	for chunk := firstChunk; i < len(keys); chunk = min(2*chunk, maxChunk) {
		n := min(chunk, len(keys)-i)
		sc.sink += s.touch(keys[i : i+n])
		s.fetch(sc, keys[i:i+n])
		x := 0
		if i == 0 {
			// The first key decides the candidates in the race.
			w := sc.ws[0]
			if w&ovfFlag == 0 {
				for shift := uint(0); shift < inline*holderBits; shift += holderBits {
					alive = sc.enter(alive, cand, w>>shift&holderMask)
				}
			} else {
				for _, hd := range sc.sets[0].h {
					alive = sc.enter(alive, cand, uint64(hd))
				}
			}
			if len(alive) == 0 {
				return out
			}
			if ages {
				s.reference(sc, 0)
			}
			x, i = 1, 1
		}
		// Several pods still in the race: the shared start of a prompt.
		for ; x < n && len(alive) > 1; x, i = x+1, i+1 {
			w := sc.ws[x&(maxChunk-1)]
			seen := 0
			if w&ovfFlag == 0 {
				for shift := uint(0); shift < inline*holderBits; shift += holderBits {
					seen += sc.see(alive, w>>shift&holderMask, i)
				}
			} else {
				for _, hd := range sc.sets[x&(maxChunk-1)].h {
					seen += sc.see(alive, uint64(hd), i)
				}
			}
			if seen != len(alive) {
				// Pods that do not hold key i stop at i blocks.
				for j := 0; j < len(alive); {
					c := &alive[j]
					if c.seen == i {
						j++
						continue
					}
					out = append(out, store.Match{Pod: s.names[c.id], Blocks: i, TierBlocks: c.tiers})
					sc.pos[c.id] = 0
					last := len(alive) - 1
					if j != last {
						alive[j] = alive[last]
						sc.pos[alive[j].id] = int32(j + 1)
					}
					alive = alive[:last]
				}
				if len(alive) == 0 {
					return out
				}
			}
			if ages {
				s.reference(sc, x)
			}
		}
		// One pod left, the common case after the first keys of a prompt.
		if len(alive) == 1 && x < n {
			c := &alive[0]
			id := uint64(c.id)
			for ; x < n; x, i = x+1, i+1 {
				w := sc.ws[x&(maxChunk-1)]
				var m uint64
				if w&ovfFlag == 0 {
					for shift := uint(0); shift < inline*holderBits; shift += holderBits {
						if hd := w >> shift & holderMask; hd&podMask == id && hd != 0 {
							m = maskOf(hd)
							break
						}
					}
				} else {
					_, m = sc.sets[x&(maxChunk-1)].find(uint16(id))
				}
				if m == 0 {
					return stop(i)
				}
				c.tiers[bits.TrailingZeros64(m)]++
				if ages && w&ageHigh == 0 {
					s.reference(sc, x)
				}
			}
		}
	}
	return stop(len(keys))
}

// fetch reads the holders of keys (at most maxChunk) into sc: the fast
// path of shard.get, written out in one loop so that its iterations
// overlap.
func (s *Store) fetch(sc *scratch, keys []uint64) {
	shards, shift, smask := s.shards, s.shift&63, s.shardMask
	nlater := 0
	for x, k := range keys {
		x &= maxChunk - 1
		h := mix(k)
		sh := &shards[h>>shift&smask]
		v := sh.seq.Load()
		t := sh.tbl.Load()
		// Most keys are in their home line, one cache line. Look at its
		// four slots without branching on which holds h: such a branch
		// would be mispredicted about once a key, and a misprediction
		// throws away the loads the CPU has started for the keys after it.
		// A deleted slot keeps its stale key, so h may match an empty slot
		// as well as its own; an empty slot's word is 0 but for a stray
		// age, so OR-ing the words of the matching slots gives h's word.
		// h can only be further on if none of the four is empty.
		hb := t.home(h)
		ln := (*[lineSlots]slot)(t.s[hb : hb+lineSlots])
		w0, w1, w2, w3 := atomic.LoadUint64(&ln[0].w), atomic.LoadUint64(&ln[1].w), atomic.LoadUint64(&ln[2].w), atomic.LoadUint64(&ln[3].w)
		w := w0&eqMask(atomic.LoadUint64(&ln[0].k), h) | w1&eqMask(atomic.LoadUint64(&ln[1].k), h) |
			w2&eqMask(atomic.LoadUint64(&ln[2].k), h) | w3&eqMask(atomic.LoadUint64(&ln[3].k), h)
		if empty(w) {
			w = 0
			if !empty(w0) && !empty(w1) && !empty(w2) && !empty(w3) {
				// h may be further on: look for it after the loop, with
				// the others like it, so that their misses overlap.
				sc.ws[x], sc.hs[x] = 0, h
				sc.later[nlater] = uint8(x)
				nlater++
				continue
			}
		}
		var set *holderSet
		if w&ovfFlag != 0 {
			set = sh.loadSet(w)
		}
		if v&1 != 0 || sh.seq.Load() != v || (w&ovfFlag != 0 && set == nil) {
			// A writer was here: read again, with the lock if need be.
			var ok bool
			if w, set, _, ok = sh.get(h); !ok {
				w = 0
			}
		}
		sc.hs[x], sc.ws[x] = h, w
		if set != nil {
			sc.sets[x] = set
			sc.nsets++
		}
	}
	if nlater > 0 {
		s.fetchLater(sc, sc.later[:nlater])
	}
}

// fetchLater finds the keys of the chunk that fetch did not find in their
// full home lines: one tight loop loads the next line of each, so that
// their cache misses overlap, then each is looked up in full.
func (s *Store) fetchLater(sc *scratch, later []uint8) {
	for _, x := range later {
		h := sc.hs[x&(maxChunk-1)]
		t := s.shard(h).tbl.Load()
		sc.sink += atomic.LoadUint64(&t.s[t.home(h)+lineSlots].w)
	}
	for _, x := range later {
		x &= maxChunk - 1
		w, set, _, ok := s.shard(sc.hs[x]).get(sc.hs[x])
		if !ok {
			w = 0
		}
		sc.ws[x] = w
		if set != nil {
			sc.sets[x] = set
			sc.nsets++
		}
	}
}

// touch loads the home line of every key, in a loop short enough for the
// CPU to have a dozen or more of these cache misses in flight at once;
// fetch, which does more work per key, then finds the lines in cache. It
// reads without the seqlock: a line it loads in vain costs nothing.
func (s *Store) touch(keys []uint64) uint64 {
	shards, shift, smask := s.shards, s.shift&63, s.shardMask
	var sink uint64
	for _, k := range keys {
		h := mix(k)
		t := shards[h>>shift&smask].tbl.Load()
		sink += atomic.LoadUint64(&t.s[t.home(h)].w)
	}
	return sink
}

// eqMask returns all ones when a == b and 0 otherwise, without a branch
// (the compiler turns a conditional assignment of a constant into one).
func eqMask(a, b uint64) uint64 {
	x := a ^ b
	return (x|-x)>>63 - 1
}

// reference sets the age of the x'th key of the chunk to its top, unless it
// is 2 or more or its shard is not under pressure. It finds the key again,
// without the lock: should a writer move it meanwhile, the age lands on
// another block or an empty slot, which costs one eviction decision and
// nothing else. A block lookups keep matching is written at most once
// every other sweep of the eviction clock.
func (s *Store) reference(sc *scratch, x int) {
	x &= maxChunk - 1
	if sc.ws[x]&ageHigh != 0 {
		return
	}
	h := sc.hs[x]
	sh := s.shard(h)
	if !sh.pressure.Load() {
		return
	}
	t := sh.tbl.Load()
	if j, _, ok := t.find(h); ok {
		atomic.OrUint64(&t.s[j].w, ageMask)
	}
}

// enter adds the pod of holder hd to alive if it is a candidate.
func (sc *scratch) enter(alive []candidate, cand *[MaxPods / 64]uint64, hd uint64) []candidate {
	m, id := maskOf(hd), idOf(hd)
	if m == 0 || cand[id/64]&(1<<(id%64)) == 0 {
		return alive
	}
	c := candidate{id: id}
	c.tiers[bits.TrailingZeros64(m)] = 1
	alive = append(alive, c)
	sc.pos[id] = int32(len(alive))
	return alive
}

// see counts holder hd at key i for the candidate it belongs to, if any,
// and returns 1 when it did.
func (sc *scratch) see(alive []candidate, hd uint64, i int) int {
	m := maskOf(hd)
	p := sc.pos[idOf(hd)]
	if m == 0 || p == 0 {
		return 0
	}
	c := &alive[p-1]
	c.seen = i
	c.tiers[bits.TrailingZeros64(m)]++
	return 1
}
