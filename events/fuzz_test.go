package events

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/prefixd/prefixd/internal/fixture"
)

// sentinels are the error kinds Decode may return.
var sentinels = []error{ErrShortSeq, ErrFrames, ErrReplayEnd, ErrTruncated, ErrType, ErrRange, ErrTooLarge, ErrMissing, ErrTrailing}

// FuzzDecode checks that Decode never panics, that every error is one of
// the sentinel kinds, and that a payload that decodes gives the same batch
// when decoded again, into a fresh batch or into one holding another batch.
// Seeds: every message of the shared recordings plus hand-made payloads.
func FuzzDecode(f *testing.F) {
	seq := seqFrame(1)
	for _, p := range [][]byte{
		benchBatch(f, 2, 2, false),
		benchBatch(f, 2, 2, true),
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

	other := benchBatch(f, 3, 4, false)
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
		first := cloneBatch(&b)
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
