package ingest

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/events/transport"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/testutil/zmqpub"
)

// Tests against real libzmq publishers (scripts/zmqpub.py).

var podsA = []string{"127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"}

// live is a Subscriber feeding a running Pipeline; both stop when the test
// ends.
type live struct {
	sub *transport.Subscriber
	p   *Pipeline
	ix  *indexer.Indexer
}

func startLive(t *testing.T, opts Options) *live {
	t.Helper()
	zmqpub.Require(t)
	o := transport.DefaultOptions()
	o.MinBackoff = 10 * time.Millisecond
	o.MaxBackoff = 200 * time.Millisecond
	o.Logger = quiet
	sub, err := transport.NewSubscriber(o, transport.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	ix := newIndexer(t)
	p := newPipeline(t, ix, sub, opts)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Run(context.Background(), sub.Messages())
	}()
	t.Cleanup(func() {
		_ = sub.Close()
		<-done
	})
	return &live{sub: sub, p: p, ix: ix}
}

func (l *live) bind(t *testing.T) string {
	t.Helper()
	ep, err := l.sub.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ep
}

// waitBatches waits until n batches have been applied.
func (l *live) waitBatches(t *testing.T, n float64) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for counter(l.p.m.batches) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%v of %v batches applied within %v", counter(l.p.m.batches), n, waitLimit)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := counter(l.p.m.batches); got != n {
		t.Fatalf("%v batches applied, want %v", got, n)
	}
}

// The publisher is killed (kill -9: what it would have published next is
// lost): its pods are stale at once. A new one sends the recording again
// from seq 1, as a restarted engine does: every pod is reset once,
// rebuilt, and consistent again.
func TestLiveRestartResets(t *testing.T) {
	want := reference(t)
	l := startLive(t, Options{})
	ep := l.bind(t)
	for i := range 2 {
		pub := zmqpub.Start(t)
		pub.Connect(ep)
		pub.WaitSubscribed()
		if n := pub.SendFile(recordingA(t)); n != 34 {
			t.Fatalf("sent %d", n)
		}
		l.waitBatches(t, float64(34*(i+1)))
		if got := snapshot(t, l.ix); got != want {
			t.Errorf("publisher %d: index differs\ngot:\n%s\nwant:\n%s", i, got, want)
		}
		pub.Kill()
		waitUntil(t, "the killed publisher's pods stale", func() bool {
			return strings.Count(snapshot(t, l.ix), "stale true") == len(podsA)
		})
	}
	for _, pod := range podsA {
		if n := counter(l.p.m.resets.WithLabelValues(pod)); n != 1 {
			t.Errorf("pod %s: %v resets, want 1", pod, n)
		}
	}
}

// Withheld seqs are fetched from the publisher's replay endpoint, with
// replies carrying the topic: the index ends as the full recording's.
func TestLiveGapRepairedFromReplay(t *testing.T) {
	want := reference(t)
	pub := zmqpub.Start(t)
	pubEP := pub.Bind("tcp://127.0.0.1:0")
	replayEP := pub.ReplayBind("tcp://127.0.0.1:0", zmqpub.ShapeTopic)
	pub.Skip(3, 4, 9)
	l := startLive(t, Options{Sources: map[string]Source{pubEP: {Replay: replayEP}}})
	if err := l.sub.Connect(pubEP); err != nil {
		t.Fatal(err)
	}
	pub.WaitSubscribed()
	if n := pub.SendFile(recordingA(t)); n != 34-9 {
		t.Fatalf("sent %d, want %d", n, 34-9)
	}
	l.waitBatches(t, 34)
	if got := snapshot(t, l.ix); got != want {
		t.Errorf("repaired index differs\ngot:\n%s\nwant:\n%s", got, want)
	}
	for _, pod := range podsA {
		// seqs 3-4 and 9 are two gaps; 8001's last seq is 10.
		if n := counter(l.p.m.replays.WithLabelValues(pod, ReplayOK)); n != 2 {
			t.Errorf("pod %s: %v ok replays, want 2", pod, n)
		}
	}
}

// onePod writes the messages of one pod of a JSONL recording to a file of
// its own.
func onePod(t *testing.T, path, pod string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := filepath.Join(t.TempDir(), "one-pod.jsonl")
	w, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	n := 0
	for sc.Scan() {
		var rec struct {
			Topic string `json:"topic"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Topic == "kv@"+pod+"@sim-model" {
			n++
			if _, err := w.Write(append(sc.Bytes(), '\n')); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := sc.Err(); err != nil || n == 0 {
		t.Fatalf("%d messages of %s: %v", n, pod, err)
	}
	return out
}

// Replies without a topic frame (vLLM <= 0.25) repair the pod whose gap
// asked for them.
func TestLiveGapRepairedFromTopiclessReplay(t *testing.T) {
	path := onePod(t, recordingA(t), "127.0.0.1:8003")
	want := referenceOf(t, path)
	pub := zmqpub.Start(t)
	pubEP := pub.Bind("tcp://127.0.0.1:0")
	replayEP := pub.ReplayBind("tcp://127.0.0.1:0", zmqpub.ShapeNoTopic)
	pub.Skip(2, 7, 8)
	l := startLive(t, Options{Sources: map[string]Source{pubEP: {Replay: replayEP}}})
	if err := l.sub.Connect(pubEP); err != nil {
		t.Fatal(err)
	}
	pub.WaitSubscribed()
	if n := pub.SendFile(path); n != 13-3 {
		t.Fatalf("sent %d, want 10", n)
	}
	l.waitBatches(t, 13)
	if got := snapshot(t, l.ix); got != want {
		t.Errorf("repaired index differs\ngot:\n%s\nwant:\n%s", got, want)
	}
	if n := counter(l.p.m.replays.WithLabelValues("127.0.0.1:8003", ReplayOK)); n != 2 {
		t.Errorf("%v ok replays, want 2", n)
	}
}

// Without a replay endpoint a gap leaves the pod stale, counted.
func TestLiveGapWithoutReplayIsStale(t *testing.T) {
	l := startLive(t, Options{})
	ep := l.bind(t)
	pub := zmqpub.Start(t)
	pub.Skip(5)
	pub.Connect(ep)
	pub.WaitSubscribed()
	if n := pub.SendFile(recordingA(t)); n != 31 {
		t.Fatalf("sent %d, want 31", n)
	}
	l.waitBatches(t, 31)
	pods, err := l.ix.Pods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 3 {
		t.Fatalf("%d pods", len(pods))
	}
	for _, p := range pods {
		if !p.Stale {
			t.Errorf("pod %s not stale", p.Name)
		}
		if n := counter(l.p.m.gaps.WithLabelValues(p.Name)); n != 1 {
			t.Errorf("pod %s: %v gaps, want 1", p.Name, n)
		}
		if n := counter(l.p.m.replays.WithLabelValues(p.Name, ReplayUnavailable)); n != 1 {
			t.Errorf("pod %s: %v unavailable replays, want 1", p.Name, n)
		}
	}
}
