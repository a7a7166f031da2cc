package events

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// Test payloads are built with msgpack/v5 from Go values: uint64 encodes as
// 0xcf + 8 bytes and uint32 as 0xce, like the sim; the types below pin
// the other encodings.

// omap is a msgpack map that keeps its key order.
type omap []kv

type kv struct {
	k string
	v any
}

func (m omap) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := enc.EncodeMapLen(len(m)); err != nil {
		return err
	}
	for _, e := range m {
		if err := enc.EncodeString(e.k); err != nil {
			return err
		}
		if err := enc.Encode(e.v); err != nil {
			return err
		}
	}
	return nil
}

// compact is an unsigned integer in its shortest msgpack form.
type compact uint64

func (c compact) EncodeMsgpack(enc *msgpack.Encoder) error { return enc.EncodeUint(uint64(c)) }

// signed is an integer encoded as a signed msgpack int of the given width
// (1, 2, 4 or 8 bytes).
type signed struct {
	v     int64
	width int
}

func (s signed) EncodeMsgpack(enc *msgpack.Encoder) error {
	switch s.width {
	case 1:
		return enc.EncodeInt8(int8(s.v))
	case 2:
		return enc.EncodeInt16(int16(s.v))
	case 4:
		return enc.EncodeInt32(int32(s.v))
	}
	return enc.EncodeInt64(s.v)
}

// width is an unsigned integer of a fixed msgpack width (1, 2, 4 or 8 bytes).
type width struct {
	v uint64
	w int
}

func (u width) EncodeMsgpack(enc *msgpack.Encoder) error {
	switch u.w {
	case 1:
		return enc.EncodeUint8(uint8(u.v))
	case 2:
		return enc.EncodeUint16(uint16(u.v))
	case 4:
		return enc.EncodeUint32(uint32(u.v))
	}
	return enc.EncodeUint64(u.v)
}

// f32 is a float encoded as msgpack float32.
type f32 float32

func (f f32) EncodeMsgpack(enc *msgpack.Encoder) error { return enc.EncodeFloat32(float32(f)) }

// raw is inserted verbatim.
type raw []byte

func (r raw) EncodeMsgpack(enc *msgpack.Encoder) error {
	_, err := enc.Writer().Write(r)
	return err
}

func pack(tb testing.TB, v any) []byte {
	tb.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	if err := enc.Encode(v); err != nil {
		tb.Fatalf("msgpack encode: %v", err)
	}
	return buf.Bytes()
}

func seqFrame(n uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, n)
}

// bin32 is a 32-byte binary hash whose last 8 bytes are v.
func bin32(v uint64) []byte {
	b := make([]byte, 32)
	for i := range 24 {
		b[i] = byte(0xa0 + i)
	}
	binary.BigEndian.PutUint64(b[24:], v)
	return b
}

// storedArray is a BlockStored event in the sim's 9-field array form.
func storedArray(hashes []uint64, parent uint64, tokens []uint32, blockSize int) []any {
	return []any{"BlockStored", hashes, parent, tokens, blockSize, nil, "GPU", nil, nil}
}

// storedMap is a BlockStored event in vLLM's map form.
func storedMap(hashes []uint64, parent any, tokens []uint32, blockSize int) omap {
	return omap{
		{"type", "BlockStored"},
		{"block_hashes", hashes},
		{"parent_block_hash", parent},
		{"token_ids", tokens},
		{"block_size", blockSize},
		{"medium", "GPU"},
	}
}

// benchBlocks returns the hashes and tokens of one benchmark event of
// hashes blocks of 16 tokens, advancing the generator h.
func benchBlocks(h *uint64, hashes int) ([]uint64, []uint32) {
	hs := make([]uint64, hashes)
	for j := range hs {
		*h = *h*6364136223846793005 + 1442695040888963407
		hs[j] = *h
	}
	toks := make([]uint32, hashes*16)
	for j := range toks {
		toks[j] = uint32(*h>>32) + uint32(j)*2654435761
	}
	return hs, toks
}

// benchBatch is a batch of n BlockStored events of hashes blocks of 16
// tokens each, in the array or map encoding.
func benchBatch(tb testing.TB, n, hashes int, asMap bool) []byte {
	tb.Helper()
	evs := make([]any, n)
	h := uint64(0x9e3779b97f4a7c15)
	for i := range evs {
		hs, toks := benchBlocks(&h, hashes)
		if asMap {
			evs[i] = storedMap(hs, h, toks, 16)
		} else {
			evs[i] = storedArray(hs, h, toks, 16)
		}
	}
	if asMap {
		return pack(tb, omap{{"ts", 1795981110.1207962}, {"events", evs}, {"data_parallel_rank", 0}})
	}
	return pack(tb, []any{1795981110.1207962, evs, 0})
}

// hybridBatch is a map batch of n BlockStored events of hashes blocks of 16
// tokens each, as vLLM >= 0.24 sends them for a hybrid model: the events
// alternate between a full-attention group and a sliding-window group,
// and each carries group_idx, kv_cache_spec_kind, the sliding window (nil
// for full attention), locality and ownership.
func hybridBatch(tb testing.TB, n, hashes int) []byte {
	tb.Helper()
	evs := make([]any, n)
	h := uint64(0x9e3779b97f4a7c15)
	for i := range evs {
		hs, toks := benchBlocks(&h, hashes)
		ev := storedMap(hs, h, toks, 16)
		kind, window := "full_attention", any(nil)
		if i%2 == 1 {
			kind, window = "sliding_window", 4096
		}
		evs[i] = append(ev, kv{"group_idx", i % 2}, kv{"kv_cache_spec_kind", kind},
			kv{"kv_cache_spec_sliding_window", window}, kv{"locality", "LOCAL"}, kv{"ownership", "lmcache-cpu"})
	}
	return pack(tb, omap{{"ts", 1795981110.1207962}, {"events", evs}, {"data_parallel_rank", 0}})
}

// diffBatch reports where two batches differ, or "" when they are equal.
// Empty and nil slices are equal.
func diffBatch(a, b *Batch) string {
	switch {
	case !bytes.Equal(a.Topic, b.Topic):
		return "topic"
	case a.Seq != b.Seq:
		return "seq"
	case math.Float64bits(a.TS) != math.Float64bits(b.TS):
		return "ts"
	case a.DPRank != b.DPRank || a.HasDPRank != b.HasDPRank:
		return "dp_rank"
	case a.Skipped != b.Skipped:
		return "skipped"
	case a.UnknownFields != b.UnknownFields:
		return "unknown fields"
	case !equalNames(a.SkippedTypes, b.SkippedTypes):
		return fmt.Sprintf("skipped types %s vs %s", fmtNames(a.SkippedTypes), fmtNames(b.SkippedTypes))
	case !equalNames(a.UnknownFieldNames, b.UnknownFieldNames):
		return fmt.Sprintf("unknown field names %s vs %s", fmtNames(a.UnknownFieldNames), fmtNames(b.UnknownFieldNames))
	case len(a.Events) != len(b.Events):
		return "event count"
	}
	for i := range a.Events {
		x, y := &a.Events[i], &b.Events[i]
		if x.Kind != y.Kind || x.ParentHash != y.ParentHash || x.HasParent != y.HasParent ||
			x.BlockSize != y.BlockSize || x.Medium != y.Medium || x.LoRAID != y.LoRAID ||
			x.HasLoRAID != y.HasLoRAID || x.GroupIdx != y.GroupIdx || x.HasGroupIdx != y.HasGroupIdx ||
			!bytes.Equal(x.LoRAName, y.LoRAName) || !bytes.Equal(x.ExtraKeys, y.ExtraKeys) ||
			!slices.Equal(x.BlockHashes, y.BlockHashes) || !slices.Equal(x.TokenIDs, y.TokenIDs) ||
			x.SpecKind != y.SpecKind || x.SlidingWindow != y.SlidingWindow || x.Locality != y.Locality ||
			!bytes.Equal(x.Ownership, y.Ownership) || !bytes.Equal(x.SessionID, y.SessionID) ||
			!slices.Equal(x.RemainingCopies, y.RemainingCopies) {
			return fmt.Sprintf("event %d: %+v vs %+v", i, *x, *y)
		}
	}
	return ""
}

// equalNames reports whether two name lists are equal; empty and nil are.
func equalNames(a, b []NameCount) bool {
	return slices.EqualFunc(a, b, func(x, y NameCount) bool {
		return x.Count == y.Count && bytes.Equal(x.Name, y.Name)
	})
}

// fmtNames formats a name list as name:count pairs.
func fmtNames(l []NameCount) string {
	var sb strings.Builder
	sb.WriteByte('[')
	for i, n := range l {
		if i > 0 {
			sb.WriteByte(' ')
		}
		fmt.Fprintf(&sb, "%q:%d", n.Name, n.Count)
	}
	sb.WriteByte(']')
	return sb.String()
}

// names builds a name list from name, count pairs.
func names(pairs ...any) []NameCount {
	var l []NameCount
	for i := 0; i < len(pairs); i += 2 {
		l = append(l, NameCount{Name: []byte(pairs[i].(string)), Count: pairs[i+1].(int)})
	}
	return l
}
