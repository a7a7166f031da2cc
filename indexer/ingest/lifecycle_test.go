package ingest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixd/prefixd/events/transport"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/store"
	"github.com/prefixd/prefixd/store/memory"
)

// podStatus returns the indexer's status of pod.
func podStatus(t *testing.T, ix *indexer.Indexer, pod string) (indexer.PodStatus, bool) {
	t.Helper()
	pods, err := ix.Pods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if p.Name == pod {
			return p, true
		}
	}
	return indexer.PodStatus{}, false
}

// A batch delivered twice (a repeated message, a replay overlapping the
// live stream) is applied once and counted, not taken for a restart.
func TestDuplicateBatchIsDropped(t *testing.T) {
	msgs := readMessages(t, recordingA(t), srcA)
	var twice []transport.Message
	for _, m := range msgs {
		twice = append(twice, m, m)
	}
	ix := newIndexer(t)
	p := newPipeline(t, ix, nil, Options{})
	runAll(t, p, twice)
	if got, want := snapshot(t, ix), reference(t); got != want {
		t.Fatalf("index differs from replay's\ngot:\n%s\nwant:\n%s", got, want)
	}
	if n := counter(p.m.duplicates); n != float64(len(msgs)) {
		t.Errorf("%v duplicates counted, want %d", n, len(msgs))
	}
	if n := testutil.CollectAndCount(p.m.resets); n != 0 {
		t.Errorf("%d pods reset by duplicates", n)
	}
}

// closedOf is the notice of the connection msgs came on.
func closedOf(m transport.Message) transport.Message {
	return transport.Message{Source: m.Source, Peer: m.Peer, Closed: true}
}

// A pod whose connection closed is stale: what its publisher sent while
// disconnected is lost. Its next batch continuing the seq shows nothing
// was missed and clears the mark; a batch after a gap does not.
func TestClosedConnectionStaleUntilSeqContinues(t *testing.T) {
	msgs := readMessages(t, recordingA(t), srcA)
	var first, rest []transport.Message
	for _, m := range msgs {
		if podOf(m) == "127.0.0.1:8001" && seqOf(m) > 5 {
			rest = append(rest, m)
		} else {
			first = append(first, m)
		}
	}
	ix := newIndexer(t)
	p := newPipeline(t, ix, nil, Options{})
	in := make(chan transport.Message, len(msgs)+1)
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background(), in) }()
	for _, m := range first {
		in <- m
	}
	in <- closedOf(first[0])
	waitUntil(t, "every pod of the connection stale", func() bool {
		n := 0
		for _, pod := range []string{"127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"} {
			if st, ok := podStatus(t, ix, pod); ok && st.Stale {
				n++
			}
		}
		return n == 3
	})
	// 8001 continues at seq 6: nothing was missed.
	for _, m := range rest {
		in <- m
	}
	waitUntil(t, "8001 consistent again", func() bool {
		st, ok := podStatus(t, ix, "127.0.0.1:8001")
		return ok && !st.Stale && st.Seq == 10
	})
	if st, _ := podStatus(t, ix, "127.0.0.1:8002"); !st.Stale {
		t.Errorf("8002 sent nothing since its connection closed and is not stale: %+v", st)
	}
	close(in)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A pod whose connection closed and did not come back leaves the index
// after the pod timeout, with its blocks and series; a pod whose
// connection is open stays however long it is silent.
func TestPodTimeoutRemovesPods(t *testing.T) {
	msgs := readMessages(t, recordingA(t), srcA)
	ix := newIndexer(t)
	p := newPipeline(t, ix, nil, Options{PodTimeout: 50 * time.Millisecond})
	in := make(chan transport.Message, len(msgs)+2)
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background(), in) }()
	other := msgs[0]
	other.Peer, other.Source = "127.0.0.1:40001", "tcp://0.0.0.0:5557"
	other.Frames = [][]byte{[]byte("kv@127.0.0.1:9000@sim-model"), other.Frames[1], other.Frames[2]}
	for _, m := range append(slices.Clone(msgs), other) {
		in <- m
	}
	in <- closedOf(msgs[0])
	waitUntil(t, "the closed connection's pods gone", func() bool {
		pods := podNames(t, ix)
		return len(pods) == 1 && pods[0] == "127.0.0.1:9000"
	})
	if n := counter(p.m.podsRemoved.WithLabelValues(RemovedTimeout)); n != 3 {
		t.Errorf("%v pods removed by timeout, want 3", n)
	}
	if n := testutil.CollectAndCount(p.m.gaps) + testutil.CollectAndCount(p.m.resets); n != 0 {
		t.Errorf("%d series of removed pods left", n)
	}
	close(in)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The first batch of a pod without history (prefixd restarted, or came
// late) is a gap from the publisher's first seq: with a replay endpoint,
// the index ends as an uninterrupted run's; without one, the pod is stale.
func TestFirstBatchWithoutHistory(t *testing.T) {
	all := readMessages(t, recordingA(t), srcA)
	var late []transport.Message
	for _, m := range all {
		if seqOf(m) > 4 {
			late = append(late, m)
		}
	}
	ix := newIndexer(t)
	p := newPipeline(t, ix, &fakeReplayer{history: all}, Options{Sources: map[string]Source{srcA: {Replay: "tcp://127.0.0.1:5601"}}})
	runAll(t, p, late)
	if got, want := snapshot(t, ix), reference(t); got != want {
		t.Fatalf("after a late start with replay, the index differs from an uninterrupted run's\ngot:\n%s\nwant:\n%s", got, want)
	}

	ix = newIndexer(t)
	runAll(t, newPipeline(t, ix, nil, Options{}), late)
	for _, pod := range []string{"127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"} {
		if st, ok := podStatus(t, ix, pod); !ok || !st.Stale {
			t.Errorf("pod %s seen first at seq 5 without replay: %+v, want stale", pod, st)
		}
	}
}

// flakyStore fails the first Apply of every third seq of each pod: a
// networked store's lost connection, which no memory store has.
type flakyStore struct {
	store.Store
	mu     sync.Mutex // protects failed
	failed map[string]bool
}

var errFlaky = errors.New("test: store unavailable")

func (s *flakyStore) Apply(ctx context.Context, pod string, b *store.Batch) (store.Result, error) {
	key := fmt.Sprint(pod, "/", b.Seq)
	s.mu.Lock()
	fail := b.Seq%3 == 0 && !s.failed[key]
	if fail {
		s.failed[key] = true
	}
	s.mu.Unlock()
	if fail {
		return store.Result{}, errFlaky
	}
	return s.Store.Apply(ctx, pod, b)
}

// Store failures are gaps: each failed batch is applied again from the
// store's applied seq, by replay, and the index ends as an uninterrupted
// run's, no pod stale.
func TestStoreFailuresRepairedByReplay(t *testing.T) {
	all := readMessages(t, recordingA(t), srcA)
	mem, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fs := &flakyStore{Store: mem, failed: map[string]bool{}}
	ix, err := indexer.New(fs, indexer.DefaultOptions(), nil, quiet)
	if err != nil {
		t.Fatal(err)
	}
	p := newPipeline(t, ix, &fakeReplayer{history: all}, Options{Sources: map[string]Source{srcA: {Replay: "tcp://127.0.0.1:5601"}}})
	runAll(t, p, all)
	if got, want := snapshot(t, ix), reference(t); got != want {
		t.Fatalf("after store failures, the index differs from an uninterrupted run's\ngot:\n%s\nwant:\n%s", got, want)
	}
	if !strings.Contains(snapshot(t, ix), "stale false") || strings.Contains(snapshot(t, ix), "stale true") {
		t.Fatalf("a pod stale after repairs:\n%s", snapshot(t, ix))
	}
	if len(fs.failed) == 0 || counter(p.m.applyErrors.WithLabelValues("127.0.0.1:8001")) == 0 {
		t.Fatal("no store failure was injected")
	}
}
