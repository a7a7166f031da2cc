package indexer

import (
	"context"
	"fmt"
	"maps"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/internal/fixture"
	"github.com/prefixd/prefixd/internal/fixture/derive"
	"github.com/prefixd/prefixd/store/memory"
)

// replayAnswers applies the recording files to a new memory indexer and
// returns, for every recorded request of dir, each pod's matched blocks,
// and the pods' block counts.
func replayAnswers(t *testing.T, dir string, files []string, mo ModelOptions) (answers []map[string]int, counts map[string]int, m *Metrics) {
	t.Helper()
	rec, err := ReadRecordings(files, "sim-model")
	if err != nil {
		t.Fatal(err)
	}
	st, err := memory.New(memory.Options{CapacityBlocks: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	opts := DefaultOptions()
	opts.Default = mo
	m = NewMetrics(nil)
	ix, err := New(st, opts, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ix.ApplyRecorded(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	for _, req := range readRequests(t, dir) {
		res, err := ix.Match(context.Background(), &Query{Model: req.Model, Messages: req.Messages})
		if err != nil {
			t.Fatal(err)
		}
		a := map[string]int{}
		for _, pm := range res.Pods {
			a[pm.Pod] = pm.Blocks
		}
		answers = append(answers, a)
	}
	return answers, podCounts(t, st), m
}

// Every derived form of every recording answers every recorded request
// exactly as the original does, in each key mode.
func TestDerivedFormsAnswerAsOriginals(t *testing.T) {
	hits := 0
	defer func() {
		if hits == 0 {
			t.Error("no request matched in any original: the comparison proves nothing")
		}
	}()
	for _, dir := range fixture.Recordings {
		files := recordingFiles(t, dir)
		base := ModelOptions{HashScheme: "llmd", HashSeed: seedOf(t, dir), BlockSize: 16}
		for _, mode := range []KeyMode{KeyModeEngine, KeyModeTokens, KeyModeAuto} {
			mo := base
			mo.KeyMode = mode
			want, wantCounts, _ := replayAnswers(t, dir, files, mo)
			for _, a := range want {
				hits += len(a)
			}
			for _, f := range derive.Forms {
				t.Run(fmt.Sprintf("%s/%s/%s", dir, mode, f.Name), func(t *testing.T) {
					tmp := t.TempDir()
					var derived []string
					for _, path := range files {
						derived = append(derived, derive.File(t, path, f, tmp))
					}
					got, counts, _ := replayAnswers(t, dir, derived, mo)
					if !maps.Equal(counts, wantCounts) {
						t.Errorf("pods' blocks %v, original %v", counts, wantCounts)
					}
					for i := range want {
						if !maps.Equal(got[i], want[i]) {
							t.Errorf("request %d: %v, original %v", i, got[i], want[i])
						}
					}
				})
			}
		}
	}
}

// The metrics of a hybrid fleet say what was indexed and what was skipped,
// per pod and kind.
func TestHybridMetrics(t *testing.T) {
	const dir = "a_array_random_seedless"
	files := recordingFiles(t, dir)
	tmp := t.TempDir()
	var derived []string
	for _, path := range files {
		derived = append(derived, derive.File(t, path, derive.Find(t, "hybrid-multi"), tmp))
	}
	_, counts, m := replayAnswers(t, dir, derived, ModelOptions{HashScheme: "llmd", BlockSize: 16, KeyMode: KeyModeAuto})
	for pod := range counts {
		fa := testutil.ToFloat64(m.storedBlocks.WithLabelValues(pod, "full_attention", "indexed"))
		second := testutil.ToFloat64(m.storedBlocks.WithLabelValues(pod, "full_attention", "skipped"))
		sw := testutil.ToFloat64(m.storedBlocks.WithLabelValues(pod, "sliding_window", "skipped"))
		mb := testutil.ToFloat64(m.storedBlocks.WithLabelValues(pod, "mamba", "skipped"))
		if fa == 0 || second != fa || sw != fa || mb != fa {
			t.Errorf("pod %s: full attention indexed %v, skipped %v; sliding window skipped %v; mamba skipped %v", pod, fa, second, sw, mb)
		}
		if n := testutil.ToFloat64(m.storedBlocks.WithLabelValues(pod, "sliding_window", "indexed")); n != 0 {
			t.Errorf("pod %s: %v sliding-window blocks indexed", pod, n)
		}
		for kind, want := range map[string]float64{"full_attention": 2, "sliding_window": 1, "mamba": 1} {
			if n := testutil.ToFloat64(m.groups.WithLabelValues(pod, kind)); n != want {
				t.Errorf("pod %s: %v groups of kind %s, want %v", pod, n, kind, want)
			}
		}
	}
	for reason, min := range map[string]float64{"kind": 1, "secondary_group": 1, "unknown_group": 1} {
		if n := testutil.ToFloat64(m.skipped.WithLabelValues(reason)); n < min {
			t.Errorf("blocks skipped for %s: %v", reason, n)
		}
	}
	if n := testutil.ToFloat64(m.hashChecks.WithLabelValues("sim-model", "mismatch")); n != 0 {
		t.Errorf("%v hash check mismatches: the skipped groups were checked", n)
	}
}

// Names of unknown event types and fields become labels only when valid,
// and only so many of them.
func TestSkippedNamesBounded(t *testing.T) {
	var s skippedNames
	if got := s.label([]byte("kv@\xff")); got != "invalid" {
		t.Errorf("invalid UTF-8 name labelled %q", got)
	}
	if got := s.label([]byte(events.NoTypeName)); got != "no_type" {
		t.Errorf("no type labelled %q", got)
	}
	for i := range maxSkippedNames {
		if got, want := s.label(fmt.Appendf(nil, "Future%d", i)), fmt.Sprintf("Future%d", i); got != want {
			t.Fatalf("label %q, want %q", got, want)
		}
	}
	if got := s.label([]byte("OneTooMany")); got != "other" {
		t.Errorf("name past the bound labelled %q", got)
	}
	if got := s.label([]byte("Future3")); got != "Future3" {
		t.Errorf("known name labelled %q", got)
	}
}
