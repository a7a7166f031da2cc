package ingest

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixd/prefixd/events/transport"
	"github.com/prefixd/prefixd/indexer"
)

const srcB = "tcp://127.0.0.1:5558"

// running starts p.Run over a channel the test feeds, until the test ends.
func running(t *testing.T, p *Pipeline, capacity int) chan<- transport.Message {
	t.Helper()
	in := make(chan transport.Message, capacity)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Run(context.Background(), in)
	}()
	t.Cleanup(func() {
		_ = p.Close()
		<-done
	})
	return in
}

// waitUntil polls cond until it holds.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, waitLimit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// holdWorkers keeps every worker of a running p busy until the returned
// function is called.
func holdWorkers(t *testing.T, p *Pipeline) (release func()) {
	t.Helper()
	var workers []*worker
	waitUntil(t, "Run started", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		workers = p.workers
		return len(workers) > 0
	})
	ch := make(chan struct{})
	for _, w := range workers {
		w.ctl <- func() { <-ch }
	}
	return func() { close(ch) }
}

func podNames(t *testing.T, ix *indexer.Indexer) []string {
	t.Helper()
	pods, err := ix.Pods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

func (p *Pipeline) isGone(source string) bool {
	p.srcMu.RLock()
	defer p.srcMu.RUnlock()
	_, gone := p.gone[source]
	return gone
}

// Pods reach the pipeline from two sources: A publishes 127.0.0.1:8001 on
// its topic and, without a topic, a pod named by the endpoint; B publishes
// 8002 and 8003. Removing A removes exactly A's pods, from the index and
// the metrics; A's messages still queued are dropped rather than bringing
// them back; A set again is taken as new.
func TestRemoveSourceForgetsItsPods(t *testing.T) {
	all := readMessages(t, recordingA(t), srcA)
	// Gaps on 8001 (A) and 8002 (B) give both sources per-pod series.
	all = withhold(withhold(all, "127.0.0.1:8001", 3), "127.0.0.1:8002", 5)
	var fromA, fromB []transport.Message
	for _, m := range all {
		if podOf(m) == "127.0.0.1:8001" {
			fromA = append(fromA, m,
				transport.Message{Source: srcA, Peer: m.Peer, Frames: [][]byte{{}, m.Frames[1], m.Frames[2]}})
			continue
		}
		m.Source = srcB
		fromB = append(fromB, m)
	}
	ix := newIndexer(t)
	p := newPipeline(t, ix, nil, Options{Workers: 3, DefaultModel: "sim-model",
		Sources: map[string]Source{srcA: {}, srcB: {}}})
	in := running(t, p, 2*len(all))
	for _, m := range append(slices.Clone(fromA), fromB...) {
		in <- m
	}
	n := len(fromA) + len(fromB)
	waitUntil(t, "every batch applied", func() bool { b, _ := p.Applied(); return b == uint64(n) })
	want := []string{"127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003", srcA}
	if got := podNames(t, ix); !slices.Equal(got, want) {
		t.Fatalf("pods %v, want %v", got, want)
	}
	if n := testutil.CollectAndCount(p.m.gaps); n != 3 { // 8001, srcA's (its copy), 8002
		t.Fatalf("%d gap series, want 3", n)
	}

	// A's stream again, as a restarted engine sends it, still queued when
	// A is removed: the workers reach it only after A is marked gone.
	release := holdWorkers(t, p)
	for _, m := range fromA {
		in <- m
	}
	type result struct {
		pods []string
		err  error
	}
	res := make(chan result, 1)
	go func() {
		pods, err := p.RemoveSource(context.Background(), srcA)
		res <- result{pods, err}
	}()
	waitUntil(t, "source marked gone", func() bool { return p.isGone(srcA) })
	release()
	r := <-res
	if r.err != nil || !slices.Equal(r.pods, []string{"127.0.0.1:8001", srcA}) {
		t.Fatalf("RemoveSource = %v, %v; want 8001 and %s", r.pods, r.err, srcA)
	}
	dropped := p.m.dropped.WithLabelValues(DropSourceRemoved, srcA)
	waitUntil(t, "queued messages dropped", func() bool { return counter(dropped) == float64(len(fromA)) })
	if b, _ := p.Applied(); b != uint64(n) {
		t.Errorf("%d batches applied, want %d: a message of the removed source was applied", b, n)
	}
	if got, want := podNames(t, ix), []string{"127.0.0.1:8002", "127.0.0.1:8003"}; !slices.Equal(got, want) {
		t.Errorf("pods after removal %v, want %v", got, want)
	}
	snap := snapshot(t, ix)
	if strings.Contains(snap, "8001") || strings.Contains(snap, srcA) || !strings.Contains(snap, "127.0.0.1:8002=") || !strings.Contains(snap, "127.0.0.1:8003=") {
		t.Errorf("queries after removal:\n%s", snap)
	}
	// A's pods' series are gone; B's stay.
	if n := testutil.CollectAndCount(p.m.gaps); n != 1 {
		t.Errorf("%d gap series, want 1 (8002's)", n)
	}
	if n := testutil.CollectAndCount(p.m.replays); n != 1 {
		t.Errorf("%d replay series, want 1 (8002's)", n)
	}

	// A comes back: its first batch starts a new pod, with no trace of the
	// old one's seq (a reset) or gap.
	p.SetSource(srcA, Source{})
	in <- fromA[0]
	waitUntil(t, "8001 back", func() bool { return slices.Contains(podNames(t, ix), "127.0.0.1:8001") })
	if seq, ok, _ := ix.AppliedSeq(context.Background(), "127.0.0.1:8001"); !ok || seq != 1 {
		t.Errorf("8001 at seq %d (%v), want 1", seq, ok)
	}
	if n := testutil.CollectAndCount(p.m.resets) + testutil.CollectAndCount(p.m.gaps); n != 1 {
		t.Errorf("%d reset and gap series, want 1 (8002's gap)", n)
	}
	if counter(dropped) != float64(len(fromA)) {
		t.Errorf("%v dropped after SetSource, want %d", counter(dropped), len(fromA))
	}
}

// RemoveSource before Run, after Close and with a done context returns at
// once.
func TestRemoveSourceDoesNotBlock(t *testing.T) {
	ctx := context.Background()
	msgs := readMessages(t, recordingA(t), srcA)

	// Before Run: nothing to forget, and the source's messages are dropped.
	ix := newIndexer(t)
	p := newPipeline(t, ix, nil, Options{})
	if pods, err := p.RemoveSource(ctx, srcA); err != nil || len(pods) != 0 {
		t.Fatalf("before Run: %v, %v", pods, err)
	}
	runAll(t, p, msgs)
	if n := counter(p.m.dropped.WithLabelValues(DropSourceRemoved, srcA)); n != float64(len(msgs)) {
		t.Errorf("%v dropped, want %d", n, len(msgs))
	}
	if names := podNames(t, ix); len(names) != 0 {
		t.Errorf("pods %v of a removed source", names)
	}

	// After Run has returned.
	p = newPipeline(t, newIndexer(t), nil, Options{})
	runAll(t, p, msgs)
	_ = p.Close()
	if _, err := p.RemoveSource(ctx, srcA); err != nil {
		t.Errorf("after Close: %v", err)
	}

	// With a context that ends while the workers are busy.
	p = newPipeline(t, newIndexer(t), nil, Options{Workers: 2})
	running(t, p, 1)
	release := holdWorkers(t, p)
	defer release()
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := p.RemoveSource(cctx, srcA); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v, want context.Canceled", err)
	}
}

// prefixd_ingest_dropped_total is registered by the subscriber and the
// pipeline alike, in either order, on one registry.
func TestDroppedSharedWithTransport(t *testing.T) {
	for _, pipelineFirst := range []bool{false, true} {
		reg := prometheus.NewRegistry()
		var m *Metrics
		if pipelineFirst {
			m = NewMetrics(reg)
			transport.NewMetrics(reg)
		} else {
			transport.NewMetrics(reg)
			m = NewMetrics(reg)
		}
		m.dropped.WithLabelValues(DropSourceRemoved, srcA).Inc()
		n, err := testutil.GatherAndCount(reg, "prefixd_ingest_dropped_total")
		if err != nil || n != 1 {
			t.Errorf("pipeline first %v: %d series, %v", pipelineFirst, n, err)
		}
	}
}
