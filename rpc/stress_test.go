package rpc

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/prefixd/prefixd/events/transport"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/ingest"
	prefixdv1 "github.com/prefixd/prefixd/proto/prefixd/v1"
	"github.com/prefixd/prefixd/store/memory"
)

// stressBatch is a batch of pod g/i's events: a BlockStored naming a new
// LoRA adapter at one of two block sizes, often other KV cache groups'
// events and an unknown type, sometimes an AllBlocksCleared.
func stressBatch(tb testing.TB, r *rand.Rand, g, n int) []byte {
	toks := make([]uint32, 32)
	for i := range toks {
		toks[i] = uint32(r.IntN(1000))
	}
	hashes := []uint64{r.Uint64(), r.Uint64()}
	evs := []any{[]any{"BlockStored", hashes, nil, toks, 16 * (1 + r.IntN(2)), nil, "GPU", fmt.Sprintf("lora-%d-%d", g, n), nil}}
	if r.IntN(2) == 0 {
		// A hybrid model's other groups, a removal for any group, a type
		// prefixd does not know.
		evs = append(evs,
			map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": nil, "token_ids": toks, "block_size": 16,
				"medium": "CPU", "group_idx": 1 + r.IntN(2), "kv_cache_spec_kind": []string{"sliding_window", "full_attention", "mamba"}[r.IntN(3)]},
			map[string]any{"type": "BlockRemoved", "block_hashes": hashes[:1], "medium": "GPU", "group_idx": r.IntN(4), "remaining_copy_counts": []int{r.IntN(2)}},
			map[string]any{"type": fmt.Sprintf("Future%d", r.IntN(100))})
	}
	if r.IntN(20) == 0 {
		evs = append(evs, []any{"AllBlocksCleared"})
	}
	b, err := msgpack.Marshal([]any{1.5, evs, nil})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// Everything at once, for a few seconds under the race detector: a live
// pipeline applying the batches of many pods (a new LoRA adapter in every
// batch, clears, engines restarting, connections closing and their pods
// timing out), while Match, Score, Pods and Stats are answered and pods
// are reset and removed. Nothing may hang or race.
func TestStressEverythingAtOnce(t *testing.T) {
	st, err := memory.New(memory.Options{CapacityBlocks: 1 << 12})
	if err != nil {
		t.Fatal(err)
	}
	opts := indexer.DefaultOptions()
	opts.Default = indexer.ModelOptions{HashScheme: "llmd", BlockSize: 16, KeyMode: indexer.KeyModeAuto}
	opts.MaxLoRAs = 1 << 20
	ix, err := indexer.New(st, opts, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	pipe, err := ingest.New(ix, nil, ingest.Options{PodTimeout: 10 * time.Millisecond, Logger: quiet}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(ix, Options{Limits: DefaultLimits()})
	if err != nil {
		t.Fatal(err)
	}
	in := make(chan transport.Message, 256)
	runDone := make(chan error, 1)
	go func() { runDone <- pipe.Run(context.Background(), in) }()

	ctx, stop := context.WithTimeout(context.Background(), 3*time.Second)
	defer stop()
	var wg sync.WaitGroup
	const producers, podsEach = 4, 6
	for g := range producers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			seqs := make([]uint64, podsEach)
			for n := 0; ctx.Err() == nil; n++ {
				i := r.IntN(podsEach)
				port := 8000 + g*podsEach + i
				peer := fmt.Sprintf("127.0.0.1:%d", 40000+port)
				switch r.IntN(50) {
				case 0: // the engine restarts
					seqs[i] = 0
				case 1: // the connection closes
					in <- transport.Message{Source: "tcp://0.0.0.0:5557", Peer: peer, Closed: true}
					continue
				}
				seqs[i]++
				var seq [8]byte
				binary.BigEndian.PutUint64(seq[:], seqs[i])
				in <- transport.Message{
					Source: "tcp://0.0.0.0:5557", Peer: peer, Inbound: true,
					Frames: [][]byte{fmt.Appendf(nil, "kv@127.0.0.1:%d@sim-model", port), seq[:], stressBatch(t, r, g, n)},
				}
			}
		})
	}
	f := newFleet(t) // only for its prompt
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				q := &prefixdv1.Query{Model: "sim-model", TokenIds: f.tokens}
				_, _ = s.Match(ctx, q)
				_, _ = s.Score(ctx, &prefixdv1.Query{Model: "lora-1-3", TokenIds: f.tokens})
				_, _ = s.Pods(ctx, &prefixdv1.PodsRequest{})
				_, _ = s.Stats(ctx, &prefixdv1.StatsRequest{})
			}
		})
	}
	wg.Go(func() {
		r := rand.New(rand.NewPCG(99, 1))
		for ctx.Err() == nil {
			pod := fmt.Sprintf("127.0.0.1:%d", 8000+r.IntN(producers*podsEach))
			if r.IntN(2) == 0 {
				_ = ix.RemovePod(ctx, pod)
			} else {
				_ = ix.Reset(ctx, pod)
			}
			time.Sleep(time.Millisecond)
		}
	})
	finished := make(chan struct{})
	go func() {
		wg.Wait()
		close(in)
		<-runDone
		close(finished)
	}()
	select {
	case <-finished:
	case <-time.After(30 * time.Second):
		t.Fatal("still running 27 s after the stress ended: something hangs")
	}
	if batches, _ := pipe.Applied(); batches == 0 {
		t.Fatal("no batch applied")
	}
}
