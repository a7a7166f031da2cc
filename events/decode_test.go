package events

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
)

var testTopic = []byte("kv@127.0.0.1:8001@sim-model")

const (
	h1 = uint64(0xfedcba9876543210) // >= 2^63, as engine hashes often are
	h2 = uint64(0x0123456789abcdef)
	h3 = uint64(42)
)

func tokens(n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(i) * 2654435761
	}
	return t
}

func TestDecodeEncodings(t *testing.T) {
	toks := tokens(32)
	stored := func(hashes []uint64, parent uint64, hasParent bool) Event {
		return Event{Kind: KindBlockStored, BlockHashes: hashes, ParentHash: parent, HasParent: hasParent,
			TokenIDs: toks, BlockSize: 16}
	}
	extra := pack(t, []any{"lora-a", []any{"salt", compact(7)}})
	tests := []struct {
		name    string
		payload any
		want    Batch
	}{
		{
			name:    "sim array batch, 9-field BlockStored, parent 0",
			payload: []any{1.5, []any{storedArray([]uint64{h1, h2}, 0, toks, 16)}, 0},
			want:    Batch{TS: 1.5, HasDPRank: true, Events: []Event{stored([]uint64{h1, h2}, 0, false)}},
		},
		{
			name: "vLLM array batch without dp_rank, trailing fields omitted",
			payload: []any{2.0, []any{
				[]any{"BlockStored", []uint64{h1}, h2, toks, 16},
				[]any{"BlockRemoved", []uint64{h2, h3}},
				[]any{"AllBlocksCleared"},
			}},
			want: Batch{TS: 2, Events: []Event{
				stored([]uint64{h1}, h2, true),
				{Kind: KindBlockRemoved, BlockHashes: []uint64{h2, h3}},
				{Kind: KindAllBlocksCleared},
			}},
		},
		{
			name:    "array batch with nil dp_rank",
			payload: []any{3.0, []any{}, nil},
			want:    Batch{TS: 3},
		},
		{
			name:    "array batch with a fourth field",
			payload: []any{3.0, []any{}, 1, "later"},
			want:    Batch{TS: 3, DPRank: 1, HasDPRank: true, UnknownFields: 1, UnknownFieldNames: names("batch[3]", 1)},
		},
		{
			name: "map batch of map events",
			payload: omap{{"ts", 4.25}, {"events", []any{
				storedMap([]uint64{h1, h2}, nil, toks, 16),
				omap{{"type", "BlockRemoved"}, {"block_hashes", []uint64{h1}}, {"medium", "CPU"}},
				omap{{"type", "AllBlocksCleared"}},
			}}, {"data_parallel_rank", 1}},
			want: Batch{TS: 4.25, DPRank: 1, HasDPRank: true, Events: []Event{
				stored([]uint64{h1, h2}, 0, false),
				{Kind: KindBlockRemoved, BlockHashes: []uint64{h1}, Medium: MediumCPU},
				{Kind: KindAllBlocksCleared},
			}},
		},
		{
			name: "map batch without dp rank, keys in another order, unknown key",
			payload: omap{{"events", []any{[]any{"AllBlocksCleared"}}}, {"ts", compact(5)},
				{"producer", omap{{"x", []any{1, 2}}}}},
			want: Batch{TS: 5, UnknownFields: 1, UnknownFieldNames: names("producer", 1), Events: []Event{{Kind: KindAllBlocksCleared}}},
		},
		{
			name: "array and map events mixed in one batch",
			payload: []any{1.0, []any{
				storedArray([]uint64{h1}, 0, toks, 16),
				storedMap([]uint64{h2}, h1, toks, 16),
				[]any{"BlockRemoved", []uint64{h3}, "DISK", 2},
			}, 0},
			want: Batch{TS: 1, HasDPRank: true, Events: []Event{
				stored([]uint64{h1}, 0, false),
				stored([]uint64{h2}, h1, true),
				{Kind: KindBlockRemoved, BlockHashes: []uint64{h3}, Medium: MediumDisk, GroupIdx: 2, HasGroupIdx: true},
			}},
		},
		{
			name: "unknown event types are skipped and counted",
			payload: []any{1.0, []any{
				[]any{"BlockMoved", []uint64{h1}, omap{{"a", 1}}},
				[]any{"AllBlocksCleared"},
				omap{{"type", "Checkpoint"}, {"block_hashes", []uint64{h2}}},
				omap{{"block_hashes", []uint64{h2}}},
			}},
			want: Batch{TS: 1, Skipped: 3, SkippedTypes: names("BlockMoved", 1, "Checkpoint", 1, NoTypeName, 1),
				Events: []Event{{Kind: KindAllBlocksCleared}}},
		},
		{
			name: "unknown fields: newer map keys, extra positional fields, non-string key",
			payload: []any{1.0, []any{
				omap{{"event_version", 2}, {"type", "BlockRemoved"}, {"block_hashes", []uint64{h1}},
					{"tier_hint", "warm"}, {"event_version", 3}},
				[]any{"BlockRemoved", []uint64{h2}, nil, nil, nil, nil, nil, "later", true},
				[]any{"BlockRemoved", []uint64{h2}, nil, nil, nil, nil, nil, "later"},
				[]any{"AllBlocksCleared", 1},
				raw{0x82, 0xa4, 't', 'y', 'p', 'e', 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd', 0x07, 0x08},
			}},
			want: Batch{TS: 1, UnknownFields: 3 + 2 + 1 + 1 + 1, UnknownFieldNames: names(
				"event_version", 2, "tier_hint", 1, "BlockRemoved[7]", 2, "BlockRemoved[8]", 1,
				"AllBlocksCleared[1]", 1, NonStringKeyName, 1),
				Events: []Event{
					{Kind: KindBlockRemoved, BlockHashes: []uint64{h1}},
					{Kind: KindBlockRemoved, BlockHashes: []uint64{h2}},
					{Kind: KindBlockRemoved, BlockHashes: []uint64{h2}},
					{Kind: KindAllBlocksCleared},
					{Kind: KindAllBlocksCleared},
				}},
		},
		{
			name: "map event with type last",
			payload: []any{1.0, []any{
				omap{{"block_hashes", []uint64{h1}}, {"medium", nil}, {"type", "BlockRemoved"}},
			}},
			want: Batch{TS: 1, Events: []Event{{Kind: KindBlockRemoved, BlockHashes: []uint64{h1}}}},
		},
		{
			name: "hashes of every integer width and binaries",
			payload: []any{1.0, []any{[]any{"BlockRemoved", []any{
				compact(5), width{200, 1}, width{60000, 2}, width{4000000000, 4}, width{h1, 8},
				signed{5, 1}, signed{300, 2}, signed{70000, 4}, signed{math.MaxInt64, 8},
				bin32(h1), bytes.Repeat([]byte{9}, 8), append(bytes.Repeat([]byte{1}, 8), bin32(h2)[24:]...),
			}}}},
			want: Batch{TS: 1, Events: []Event{{Kind: KindBlockRemoved, BlockHashes: []uint64{
				5, 200, 60000, 4000000000, h1, 5, 300, 70000, math.MaxInt64,
				h1, 0x0909090909090909, h2,
			}}}},
		},
		{
			name: "binary parent, compact tokens, every optional field set",
			payload: []any{1.0, []any{
				[]any{"BlockStored", []any{bin32(h1)}, bin32(h2), []any{compact(1), compact(300), width{7, 4}, signed{9, 2}},
					compact(4), 3, "cpu_pinned", "lora-a", raw(extra), 1, "full_attention", nil, "REMOTE", "lmcache", []byte("s-1"), "future"},
				omap{{"type", "BlockStored"}, {"block_hashes", []uint64{h3}}, {"parent_block_hash", compact(0)},
					{"token_ids", nil}, {"block_size", 0}, {"lora_id", signed{-1, 1}}, {"lora_name", []byte("bin-name")},
					{"medium", "NVME"}, {"extra_keys", nil}, {"group_idx", 0}, {"kv_cache_spec_kind", "sliding_window"},
					{"kv_cache_spec_sliding_window", 128}},
			}},
			want: Batch{TS: 1, UnknownFields: 1, UnknownFieldNames: names("BlockStored[15]", 1), Events: []Event{
				{Kind: KindBlockStored, BlockHashes: []uint64{h1}, ParentHash: h2, HasParent: true,
					TokenIDs: []uint32{1, 300, 7, 9}, BlockSize: 4, LoRAID: 3, HasLoRAID: true,
					Medium: MediumCPUPinned, LoRAName: []byte("lora-a"), ExtraKeys: extra, GroupIdx: 1, HasGroupIdx: true,
					SpecKind: SpecFullAttention, Locality: LocalityRemote, Ownership: []byte("lmcache"), SessionID: []byte("s-1")},
				{Kind: KindBlockStored, BlockHashes: []uint64{h3}, LoRAID: -1, HasLoRAID: true,
					LoRAName: []byte("bin-name"), Medium: MediumOther, HasGroupIdx: true,
					SpecKind: SpecSlidingWindow, SlidingWindow: 128},
			}},
		},
		{
			name:    "float32 timestamp",
			payload: []any{f32(0.5), nil, 0},
			want:    Batch{TS: 0.5, HasDPRank: true},
		},
		{
			name:    "integer timestamps",
			payload: omap{{"ts", width{1795981110, 4}}, {"events", []any{}}},
			want:    Batch{TS: 1795981110},
		},
		{
			name:    "negative integer timestamp, nil events",
			payload: omap{{"ts", signed{-3, 8}}, {"events", nil}},
			want:    Batch{TS: -3},
		},
		{
			name:    "nil timestamp",
			payload: []any{nil, []any{}},
			want:    Batch{},
		},
		{
			name:    "array32 and map16 headers",
			payload: raw{0xdd, 0, 0, 0, 2, 0x01, 0xdc, 0, 1, 0xde, 0, 1, 0xa4, 't', 'y', 'p', 'e', 0xd9, 16, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd'},
			want:    Batch{TS: 1, Events: []Event{{Kind: KindAllBlocksCleared}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			payload := pack(t, tt.payload)
			var b Batch
			if err := Decode(testTopic, seqFrame(7), payload, &b); err != nil {
				t.Fatalf("Decode: %v", err)
			}
			tt.want.Topic, tt.want.Seq = testTopic, 7
			if d := diffBatch(&b, &tt.want); d != "" {
				t.Fatalf("decoded batch differs in %s:\ngot  %+v\nwant %+v", d, b, tt.want)
			}
			// Decoding again into the used batch gives the same batch.
			if err := Decode(testTopic, seqFrame(7), payload, &b); err != nil {
				t.Fatalf("second Decode: %v", err)
			}
			if d := diffBatch(&b, &tt.want); d != "" {
				t.Fatalf("second decode differs in %s", d)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	good := pack(t, []any{1.0, []any{storedArray([]uint64{h1}, 0, tokens(16), 16)}, 0})
	tests := []struct {
		name    string
		seq     []byte
		payload any // []byte verbatim, or a value to pack
		kind    error
		offset  int // -1: not checked
		field   string
	}{
		{"seq frame of 7 bytes", make([]byte, 7), good, ErrShortSeq, 0, "seq"},
		{"seq frame of 9 bytes", make([]byte, 9), good, ErrShortSeq, 0, "seq"},
		{"empty seq frame", nil, good, ErrShortSeq, 0, "seq"},
		{"empty payload", nil, []byte{}, ErrTruncated, 0, ""},
		{"replay end marker", seqFrame(math.MaxUint64), []byte{}, ErrReplayEnd, -1, ""},
		{"batch is an integer", nil, []byte{0x05}, ErrType, 0, ""},
		{"batch array of one element", nil, []any{1.0}, ErrType, 0, ""},
		{"ts is a string", nil, []any{"now", []any{}}, ErrType, 1, "ts"},
		{"events is a map", nil, []any{1.0, omap{}}, ErrType, 10, "events"},
		{"event is an integer", nil, []any{1.0, []any{7}}, ErrType, 11, "events[0]"},
		{"event is an empty array", nil, []any{1.0, []any{[]any{}}}, ErrType, 11, "events[0]"},
		{"event tag is an integer", nil, []any{1.0, []any{[]any{1}}}, ErrType, 12, "events[0].type"},
		{"hash is a string", nil, []any{1.0, []any{[]any{"BlockRemoved", []any{"h"}}}}, ErrType, 26, "events[0].block_hashes[0]"},
		{"hash is a float", nil, []any{1.0, []any{[]any{"BlockRemoved", []any{1.0}}}}, ErrType, -1, "events[0].block_hashes[0]"},
		{"negative hash", nil, []any{1.0, []any{[]any{"BlockRemoved", []any{signed{-1, 8}}}}}, ErrRange, -1, "events[0].block_hashes[0]"},
		{"negative fixint hash", nil, []any{1.0, []any{[]any{"BlockRemoved", []any{h1, signed{-1, 1}}}}}, ErrRange, -1, "events[0].block_hashes[1]"},
		{"binary hash of 4 bytes", nil, []any{1.0, []any{[]any{"BlockRemoved", []any{[]byte{1, 2, 3, 4}}}}}, ErrType, -1, "events[0].block_hashes[0]"},
		{"token id above 2^32-1", nil, []any{1.0, []any{[]any{"BlockStored", []uint64{h1}, nil, []uint64{1 << 32}, 1}}}, ErrRange, -1, "events[0].token_ids[0]"},
		{"token id is a string", nil, []any{1.0, []any{[]any{"BlockStored", []uint64{h1}, nil, []any{"a"}, 1}}}, ErrType, -1, "events[0].token_ids[0]"},
		{"block size is a string", nil, []any{1.0, []any{[]any{"BlockStored", []uint64{h1}, nil, []uint32{}, "16"}}}, ErrType, -1, "events[0].block_size"},
		{"negative block size", nil, []any{1.0, []any{[]any{"BlockStored", []uint64{h1}, nil, []uint32{}, -16}}}, ErrRange, -1, "events[0].block_size"},
		{"medium is an integer", nil, []any{1.0, []any{[]any{"BlockRemoved", []uint64{h1}, 1}}}, ErrType, -1, "events[0].medium"},
		{"lora id above 2^63-1", nil, []any{1.0, []any{[]any{"BlockStored", []uint64{h1}, nil, []uint32{}, 1, uint64(math.MaxUint64)}}}, ErrRange, -1, "events[0].lora_id"},
		{"parent is a string", nil, []any{1.0, []any{storedMap([]uint64{h1}, "p", nil, 16)}}, ErrType, -1, "events[0].parent_block_hash"},
		{"dp rank is negative", nil, []any{1.0, []any{}, -1}, ErrRange, 11, "data_parallel_rank"},
		{"dp rank is a string", nil, omap{{"events", nil}, {"data_parallel_rank", "0"}}, ErrType, -1, "data_parallel_rank"},
		{"map batch without events", nil, omap{{"ts", 1.0}}, ErrMissing, 0, "events"},
		{"map key is an array", nil, []any{1.0, []any{raw{0x81, 0x91, 0x01}}}, ErrTruncated, -1, "events[0].value"},
		{"never-used code 0xc1", nil, []byte{0x92, 0xc1, 0x90}, ErrType, 1, "ts"},
		{"never-used code in an unknown map field", nil, []any{1.0, []any{omap{{"type", "AllBlocksCleared"}, {"novel", raw{0xc1}}}}}, ErrType, -1, "events[0].novel"},
		{"never-used code in skipped value", nil, []any{1.0, []any{}, 0, raw{0xc1}}, ErrType, -1, "batch[3]"},
		{"leftover bytes", nil, append(bytes.Clone(good), 0xc0), ErrTrailing, len(good), ""},
		{"array32 claiming 2^31 events", nil, []any{1.0, raw{0xdd, 0x80, 0, 0, 0}}, ErrTooLarge, 10, "events"},
		{"array32 claiming 2^32-1 hashes", nil, []any{1.0, []any{[]any{"BlockRemoved", raw{0xdd, 0xff, 0xff, 0xff, 0xff}}}}, ErrTooLarge, 25, "events[0].block_hashes"},
		{"array16 claiming more tokens than bytes", nil, []any{1.0, []any{[]any{"BlockStored", nil, nil, raw{0xdc, 0x01, 0x00, 1, 2}, 1}}}, ErrTooLarge, -1, "events[0].token_ids"},
		{"bin32 hash claiming 2^32-1 bytes", nil, []any{1.0, []any{[]any{"BlockRemoved", []any{raw{0xc6, 0xff, 0xff, 0xff, 0xff, 0}}}}}, ErrTooLarge, 26, "events[0].block_hashes[0]"},
		{"str32 medium claiming 2^32-1 bytes", nil, []any{1.0, []any{[]any{"BlockRemoved", nil, raw{0xdb, 0xff, 0xff, 0xff, 0xff}}}}, ErrTooLarge, -1, "events[0].medium"},
		{"map32 batch claiming 2^31 pairs", nil, []byte{0xdf, 0x80, 0, 0, 0, 0xc0}, ErrTooLarge, 0, ""},
		{"ext32 in extra keys claiming 2^32-1 bytes", nil, []any{1.0, []any{[]any{"BlockStored", nil, nil, nil, 0, nil, nil, nil, raw{0xc9, 0xff, 0xff, 0xff, 0xff, 1}}}}, ErrTooLarge, -1, "events[0].extra_keys"},
		{"nested arrays in extra keys claiming too much", nil, []any{1.0, []any{[]any{"BlockStored", nil, nil, nil, 0, nil, nil, nil, raw{0x93, 0x93, 0x93, 0x93}}}}, ErrTooLarge, -1, "events[0].extra_keys"},
		{"fixstr tag cut short", nil, []byte{0x92, 0x01, 0x91, 0x91, 0xab, 'B', 'l'}, ErrTruncated, 4, "events[0].type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			payload, ok := tt.payload.([]byte)
			if !ok {
				payload = pack(t, tt.payload)
			}
			seq := tt.seq
			if seq == nil && !errors.Is(tt.kind, ErrShortSeq) {
				seq = seqFrame(1)
			}
			var b Batch
			err := Decode(testTopic, seq, payload, &b)
			if !errors.Is(err, tt.kind) {
				t.Fatalf("Decode(% x) = %v, want %v", payload, err, tt.kind)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				if !errors.Is(tt.kind, ErrReplayEnd) {
					t.Fatalf("error %v is not a *DecodeError", err)
				}
				return
			}
			if tt.offset >= 0 && de.Offset != tt.offset {
				t.Errorf("offset = %d, want %d (%v)", de.Offset, tt.offset, err)
			}
			if de.Field != tt.field {
				t.Errorf("field = %q, want %q (%v)", de.Field, tt.field, err)
			}
			if de.Want == "" || de.Got == "" {
				t.Errorf("error %v does not say what was expected and what came", err)
			}
		})
	}
}

// TestDecodeTruncated cuts valid payloads of both encodings at every offset.
func TestDecodeTruncated(t *testing.T) {
	payloads := map[string][]byte{
		"array": pack(t, []any{1.0, []any{
			storedArray([]uint64{h1, h2}, h3, tokens(32), 16),
			[]any{"BlockRemoved", []any{bin32(h1)}, "CPU", 1},
			[]any{"AllBlocksCleared"},
			[]any{"Unknown", omap{{"x", []any{1.5, f32(2)}}}},
			[]any{"BlockStored", []uint64{h3}, nil, nil, 0, nil, "CPU", nil, nil, 1, "sliding_window", 512, "LOCAL", "tier", "sess", "extra"},
			[]any{"BlockRemoved", []uint64{h3}, "DISK", 1, "REMOTE", "tier", []any{1, compact(300)}, nil},
		}, 0}),
		"map": pack(t, omap{{"ts", 1.0}, {"events", []any{
			storedMap([]uint64{h1}, nil, tokens(16), 16),
			omap{{"type", "BlockStored"}, {"block_hashes", []uint64{h2}}, {"lora_name", "a"}, {"extra_keys", []any{"s", nil}}, {"lora_id", 2}},
			omap{{"type", "BlockStored"}, {"block_hashes", []uint64{h2}}, {"group_idx", 1}, {"kv_cache_spec_kind", "mamba"},
				{"kv_cache_spec_sliding_window", 0}, {"locality", "LOCAL"}, {"ownership", "o"}, {"session_id", "s"}},
			omap{{"type", "BlockRemoved"}, {"block_hashes", []uint64{h2}}, {"remaining_copy_counts", []any{0}}, {"novel", 1}},
			omap{{"type", "BlockInactive"}},
		}}, {"data_parallel_rank", 0}}),
	}
	for name, p := range payloads {
		t.Run(name, func(t *testing.T) {
			var b Batch
			if err := Decode(testTopic, seqFrame(1), p, &b); err != nil {
				t.Fatalf("whole payload: %v", err)
			}
			for n := range len(p) {
				err := Decode(testTopic, seqFrame(1), p[:n], &b)
				if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrTooLarge) {
					t.Fatalf("payload cut to %d of %d bytes: err = %v, want ErrTruncated or ErrTooLarge", n, len(p), err)
				}
			}
		})
	}
}

func TestDecodeFrames(t *testing.T) {
	payload := pack(t, []any{1.0, []any{[]any{"AllBlocksCleared"}}, 0})
	tests := []struct {
		name   string
		frames [][]byte
		topic  string
		err    error
	}{
		{"live", [][]byte{testTopic, seqFrame(3), payload}, string(testTopic), nil},
		{"live without topic", [][]byte{{}, seqFrame(3), payload}, "", nil},
		{"replay reply", [][]byte{{}, testTopic, seqFrame(3), payload}, string(testTopic), nil},
		{"replay reply through REQ", [][]byte{seqFrame(3), payload}, "", nil},
		{"replay end", [][]byte{{}, {}, seqFrame(math.MaxUint64), {}}, "", ErrReplayEnd},
		{"4 frames without delimiter", [][]byte{{1}, testTopic, seqFrame(3), payload}, "", ErrFrames},
		{"one frame", [][]byte{payload}, "", ErrFrames},
		{"five frames", [][]byte{{}, {}, {}, {}, {}}, "", ErrFrames},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b Batch
			err := DecodeFrames(tt.frames, &b)
			if !errors.Is(err, tt.err) {
				t.Fatalf("err = %v, want %v", err, tt.err)
			}
			if err != nil {
				return
			}
			if string(b.Topic) != tt.topic || b.Seq != 3 || len(b.Events) != 1 || b.Events[0].Kind != KindAllBlocksCleared {
				t.Fatalf("got topic %q seq %d events %+v", b.Topic, b.Seq, b.Events)
			}
		})
	}
}

// TestDecodeReusesMemory decodes batches of different sizes into one Batch
// and checks each against a fresh decode, and that the batch owns its bytes.
func TestDecodeReusesMemory(t *testing.T) {
	big := benchBatch(t, 16, 8, false)
	small := pack(t, []any{1.0, []any{
		[]any{"BlockStored", []uint64{h1}, nil, tokens(16), 16, 1, "CPU", "lora", []any{"x"}},
		[]any{"AllBlocksCleared"},
	}})
	mapped := benchBatch(t, 3, 2, true)
	var reused Batch
	for i, p := range [][]byte{big, small, mapped, big, small} {
		topic := []byte("kv@10.0.0.1:8000@m")
		payload := bytes.Clone(p)
		if err := Decode(topic, seqFrame(uint64(i)), payload, &reused); err != nil {
			t.Fatalf("decode %d: %v", i, err)
		}
		var fresh Batch
		if err := Decode(topic, seqFrame(uint64(i)), p, &fresh); err != nil {
			t.Fatal(err)
		}
		// Overwrite the frames: the batch must not alias them.
		for j := range payload {
			payload[j] = 0
		}
		topic[0] = 'X'
		if d := diffBatch(&reused, &fresh); d != "" {
			t.Fatalf("decode %d into a used batch differs from a fresh one in %s", i, d)
		}
	}
}

func TestDecodeAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	oddities := pack(t, omap{{"ts", 1.0}, {"events", []any{
		omap{{"type", "BlockStored"}, {"block_hashes", []any{bin32(h1)}}, {"event_version", 2}, {"lora_name", "a"},
			{"extra_keys", []any{"salt"}}, {"medium", "CPU"}, {"kv_cache_spec_kind", "full"}},
		[]any{"Unknown", []any{1, 2}},
		[]any{"BlockRemoved", []uint64{h1}, nil, 1, "new"},
	}}, {"future", []any{1}}})
	// More distinct unknown names than a batch keeps, long ones among them.
	var unknowns []any
	for i := range 12 {
		name := strings.Repeat(strconv.Itoa(i), 70)
		unknowns = append(unknowns, []any{name, 1}, omap{{"type", "AllBlocksCleared"}, {name, 1}},
			[]any{"BlockRemoved", nil, nil, nil, nil, nil, nil, i})
	}
	many := pack(t, []any{1.0, unknowns, 0, "x"})
	for i, p := range [][]byte{benchBatch(t, 16, 8, false), benchBatch(t, 16, 8, true), oddities, many, hybridBatch(t, 16, 8)} {
		var b Batch
		seq := seqFrame(1)
		if err := Decode(testTopic, seq, p, &b); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(20, func() {
			if err := Decode(testTopic, seq, p, &b); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("payload %d: %v allocations per decode into a used batch, want 0", i, allocs)
		}
	}
}

func TestParseTopic(t *testing.T) {
	tests := []struct {
		topic, pod, model string
		ok                bool
	}{
		{"kv@127.0.0.1:8001@sim-model", "127.0.0.1:8001", "sim-model", true},
		{"kv@[fd00::1]:8000@meta-llama/Llama-3.1-8B", "[fd00::1]:8000", "meta-llama/Llama-3.1-8B", true},
		{"kv@10.0.0.1:8000@org@model@v2", "10.0.0.1:8000", "org@model@v2", true},
		{"kv@10.0.0.1:8000@", "10.0.0.1:8000", "", true},
		{"", "", "", false},
		{"kv@10.0.0.1:8000", "", "", false},
		{"kv@@model", "", "", false},
		{"kv", "", "", false},
		{"vllm-events", "", "", false},
		{"KV@10.0.0.1:8000@m", "", "", false},
	}
	for _, tt := range tests {
		pod, model, ok := ParseTopic([]byte(tt.topic))
		if ok != tt.ok || string(pod) != tt.pod || string(model) != tt.model {
			t.Errorf("ParseTopic(%q) = %q, %q, %v; want %q, %q, %v", tt.topic, pod, model, ok, tt.pod, tt.model, tt.ok)
		}
	}
	topic := []byte("kv@127.0.0.1:8001@sim-model")
	if n := testing.AllocsPerRun(10, func() { ParseTopic(topic) }); n != 0 {
		t.Errorf("ParseTopic allocates %v times", n)
	}
	pod, model, _ := ParseTopic(topic)
	_ = append(pod, 'X')
	if string(model) != "sim-model" {
		t.Errorf("appending to the pod overwrote the model: %q", model)
	}
}

func TestParseMedium(t *testing.T) {
	for name, want := range map[string]Medium{
		"": MediumGPU, "GPU": MediumGPU, "gpu": MediumGPU, "CPU": MediumCPU, "CPU_PINNED": MediumCPUPinned,
		"cpu_pinned": MediumCPUPinned, "DISK": MediumDisk, "NVME": MediumOther,
		"STORAGE": MediumStorage, "Storage": MediumStorage, "FS": MediumFS, "fs": MediumFS,
		"OBJ": MediumOBJ, "obj": MediumOBJ, "FSX": MediumOther, "OTHER": MediumOther, "S3": MediumOther,
	} {
		if got := ParseMedium([]byte(name)); got != want {
			t.Errorf("ParseMedium(%q) = %v, want %v", name, got, want)
		}
	}
}
