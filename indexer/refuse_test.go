package indexer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/store/memory"
)

// newLimitedFleet is newFleet with the indexer's limits set by f.
func newLimitedFleet(t *testing.T, set func(*Options)) *fleet {
	t.Helper()
	f := newFleet(t, KeyModeEngine, "")
	opts := f.ix.opts
	set(&opts)
	ix, err := New(f.st, opts, NewMetrics(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	f.ix = ix
	return f
}

func (f *fleet) apply(topic string, evs ...events.Event) error {
	f.seq[topic]++
	b := &events.Batch{Topic: []byte(topic), Seq: f.seq[topic], Events: evs}
	_, err := f.ix.Apply(context.Background(), b, Source{Pod: "src:1", Model: testModel})
	return err
}

// Every string of a batch that becomes a name is checked before anything
// of the batch applies: a name that cannot be right refuses the batch with
// a reason, counted, and creates no pod, model or adapter.
func TestApplyRefusesInvalidNames(t *testing.T) {
	f := newFleet(t, KeyModeEngine, "")
	a := tokens(0, 8)
	good := f.stored(a, 0, 2, events.MediumGPU)
	withLoRA := func(name string) events.Event {
		e := good
		e.LoRAName = []byte(name)
		return e
	}
	long := strings.Repeat("x", events.MaxNameBytes+1)
	for _, c := range []struct {
		name, topic string
		ev          events.Event
		reason      string
	}{
		{"pod not UTF-8", "kv@\xff\xfe:1@" + testModel, good, RefuseInvalidPod},
		{"pod too long", "kv@" + long + "@" + testModel, good, RefuseInvalidPod},
		{"pod with a quote", "kv@1.2.3.4:5\"@" + testModel, good, RefuseInvalidPod},
		{"model not UTF-8", "kv@10.0.0.9:8000@sim\xff", good, RefuseInvalidModel},
		{"model too long", "kv@10.0.0.9:8000@" + long, good, RefuseInvalidModel},
		{"model with a newline", "kv@10.0.0.9:8000@a\nb", good, RefuseInvalidModel},
		{"lora not UTF-8", "kv@10.0.0.9:8000@" + testModel, withLoRA("\xc3("), RefuseInvalidLoRA},
		{"lora too long", "kv@10.0.0.9:8000@" + testModel, withLoRA(long), RefuseInvalidLoRA},
		{"lora with a control character", "kv@10.0.0.9:8000@" + testModel, withLoRA("a\x00b"), RefuseInvalidLoRA},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := testutil.ToFloat64(f.ix.metrics.refused.WithLabelValues(c.reason))
			err := f.apply(c.topic, c.ev)
			if !errors.Is(err, ErrRefused) || RefusedReason(err) != c.reason {
				t.Fatalf("Apply = %v; want a refusal for %s", err, c.reason)
			}
			if n := testutil.ToFloat64(f.ix.metrics.refused.WithLabelValues(c.reason)) - before; n != 1 {
				t.Fatalf("refusals counted: %v, want 1", n)
			}
		})
	}
	pods, err := f.ix.Pods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The pod of the refused LoRA batches exists (its own name is fine) but
	// holds nothing; no other pod was created.
	if len(pods) != 1 || pods[0].Name != "10.0.0.9:8000" || pods[0].Blocks != 0 {
		t.Fatalf("pods after refusals: %+v", pods)
	}
	f.ix.mu.RLock()
	models := len(f.ix.models)
	f.ix.mu.RUnlock()
	if models != 1 {
		t.Fatalf("%d models known, want only %q", models, testModel)
	}
	if got := f.match(Query{TokenIDs: a}); len(got) != 0 {
		t.Fatalf("a refused batch was applied: %+v", got)
	}
	if err := f.apply("kv@10.0.0.9:8000@"+testModel, withLoRA("sql-lora")); err != nil {
		t.Fatalf("a valid batch after the refusals: %v", err)
	}
	if got := f.match(Query{TokenIDs: a}); got["10.0.0.9:8000"].Blocks != 2 {
		t.Fatalf("valid batch not applied: %+v", got)
	}
}

// MaxPods, MaxModels and MaxLoRAs bound what events can make the indexer
// keep; the pods and models already known carry on.
func TestApplyLimits(t *testing.T) {
	f := newLimitedFleet(t, func(o *Options) { o.MaxPods, o.MaxModels, o.MaxLoRAs = 3, 2, 2 })
	a := tokens(0, 8)
	ev := f.stored(a, 0, 2, events.MediumGPU)
	for i := range 3 {
		if err := f.apply(fmt.Sprintf("kv@10.0.0.%d:8000@%s", i, testModel), ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.apply("kv@10.0.0.3:8000@"+testModel, ev); RefusedReason(err) != RefuseMaxPods {
		t.Fatalf("fourth pod: %v; want refused for max_pods", err)
	}
	if _, _, err := f.ix.AdmitPod(context.Background(), []byte("kv@10.0.0.4:8000@"+testModel), 0, Source{}); RefusedReason(err) != RefuseMaxPods {
		t.Fatalf("AdmitPod of a fourth pod: %v; want refused for max_pods", err)
	}
	if err := f.apply("kv@10.0.0.0:8000@"+testModel, ev); err != nil {
		t.Fatalf("a known pod refused: %v", err)
	}
	if err := f.ix.RemovePod(context.Background(), "10.0.0.2:8000"); err != nil {
		t.Fatal(err)
	}
	if err := f.apply("kv@10.0.0.3:8000@"+testModel, ev); err != nil {
		t.Fatalf("a pod after one left: %v", err)
	}

	f = newLimitedFleet(t, func(o *Options) { o.MaxModels, o.MaxLoRAs = 2, 2 })
	for i, want := range []string{"", "", RefuseMaxModels} {
		err := f.apply(fmt.Sprintf("kv@10.0.1.%d:8000@model-%d", i, i), ev)
		if RefusedReason(err) != want || (want == "") != (err == nil) {
			t.Fatalf("model %d: %v; want refusal %q", i, err, want)
		}
	}
	for i := range 4 {
		e := ev
		e.LoRAName = []byte(fmt.Sprintf("lora-%d", i))
		if err := f.apply("kv@10.0.1.0:8000@model-0", e); err != nil {
			t.Fatal(err)
		}
	}
	f.ix.loraMu.RLock()
	n := len(f.ix.loras)
	f.ix.loraMu.RUnlock()
	if n != 2 {
		t.Fatalf("%d adapters learned, want the limit 2", n)
	}
	if got := testutil.ToFloat64(f.ix.metrics.lorasUnlearned); got != 2 {
		t.Fatalf("adapters not learned: counted %v, want 2", got)
	}
}

// Pods and Stats hold the indexer's lock while they read each pod's; an
// Apply that learns a new adapter holds its pod's lock. Run together they
// must not wait on each other.
func TestPodsWhileLearningAdapters(t *testing.T) {
	st, err := memory.New(memory.Options{CapacityBlocks: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	opts := DefaultOptions()
	opts.Default = ModelOptions{HashScheme: "llmd", BlockSize: 4, KeyMode: KeyModeEngine}
	opts.MaxLoRAs = 1 << 20
	ix, err := New(st, opts, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				b := &events.Batch{Topic: fmt.Appendf(nil, "kv@10.0.0.%d:8000@m", g), Seq: uint64(i + 1), Events: []events.Event{{
					Kind: events.KindBlockStored, BlockHashes: []uint64{uint64(g<<32 | i)}, LoRAName: fmt.Appendf(nil, "lora-%d-%d", g, i),
				}}}
				if _, err := ix.Apply(ctx, b, Source{}); err != nil && ctx.Err() == nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				if _, err := ix.Pods(ctx); err != nil && ctx.Err() == nil {
					t.Error(err)
					return
				}
				_, _ = ix.Match(ctx, &Query{Model: "m", BlockHashes: []uint64{1, 2}})
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Apply, Pods and Match still running 18 s after they were told to stop: deadlocked")
	}
}

// FuzzApplyNames feeds Apply batches with any topic, rank and adapter
// name: it never panics, refuses a batch only with one of its reasons, and
// whatever it accepts has names that are valid labels.
func FuzzApplyNames(f *testing.F) {
	for _, s := range [][2]string{
		{"kv@127.0.0.1:8001@sim-model", ""}, {"kv@\xff\xfe:1@sim-model", "sql-lora"}, {"kv@127.0.0.1:1@sim\xff", "\xff"},
		{"kv@" + strings.Repeat("1", 300) + "@m", ""}, {"", ""}, {"kv@a@b@c", "a\x00b"}, {"other", "l"},
	} {
		f.Add([]byte(s[0]), 0, []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, topic []byte, rank int, lora []byte) {
		fl := newFleet(t, KeyModeEngine, "")
		b := &events.Batch{Topic: topic, Seq: 1, DPRank: rank, Events: []events.Event{{
			Kind: events.KindBlockStored, BlockHashes: []uint64{1, 2}, LoRAName: lora,
		}}}
		_, err := fl.ix.Apply(context.Background(), b, Source{Pod: "src:1", Model: "m"})
		switch RefusedReason(err) {
		case "":
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
		case RefuseInvalidPod, RefuseInvalidModel, RefuseInvalidLoRA:
			return
		default:
			t.Fatalf("Apply refused for %v", err)
		}
		pods, err := fl.ix.Pods(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods {
			if events.CheckLabel([]byte(p.Name)) != nil || events.CheckLabel([]byte(p.Model)) != nil {
				t.Fatalf("accepted pod %q of model %q", p.Name, p.Model)
			}
		}
	})
}
