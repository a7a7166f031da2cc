package events

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strconv"
)

// ReplayEndSeq is the seq of the message that ends a replay reply; its
// payload is empty.
const ReplayEndSeq = math.MaxUint64

// IsReplayEnd reports whether seq and payload are a replay end marker.
func IsReplayEnd(seq, payload []byte) bool {
	return len(seq) == 8 && binary.BigEndian.Uint64(seq) == ReplayEndSeq && len(payload) == 0
}

// DecodeFrames decodes one ZMQ message into b. It takes the frame shapes
// publishers send:
//
//	[topic, seq, payload]        live (topic may be empty), and replay replies of vLLM <= 0.25
//	["", topic, seq, payload]    replay replies of the sim and vLLM >= 0.26 (DEALER socket)
//	[seq, payload]               replay replies read with a REQ socket from vLLM <= 0.25
//
// A replay end marker returns ErrReplayEnd. See Decode for the rest.
func DecodeFrames(frames [][]byte, b *Batch) error {
	switch len(frames) {
	case 2:
		return Decode(nil, frames[0], frames[1], b)
	case 3:
		return Decode(frames[0], frames[1], frames[2], b)
	case 4:
		if len(frames[0]) != 0 {
			return &DecodeError{Kind: ErrFrames, Field: "frames[0]", Offset: 0,
				Want: "empty delimiter frame before a 4-frame replay reply",
				Got:  strconv.Itoa(len(frames[0])) + " bytes"}
		}
		return Decode(frames[1], frames[2], frames[3], b)
	}
	return &DecodeError{Kind: ErrFrames, Field: "frames", Offset: 0,
		Want: "2, 3 or 4 frames", Got: strconv.Itoa(len(frames)) + " frames"}
}

// Decode decodes one message, its topic frame, its 8-byte big-endian seq
// frame and its msgpack payload, into b, reusing the memory b holds from
// earlier decodes: in the steady state it allocates nothing. The decoded
// batch copies what it keeps (topic, LoRA names, extra keys, ownership,
// session ids, unknown names), so the frames may be reused as soon as
// Decode returns.
//
// The payload is an EventBatch in either encoding, array [ts, events,
// dp_rank?] or map {ts, events, data_parallel_rank}, whose events are each
// either a positional array or a map. Unknown event types are dropped and
// counted in b.Skipped, unknown fields in b.UnknownFields, and both named
// in b.SkippedTypes and b.UnknownFieldNames. Any other
// deviation is an error matching one of the sentinels in errors.go; most are
// a *DecodeError with the byte offset. After an error b holds a partial
// batch that must not be used.
func Decode(topic, seq, payload []byte, b *Batch) error {
	b.reset()
	b.Topic = append(b.Topic[:0], topic...)
	if len(seq) != 8 {
		return &DecodeError{Kind: ErrShortSeq, Field: "seq", Offset: 0,
			Want: "8-byte big-endian seq frame", Got: strconv.Itoa(len(seq)) + " bytes"}
	}
	b.Seq = binary.BigEndian.Uint64(seq)
	if b.Seq == ReplayEndSeq && len(payload) == 0 {
		return ErrReplayEnd
	}
	d := decoder{p: payload, ev: -1}
	if err := d.batch(b); err != nil {
		return err
	}
	if d.off != len(d.p) {
		return d.fail(ErrTrailing, d.off, "", -1, "end of payload",
			strconv.Itoa(len(d.p)-d.off)+" more bytes starting with "+describe(d.p[d.off]))
	}
	return nil
}

func (b *Batch) reset() {
	b.Seq, b.TS, b.DPRank, b.HasDPRank = 0, 0, 0, false
	b.Events = b.Events[:0]
	b.Skipped, b.UnknownFields = 0, 0
	b.SkippedTypes, b.UnknownFieldNames = b.SkippedTypes[:0], b.UnknownFieldNames[:0]
}

// next extends b.Events by one reset event, reusing the slices of an event
// that an earlier decode left beyond len.
func (b *Batch) next() *Event {
	n := len(b.Events)
	if n < cap(b.Events) {
		b.Events = b.Events[:n+1]
	} else {
		b.Events = append(b.Events, Event{})
	}
	e := &b.Events[n]
	e.reset()
	return e
}

func (e *Event) reset() {
	*e = Event{
		BlockHashes:     e.BlockHashes[:0],
		TokenIDs:        e.TokenIDs[:0],
		LoRAName:        e.LoRAName[:0],
		ExtraKeys:       e.ExtraKeys[:0],
		Ownership:       e.Ownership[:0],
		SessionID:       e.SessionID[:0],
		RemainingCopies: e.RemainingCopies[:0],
	}
}

func (d *decoder) batch(b *Batch) error {
	c, err := d.peek("", -1, "batch array or map")
	if err != nil {
		return err
	}
	if isMap(c) {
		return d.batchMap(b)
	}
	start := d.off
	n, err := d.readArrayLen("", -1)
	if err != nil {
		return err
	}
	if n < 2 {
		return d.fail(ErrType, start, "", -1, "batch array of 2 or 3 elements", "array of "+strconv.Itoa(n))
	}
	if b.TS, err = d.readTS(); err != nil {
		return err
	}
	if err := d.events(b); err != nil {
		return err
	}
	if n >= 3 {
		if err := d.dpRank(b); err != nil {
			return err
		}
	}
	for i := 3; i < n; i++ {
		if err := d.skip("batch", i); err != nil {
			return err
		}
		b.unknownPositional("batch", i)
	}
	return nil
}

func (d *decoder) batchMap(b *Batch) error {
	start := d.off
	n, err := d.readMapLen("", -1)
	if err != nil {
		return err
	}
	sawEvents := false
	for range n {
		key, ok, err := d.mapKey(b)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		switch string(key) {
		case "ts":
			b.TS, err = d.readTS()
		case "events":
			sawEvents = true
			err = d.events(b)
		case "data_parallel_rank":
			err = d.dpRank(b)
		default:
			b.unknownField(key)
			err = d.skipUnknown(key)
		}
		if err != nil {
			return err
		}
	}
	if !sawEvents {
		return d.fail(ErrMissing, start, "events", -1, "map batch with an events key", "map without one")
	}
	return nil
}

// skipUnknown skips the value of an unknown map key. The key is named in
// an error, and only then converted to a string.
func (d *decoder) skipUnknown(key []byte) error {
	err := d.skip("", -1)
	if err == nil {
		return nil
	}
	var de *DecodeError
	if errors.As(err, &de) {
		de.Field = d.path(string(key), -1)
	}
	return err
}

// mapKey reads a string map key; the bytes alias the payload. A key of
// another type is skipped with its value and counted as an unknown field,
// and ok is false.
func (d *decoder) mapKey(b *Batch) (key []byte, ok bool, err error) {
	if key, ok := d.fixstr(); ok {
		return key, true, nil
	}
	c, err := d.peek("key", -1, "map key")
	if err != nil {
		return nil, false, err
	}
	if c >= 0xa0 && c <= 0xbf || c >= 0xd9 && c <= 0xdb {
		key, err = d.readBytes("key", -1, false)
		return key, err == nil, err
	}
	if err := d.skip("key", -1); err != nil {
		return nil, false, err
	}
	b.unknownField(nonStringKeyName)
	return nil, false, d.skip("value", -1)
}

func (d *decoder) readTS() (float64, error) {
	if d.nextNil() {
		return 0, nil
	}
	return d.readFloat("ts", -1)
}

func (d *decoder) dpRank(b *Batch) error {
	if d.nextNil() {
		b.DPRank, b.HasDPRank = 0, false
		return nil
	}
	v, err := d.readIntRange("data_parallel_rank", -1, 0, math.MaxInt32)
	if err != nil {
		return err
	}
	b.DPRank, b.HasDPRank = int(v), true
	return nil
}

func (d *decoder) events(b *Batch) error {
	b.Events = b.Events[:0]
	b.Skipped, b.SkippedTypes = 0, b.SkippedTypes[:0]
	if d.nextNil() {
		return nil
	}
	n, err := d.readArrayLen("events", -1)
	if err != nil {
		return err
	}
	for i := range n {
		d.ev = i
		e := b.next()
		tag, err := d.event(e, b)
		if err != nil {
			return err
		}
		if e.Kind == KindUnknown {
			b.Events = b.Events[:len(b.Events)-1]
			b.Skipped++
			b.SkippedTypes = noteName(b.SkippedTypes, tag)
		}
	}
	d.ev = -1
	return nil
}

// field identifies an event field, by position in the array encoding or by
// key in the map encoding.
type field uint8

const (
	fUnknown field = iota
	fBlockHashes
	fParent
	fTokenIDs
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSpecSlidingWindow
	fLocality
	fOwnership
	fSessionID
	fRemainingCopies
)

var fieldNames = [...]string{
	fUnknown:           "unknown",
	fBlockHashes:       "block_hashes",
	fParent:            "parent_block_hash",
	fTokenIDs:          "token_ids",
	fBlockSize:         "block_size",
	fLoRAID:            "lora_id",
	fMedium:            "medium",
	fLoRAName:          "lora_name",
	fExtraKeys:         "extra_keys",
	fGroupIdx:          "group_idx",
	fSpecKind:          "kv_cache_spec_kind",
	fSpecSlidingWindow: "kv_cache_spec_sliding_window",
	fLocality:          "locality",
	fOwnership:         "ownership",
	fSessionID:         "session_id",
	fRemainingCopies:   "remaining_copy_counts",
}

// Positional fields after the tag in the array encoding. Elements beyond
// them are skipped and counted as unknown fields.
var (
	storedFields = [...]field{fBlockHashes, fParent, fTokenIDs, fBlockSize, fLoRAID,
		fMedium, fLoRAName, fExtraKeys, fGroupIdx, fSpecKind, fSpecSlidingWindow,
		fLocality, fOwnership, fSessionID}
	removedFields = [...]field{fBlockHashes, fMedium, fGroupIdx, fLocality, fOwnership, fRemainingCopies}
)

// fieldByName maps a map key to its field. The compiler's string switch
// (a jump on the length, then constant compares) inlines; a dispatch by
// hand on the length and first byte did not, and cost 5% more
// instructions per map event (callgrind, BenchmarkDecode/map).
func fieldByName(key []byte) field {
	switch string(key) {
	case "block_hashes":
		return fBlockHashes
	case "parent_block_hash":
		return fParent
	case "token_ids":
		return fTokenIDs
	case "block_size":
		return fBlockSize
	case "lora_id":
		return fLoRAID
	case "medium":
		return fMedium
	case "lora_name":
		return fLoRAName
	case "extra_keys":
		return fExtraKeys
	case "group_idx":
		return fGroupIdx
	case "kv_cache_spec_kind":
		return fSpecKind
	case "kv_cache_spec_sliding_window":
		return fSpecSlidingWindow
	case "locality":
		return fLocality
	case "ownership":
		return fOwnership
	case "session_id":
		return fSessionID
	case "remaining_copy_counts":
		return fRemainingCopies
	}
	return fUnknown
}

func kindByName(tag []byte) Kind {
	switch string(tag) {
	case "BlockStored":
		return KindBlockStored
	case "BlockRemoved":
		return KindBlockRemoved
	case "AllBlocksCleared":
		return KindAllBlocksCleared
	}
	return KindUnknown
}

// event decodes one event into e. An unknown type leaves e.Kind unknown and
// returns the type's name, aliasing the payload (NoTypeName for a map
// without a type).
func (d *decoder) event(e *Event, b *Batch) (tag []byte, err error) {
	c, err := d.peek("", -1, "event array or map")
	if err != nil {
		return nil, err
	}
	if isMap(c) {
		return d.eventMap(e, b)
	}
	if !isArray(c) {
		return nil, d.wrongType("", -1, "event array or map")
	}
	start := d.off
	n, err := d.readArrayLen("", -1)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, d.fail(ErrType, start, "", -1, "event array starting with its type", "empty array")
	}
	if tag, err = d.readBytes("type", -1, false); err != nil {
		return nil, err
	}
	e.Kind = kindByName(tag)
	var order []field
	switch e.Kind {
	case KindBlockStored:
		order = storedFields[:]
	case KindBlockRemoved:
		order = removedFields[:]
	case KindAllBlocksCleared:
	default:
		for i := 1; i < n; i++ {
			if err := d.skip("", i); err != nil {
				return nil, err
			}
		}
		return tag, nil
	}
	for i := 1; i < n; i++ {
		if i-1 < len(order) {
			if err := d.field(e, order[i-1]); err != nil {
				return nil, err
			}
			continue
		}
		if err := d.skip("", i); err != nil {
			return nil, err
		}
		b.unknownPositional(e.Kind.String(), i)
	}
	return tag, nil
}

func (d *decoder) eventMap(e *Event, b *Batch) (tag []byte, err error) {
	n, err := d.readMapLen("", -1)
	if err != nil {
		return nil, err
	}
	tag = noTypeName
	for range n {
		// Every key prefixd knows is a fixstr, taken inline: mapKey is
		// too large to inline, and called 6 to 12 times per map event.
		key, ok := d.fixstr()
		if !ok {
			if key, ok, err = d.mapKey(b); err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
		}
		if string(key) == "type" {
			if tag, err = d.readBytes("type", -1, false); err != nil {
				return nil, err
			}
			e.Kind = kindByName(tag)
			continue
		}
		f := fieldByName(key)
		if f == fUnknown {
			b.unknownField(key)
			if err := d.skipUnknown(key); err != nil {
				return nil, err
			}
			continue
		}
		if err := d.field(e, f); err != nil {
			return nil, err
		}
	}
	return tag, nil
}

// field decodes the value of field f into e. A nil value leaves the field
// at its zero (GPU medium, no parent, no LoRA, ...).
func (d *decoder) field(e *Event, f field) error {
	name := fieldNames[f]
	if d.nextNil() {
		return nil
	}
	switch f {
	case fBlockHashes:
		n, err := d.readArrayLen(name, -1)
		if err != nil {
			return err
		}
		if cap(e.BlockHashes) < n {
			e.BlockHashes = make([]uint64, n)
		}
		e.BlockHashes = e.BlockHashes[:n]
		for i := range e.BlockHashes {
			if e.BlockHashes[i], err = d.readHash(name, i); err != nil {
				return err
			}
		}
	case fParent:
		h, err := d.readHash(name, -1)
		if err != nil {
			return err
		}
		e.ParentHash, e.HasParent = h, h != 0
	case fTokenIDs:
		n, err := d.readArrayLen(name, -1)
		if err != nil {
			return err
		}
		if cap(e.TokenIDs) < n {
			e.TokenIDs = make([]uint32, n)
		}
		e.TokenIDs = e.TokenIDs[:n]
		return d.readTokens(e.TokenIDs, name)
	case fBlockSize:
		v, err := d.readIntRange(name, -1, 0, math.MaxInt32)
		if err != nil {
			return err
		}
		e.BlockSize = int(v)
	case fLoRAID:
		v, err := d.readInt(name, -1)
		if err != nil {
			return err
		}
		e.LoRAID, e.HasLoRAID = v, true
	case fMedium:
		s, err := d.readBytes(name, -1, false)
		if err != nil {
			return err
		}
		e.Medium = ParseMedium(s)
	case fLoRAName:
		s, err := d.readBytes(name, -1, true)
		if err != nil {
			return err
		}
		e.LoRAName = append(e.LoRAName[:0], s...)
	case fExtraKeys:
		start := d.off
		if err := d.skip(name, -1); err != nil {
			return err
		}
		e.ExtraKeys = append(e.ExtraKeys[:0], d.p[start:d.off]...)
	case fGroupIdx:
		v, err := d.readInt(name, -1)
		if err != nil {
			return err
		}
		e.GroupIdx, e.HasGroupIdx = v, true
	case fSpecKind:
		s, err := d.readBytes(name, -1, false)
		if err != nil {
			return err
		}
		e.SpecKind = ParseSpecKind(s)
	case fSpecSlidingWindow:
		v, err := d.readIntRange(name, -1, 0, math.MaxInt64)
		if err != nil {
			return err
		}
		e.SlidingWindow = v
	case fLocality:
		s, err := d.readBytes(name, -1, false)
		if err != nil {
			return err
		}
		e.Locality = ParseLocality(s)
	case fOwnership:
		s, err := d.readName(name)
		if err != nil {
			return err
		}
		e.Ownership = append(e.Ownership[:0], s...)
	case fSessionID:
		s, err := d.readName(name)
		if err != nil {
			return err
		}
		e.SessionID = append(e.SessionID[:0], s...)
	case fRemainingCopies:
		n, err := d.readArrayLen(name, -1)
		if err != nil {
			return err
		}
		if cap(e.RemainingCopies) < n {
			e.RemainingCopies = make([]uint64, n)
		}
		e.RemainingCopies = e.RemainingCopies[:n]
		for i := range e.RemainingCopies {
			if e.RemainingCopies[i], err = d.readUint(name, i); err != nil {
				return err
			}
		}
	}
	return nil
}

// readName reads a string or binary that an Event keeps as a name
// (ownership, session_id): at most MaxNameBytes bytes, or ErrTooLarge.
// Its bytes, which alias the payload, are not otherwise checked, as
// lora_name's are not: a consumer that shows one checks it (CheckName).
func (d *decoder) readName(field string) ([]byte, error) {
	start := d.off
	s, err := d.readBytes(field, -1, true)
	if err != nil {
		return nil, err
	}
	if len(s) > MaxNameBytes {
		return nil, d.fail(ErrTooLarge, start, field, -1,
			"string of at most "+strconv.Itoa(MaxNameBytes)+" bytes", describe(d.p[start])+" of "+strconv.Itoa(len(s))+" bytes")
	}
	return s, nil
}

// readTokens fills toks with token ids. uint32 (0xce), the form the sim
// writes, takes a fast path; other widths go through readUint.
func (d *decoder) readTokens(toks []uint32, name string) error {
	p, off := d.p, d.off
	for i := range toks {
		if off+5 <= len(p) && p[off] == 0xce {
			toks[i] = binary.BigEndian.Uint32(p[off+1 : off+5])
			off += 5
			continue
		}
		d.off = off
		t, err := d.readUint(name, i)
		if err != nil {
			return err
		}
		if t > math.MaxUint32 {
			return d.fail(ErrRange, off, name, i, "token id below 2^32", strconv.FormatUint(t, 10))
		}
		toks[i] = uint32(t)
		off = d.off
	}
	d.off = off
	return nil
}

// ParseMedium maps a medium name to a Medium, ignoring case; an empty name
// is GPU and a name prefixd does not know is MediumOther.
func ParseMedium(name []byte) Medium {
	// The upper-case names publishers write match here, without EqualFold.
	switch string(name) {
	case "", "GPU":
		return MediumGPU
	case "CPU":
		return MediumCPU
	case "CPU_PINNED":
		return MediumCPUPinned
	case "DISK":
		return MediumDisk
	case "STORAGE":
		return MediumStorage
	case "FS":
		return MediumFS
	case "OBJ":
		return MediumOBJ
	}
	switch {
	case bytes.EqualFold(name, []byte("GPU")):
		return MediumGPU
	case bytes.EqualFold(name, []byte("CPU")):
		return MediumCPU
	case bytes.EqualFold(name, []byte("CPU_PINNED")):
		return MediumCPUPinned
	case bytes.EqualFold(name, []byte("DISK")):
		return MediumDisk
	case bytes.EqualFold(name, []byte("STORAGE")):
		return MediumStorage
	case bytes.EqualFold(name, []byte("FS")):
		return MediumFS
	case bytes.EqualFold(name, []byte("OBJ")):
		return MediumOBJ
	}
	return MediumOther
}

// ParseSpecKind maps a kv_cache_spec_kind name to a SpecKind, ignoring
// case; any other name, the empty one included, is SpecOther.
func ParseSpecKind(name []byte) SpecKind {
	// The lower-case names vLLM writes match here, without a loop.
	switch string(name) {
	case "full_attention":
		return SpecFullAttention
	case "mla_attention":
		return SpecMLAAttention
	case "sink_full_attention":
		return SpecSinkFullAttention
	case "sliding_window":
		return SpecSlidingWindow
	case "sliding_window_mla":
		return SpecSlidingWindowMLA
	case "mamba":
		return SpecMamba
	case "chunked_local_attention":
		return SpecChunkedLocalAttention
	case "encoder_only_attention":
		return SpecEncoderOnlyAttention
	case "cross_attention":
		return SpecCrossAttention
	case "unknown":
		return SpecUnknown
	}
	for k := SpecFullAttention; k < SpecOther; k++ {
		if equalFoldASCII(name, specKindNames[k]) {
			return k
		}
	}
	return SpecOther
}

// ParseLocality maps a locality name, LOCAL or REMOTE, to a Locality,
// ignoring case; any other name, the empty one included, is LocalityOther.
func ParseLocality(name []byte) Locality {
	switch string(name) {
	case "LOCAL":
		return LocalityLocal
	case "REMOTE":
		return LocalityRemote
	}
	switch {
	case bytes.EqualFold(name, []byte("LOCAL")):
		return LocalityLocal
	case bytes.EqualFold(name, []byte("REMOTE")):
		return LocalityRemote
	}
	return LocalityOther
}

// equalFoldASCII reports whether b is s, ignoring the case of ASCII letters.
func equalFoldASCII(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		x, y := b[i], s[i]
		if x == y {
			continue
		}
		if x|0x20 != y|0x20 || x|0x20 < 'a' || x|0x20 > 'z' {
			return false
		}
	}
	return true
}
