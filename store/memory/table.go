package memory

import "sync/atomic"

// table is one shard's open-addressing hash table, keyed by mixed block
// keys. A slot is 16 bytes, the key and its holders word, so a 64-byte
// cache line holds four. A key's home is a line; its probe sequence starts
// at the line's first slot and runs on without wrapping: the table ends in
// tailSlots spare slots, and a table whose probes would run past them
// grows.
//
// Entries are kept in key order (ordered linear probing, the Robin Hood
// invariant with ties broken by key), so a lookup for an absent key stops
// at the first empty slot or greater key, a deletion shifts the entries
// after it back (no tombstones), and growing the table is one ordered
// pass. Most keys are in their home line: one cache miss a key.
//
// Lookups read slots while a writer may be changing them, so every slot
// word is read and written atomically; the shard's sequence counter tells
// a reader whether what it read is whole.
type table struct {
	s      []slot
	nLines uint64 // home lines
	nSlots uint64 // home slots, lineSlots*nLines; len(s) = nSlots + tailSlots
	// shardBits is how many high bits of a mixed key chose the shard; the
	// 32 bits below them choose the home slot.
	shardBits uint
}

// slot is a key and its holders word. Go allocates a table's slots 64-byte
// aligned: their size is a multiple of 64 of at least 576 bytes, every
// size class from 512 bytes up is a multiple of 64, objects sit at
// multiples of their class from a page boundary, and large objects start
// on pages. So a home line is one cache line (TestTableAlignment).
type slot struct {
	k, w uint64
}

const (
	lineSlots = 4
	tailSlots = 32
	minLines  = 8
	// A table grows by a quarter when more than maxLoadNum/maxLoadDen of
	// its home slots are used, and shrinks when fewer than 1/shrinkDen are.
	// A growing table stays 56% to 70% full (23 to 29 bytes a key), where
	// doubling would leave it 35% full (46 bytes a key) and a fuller table
	// would leave more keys outside their home line.
	maxLoadNum = 7
	maxLoadDen = 10
	growNum    = 5
	growDen    = 4
	shrinkDen  = 8
)

func newTable(nLines uint64, shardBits uint) *table {
	n := lineSlots * nLines
	return &table{s: make([]slot, n+tailSlots), nLines: nLines, nSlots: n, shardBits: shardBits}
}

// end is the number of slots, spare ones included.
func (t *table) end() uint64 { return uint64(len(t.s)) }

// ord is the order of keys in a table: the bits of a mixed key below the
// shard bits, which are the same for every key of the shard.
func (t *table) ord(h uint64) uint64 { return h << (t.shardBits & 63) }

// frac is the top 32 bits of ord(h): what chooses h's home line, whatever
// the table's size. Ownership lists keep keys as fractions.
func (t *table) frac(h uint64) uint32 { return uint32(t.ord(h) >> 32) }

// fracHome returns the first slot of the home line of keys with fraction f.
func (t *table) fracHome(f uint32) uint64 { return lineSlots * (uint64(f) * t.nLines >> 32) }

// home returns the first slot of h's home line. The top 32 bits of ord(h)
// are mapped onto [0, nLines) with a multiplication (Lemire's fast range),
// so a table may have any number of lines, and homes follow key order.
func (t *table) home(h uint64) uint64 { return t.fracHome(t.frac(h)) }

func (t *table) word(j uint64) uint64 { return atomic.LoadUint64(&t.s[j].w) }

func (t *table) key(j uint64) uint64 { return atomic.LoadUint64(&t.s[j].k) }

func (t *table) setWord(j uint64, w uint64) { atomic.StoreUint64(&t.s[j].w, w) }

func (t *table) set(j, h uint64, w uint64) {
	s := &t.s[j]
	atomic.StoreUint64(&s.k, h)
	atomic.StoreUint64(&s.w, w)
}

// find returns the slot and holders word of h. Under a concurrent writer it
// may return anything, but it always returns and never indexes out of
// range.
func (t *table) find(h uint64) (uint64, uint64, bool) {
	hb := t.home(h)
	for j := hb; j < t.end(); j++ {
		w := t.word(j)
		if empty(w) {
			return 0, 0, false
		}
		k := t.key(j)
		if k == h {
			return j, w, true
		}
		if t.ord(k) > t.ord(h) {
			return 0, 0, false // entries are in key order: h is not further on
		}
	}
	return 0, 0, false
}

// insert adds h, which must be absent, with holders word w. It reports
// false, changing nothing, when the probe would run past the last slot;
// the table must then grow.
func (t *table) insert(h uint64, w uint64) bool {
	// h goes at the first empty slot or greater key from its home on; the
	// entries from there to the next empty slot move up by one.
	j := t.home(h)
	for ; j < t.end(); j++ {
		if wj := t.word(j); empty(wj) || t.ord(t.key(j)) > t.ord(h) {
			break
		}
	}
	e := j
	for ; e < t.end() && !empty(t.word(e)); e++ {
	}
	if e >= t.end() {
		return false
	}
	for k := e; k > j; k-- {
		t.set(k, t.key(k-1), t.word(k-1))
	}
	t.set(j, h, w)
	return true
}

// delete empties slot j and shifts back the entries after it that may
// move (those whose home is not past the freed slot).
func (t *table) delete(j uint64) {
	for {
		n := j + 1
		if n >= t.end() {
			break
		}
		wn := t.word(n)
		if empty(wn) {
			break
		}
		k := t.key(n)
		if t.home(k) > j {
			break
		}
		t.set(j, k, wn)
		j = n
	}
	t.setWord(j, 0)
}

// rehash appends h to a table no reader can see yet, with plain stores.
// Keys must come in order, as they do from an older table; from is the
// first free slot. It reports false when h would land past the last slot.
func (t *table) rehash(from *uint64, h uint64, w uint64) bool {
	j := max(t.home(h), *from)
	if j >= t.end() {
		return false
	}
	t.s[j] = slot{h, w}
	*from = j + 1
	return true
}
