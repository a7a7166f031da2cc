package memory

import (
	"context"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/prefixd/prefixd/store"
)

// A lookup reads its keys in chunks. The records of keys stored by one
// OpAdd are consecutive in the arena, so a lookup first checks the record
// after the last one it matched: a prompt stored in one piece is found
// with one probe of the index and a sequential read of its records. A key
// that is not there costs a probe of the index; when that happens more
// than once in a chunk (a prompt stored in many small pieces), the rest
// of the chunk is probed in passes built to overlap the cache misses:
// touch loads each key's home line of the index, a second pass loads the
// records the lines point to, and a third reads them, now in cache; when
// most of those records did not follow one another, the next chunk starts
// with these passes. The walk then follows the candidate pods through the
// fetched words. Chunks start small, so that a query that stops at its
// first keys does not fetch the rest, and grow to maxChunk.
//
// Measured on the benchmark's shape (512-key prompts stored whole, one
// core): the median lookup went from 17 µs at 1M blocks and 24 µs at 10M,
// with a probe a key into tables that held the words, to under 4 µs at
// both. Prompts stored in interleaved pieces, each after its parent
// (BenchmarkLookupPieces), take about what the probe a key took.
const (
	firstChunk = 8
	maxChunk   = 128 // a power of two: x&(maxChunk-1) spares bounds checks
)

// scratch is one lookup's working memory, pooled so a lookup allocates
// nothing.
type scratch struct {
	// Per key of the chunk: the mixed key and its holders word (0 when
	// absent); its set, for a word with ovfFlag; and its record.
	hs    [maxChunk]uint64
	ws    [maxChunk]uint64
	sets  [maxChunk]*holderSet
	recs  [maxChunk]*rec
	nsets int    // sets stored since the last clear
	sink  uint64 // the sum of touch's loads, so that they stay
	// seg and off are the record of the last key fetched, or seg is nil.
	seg *segment
	off int
	// scattered is set when the last chunk's records were mostly not
	// consecutive: the next is fetched through the index at once.
	scattered bool

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
	clear(sc.recs[:]) // keep no segment alive
	sc.seg, sc.scattered = nil, false
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
			out = append(out, s.match(&c, i))
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
					out = append(out, s.match(c, i))
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

// match is candidate c's answer, a run of i blocks. A pod some of whose
// blocks were evicted may hold more than the store knows.
func (s *Store) match(c *candidate, i int) store.Match {
	return store.Match{
		Pod:        s.names[c.id],
		Blocks:     i,
		TierBlocks: c.tiers,
		Incomplete: s.pods.evicted[c.id].Load() > 0,
		Stale:      s.pods.stale[c.id].Load(),
	}
}

// fetch reads the holders of keys (at most maxChunk) into sc, each from
// the record after the last one fetched when it is there, else through
// the index.
func (s *Store) fetch(sc *scratch, keys []uint64) {
	if sc.scattered {
		// The last chunk was in pieces: so is this one, most likely.
		for x, k := range keys {
			sc.hs[x&(maxChunk-1)] = mix(k)
		}
		s.fetchIndexed(sc, keys, 0)
		return
	}
	probes := 0
	for x, k := range keys {
		x &= maxChunk - 1
		h := mix(k)
		sc.hs[x] = h
		if seg, o := sc.seg, sc.off+1; seg != nil && o < segSize && h != 0 {
			r := &seg.r[o]
			// The common case of fromRecord written out: a call a key
			// costs a quarter of a lookup of a prompt stored whole.
			if atomic.LoadUint64(&r.k) == h {
				if w := atomic.LoadUint64(&r.w); !empty(w) && w&ovfFlag == 0 {
					sc.ws[x], sc.recs[x], sc.off = w, r, o
					continue
				}
			}
			if s.fromRecord(sc, x, r, h) {
				sc.off = o
				continue
			}
		}
		if probes++; probes > 1 {
			// The chunk's keys are in several pieces: probe the rest of
			// them together.
			for i := x + 1; i < len(keys); i++ {
				sc.hs[i&(maxChunk-1)] = mix(keys[i])
			}
			s.fetchIndexed(sc, keys[x:], x)
			return
		}
		s.fetchOne(sc, x, h)
	}
}

// fromRecord reads key x of the chunk, h, from record r when r is h's, and
// reports whether it was. A record holds one key for the life of its
// segment, so a record of h with a live word is h's, as it is now or was a
// moment ago. (Key 0 is left to the index: records never written read as
// key 0.) A word with a set is read under the shard's seqlock, which keeps
// set and word together.
func (s *Store) fromRecord(sc *scratch, x int, r *rec, h uint64) bool {
	if h == 0 || atomic.LoadUint64(&r.k) != h {
		return false
	}
	w := atomic.LoadUint64(&r.w)
	if empty(w) {
		return false
	}
	x &= maxChunk - 1
	if w&ovfFlag == 0 {
		sc.ws[x], sc.recs[x] = w, r
		return true
	}
	sh := s.shard(h)
	v := sh.seq.Load()
	if v&1 != 0 {
		return false
	}
	if w = atomic.LoadUint64(&r.w); empty(w) || w&ovfFlag == 0 {
		return false
	}
	set := sh.loadSet(w)
	if set == nil || sh.seq.Load() != v {
		return false
	}
	sc.ws[x], sc.recs[x], sc.sets[x] = w, r, set
	sc.nsets++
	return true
}

// fetchOne reads key x of the chunk, h, through the index.
func (s *Store) fetchOne(sc *scratch, x int, h uint64) {
	x &= maxChunk - 1
	w, set, seg, off, ok := s.shard(h).get(h)
	if !ok {
		sc.ws[x], sc.recs[x], sc.seg = 0, nil, nil
		return
	}
	sc.ws[x], sc.recs[x], sc.seg, sc.off = w, &seg.r[off], seg, off
	if set != nil {
		sc.sets[x] = set
		sc.nsets++
	}
}

// fetchIndexed reads keys, the chunk's from x0 on, through the index, in
// passes whose cache misses overlap: touch loads the home lines of the
// index; a second pass finds in each line the record the key most likely
// has and loads it; a third takes each record whose key and live word say
// it is the key's (as fetch does for the next record), and asks the index
// again, with the seqlock, for the others.
func (s *Store) fetchIndexed(sc *scratch, keys []uint64, x0 int) {
	sc.sink += s.touch(keys)
	var (
		sink uint64
		locs [maxChunk]uint32 // by i: the location of the record loaded
	)
	for i := range keys {
		x := (x0 + i) & (maxChunk - 1)
		h := sc.hs[x]
		// The record of the entry of h's fraction in its home line,
		// found without branching on where it is: a branch mispredicted
		// about once a key would throw away the loads started for the keys
		// after it. Two entries of one fraction in a line (rare) give a
		// wrong record, which the third pass tells.
		t := s.shard(h).tbl.Load()
		f := uint64(t.frac(h))
		hb := t.fracHome(uint32(f))
		ln := (*[lineSlots]uint64)(t.s[hb : hb+lineSlots])
		var loc uint64
		for i := range ln {
			e := atomic.LoadUint64(&ln[i])
			loc |= e & eqMask(e>>32, f)
		}
		r := s.arena.rec(uint32(loc))
		if r != nil {
			sink += atomic.LoadUint64(&r.k)
		}
		sc.recs[x], locs[i&(maxChunk-1)] = r, uint32(loc)
	}
	sc.sink += sink
	fromLoaded := false // whether the last key was read from its loaded record
	for i := range keys {
		x := (x0 + i) & (maxChunk - 1)
		h := sc.hs[x]
		if r := sc.recs[x]; r != nil && s.fromRecord(sc, x, r, h) {
			fromLoaded = true
			continue
		}
		fromLoaded = false
		s.fetchOne(sc, x, h) // sets sc.seg and sc.off from the key's record
	}
	// The next chunk starts in the same mode unless most of these keys'
	// records followed one another.
	together := 0
	for i := 1; i < len(keys); i++ {
		a, b := sc.recs[(x0+i-1)&(maxChunk-1)], sc.recs[(x0+i)&(maxChunk-1)]
		if a != nil && uintptr(unsafe.Pointer(b)) == uintptr(unsafe.Pointer(a))+unsafe.Sizeof(rec{}) {
			together++
		}
	}
	sc.scattered = 2*together < len(keys)
	// Go on from the last key's record: fetchOne has set it, or it is the
	// one loaded, unless its segment was dropped meanwhile.
	if fromLoaded {
		n := len(keys) - 1
		loc := locs[n&(maxChunk-1)]
		sc.seg, sc.off = s.arena.segOf(loc), int(loc&segMask)
		if sc.seg != nil && &sc.seg.r[sc.off] != sc.recs[(x0+n)&(maxChunk-1)] {
			sc.seg = nil
		}
	}
}

// touch loads the home line of every key in the index, in a loop short
// enough for the CPU to have a dozen or more of these cache misses in
// flight at once. It reads without the seqlock: a line it loads in vain
// costs nothing.
func (s *Store) touch(keys []uint64) uint64 {
	shards, shift, smask := s.shards, s.shift&63, s.shardMask
	var sink uint64
	for _, k := range keys {
		h := mix(k)
		t := shards[h>>shift&smask].tbl.Load()
		sink += atomic.LoadUint64(&t.s[t.home(h)])
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
// is 2 or more or its shard is not under pressure. Should a writer have
// freed or moved the record meanwhile, the age lands on a dead record,
// which costs one eviction decision and nothing else. A block lookups keep
// matching is written at most once every other pass of eviction over its
// holders' keys.
func (s *Store) reference(sc *scratch, x int) {
	x &= maxChunk - 1
	r := sc.recs[x]
	if r == nil || sc.ws[x]&ageHigh != 0 || !s.shard(sc.hs[x]).pressure.Load() {
		return
	}
	atomic.OrUint64(&r.w, ageMask)
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
