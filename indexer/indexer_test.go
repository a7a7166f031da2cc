package indexer

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/indexer/blockhash"
	"github.com/prefixd/prefixd/store"
	"github.com/prefixd/prefixd/store/memory"
)

const testModel = "m"

// fleet is a small synthetic fleet: an indexer and a hasher playing the engine.
type fleet struct {
	t      *testing.T
	ix     *Indexer
	st     *memory.Store
	engine *blockhash.Hasher
	seq    map[string]uint64
}

func newFleet(t *testing.T, mode KeyMode, engineSeed string) *fleet {
	t.Helper()
	st, err := memory.New(memory.Options{CapacityBlocks: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	opts := DefaultOptions()
	opts.Default = ModelOptions{HashScheme: "llmd", BlockSize: 4, KeyMode: mode}
	opts.AutoDecideAfter = 2
	ix, err := New(st, opts, NewMetrics(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	engine, err := blockhash.New(blockhash.Config{Scheme: blockhash.LLMD, Seed: engineSeed, BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	return &fleet{t: t, ix: ix, st: st, engine: engine, seq: map[string]uint64{}}
}

func tokens(start, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(start + i)
	}
	return out
}

// hashes returns the engine's hashes of a whole prompt.
func (f *fleet) hashes(toks []uint32, lora string) []uint64 {
	h, err := f.engine.AppendPrompt(nil, toks, blockhash.Prompt{Model: testModel, LoRA: lora})
	if err != nil {
		f.t.Fatal(err)
	}
	return h
}

func (f *fleet) send(pod string, rank int, evs ...events.Event) {
	f.t.Helper()
	key := pod + "/" + string(rune('0'+rank))
	f.seq[key]++
	b := &events.Batch{Topic: []byte("kv@" + pod + "@" + testModel), Seq: f.seq[key], DPRank: rank, Events: evs}
	if _, err := f.ix.Apply(context.Background(), b, Source{}); err != nil {
		f.t.Fatal(err)
	}
}

// stored returns the BlockStored event of blocks [from, to) of a prompt.
func (f *fleet) stored(toks []uint32, from, to int, medium events.Medium) events.Event {
	h := f.hashes(toks, "")
	e := events.Event{Kind: events.KindBlockStored, BlockHashes: h[from:to], TokenIDs: toks[from*4 : to*4], BlockSize: 4, Medium: medium}
	if from > 0 {
		e.ParentHash, e.HasParent = h[from-1], true
	}
	return e
}

// keyOf returns the index key of block i of a whole prompt in the model's
// key mode.
func (f *fleet) keyOf(toks []uint32, i int) uint64 {
	f.t.Helper()
	if f.ix.KeyMode(testModel) != KeyModeTokens {
		return f.hashes(toks, "")[i]
	}
	f.ix.mu.RLock()
	m := f.ix.models[testModel]
	f.ix.mu.RUnlock()
	return prompt(m.hashers().own, nil, toks, blockhash.Prompt{Model: testModel})[i]
}

func (f *fleet) match(q Query) map[string]PodMatch {
	f.t.Helper()
	if q.Model == "" {
		q.Model = testModel
	}
	res, err := f.ix.Match(context.Background(), &q)
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]PodMatch{}
	for _, p := range res.Pods {
		out[p.Pod] = p
	}
	return out
}

func TestAutoFallsBackToTokensOnWrongSeed(t *testing.T) {
	f := newFleet(t, KeyModeAuto, "engine-seed") // prefixd is configured with seed ""
	a, b := tokens(0, 16), tokens(100, 16)
	f.send("10.0.0.1:8000", 0, f.stored(a, 0, 4, events.MediumGPU))
	if got := f.ix.KeyMode(testModel); got != KeyModeAuto {
		t.Fatalf("decided %v after one mismatch, want to wait for %d", got, 2)
	}
	f.send("10.0.0.2:8000", 0, f.stored(b, 0, 2, events.MediumGPU), f.stored(b, 2, 4, events.MediumGPU))
	if got := f.ix.KeyMode(testModel); got != KeyModeTokens {
		t.Fatalf("key mode %v, want tokens", got)
	}
	// The batches held while undecided were applied in tokens mode: a query
	// by tokens finds them although prefixd cannot reproduce the engine's hashes.
	got := f.match(Query{TokenIDs: a})
	if got["10.0.0.1:8000"].Blocks != 4 || len(got) != 1 {
		t.Fatalf("match a: %+v", got)
	}
	if got := f.match(Query{TokenIDs: b[:10]}); got["10.0.0.2:8000"].Blocks != 2 {
		t.Fatalf("match b: %+v", got)
	}
}

func TestMismatchesAreCountedAndExplained(t *testing.T) {
	f := newFleet(t, KeyModeEngine, "other")
	a := tokens(0, 16)
	f.send("10.0.0.1:8000", 0, f.stored(a, 0, 2, events.MediumGPU))
	f.send("10.0.0.1:8000", 0, f.stored(a, 2, 4, events.MediumGPU)) // continues: the block function is right
	m := f.ix.metrics
	if n := testutil.ToFloat64(m.mismatches.WithLabelValues(testModel, "root")); n != 1 {
		t.Errorf("root mismatches %v, want 1", n)
	}
	if n := testutil.ToFloat64(m.hashChecks.WithLabelValues(testModel, "match")); n != 1 {
		t.Errorf("matches %v, want 1", n)
	}
	// Wrong block size.
	e := f.stored(a, 0, 1, events.MediumGPU)
	e.BlockSize = 8
	f.send("10.0.0.1:8000", 0, e)
	if n := testutil.ToFloat64(m.mismatches.WithLabelValues(testModel, "block_size")); n != 1 {
		t.Errorf("block size mismatches %v, want 1", n)
	}
	// A prompt's first block listed after a parent: non-contiguous.
	f = newFleet(t, KeyModeEngine, "")
	nc := f.stored(a, 0, 1, events.MediumGPU)
	nc.ParentHash, nc.HasParent = f.hashes(a, "")[3], true
	f.send("10.0.0.1:8000", 0, nc)
	// Not a failure of the hash check: engine key mode indexes such events
	// exactly.
	if n := testutil.ToFloat64(f.ix.metrics.hashChecks.WithLabelValues(testModel, "non_contiguous")); n != 1 {
		t.Errorf("non-contiguous %v, want 1", n)
	}
	if n := testutil.ToFloat64(f.ix.metrics.hashChecks.WithLabelValues(testModel, "mismatch")) + testutil.ToFloat64(f.ix.metrics.mismatches.WithLabelValues(testModel, "non_contiguous")); n != 0 {
		t.Errorf("a non-contiguous event counted as %v mismatches", n)
	}
	if explain("root") == "root" || explain("non_contiguous") == "non_contiguous" {
		t.Error("reasons are not explained")
	}
}

// prefixd configured with another block size than the fleet's learns the
// fleet's from its events: answers are right and the key mode is engine.
func TestBlockSizeLearnedFromEvents(t *testing.T) {
	st, err := memory.New(memory.Options{CapacityBlocks: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	opts := DefaultOptions()
	opts.Default = ModelOptions{HashScheme: "llmd", BlockSize: 8, KeyMode: KeyModeAuto}
	m := NewMetrics(nil)
	ix, err := New(st, opts, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := newFleet(t, KeyModeAuto, "")
	f.ix, f.st = ix, st
	a := tokens(0, 16)
	f.send("10.0.0.1:8000", 0, f.stored(a, 0, 4, events.MediumGPU))
	if got := ix.KeyMode(testModel); got != KeyModeEngine {
		t.Fatalf("key mode %v, want engine", got)
	}
	if got := f.match(Query{TokenIDs: a}); got["10.0.0.1:8000"].Blocks != 4 || got["10.0.0.1:8000"].Tokens != 16 {
		t.Fatalf("match: %+v", got)
	}
	if n := testutil.ToFloat64(m.blockSize.WithLabelValues(testModel)); n != 4 {
		t.Errorf("model block size %v, want the events' 4", n)
	}
	if n := testutil.ToFloat64(m.podBlockSize.WithLabelValues("10.0.0.1:8000")); n != 4 {
		t.Errorf("pod block size %v", n)
	}
	if n := testutil.ToFloat64(m.dropped.WithLabelValues(dropBlockSize)); n != 0 {
		t.Errorf("%v blocks dropped for block size", n)
	}
	// A pod at another block size than the model's: reported, not matched.
	e := f.stored(a, 0, 2, events.MediumGPU)
	e.BlockSize, e.TokenIDs = 2, e.TokenIDs[:4]
	f.send("10.0.0.2:8000", 0, e)
	if n := testutil.ToFloat64(m.podBlockSize.WithLabelValues("10.0.0.2:8000")); n != 2 {
		t.Errorf("pod block size %v, want 2", n)
	}
	if n := testutil.ToFloat64(m.mismatches.WithLabelValues(testModel, "block_size")); n != 1 {
		t.Errorf("block size mismatches %v, want 1", n)
	}
}

// A second full-attention group at another block size is not indexed, and
// the hash check says why; a REMOTE copy is not credited; a removal with
// copies left removes nothing.
func TestGroupsLocalityAndCopies(t *testing.T) {
	for _, mode := range []KeyMode{KeyModeEngine, KeyModeTokens} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFleet(t, mode, "")
			a, b := tokens(0, 16), tokens(100, 16)
			const pod = "10.0.0.1:8000"
			fa := f.stored(a, 0, 4, events.MediumGPU)
			fa.GroupIdx, fa.HasGroupIdx, fa.SpecKind = 0, true, events.SpecFullAttention
			wide := f.stored(a, 0, 2, events.MediumGPU)
			wide.GroupIdx, wide.HasGroupIdx, wide.SpecKind, wide.BlockSize = 1, true, events.SpecFullAttention, 8
			f.send(pod, 0, fa, wide)
			m := f.ix.metrics
			if n := testutil.ToFloat64(m.dropped.WithLabelValues(dropBlockSize)); n != 2 {
				t.Errorf("blocks dropped for block size %v, want 2", n)
			}
			if n := testutil.ToFloat64(m.mismatches.WithLabelValues(testModel, "block_size")); n != 1 {
				t.Errorf("block size mismatches %v, want 1", n)
			}
			// The wide group's removal does not touch group 0's blocks.
			rm := events.Event{Kind: events.KindBlockRemoved, BlockHashes: f.hashes(a, "")[:2], GroupIdx: 1, HasGroupIdx: true}
			f.send(pod, 0, rm)
			if got := f.match(Query{TokenIDs: a}); got[pod].Blocks != 4 {
				t.Fatalf("after the other group's removal: %+v", got)
			}
			// Copies left: nothing removed; none left: removed.
			rm.GroupIdx, rm.RemainingCopies = 0, []uint64{0, 1}
			f.send(pod, 0, rm)
			if got := f.match(Query{TokenIDs: a}); got[pod].Blocks != 0 {
				t.Fatalf("block 0 removed, block 1 has a copy left: %+v", got)
			}
			if !holds(t, f.st, pod, f.keyOf(a, 1)) {
				t.Error("block 1 with a copy left was removed")
			}
			// A REMOTE copy of another prompt is not the pod's.
			remote := f.stored(b, 0, 4, events.MediumStorage)
			remote.Locality = events.LocalityRemote
			f.send(pod, 0, remote)
			if got := f.match(Query{TokenIDs: b}); len(got) != 0 {
				t.Fatalf("REMOTE blocks credited: %+v", got)
			}
			if n := testutil.ToFloat64(m.skipped.WithLabelValues("remote")); n != 4 {
				t.Errorf("remote blocks skipped %v, want 4", n)
			}
			if n := testutil.ToFloat64(m.skipped.WithLabelValues("copies_remain")); n != 1 {
				t.Errorf("copies_remain %v, want 1", n)
			}
		})
	}
}

func TestUnknownParentAndUnknownRemoval(t *testing.T) {
	a := tokens(0, 16)
	for _, mode := range []KeyMode{KeyModeEngine, KeyModeTokens} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFleet(t, mode, "")
			// prefixd missed blocks 0-1; blocks 2-3 come with a parent it never saw.
			f.send("p:1", 0, f.stored(a, 2, 4, events.MediumGPU))
			f.send("p:1", 0, events.Event{Kind: events.KindBlockRemoved, BlockHashes: []uint64{42, 43}})
			m := f.ix.metrics
			if n := testutil.ToFloat64(m.dropped.WithLabelValues(dropUnknownHash)); n != 2 {
				t.Errorf("unknown removals %v, want 2", n)
			}
			counts := podCounts(t, f.st)
			if mode == KeyModeEngine {
				// Engine hashes are right whatever the parent: both indexed.
				if counts["p:1"] != 2 {
					t.Errorf("blocks %d, want 2", counts["p:1"])
				}
				return
			}
			if n := testutil.ToFloat64(m.dropped.WithLabelValues(dropUnknownParent)); n != 2 || counts["p:1"] != 0 {
				t.Errorf("unknown parent drops %v, blocks %d: want 2 and 0", n, counts["p:1"])
			}
		})
	}
}

func TestTiersRanksAndClears(t *testing.T) {
	for _, mode := range []KeyMode{KeyModeEngine, KeyModeTokens} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFleet(t, mode, "")
			a := tokens(0, 16)
			h := f.hashes(a, "")
			f.send("p:1", 0, f.stored(a, 0, 4, events.MediumGPU))
			// Offload of blocks 2-3 to CPU (no tokens), then their GPU copies go.
			f.send("p:1", 0,
				events.Event{Kind: events.KindBlockStored, BlockHashes: h[2:4], Medium: events.MediumCPU, HasParent: true, ParentHash: h[1]},
				events.Event{Kind: events.KindBlockRemoved, BlockHashes: h[2:4], Medium: events.MediumGPU})
			// Rank 1 of p:1 holds blocks 0-1.
			f.send("p:1", 1, f.stored(a, 0, 2, events.MediumGPU))

			got := f.match(Query{TokenIDs: a})
			p := got["p:1"]
			if p.Blocks != 4 || p.TierBlocks[store.TierGPU] != 2 || p.TierBlocks[store.TierCPU] != 2 {
				t.Fatalf("p:1 %+v, want 4 blocks, 2 GPU and 2 CPU", p)
			}
			if want := (2*1.0 + 2*0.8) / 4; p.Score != want {
				t.Errorf("score %v, want %v", p.Score, want)
			}
			if r := got["p:1#1"]; r.Blocks != 2 {
				t.Errorf("rank 1: %+v", r)
			}
			// A candidate without a rank selects its ranks too; others are left out.
			sel := f.match(Query{TokenIDs: a, Pods: []string{"p:1"}})
			if len(sel) != 2 {
				t.Errorf("candidates p:1: %+v", sel)
			}
			if sel := f.match(Query{TokenIDs: a, Pods: []string{"p:9"}}); len(sel) != 0 {
				t.Errorf("candidate p:9: %+v", sel)
			}
			// AllBlocksCleared clears one holder only.
			f.send("p:1", 1, events.Event{Kind: events.KindAllBlocksCleared})
			if got := f.match(Query{TokenIDs: a}); len(got) != 1 || got["p:1"].Blocks != 4 {
				t.Errorf("after clear: %+v", got)
			}
			if err := f.ix.RemovePod(context.Background(), "p:1"); err != nil {
				t.Fatal(err)
			}
			if got := f.match(Query{TokenIDs: a}); len(got) != 0 {
				t.Errorf("after removing the pod: %+v", got)
			}
		})
	}
}

func TestLoRAAdapterRoot(t *testing.T) {
	for _, mode := range []KeyMode{KeyModeEngine, KeyModeTokens} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFleet(t, mode, "")
			a := tokens(0, 8)
			h := f.hashes(a, "sql-lora")
			f.send("p:1", 0, events.Event{Kind: events.KindBlockStored, BlockHashes: h, TokenIDs: a, BlockSize: 4, LoRAName: []byte("sql-lora")})
			if got := f.match(Query{Model: "sql-lora", TokenIDs: a}); got["p:1"].Blocks != 2 {
				t.Errorf("query by adapter name: %+v", got)
			}
			if got := f.match(Query{TokenIDs: a}); len(got) != 0 {
				t.Errorf("query by base model matched adapter blocks: %+v", got)
			}
		})
	}
}

func TestQueryErrors(t *testing.T) {
	f := newFleet(t, KeyModeEngine, "")
	f.send("p:1", 0, f.stored(tokens(0, 8), 0, 2, events.MediumGPU))
	ctx := context.Background()
	if _, err := f.ix.Match(ctx, &Query{Model: "nope", TokenIDs: tokens(0, 8)}); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("unknown model: %v", err)
	}
	if _, err := f.ix.Match(ctx, &Query{Model: testModel}); !errors.Is(err, ErrEmptyQuery) {
		t.Errorf("empty query: %v", err)
	}
	if _, err := f.ix.Match(ctx, &Query{Model: testModel, TokenIDs: tokens(0, 4), BlockHashes: []uint64{1}}); !errors.Is(err, ErrBadQuery) {
		t.Error("tokens and hashes together: no error")
	}
	// A prompt shorter than a block has no blocks and matches nothing.
	res, err := f.ix.Match(ctx, &Query{Model: testModel, TokenIDs: tokens(0, 3)})
	if err != nil || res.TotalBlocks != 0 || len(res.Pods) != 0 {
		t.Errorf("short prompt: %+v, %v", res, err)
	}
	// Block hashes are used as they are.
	h := f.hashes(tokens(0, 8), "")
	res, err = f.ix.Match(ctx, &Query{Model: testModel, BlockHashes: h})
	if err != nil || len(res.Pods) != 1 || res.Pods[0].Blocks != 2 {
		t.Errorf("by hashes: %+v, %v", res, err)
	}
}

func TestResetAndStale(t *testing.T) {
	f := newFleet(t, KeyModeEngine, "")
	a := tokens(0, 8)
	f.send("p:1", 0, f.stored(a, 0, 2, events.MediumGPU))
	_ = f.ix.SetStale(context.Background(), "p:1", true)
	if got := f.match(Query{TokenIDs: a}); !got["p:1"].Stale {
		t.Errorf("stale pod not flagged: %+v", got)
	}
	if v := testutil.ToFloat64(f.ix.metrics.stale.WithLabelValues("p:1")); v != 1 {
		t.Errorf("prefixd_pod_stale %v, want 1", v)
	}
	if err := f.ix.Reset(context.Background(), "p:1"); err != nil {
		t.Fatal(err)
	}
	if got := f.match(Query{TokenIDs: a}); len(got) != 0 {
		t.Errorf("after reset: %+v", got)
	}
	if _, ok, err := f.ix.AppliedSeq(context.Background(), "p:1"); ok || err != nil {
		t.Errorf("reset kept the seq (err %v)", err)
	}
}

// podSeries counts the series labelled pod=name that reg gathers.
func podSeries(t *testing.T, reg *prometheus.Registry, name string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "pod" && l.GetValue() == name {
					n++
				}
			}
		}
	}
	return n
}

// RemovePod deletes the pod's series of prefixd_events_total and
// prefixd_pod_stale, and only the pod's: a churning fleet does not grow
// /metrics.
func TestRemovePodDeletesItsSeries(t *testing.T) {
	f := newFleet(t, KeyModeEngine, "")
	reg := prometheus.NewRegistry()
	reg.MustRegister(f.ix.metrics.events, f.ix.metrics.stale)
	a := tokens(0, 8)
	for _, pod := range []string{"p:1", "p:2"} {
		f.send(pod, 0, f.stored(a, 0, 2, events.MediumGPU))
		_ = f.ix.SetStale(context.Background(), pod, true)
	}
	// A series for each kind of event the pod sent (BlockStored only),
	// not one for every kind, and stale.
	perPod := 2
	if n := podSeries(t, reg, "p:1"); n != perPod {
		t.Fatalf("p:1 has %d series before removal, want %d", n, perPod)
	}
	if err := f.ix.RemovePod(context.Background(), "p:1"); err != nil {
		t.Fatal(err)
	}
	if n := podSeries(t, reg, "p:1"); n != 0 {
		t.Errorf("p:1 has %d series after removal, want 0", n)
	}
	if n := podSeries(t, reg, "p:2"); n != perPod {
		t.Errorf("p:2 has %d series, want %d: removal deleted another pod's", n, perPod)
	}
	// Marking a forgotten pod does not bring its gauge back.
	_ = f.ix.SetStale(context.Background(), "p:1", false)
	if n := podSeries(t, reg, "p:1"); n != 0 {
		t.Errorf("SetStale of a removed pod made %d series", n)
	}
	// The same name coming back is a new pod, counted from zero.
	f.send("p:1", 0, f.stored(a, 0, 2, events.MediumGPU))
	if n := testutil.ToFloat64(f.ix.metrics.events.WithLabelValues(events.KindBlockStored.String(), "p:1")); n != 1 {
		t.Errorf("events of the new p:1: %v, want 1", n)
	}
}

// A pod removed while its model's key mode is undecided keeps no blocks
// from the batches held for the decision.
func TestRemovePodDropsHeldBatches(t *testing.T) {
	testClearDropsHeldBatches(t, func(ix *Indexer, pod string) error { return ix.RemovePod(context.Background(), pod) })
}

// A reset (the engine restarted) clears what the old engine stored,
// including its batches held while the key mode is undecided.
func TestResetDropsHeldBatches(t *testing.T) {
	testClearDropsHeldBatches(t, func(ix *Indexer, pod string) error { return ix.Reset(context.Background(), pod) })
}

func testClearDropsHeldBatches(t *testing.T, clear func(*Indexer, string) error) {
	f := newFleet(t, KeyModeAuto, "engine-seed") // mismatches: batches are held
	a, b := tokens(0, 16), tokens(100, 16)
	f.send("p:1", 0, f.stored(a, 0, 4, events.MediumGPU))
	if got := f.ix.KeyMode(testModel); got != KeyModeAuto {
		t.Fatalf("decided %v after one mismatch", got)
	}
	if err := clear(f.ix, "p:1"); err != nil {
		t.Fatal(err)
	}
	f.send("p:2", 0, f.stored(b, 0, 2, events.MediumGPU), f.stored(b, 2, 4, events.MediumGPU))
	if got := f.ix.KeyMode(testModel); got != KeyModeTokens {
		t.Fatalf("key mode %v, want tokens", got)
	}
	counts := podCounts(t, f.st)
	if counts["p:1"] != 0 || counts["p:2"] != 4 {
		t.Errorf("blocks %v, want none of p:1 and 4 of p:2", counts)
	}
	if got := f.match(Query{TokenIDs: a}); len(got) != 0 {
		t.Errorf("cleared pod matched: %+v", got)
	}
}
