package ingest

import (
	"context"
	"slices"
	"testing"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/events/transport"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/recovery"
	"github.com/prefixd/prefixd/store"
	"github.com/prefixd/prefixd/store/memory"
)

// inbound returns msgs as received on a bound address from peer.
func inbound(msgs []transport.Message, peer string) []transport.Message {
	out := make([]transport.Message, len(msgs))
	for i, m := range msgs {
		m.Inbound, m.Peer = true, peer
		out[i] = m
	}
	return out
}

// On a bound address a publisher writes only the pods at its own address:
// the same recording from another source address changes nothing and is
// counted, unless topics are trusted.
func TestForeignTopicsRefused(t *testing.T) {
	msgs := readMessages(t, recordingA(t), "tcp://0.0.0.0:5557") // pods 127.0.0.1:800x
	want := reference(t)

	ix := newIndexer(t)
	p := newPipeline(t, ix, nil, Options{})
	runAll(t, p, inbound(msgs, "127.0.0.2:41000"))
	pods, err := ix.Pods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 0 {
		t.Fatalf("a publisher at 127.0.0.2 created pods at 127.0.0.1: %+v", pods)
	}
	if n := counter(p.m.dropped.WithLabelValues(DropForeignTopic, "tcp://0.0.0.0:5557")); n != float64(len(msgs)) {
		t.Fatalf("foreign topics counted %v, want %d", n, len(msgs))
	}

	// From the pods' own address, and from [::ffff:127.0.0.1], the same
	// messages are the real thing.
	for _, peer := range []string{"127.0.0.1:41000", "[::ffff:127.0.0.1]:41000"} {
		ix := newIndexer(t)
		runAll(t, newPipeline(t, ix, nil, Options{}), inbound(msgs, peer))
		if got := snapshot(t, ix); got != want {
			t.Fatalf("from %s: index differs from the reference:\n%s\nwant:\n%s", peer, got, want)
		}
	}

	ix = newIndexer(t)
	runAll(t, newPipeline(t, ix, nil, Options{TrustTopics: true}), inbound(msgs, "127.0.0.2:41000"))
	if got := snapshot(t, ix); got != want {
		t.Fatalf("with TrustTopics: index differs from the reference:\n%s\nwant:\n%s", got, want)
	}
}

// A spoofed AllBlocksCleared from another address, after the real pod's
// batches, leaves the real pod's blocks alone.
func TestSpoofedClearChangesNothing(t *testing.T) {
	msgs := inbound(readMessages(t, recordingA(t), "tcp://0.0.0.0:5557"), "127.0.0.1:41000")
	clear := msgs[len(msgs)-1]
	clear.Peer = "127.0.0.3:5000"
	clear.Frames = [][]byte{clear.Frames[0], {0, 0, 0, 0, 0, 0, 1, 0}, {0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x91, 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd', 0xc0}}
	ix := newIndexer(t)
	p := newPipeline(t, ix, nil, Options{})
	runAll(t, p, append(slices.Clone(msgs), clear))
	if got, want := snapshot(t, ix), reference(t); got != want {
		t.Fatalf("a spoofed clear changed the index:\n%s\nwant:\n%s", got, want)
	}
	if n := counter(p.m.dropped.WithLabelValues(DropForeignTopic, "tcp://0.0.0.0:5557")); n != 1 {
		t.Fatalf("foreign topics counted %v, want 1", n)
	}
}

// Messages naming pods or models the indexer refuses are dropped and
// counted by reason, and no worker keeps state for them.
func TestRefusedPodsKeepNoState(t *testing.T) {
	ix := newIndexer(t)
	p := newPipeline(t, ix, nil, Options{})
	base := readMessages(t, recordingA(t), "tcp://0.0.0.0:5557")[0]
	var msgs []transport.Message
	for _, topic := range []string{"kv@\xff\xfe:1@sim-model", "kv@127.0.0.1:1@sim\xff", "kv@127.0.0.1:1@" + string(make([]byte, 300))} {
		m := base
		m.Frames = [][]byte{[]byte(topic), base.Frames[1], base.Frames[2]}
		msgs = append(msgs, m)
	}
	runAll(t, p, msgs)
	if n := counter(p.m.dropped.WithLabelValues(indexer.RefuseInvalidPod, "tcp://0.0.0.0:5557")); n != 1 {
		t.Errorf("invalid pods counted %v, want 1", n)
	}
	if n := counter(p.m.dropped.WithLabelValues(indexer.RefuseInvalidModel, "tcp://0.0.0.0:5557")); n != 2 {
		t.Errorf("invalid models counted %v, want 2", n)
	}
	for _, w := range p.workers {
		if len(w.pods) != 0 || len(w.byTopic) != 0 {
			t.Fatalf("a worker keeps %d pods and %d topics of refused messages", len(w.pods), len(w.byTopic))
		}
	}
}

// panicStore is a memory store whose Add panics for one pod and key: no
// real store panics on demand, and the boundary under test is the worker's.
type panicStore struct {
	*memory.Store
	pod string
	key uint64
}

func (s panicStore) Apply(ctx context.Context, pod string, b *store.Batch) (store.Result, error) {
	for _, op := range b.Ops {
		if pod == s.pod && op.Kind == store.OpAdd && !op.HasParent && slices.Contains(op.Keys, s.key) {
			panic("test: store panics on this key")
		}
	}
	return s.Store.Apply(ctx, pod, b)
}

// A panic while applying a message is counted, its pod marked stale, and
// the pipeline goes on with the next messages.
func TestPanicInApplyIsContained(t *testing.T) {
	recovery.KeepRecovered(t)
	msgs := readMessages(t, recordingA(t), "tcp://0.0.0.0:5557")
	rec, err := indexer.ReadRecordings([]string{recordingA(t)}, "default")
	if err != nil {
		t.Fatal(err)
	}
	// The first block of the pod's first prompt, and the batches that add
	// it without a parent.
	var key uint64
	panics := 0
	for _, b := range rec.Pods["127.0.0.1:8001"] {
		adds := false
		for _, e := range b.Events {
			if e.Kind == events.KindBlockStored && !e.HasParent {
				if key == 0 {
					key = e.BlockHashes[0]
				}
				adds = adds || slices.Contains(e.BlockHashes, key)
			}
		}
		if adds {
			panics++
		}
	}
	mem, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts := indexer.DefaultOptions()
	opts.Default.KeyMode = indexer.KeyModeEngine
	ix, err := indexer.New(panicStore{mem, "127.0.0.1:8001", key}, opts, nil, quiet)
	if err != nil {
		t.Fatal(err)
	}
	p := newPipeline(t, ix, nil, Options{Recovery: recovery.New(nil, quiet)})
	runAll(t, p, msgs)
	if n := counter(p.m.dropped.WithLabelValues(DropPanic, "tcp://0.0.0.0:5557")); n != float64(panics) || n == 0 {
		t.Fatalf("panics counted %v, want %d", n, panics)
	}
	pods, err := ix.Pods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, ps := range pods {
		seen[ps.Name] = true
		if ps.Name == "127.0.0.1:8001" && !ps.Stale {
			t.Errorf("the pod whose batch panicked is not stale: %+v", ps)
		}
		if ps.Name != "127.0.0.1:8001" && (ps.Stale || ps.Blocks == 0) {
			t.Errorf("another pod suffered: %+v", ps)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("pods after the panic: %+v", pods)
	}
}
