package indexer

import (
	"context"
	"testing"
	"time"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/indexer/blockhash"
	"github.com/prefixd/prefixd/store/memory"
)

// BenchmarkApply applies batches of 16 BlockStored events of 8 blocks of 16
// tokens, each followed later by the BlockRemoved of the same blocks, to
// one pod: the whole apply path (hash check, key mapping, store) per mode.
func BenchmarkApply(b *testing.B) {
	for _, mode := range []KeyMode{KeyModeEngine, KeyModeTokens} {
		b.Run(mode.String(), func(b *testing.B) {
			st, err := memory.New(memory.Options{CapacityBlocks: 1 << 22})
			if err != nil {
				b.Fatal(err)
			}
			opts := DefaultOptions()
			opts.Default = ModelOptions{HashScheme: "llmd", BlockSize: 16, KeyMode: mode}
			ix, err := New(st, opts, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			h, _ := blockhash.New(blockhash.Config{Scheme: blockhash.LLMD, BlockSize: 16})
			const prompts = 1024
			stored := make([]*events.Batch, prompts/16)
			removed := make([]*events.Batch, prompts/16)
			for i := range stored {
				stored[i] = &events.Batch{Topic: []byte("kv@10.0.0.1:8000@m")}
				removed[i] = &events.Batch{Topic: []byte("kv@10.0.0.1:8000@m")}
				for j := 0; j < 16; j++ {
					toks := tokens((i*16+j)*1000, 128)
					keys, _ := h.AppendPrompt(nil, toks, blockhash.Prompt{Model: "m"})
					stored[i].Events = append(stored[i].Events, events.Event{Kind: events.KindBlockStored, BlockHashes: keys, TokenIDs: toks, BlockSize: 16})
					removed[i].Events = append(removed[i].Events, events.Event{Kind: events.KindBlockRemoved, BlockHashes: keys})
				}
			}
			ctx := context.Background()
			seq := uint64(0)
			apply := func(bt *events.Batch) {
				seq++
				bt.Seq = seq
				if _, err := ix.Apply(ctx, bt, Source{}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			start := time.Now()
			blocks := 0
			for b.Loop() {
				for i := range stored {
					apply(stored[i])
				}
				for i := range removed {
					apply(removed[i])
				}
				blocks += 2 * prompts * 8
			}
			b.ReportMetric(float64(blocks)/time.Since(start).Seconds(), "blocks/s")
		})
	}
}

// BenchmarkMatchTokens answers a query of 8192 token ids (512 blocks) that
// one of 100 pods holds whole: hashing plus lookup.
func BenchmarkMatchTokens(b *testing.B) {
	st, err := memory.New(memory.Options{CapacityBlocks: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	opts := DefaultOptions()
	opts.Default = ModelOptions{HashScheme: "llmd", BlockSize: 16, KeyMode: KeyModeEngine}
	ix, err := New(st, opts, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	h, _ := blockhash.New(blockhash.Config{Scheme: blockhash.LLMD, BlockSize: 16})
	toks := tokens(7, 8192)
	keys, _ := h.AppendPrompt(nil, toks, blockhash.Prompt{Model: "m"})
	ctx := context.Background()
	for p := 0; p < 100; p++ {
		other := tokens(p*100000+10, 8192)
		ok, _ := h.AppendPrompt(nil, other, blockhash.Prompt{Model: "m"})
		bt := &events.Batch{Topic: []byte("kv@10.0.0." + string(rune('a'+p%26)) + string(rune('a'+p/26)) + ":8000@m"), Seq: 1,
			Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: ok}}}
		if p == 42 {
			bt.Events[0].BlockHashes = keys
		}
		if _, err := ix.Apply(ctx, bt, Source{}); err != nil {
			b.Fatal(err)
		}
	}
	q := &Query{Model: "m", TokenIDs: toks}
	b.ReportAllocs()
	for b.Loop() {
		res, err := ix.Match(ctx, q)
		if err != nil || len(res.Pods) != 1 || res.Pods[0].Blocks != 512 {
			b.Fatalf("%+v %v", res, err)
		}
	}
}
