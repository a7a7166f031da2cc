package memory

import (
	"sync"
	"sync/atomic"
)

// The arena holds the store's records: a mixed key and its holders word,
// 16 bytes. The keys of one OpAdd get consecutive records, so the blocks of a
// prompt lie together in the order a lookup walks them; a lookup checks
// the record after the last one it matched before it asks the index, and
// reads a prompt stored in one piece as one run of memory.
//
// Records live in segments of segSize. The segment being filled is the
// head; adds take ranges from it. A record holds one key for the whole life
// of its segment: it is written once, its word then changes as holders come
// and go, and it is dead once its word is 0. A segment left with fewer
// than compactNum/compactDen of its records live is compacted: its live
// records move to the head, in order, and the segment is dropped from the
// directory. A lookup still reading it sees the moved words as 0 and asks
// the index, which points to the new records; the garbage collector frees
// the segment once no lookup holds it.
const (
	segShift   = 12
	segSize    = 1 << segShift
	segMask    = segSize - 1
	maxSegs    = 1 << (32 - segShift) // record locations are 32 bits
	compactNum = 3
	compactDen = 4
)

// rec is one record. Both words are read and written atomically: lookups
// read records while writers change them.
type rec struct {
	k, w uint64
}

type segment struct {
	r    [segSize]rec
	num  uint32       // the segment's number in the directory
	live atomic.Int32 // records in use
	// pending counts the ranges handed out (alloc, claim) and not yet
	// finished; a segment is compacted only without any. claimed marks the
	// records handed out and not given back: the others have never been
	// written. Both are guarded by arena.mu.
	pending int
	claimed [segSize / 64]uint64
	// sealed is set when the segment stops being the head; queued when it
	// is put in the sparse list (and stays set).
	sealed, queued atomic.Bool
}

// loc returns the location of record off of s.
func (s *segment) loc(off int) uint32 { return s.num<<segShift | uint32(off) }

// mark sets or clears the claimed bits of records [from, to).
func (s *segment) mark(from, to int, on bool) {
	for i := from; i < to; i++ {
		if on {
			s.claimed[i/64] |= 1 << (i % 64)
		} else {
			s.claimed[i/64] &^= 1 << (i % 64)
		}
	}
}

// unclaimed reports whether no record in [from, to) is claimed.
func (s *segment) unclaimed(from, to int) bool {
	for i := from; i < to; i++ {
		if s.claimed[i/64]&(1<<(i%64)) != 0 {
			return false
		}
	}
	return true
}

type arena struct {
	dir atomic.Pointer[segDir]

	mu         sync.Mutex
	head       *segment
	next       int      // the head's next free record
	free       []uint32 // unused segment numbers below nums
	nums       uint32   // segment numbers ever used
	maxSegs    uint32   // the most segments: maxSegs, lowered by tests
	sparse     []*segment
	nsparse    atomic.Int32 // len(sparse)
	compacting *segment     // the segment being compacted, if any
	segs       atomic.Int64 // segments in the directory
	live       atomic.Int64 // records in use, in all segments
}

// segDir is the directory of segments, by number; nil for free numbers.
// It is replaced when it grows, so a reader holding one may index it while
// a writer grows it.
type segDir struct {
	s []atomic.Pointer[segment]
}

func (a *arena) init() {
	a.dir.Store(&segDir{})
	a.maxSegs = maxSegs
}

// rec returns the record at loc, or nil when loc names no segment (only
// under a concurrent writer, or for loc 0, which is never a record).
func (a *arena) rec(loc uint32) *rec {
	if s := a.segOf(loc); s != nil {
		return &s.r[loc&segMask]
	}
	return nil
}

// segOf returns the segment of loc, or nil when it names none.
func (a *arena) segOf(loc uint32) *segment {
	d := a.dir.Load()
	if n := loc >> segShift; loc != 0 && int(n) < len(d.s) {
		return d.s[n].Load()
	}
	return nil
}

// alloc returns n consecutive free records, 1 <= n <= segSize: a segment and
// the offset of the first, and leaves the reserve records after them free,
// for claim to continue the chain in. It reports false when every segment
// number is taken. The caller fills what it needs and calls finish.
func (a *arena) alloc(n, reserve int) (*segment, int, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.head == nil || a.next+n > segSize {
		if !a.newHeadLocked() {
			return nil, 0, false
		}
	}
	off := a.next
	a.next = min(off+n+reserve, segSize)
	a.head.mark(off, off+n, true)
	a.head.pending++
	return a.head, off, true
}

// claim hands out the n records after record p of s, when no one has
// them: the records of keys that continue a chain whose last block is
// record p. It extends the head past its next free record if need be.
func (a *arena) claim(s *segment, p, n, reserve int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	from, to := p+1, p+1+n
	if s == a.compacting || to > segSize || a.dir.Load().s[s.num].Load() != s {
		return false
	}
	if s == a.head && to > a.next {
		if !s.unclaimed(from, a.next) {
			return false
		}
		a.next = min(to+reserve, segSize)
	} else if !s.unclaimed(from, to) {
		return false
	}
	s.mark(from, to, true)
	s.pending++
	return true
}

// finish ends the use of n records from off that alloc or claim handed
// out, of which the first used were filled. The others are unclaimed, and
// given back to the head when they are its last.
func (a *arena) finish(s *segment, off, used, n, reserve int) {
	a.mu.Lock()
	s.pending--
	s.mark(off+used, off+n, false)
	if a.head == s && a.next == min(off+n+reserve, segSize) {
		if used == 0 {
			a.next = off
		} else {
			a.next = min(off+used+reserve, segSize)
		}
	}
	a.mu.Unlock()
}

func (a *arena) newHeadLocked() bool {
	if a.head != nil {
		a.head.sealed.Store(true)
		a.maybeQueueLocked(a.head)
		a.head = nil
	}
	d := a.dir.Load()
	var num uint32
	if k := len(a.free); k > 0 {
		num = a.free[k-1]
		a.free = a.free[:k-1]
	} else {
		num = a.nums
		if num >= a.maxSegs {
			return false
		}
		a.nums++
		if int(num) >= len(d.s) {
			nd := &segDir{s: make([]atomic.Pointer[segment], min(max(2*len(d.s), 16), maxSegs))}
			for i := range d.s {
				nd.s[i].Store(d.s[i].Load())
			}
			a.dir.Store(nd)
			d = nd
		}
	}
	s := &segment{num: num}
	d.s[num].Store(s)
	a.segs.Add(1)
	a.head, a.next = s, 0
	if num == 0 {
		a.next = 1 // location 0 is never a record
	}
	return true
}

// filled counts n records of s taken into use, released one taken out of
// use (its caller holds the lock of the record's shard).
func (a *arena) filled(s *segment, n int) {
	s.live.Add(int32(n))
	a.live.Add(int64(n))
}

// moved counts a record of s moved out by compaction.
func (a *arena) moved(s *segment) {
	s.live.Add(-1)
	a.live.Add(-1)
}

func (a *arena) released(s *segment, n int) {
	a.live.Add(-int64(n))
	l := s.live.Add(-int32(n))
	if s.queued.Load() || l >= segSize*compactNum/compactDen || !s.sealed.Load() && l > 0 {
		return
	}
	a.mu.Lock()
	if !s.sealed.Load() && a.head == s && s.live.Load() == 0 {
		// Every record of the head is dead: leave it, for compaction to
		// drop, rather than keep it for the next add.
		s.sealed.Store(true)
		a.head = nil
	}
	if s.sealed.Load() {
		a.maybeQueueLocked(s)
	}
	a.mu.Unlock()
}

func (a *arena) maybeQueueLocked(s *segment) {
	if s.live.Load() < segSize*compactNum/compactDen && !s.queued.Load() {
		s.queued.Store(true)
		a.sparse = append(a.sparse, s)
		a.nsparse.Store(int32(len(a.sparse)))
	}
}

// wasteful reports whether fewer than compactNum/compactDen of the
// segments' records are in use: only then is compacting worth its copies.
func (a *arena) wasteful() bool {
	return a.live.Load()*compactDen < a.segs.Load()*segSize*compactNum
}

// takeSparse returns a segment to compact, or nil when there is none (no
// add still filling it) or a compaction is running. It takes the segment
// queued first: when blocks are evicted or removed oldest first, as engines
// do, it is the emptiest by now, and the cheapest to compact.
func (a *arena) takeSparse() *segment {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.compacting != nil {
		return nil
	}
	for i := range a.sparse {
		if s := a.sparse[i]; s.pending == 0 {
			a.sparse = append(a.sparse[:i], a.sparse[i+1:]...)
			a.nsparse.Store(int32(len(a.sparse)))
			a.compacting = s
			return s
		}
	}
	return nil
}

// dropped ends the compaction of s: when done, s holds no live record and
// its number is freed; otherwise s goes back in the sparse list.
func (a *arena) dropped(s *segment, done bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.compacting = nil
	if !done {
		a.sparse = append(a.sparse, s)
		a.nsparse.Store(int32(len(a.sparse)))
		return
	}
	a.dir.Load().s[s.num].Store(nil)
	a.free = append(a.free, s.num)
	a.segs.Add(-1)
}

// bytes is the memory of the segments.
func (a *arena) bytes() int64 { return a.segs.Load() * segSize * 16 }
