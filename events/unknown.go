package events

import (
	"bytes"
	"strconv"
	"unicode/utf8"
)

// Bounds on the names of what a batch held that prefixd does not know
// (Batch.SkippedTypes, Batch.UnknownFieldNames): they are a publisher's to
// choose, and a consumer may turn them into metric labels.
const (
	// MaxUnknownNames is the number of distinct names a Batch keeps in
	// each list; further names are counted in the totals only.
	MaxUnknownNames = 8
	// MaxUnknownNameBytes is the length a kept name is cut to.
	MaxUnknownNameBytes = 64
)

// Names given to unknown things that have no name of their own on the wire.
// Positional elements beyond the known ones are named by their place in
// their array, tag at 0: "BlockStored[15]", "BlockRemoved[7]",
// "AllBlocksCleared[1]", and "batch[3]" for the batch array.
const (
	// NoTypeName names, in Batch.SkippedTypes, map events without a type key.
	NoTypeName = "(no type)"
	// NonStringKeyName names, in Batch.UnknownFieldNames, map keys that are
	// not strings (their values are skipped with them).
	NonStringKeyName = "(non-string key)"
)

var noTypeName, nonStringKeyName = []byte(NoTypeName), []byte(NonStringKeyName)

// NameCount is a name and how often it came in a batch.
type NameCount struct {
	// Name is at most MaxUnknownNameBytes bytes as they came, not checked:
	// check it (CheckLabel, CheckName) before using it as a label.
	Name  []byte
	Count int
}

// unknownField counts an unknown map key.
func (b *Batch) unknownField(key []byte) {
	b.UnknownFields++
	b.UnknownFieldNames = noteName(b.UnknownFieldNames, key)
}

// unknownPositional counts element i of an array, the tag or batch at 0,
// that is beyond the known fields of array kind, as "kind[i]".
func (b *Batch) unknownPositional(kind string, i int) {
	b.UnknownFields++
	var buf [MaxUnknownNameBytes]byte
	name := append(buf[:0], kind...)
	name = append(name, '[')
	name = strconv.AppendInt(name, int64(i), 10)
	name = append(name, ']')
	b.UnknownFieldNames = noteName(b.UnknownFieldNames, name)
}

// noteName counts name, cut to MaxUnknownNameBytes, in list: one more for
// a name already there, a new entry while there are fewer than
// MaxUnknownNames. Entries beyond len are reused, and each entry's Name is
// made with room for the longest name, so that a steady stream of unknown
// names allocates nothing.
func noteName(list []NameCount, name []byte) []NameCount {
	name = cutName(name)
	for i := range list {
		if bytes.Equal(list[i].Name, name) {
			list[i].Count++
			return list
		}
	}
	n := len(list)
	switch {
	case n == MaxUnknownNames:
		return list
	case n < cap(list):
		list = list[:n+1]
	case cap(list) == 0:
		list = make([]NameCount, 1, MaxUnknownNames)
	default:
		list = append(list, NameCount{})
	}
	e := &list[n]
	if cap(e.Name) < MaxUnknownNameBytes {
		e.Name = make([]byte, 0, MaxUnknownNameBytes)
	}
	e.Name = append(e.Name[:0], name...)
	e.Count = 1
	return list
}

// cutName cuts name to MaxUnknownNameBytes, backing off to the start of a
// UTF-8 sequence so that a valid name stays valid.
func cutName(name []byte) []byte {
	if len(name) <= MaxUnknownNameBytes {
		return name
	}
	n := MaxUnknownNameBytes
	for i := n; i > n-utf8.UTFMax && i > 0; i-- {
		if utf8.RuneStart(name[i]) {
			n = i
			break
		}
	}
	return name[:n]
}
