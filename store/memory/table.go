package memory

import "sync/atomic"

// table is one shard's index: an open-addressing hash table from mixed
// keys to their records in the arena. An entry is 8 bytes, the key's
// fraction (below) and its record's location, so a 64-byte cache line
// holds eight; 0 is an empty entry. The full key is in the record, which
// find reads to tell apart keys of the same fraction. A key's home is a
// line; its probe sequence starts at the line's first entry and runs on
// without wrapping: the table ends in tailSlots spare entries, and a table
// whose probes would run past them grows.
//
// Entries are kept in fraction order (ordered linear probing, the Robin
// Hood invariant), so a lookup for an absent key stops at the first empty
// entry or greater fraction, a deletion shifts the entries after it back
// (no tombstones), and growing the table is one ordered pass. Most keys
// are in their home line.
//
// Lookups read entries while a writer may be changing them, so every entry
// is read and written atomically; the shard's sequence counter tells a
// reader whether what it read is whole.
type table struct {
	s      []uint64
	nLines uint64 // home lines
	nSlots uint64 // home entries, lineSlots*nLines; len(s) = nSlots + tailSlots
	// shardBits is how many high bits of a mixed key chose the shard; the
	// 32 bits below them are the key's fraction.
	shardBits uint
}

const (
	lineSlots = 8
	tailSlots = 32
	minLines  = 8
	// A table grows by a quarter when more than maxLoadNum/maxLoadDen of
	// its home entries are used, and shrinks when fewer than 1/shrinkDen
	// are. A growing table stays 56% to 70% full (11 to 14 bytes a key).
	maxLoadNum = 7
	maxLoadDen = 10
	growNum    = 5
	growDen    = 4
	shrinkDen  = 8
)

// Go allocates a table's entries 64-byte aligned: their size is a multiple
// of 64 of at least 768 bytes, every size class from 512 bytes up is a
// multiple of 64, objects sit at multiples of their class from a page
// boundary, and large objects start on pages. So a home line is one cache
// line (TestTableAlignment).
func newTable(nLines uint64, shardBits uint) *table {
	n := lineSlots * nLines
	return &table{s: make([]uint64, n+tailSlots), nLines: nLines, nSlots: n, shardBits: shardBits}
}

func entry(f uint32, loc uint32) uint64 { return uint64(f)<<32 | uint64(loc) }
func entryFrac(e uint64) uint32         { return uint32(e >> 32) }
func entryLoc(e uint64) uint32          { return uint32(e) }

// end is the number of entries, spare ones included.
func (t *table) end() uint64 { return uint64(len(t.s)) }

// frac is the top 32 bits of a mixed key below the shard bits: what orders
// the table and chooses h's home line, whatever the table's size.
// Ownership lists keep keys as fractions.
func (t *table) frac(h uint64) uint32 { return uint32(h << (t.shardBits & 63) >> 32) }

// fracHome returns the first entry of the home line of keys with fraction
// f. The fraction is mapped onto [0, nLines) with a multiplication
// (Lemire's fast range), so a table may have any number of lines, and
// homes follow fraction order.
func (t *table) fracHome(f uint32) uint64 { return lineSlots * (uint64(f) * t.nLines >> 32) }

// home returns the first entry of h's home line.
func (t *table) home(h uint64) uint64 { return t.fracHome(t.frac(h)) }

func (t *table) at(j uint64) uint64 { return atomic.LoadUint64(&t.s[j]) }

func (t *table) set(j uint64, e uint64) { atomic.StoreUint64(&t.s[j], e) }

// find returns the entry index and record of h. Under a concurrent writer
// it may return anything, but it always returns and never indexes out of
// range.
func (t *table) find(a *arena, h uint64) (uint64, *rec, bool) {
	f := t.frac(h)
	for j := t.fracHome(f); j < t.end(); j++ {
		e := t.at(j)
		if e == 0 || entryFrac(e) > f {
			return 0, nil, false // entries are in order: h is not further on
		}
		if entryFrac(e) == f {
			if r := a.rec(entryLoc(e)); r != nil && atomic.LoadUint64(&r.k) == h {
				return j, r, true
			}
		}
	}
	return 0, nil, false
}

// insert adds entry e (of a key absent from t). It reports false, changing
// nothing, when the probe would run past the last entry; the table must
// then grow.
func (t *table) insert(e uint64) bool {
	// e goes at the first empty entry or greater fraction from its home
	// on; the entries from there to the next empty one move up by one.
	f := entryFrac(e)
	j := t.fracHome(f)
	for ; j < t.end(); j++ {
		if ej := t.at(j); ej == 0 || entryFrac(ej) > f {
			break
		}
	}
	k := j
	for ; k < t.end() && t.at(k) != 0; k++ {
	}
	if k >= t.end() {
		return false
	}
	for ; k > j; k-- {
		t.set(k, t.at(k-1))
	}
	t.set(j, e)
	return true
}

// delete empties entry j and shifts back the entries after it that may
// move (those whose home is not past the freed entry).
func (t *table) delete(j uint64) {
	for {
		n := j + 1
		if n >= t.end() {
			break
		}
		en := t.at(n)
		if en == 0 || t.fracHome(entryFrac(en)) > j {
			break
		}
		t.set(j, en)
		j = n
	}
	t.set(j, 0)
}

// rehash appends entry e to a table no reader can see yet, with plain
// stores. Entries must come in order, as they do from an older table; from
// is the first free entry. It reports false when e would land past the
// last entry.
func (t *table) rehash(from *uint64, e uint64) bool {
	j := max(t.fracHome(entryFrac(e)), *from)
	if j >= t.end() {
		return false
	}
	t.s[j] = e
	*from = j + 1
	return true
}
