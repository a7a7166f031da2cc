package ingest

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/prefixd/prefixd/events/recording"
	"github.com/prefixd/prefixd/events/transport"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/tokenize"
	"github.com/prefixd/prefixd/internal/fixture"
	"github.com/prefixd/prefixd/store/memory"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitLimit bounds every wait. Reaching it means the behaviour is missing,
// not slow.
const waitLimit = 20 * time.Second

var quiet = slog.New(slog.DiscardHandler)

// newIndexer returns an indexer over a memory store with the defaults (the
// llm-d chain, seed "", which recording a was made with).
func newIndexer(t testing.TB) *indexer.Indexer {
	t.Helper()
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ix, err := indexer.New(st, indexer.DefaultOptions(), nil, quiet)
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

// recordingA returns the path of recording a's live stream.
func recordingA(t testing.TB) string {
	t.Helper()
	return fixture.Path(t, "a_array_random_seedless", "events.jsonl")
}

// readMessages reads a recording as the transport would deliver it, from
// source src.
func readMessages(t testing.TB, path, src string) []transport.Message {
	t.Helper()
	msgs, err := recording.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]transport.Message, len(msgs))
	for i, m := range msgs {
		out[i] = transport.Message{Source: src, Peer: "127.0.0.1:40000", RecvTime: m.RecvTime, Frames: m.Frames}
	}
	return out
}

func seqOf(m transport.Message) uint64 { return binary.BigEndian.Uint64(m.Frames[1]) }

func podOf(m transport.Message) string {
	return strings.Split(string(m.Frames[0]), "@")[1]
}

// snapshot describes an index: each pod's block count, seq and stale flag,
// then for each recorded request the blocks each pod matches.
func snapshot(t testing.TB, ix *indexer.Indexer) string {
	t.Helper()
	return snapshotWith(t, ix, fixture.Path(t, "a_array_random_seedless", "requests.jsonl"))
}

// snapshotWith is snapshot with the requests of another recording.
func snapshotWith(t testing.TB, ix *indexer.Indexer, requests string) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	pods, err := ix.Pods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		fmt.Fprintf(&b, "pod %s model %s blocks %d seq %d stale %v\n", p.Name, p.Model, p.Blocks, p.Seq, p.Stale)
	}
	f, err := os.Open(requests)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var line struct {
			Request json.RawMessage `json:"request"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		req, err := tokenize.ParseChat(line.Request)
		if err != nil {
			t.Fatal(err)
		}
		res, err := ix.Match(ctx, &indexer.Query{Model: req.Model, Messages: req.Messages})
		if err != nil {
			t.Fatal(err)
		}
		var parts []string
		for _, p := range res.Pods {
			parts = append(parts, fmt.Sprintf("%s=%d", p.Pod, p.Blocks))
		}
		slices.Sort(parts)
		fmt.Fprintf(&b, "query %d: %s\n", res.TotalBlocks, strings.Join(parts, " "))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// reference is the snapshot of recording a applied as `prefixd replay`
// applies it.
func reference(t testing.TB) string {
	t.Helper()
	return referenceOf(t, recordingA(t))
}

// referenceOf is the snapshot of a recording applied as `prefixd replay`
// applies it.
func referenceOf(t testing.TB, path string) string {
	t.Helper()
	rec, err := indexer.ReadRecordings([]string{path}, "default")
	if err != nil {
		t.Fatal(err)
	}
	ix := newIndexer(t)
	if _, err := ix.ApplyRecorded(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	return snapshot(t, ix)
}

// fakeReplayer serves a message history as a publisher's replay endpoint
// does: every batch with seq >= start, of every topic, in publish order.
type fakeReplayer struct {
	history []transport.Message
	noTopic bool
	err     error
}

func (f *fakeReplayer) Replay(ctx context.Context, endpoint string, start uint64, fn transport.ReplayFunc) error {
	if f.err != nil {
		return f.err
	}
	for _, m := range f.history {
		if seqOf(m) < start {
			continue
		}
		topic := m.Frames[0]
		if f.noTopic {
			topic = nil
		}
		if err := fn(seqOf(m), topic, m.Frames[2]); err != nil {
			return err
		}
	}
	return nil
}

// runAll runs p over msgs and returns once every message is applied.
func runAll(t testing.TB, p *Pipeline, msgs []transport.Message) {
	t.Helper()
	in := make(chan transport.Message, len(msgs))
	for _, m := range msgs {
		in <- m
	}
	close(in)
	if err := p.Run(context.Background(), in); err != nil {
		t.Fatal(err)
	}
}

func newPipeline(t testing.TB, ix *indexer.Indexer, rp Replayer, opts Options) *Pipeline {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	p, err := New(ix, rp, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// counter returns the value of a counter.
func counter(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }
