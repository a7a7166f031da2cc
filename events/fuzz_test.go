package events

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/internal/fixture"
)

// sentinels are the error kinds Decode may return.
var sentinels = []error{ErrShortSeq, ErrFrames, ErrReplayEnd, ErrTruncated, ErrType, ErrRange, ErrTooLarge, ErrMissing, ErrTrailing}

// fuzzSeeders add seeds to FuzzDecode. External test files (package
// events_test) register them with AddFuzzSeeds from an init function, so
// that seeds can come from packages that import events.
var fuzzSeeders []func(f *testing.F)

// AddFuzzSeeds registers a function that adds seeds (topic, seq, payload)
// to FuzzDecode. It exists only in tests.
func AddFuzzSeeds(seed func(f *testing.F)) { fuzzSeeders = append(fuzzSeeders, seed) }

// FuzzDecode checks that Decode never panics, that every error is one of
// the sentinel kinds, and that a payload that decodes gives the same batch
// when decoded again, into a fresh batch or into one holding another batch.
// Seeds: every message of the shared recordings, hand-made payloads with
// every field current vLLM publishes in both encodings, and what
// AddFuzzSeeds registered (the recordings rewritten by
// internal/fixture/derive).
func FuzzDecode(f *testing.F) {
	seq := seqFrame(1)
	var unknowns []any
	for i := range MaxUnknownNames + 2 {
		name := strings.Repeat(string(rune('a'+i)), MaxUnknownNameBytes+i)
		unknowns = append(unknowns, []any{name}, omap{{"type", "AllBlocksCleared"}, {name, i}})
	}
	for _, p := range [][]byte{
		benchBatch(f, 2, 2, false),
		benchBatch(f, 2, 2, true),
		hybridBatch(f, 2, 2),
		pack(f, []any{1.0, []any{
			[]any{"BlockStored", []uint64{h1}, h2, tokens(4), 4, nil, "STORAGE", nil, nil, 1, "sliding_window", 4096, "LOCAL", "lmcache", "session-1", "future"},
			[]any{"BlockRemoved", []uint64{h1, h2}, "FS", 1, "REMOTE", "lmcache", []any{0, compact(3)}, "future"},
			[]any{"BlockStored", []any{bin32(h3)}, nil, nil, 0, nil, "OBJ", nil, nil, nil, "mamba", nil, "elsewhere", []byte("ÿþ"), nil},
			[]any{"BlockInactive", []uint64{h1}},
		}, 0}),
		pack(f, omap{{"ts", 1.0}, {"events", []any{
			omap{{"type", "BlockStored"}, {"block_hashes", []uint64{h1}}, {"parent_block_hash", nil}, {"token_ids", tokens(4)},
				{"block_size", 4}, {"medium", "GPU"}, {"group_idx", 0}, {"kv_cache_spec_kind", "full_attention"},
				{"kv_cache_spec_sliding_window", nil}, {"locality", "local"}, {"ownership", "nixl"}, {"session_id", "s"}},
			omap{{"type", "BlockRemoved"}, {"block_hashes", []uint64{h1}}, {"medium", "storage"}, {"group_idx", 2},
				{"locality", "REMOTE"}, {"ownership", nil}, {"remaining_copy_counts", []any{1}}, {"event_version", 2}},
			omap{{"type", "BlockInactive"}, {"block_hashes", []uint64{h1}}},
			omap{{"block_hashes", []uint64{h2}}},
		}}, {"data_parallel_rank", 1}, {"producer", "vllm"}}),
		pack(f, []any{1.0, unknowns, 0, "x", "y"}),
		pack(f, []any{f32(1), []any{
			[]any{"BlockStored", []any{bin32(h1), compact(3)}, bin32(h2), []any{compact(1), width{2, 2}}, 1, 7, "CPU", "lora", []any{"salt", nil}, 0, "full", 4, "extra"},
			omap{{"type", "BlockRemoved"}, {"block_hashes", []any{signed{9, 4}}}, {"medium", nil}, {"group_idx", 1}, {"new", omap{{"k", 1.5}}}},
			[]any{"AllBlocksCleared"},
			[]any{"Other", 1, 2},
		}, nil, 9}),
		pack(f, omap{{"events", []any{}}, {"ts", signed{-1, 8}}}),
		{0x92, 0xcb},
		{0xdd, 0xff, 0xff, 0xff, 0xff},
		{},
	} {
		f.Add([]byte("kv@127.0.0.1:8001@sim-model"), seq, p)
	}
	f.Add([]byte{}, seqFrame(ReplayEndSeq), []byte{})
	f.Add([]byte("x"), []byte{1, 2, 3}, []byte{0x90})

	sim := fixture.SimDir(f)
	for _, name := range fixture.Recordings {
		for _, file := range recordingFiles(f, filepath.Join(sim, name)) {
			msgs, _ := readRecording(f, file)
			for _, m := range msgs {
				f.Add(m.Topic, m.Seq, m.Payload)
			}
		}
	}

	for _, seed := range fuzzSeeders {
		seed(f)
	}

	other := pack(f, []any{1.0, []any{
		[]any{"BlockStored", []uint64{h1, h2, h3}, nil, tokens(48), 16, 1, "CPU", "lora", []any{"x"}, 3, "mamba", 7, "REMOTE", "tier", "sess"},
		[]any{"BlockRemoved", []uint64{h1, h2}, "DISK", 3, "LOCAL", "tier", []any{5, 6, 7, 8}, "extra"},
		omap{{"type", "Other"}, {"other", 1}},
		[]any{"Another"},
	}, 0, "more"})
	f.Fuzz(func(t *testing.T, topic, seq, payload []byte) {
		var b Batch
		err := Decode(topic, seq, payload, &b)
		if err != nil {
			n := 0
			for _, s := range sentinels {
				if errors.Is(err, s) {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("error %v matches %d sentinel kinds, want 1", err, n)
			}
			return
		}
		checkNames(t, "skipped types", b.SkippedTypes, b.Skipped)
		checkNames(t, "unknown field names", b.UnknownFieldNames, b.UnknownFields)
		first := *b.Clone()
		if err := Decode(topic, seq, payload, &b); err != nil {
			t.Fatalf("second decode failed: %v", err)
		}
		if d := diffBatch(&b, &first); d != "" {
			t.Fatalf("second decode differs in %s", d)
		}
		var used Batch
		if err := Decode(nil, seqFrame(2), other, &used); err != nil {
			t.Fatal(err)
		}
		if err := Decode(topic, seq, payload, &used); err != nil {
			t.Fatalf("decode into a used batch failed: %v", err)
		}
		if d := diffBatch(&used, &first); d != "" {
			t.Fatalf("decode into a used batch differs in %s", d)
		}
	})
}

// checkNames checks a list of unknown names against its total: at most
// MaxUnknownNames distinct names of at most MaxUnknownNameBytes bytes,
// whose counts add up to the total unless the list is full.
func checkNames(t *testing.T, what string, l []NameCount, total int) {
	t.Helper()
	sum := 0
	for i, n := range l {
		if len(n.Name) > MaxUnknownNameBytes || n.Count < 1 {
			t.Fatalf("%s: %q counted %d", what, n.Name, n.Count)
		}
		for _, m := range l[:i] {
			if string(m.Name) == string(n.Name) {
				t.Fatalf("%s: %q twice", what, n.Name)
			}
		}
		sum += n.Count
	}
	if len(l) > MaxUnknownNames || sum > total || len(l) < MaxUnknownNames && sum != total {
		t.Fatalf("%s: %d names counting %d of %d", what, len(l), sum, total)
	}
}
