package ingest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/events/transport"
)

const srcA = "tcp://127.0.0.1:5557"

// Recording a, applied live, gives the index `prefixd replay` builds from
// the same file.
func TestInOrderEqualsReplay(t *testing.T) {
	want := reference(t)
	if !strings.Contains(want, "pod 127.0.0.1:8001 model sim-model blocks 64 seq 10 ") {
		t.Fatalf("reference unexpected:\n%s", want)
	}
	for _, workers := range []int{1, 3, 8} {
		ix := newIndexer(t)
		p := newPipeline(t, ix, nil, Options{Workers: workers, WorkerQueue: 2})
		runAll(t, p, readMessages(t, recordingA(t), srcA))
		if got := snapshot(t, ix); got != want {
			t.Errorf("workers %d: index differs from replay's\ngot:\n%s\nwant:\n%s", workers, got, want)
		}
		if n := counter(p.m.batches); n != 34 {
			t.Errorf("workers %d: %v batches applied, want 34", workers, n)
		}
	}
}

// The stream sent twice: the second pass starts every pod at seq 1 again,
// as a restarted engine does, so each pod is reset once and rebuilt.
func TestSeqBackwardsResets(t *testing.T) {
	want := reference(t)
	msgs := readMessages(t, recordingA(t), srcA)
	ix := newIndexer(t)
	p := newPipeline(t, ix, nil, Options{})
	runAll(t, p, append(append([]transport.Message(nil), msgs...), msgs...))
	if got := snapshot(t, ix); got != want {
		t.Errorf("index after restart differs\ngot:\n%s\nwant:\n%s", got, want)
	}
	for _, pod := range []string{"127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"} {
		if n := counter(p.m.resets.WithLabelValues(pod)); n != 1 {
			t.Errorf("pod %s: %v resets, want 1", pod, n)
		}
		if n := counter(p.m.gaps.WithLabelValues(pod)); n != 0 {
			t.Errorf("pod %s: %v gaps, want 0", pod, n)
		}
	}
}

// withhold drops the messages of pod with these seqs.
func withhold(msgs []transport.Message, pod string, seqs ...uint64) []transport.Message {
	var out []transport.Message
	for _, m := range msgs {
		skip := false
		for _, s := range seqs {
			skip = skip || (podOf(m) == pod && seqOf(m) == s)
		}
		if !skip {
			out = append(out, m)
		}
	}
	return out
}

func TestGapRepairedFromReplay(t *testing.T) {
	want := reference(t)
	all := readMessages(t, recordingA(t), srcA)
	live := withhold(withhold(all, "127.0.0.1:8001", 3, 4), "127.0.0.1:8002", 7)
	for _, noTopic := range []bool{false, true} {
		rp := &fakeReplayer{history: all, noTopic: noTopic}
		if noTopic {
			// Replies without topics can only be one pod's: serve 8001's.
			rp.history = nil
			for _, m := range all {
				if podOf(m) == "127.0.0.1:8001" {
					rp.history = append(rp.history, m)
				}
			}
			live = withhold(all, "127.0.0.1:8001", 3, 4)
		}
		ix := newIndexer(t)
		p := newPipeline(t, ix, rp, Options{Sources: map[string]Source{srcA: {Replay: "tcp://127.0.0.1:5601"}}})
		runAll(t, p, live)
		if got := snapshot(t, ix); got != want {
			t.Errorf("noTopic %v: repaired index differs\ngot:\n%s\nwant:\n%s", noTopic, got, want)
		}
		if n := counter(p.m.gaps.WithLabelValues("127.0.0.1:8001")); n != 1 {
			t.Errorf("noTopic %v: %v gaps on 8001, want 1", noTopic, n)
		}
		if n := counter(p.m.replays.WithLabelValues("127.0.0.1:8001", ReplayOK)); n != 1 {
			t.Errorf("noTopic %v: %v ok replays on 8001, want 1", noTopic, n)
		}
	}
}

func TestGapWithoutReplayMarksStale(t *testing.T) {
	all := readMessages(t, recordingA(t), srcA)
	live := withhold(all, "127.0.0.1:8002", 5)
	cases := []struct {
		name   string
		rp     Replayer
		result string
	}{
		{"no endpoint", nil, ReplayUnavailable},
		{"replay fails", &fakeReplayer{err: errors.New("connection refused")}, ReplayError},
		{"replay lacks the batch", &fakeReplayer{history: withhold(all, "127.0.0.1:8002", 5)}, ReplayIncomplete},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ix := newIndexer(t)
			opts := Options{}
			if c.rp != nil {
				opts.Replay = map[string]string{"127.0.0.1:8002": "tcp://127.0.0.1:5602"}
			}
			p := newPipeline(t, ix, c.rp, opts)
			runAll(t, p, live)
			pods, err := ix.Pods(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, ps := range pods {
				if stale := ps.Name == "127.0.0.1:8002"; ps.Stale != stale {
					t.Errorf("pod %s stale %v, want %v", ps.Name, ps.Stale, stale)
				}
			}
			if n := counter(p.m.replays.WithLabelValues("127.0.0.1:8002", c.result)); n != 1 {
				t.Errorf("%v replays with result %s, want 1", n, c.result)
			}
			if n := counter(p.m.gaps.WithLabelValues("127.0.0.1:8002")); n != 1 {
				t.Errorf("%v gaps, want 1", n)
			}
		})
	}
}

// A reset makes a stale pod consistent again.
func TestResetClearsStale(t *testing.T) {
	all := readMessages(t, recordingA(t), srcA)
	ix := newIndexer(t)
	p := newPipeline(t, ix, nil, Options{})
	runAll(t, p, append(withhold(all, "127.0.0.1:8003", 2), all...))
	pods, err := ix.Pods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, ps := range pods {
		if ps.Stale {
			t.Errorf("pod %s still stale after a reset", ps.Name)
		}
	}
}

// Resync on a message whose seq is contiguous is still handled as a gap:
// without a replay endpoint the pod is marked stale; with one it is
// repaired (nothing is missing) and stays consistent.
func TestResyncIsAGap(t *testing.T) {
	all := readMessages(t, recordingA(t), srcA)
	for _, withReplay := range []bool{false, true} {
		msgs := append([]transport.Message(nil), all...)
		for i := range msgs {
			if podOf(msgs[i]) == "127.0.0.1:8001" && seqOf(msgs[i]) == 6 {
				msgs[i].Resync = true
			}
		}
		ix := newIndexer(t)
		var rp Replayer
		opts := Options{}
		if withReplay {
			rp = &fakeReplayer{history: all}
			opts.Sources = map[string]Source{srcA: {Replay: "tcp://127.0.0.1:5601"}}
		}
		p := newPipeline(t, ix, rp, opts)
		runAll(t, p, msgs)
		pods, err := ix.Pods(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, ps := range pods {
			if stale := ps.Name == "127.0.0.1:8001" && !withReplay; ps.Stale != stale {
				t.Errorf("replay %v: pod %s stale %v, want %v", withReplay, ps.Name, ps.Stale, stale)
			}
		}
		if n := counter(p.m.gaps.WithLabelValues("127.0.0.1:8001")); n != 1 {
			t.Errorf("replay %v: %v gaps, want 1", withReplay, n)
		}
	}
}

func TestDecodeErrorsAreCounted(t *testing.T) {
	all := readMessages(t, recordingA(t), srcA)
	bad := []transport.Message{
		{Source: "tcp://bad:1", Frames: [][]byte{[]byte("kv@x:1@m")}},
		{Source: "tcp://bad:1", Frames: [][]byte{[]byte("kv@x:1@m"), {1, 2}, {0x93}}},
		{Source: "tcp://bad:1", Frames: [][]byte{[]byte("kv@x:1@m"), {0, 0, 0, 0, 0, 0, 0, 1}, {0x93, 0xcb}}},
		{Source: "tcp://bad:1", Frames: [][]byte{{}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, {}}},
	}
	msgs := append(append([]transport.Message(nil), bad...), all...)
	ix := newIndexer(t)
	p := newPipeline(t, ix, nil, Options{})
	runAll(t, p, msgs)
	if n := counter(p.m.decodeErrors.WithLabelValues("tcp://bad:1")); n != float64(len(bad)) {
		t.Errorf("%v decode errors, want %d", n, len(bad))
	}
	if got, want := snapshot(t, ix), reference(t); got != want {
		t.Errorf("bad messages changed the index\ngot:\n%s\nwant:\n%s", got, want)
	}
}

// Publishers without a kv@ topic are named by their configured Source, by
// the endpoint connected to, or by their peer address.
func TestTopiclessSourcesAreNamed(t *testing.T) {
	all := readMessages(t, recordingA(t), srcA)
	var msgs []transport.Message
	for _, m := range all {
		if podOf(m) != "127.0.0.1:8001" {
			continue
		}
		for _, src := range []struct{ source, peer string }{
			{"tcp://10.0.0.1:5557", "10.0.0.1:5557"},
			{"tcp://10.0.0.2:5557", "10.0.0.2:5557"},
			{"tcp://0.0.0.0:5557", "10.0.0.3:41234"},
		} {
			msgs = append(msgs, transport.Message{Source: src.source, Peer: src.peer,
				Frames: [][]byte{{}, m.Frames[1], m.Frames[2]}})
		}
	}
	ix := newIndexer(t)
	p := newPipeline(t, ix, nil, Options{DefaultModel: "sim-model", Sources: map[string]Source{
		"tcp://10.0.0.1:5557": {Name: "vllm-0"},
		"tcp://10.0.0.2:5557": {},
	}})
	runAll(t, p, msgs)
	pods, err := ix.Pods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ps := range pods {
		names = append(names, ps.Name)
		if ps.Blocks != 64 || ps.Seq != 10 || ps.Model != "sim-model" {
			t.Errorf("pod %+v, want 64 blocks at seq 10 of sim-model", ps)
		}
	}
	if got := strings.Join(names, " "); got != "10.0.0.3:41234 tcp://10.0.0.2:5557 vllm-0" {
		t.Errorf("pods %s", got)
	}
}

func TestRunAndClose(t *testing.T) {
	ix := newIndexer(t)
	p := newPipeline(t, ix, nil, Options{})
	if err := p.Close(); err != nil { // before Run: Run then returns at once
		t.Fatal(err)
	}
	in := make(chan transport.Message)
	if err := p.Run(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	if err := p.Run(context.Background(), in); !errors.Is(err, ErrRunning) {
		t.Fatalf("second Run: %v", err)
	}

	// Close while Run waits for input.
	p = newPipeline(t, ix, nil, Options{})
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background(), in) }()
	_ = p.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Cancel while Run waits for input.
	p = newPipeline(t, ix, nil, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- p.Run(ctx, in) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestOptionsValidate(t *testing.T) {
	if err := (Options{Workers: -1, WorkerQueue: -2}).Validate(); err == nil ||
		!strings.Contains(err.Error(), "workers") || !strings.Contains(err.Error(), "worker queue") {
		t.Errorf("Validate: %v", err)
	}
	if _, err := New(nil, nil, Options{}, nil); err == nil {
		t.Error("New accepted a nil indexer")
	}
}
