package ingest

import (
	"context"
	"encoding/binary"
	"path/filepath"
	"testing"

	"github.com/prefixd/prefixd/events/recording"
	"github.com/prefixd/prefixd/events/transport"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/fixture"
)

// replayFiles serves each endpoint from a recorded replay reply.
type replayFiles map[string][]recording.Message

func (r replayFiles) Replay(ctx context.Context, endpoint string, start uint64, fn transport.ReplayFunc) error {
	for _, m := range r[endpoint] {
		s := binary.BigEndian.Uint64(m.Seq)
		if s < start {
			continue
		}
		if err := fn(s, m.Topic, m.Payload); err != nil {
			return err
		}
	}
	return nil
}

func readReplay(t *testing.T, path string) []recording.Message {
	t.Helper()
	msgs, err := recording.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

// Recording c: a data-parallel sim whose two ranks publish on their own
// topics and seqs, seen by a subscriber that came late and was down for a
// while. Each rank is a pod named by its topic (127.0.0.1:8001 and
// 127.0.0.1:8002, the ports the ranks serve on). What came before the
// first batch seen, and the outage's gaps, are repaired from the ranks'
// replay endpoints (their recorded replies): the index ends as the
// complete streams'.
func TestDataParallelOutageRepaired(t *testing.T) {
	dir := fixture.Path(t, "c_dp2_late_subscriber_restart")
	var live []transport.Message
	for _, f := range []string{"events-rank0-part1.jsonl", "events-rank0-part2.jsonl", "events-rank1-part1.jsonl", "events-rank1-part2.jsonl"} {
		src := "tcp://127.0.0.1:5557"
		if f[len("events-rank")] == '1' {
			src = "tcp://127.0.0.1:5558"
		}
		live = append(live, readMessages(t, filepath.Join(dir, f), src)...)
	}
	rp := replayFiles{
		"tcp://127.0.0.1:5601": readReplay(t, filepath.Join(dir, "replay-rank0-from-0.jsonl")),
		"tcp://127.0.0.1:5602": readReplay(t, filepath.Join(dir, "replay-rank1-from-0.jsonl")),
	}
	ix := newIndexer(t)
	p := newPipeline(t, ix, rp, Options{Replay: map[string]string{
		"127.0.0.1:8001": "tcp://127.0.0.1:5601",
		"127.0.0.1:8002": "tcp://127.0.0.1:5602",
	}})
	runAll(t, p, live)

	// The reference: the complete streams.
	rec, err := indexer.ReadRecordings([]string{
		filepath.Join(dir, "replay-rank0-from-0.jsonl"), filepath.Join(dir, "replay-rank1-from-0.jsonl"),
	}, "default")
	if err != nil {
		t.Fatal(err)
	}
	pods := []string{"127.0.0.1:8001", "127.0.0.1:8002"}
	if len(rec.Pods) != len(pods) {
		t.Fatalf("pods %v", rec.Pods)
	}
	ref := newIndexer(t)
	if _, err := ref.ApplyRecorded(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	requests := filepath.Join(dir, "requests-3.jsonl")
	got, want := snapshotWith(t, ix, requests), snapshotWith(t, ref, requests)
	if got != want {
		t.Errorf("repaired index differs\ngot:\n%s\nwant:\n%s", got, want)
	}
	for _, pod := range pods {
		// Before the first batch seen, and the outage.
		if n := counter(p.m.replays.WithLabelValues(pod, ReplayOK)); n != 2 {
			t.Errorf("pod %s: %v ok replays, want 2", pod, n)
		}
	}
}
