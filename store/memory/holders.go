package memory

import (
	"sync/atomic"

	"github.com/prefixd/prefixd/store"
)

// A block's holders are one 64-bit word per table slot:
//
//	bit 63     ovfFlag: bits 0-31 index the shard's overflow sets
//	bits 61-62 age: eviction's second chances, see shard.evictOwn
//	bit 60     markBit: set only while compactOwned runs, under the lock
//	bits 0-59  otherwise up to four inline holders, 15 bits each
//
// A holder is 15 bits: a 3-bit tier mask above a 12-bit pod id. A holder
// with an empty tier mask is absent (all 15 bits are then zero), so a word
// whose bits other than the age are all zero is an empty slot; this is what
// lets key 0 be stored like any other key. Blocks with more than four
// holders keep them in a holderSet, the same 15-bit holders as uint16s.
const (
	ovfFlag  = 1 << 63
	ageShift = 61
	ageMask  = 3 << ageShift
	// ageNew is the age of a block just stored, ageMask (3) that of a
	// block a lookup just matched; ageHigh is set in ages 2 and 3, which a
	// lookup leaves alone, so that it writes to a block at most once every
	// other pass of eviction.
	ageNew     = 1 << ageShift
	ageHigh    = 2 << ageShift
	markBit    = 1 << 60
	setIdxMask = 1<<32 - 1

	podBits    = 12
	podMask    = 1<<podBits - 1
	holderBits = 15
	holderMask = 1<<holderBits - 1
	// inline is how many holders a word holds.
	inline = 4
	// allTiers is a tier mask with every tier.
	allTiers = 1<<store.NumTiers - 1
)

// A holder's tier mask has three bits.
var _ [3 - store.NumTiers]struct{}

// holder packs a pod id and a tier mask.
func holder(id uint16, mask uint64) uint64 { return mask<<podBits | uint64(id) }

func idOf(h uint64) uint16   { return uint16(h & podMask) }
func maskOf(h uint64) uint64 { return h >> podBits & 7 }

// empty reports whether a holders word marks an empty slot. Lookups may set
// the age of a slot a writer has just emptied; those stray bits mean
// nothing.
func empty(w uint64) bool { return w&^ageMask == 0 }

// inlineFind returns the shift and tier mask of pod id in an inline word.
func inlineFind(w uint64, id uint16) (shift uint, mask uint64, ok bool) {
	for shift := uint(0); shift < inline*holderBits; shift += holderBits {
		if hd := w >> shift & holderMask; hd != 0 && idOf(hd) == id {
			return shift, maskOf(hd), true
		}
	}
	return 0, 0, false
}

// inlineFree returns the shift of a free inline holder.
func inlineFree(w uint64) (uint, bool) {
	for shift := uint(0); shift < inline*holderBits; shift += holderBits {
		if w>>shift&holderMask == 0 {
			return shift, true
		}
	}
	return 0, false
}

// holderSet is an immutable set of more than four holders. Writers replace
// a set instead of changing it, so a lookup that loaded one may read it
// without locks.
type holderSet struct {
	h []uint16
}

func (s *holderSet) find(id uint16) (int, uint64) {
	for i, h := range s.h {
		if idOf(uint64(h)) == id {
			return i, maskOf(uint64(h))
		}
	}
	return -1, 0
}

// with returns a copy of s with holder i (or a new holder when i < 0) set
// to id and mask; a zero mask removes holder i.
func (s *holderSet) with(i int, id uint16, mask uint64) *holderSet {
	n := &holderSet{h: make([]uint16, 0, len(s.h)+1)}
	n.h = append(n.h, s.h...)
	switch {
	case i < 0:
		n.h = append(n.h, uint16(holder(id, mask)))
	case mask == 0:
		n.h[i] = n.h[len(n.h)-1]
		n.h = n.h[:len(n.h)-1]
	default:
		n.h[i] = uint16(holder(id, mask))
	}
	return n
}

// setDir is a shard's directory of overflow sets. It is replaced, never
// resized, so a reader holding one may index it while a writer grows it.
type setDir struct {
	sets []atomic.Pointer[holderSet]
}
