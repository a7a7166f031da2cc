package main

import (
	"strings"
	"testing"

	"github.com/prefixd/prefixd/events/recording"
	"github.com/prefixd/prefixd/internal/fixture"
	"github.com/prefixd/prefixd/internal/fixture/derive"
	"github.com/prefixd/prefixd/testutil/zmqpub"
)

// replayQuery runs prefixd replay of files with the recorded requests of
// recording a and returns one answer per request.
func replayQuery(t *testing.T, files ...string) []string {
	t.Helper()
	args := append([]string{"replay"}, files...)
	args = append(args, "--query", fixture.Path(t, "a_array_random_seedless", "requests.jsonl"))
	code, out, errOut := runCmd(t, args...)
	if code != 0 {
		t.Fatalf("replay: exit %d: %s", code, errOut)
	}
	return strings.Split(strings.TrimSpace(out), "\n")
}

// serveMessages starts prefixd serve with extra flags, publishes msgs into
// it from a real libzmq publisher and waits until every one is applied.
func serveMessages(t *testing.T, msgs []recording.Message, extra ...string) *proc {
	t.Helper()
	s := startServe(t, extra...)
	pub := zmqpub.Start(t)
	pub.Connect(s.zmq)
	pub.WaitSubscribed()
	for _, m := range msgs {
		pub.Send(m.Frames...)
	}
	s.waitUntil(t, "every message applied", func() bool {
		return s.metric(t, "prefixd_batches_applied_total") == float64(len(msgs))
	})
	return s
}

// Recording a rewritten into every form current vLLM publishes (hybrid
// KV cache groups, the newest fields, offload media, seqs from 0, re-sent
// BlockStored events, binary hashes) answers every recorded request as
// the original does, through prefixd replay.
func TestReplayDerivedFormsAnswerAsOriginal(t *testing.T) {
	path := fixture.Path(t, "a_array_random_seedless", "events.jsonl")
	want := replayQuery(t, path)
	for _, f := range derive.Forms {
		t.Run(f.Name, func(t *testing.T) {
			got := replayQuery(t, derive.File(t, path, f, t.TempDir()))
			if len(got) != len(want) {
				t.Fatalf("%d answers, original %d", len(got), len(want))
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("request %d:\n%s\noriginal:\n%s", i, got[i], want[i])
				}
			}
		})
	}
}

// The same through prefixd serve fed by a real libzmq publisher: a hybrid
// fleet, one on offload media with the newest fields, and one whose seqs
// start at 0 as vLLM's do (a first batch, not a gap); the metrics say
// what was indexed and skipped per pod and group kind.
func TestServeDerivedFormsAnswerAsOriginal(t *testing.T) {
	path := fixture.Path(t, "a_array_random_seedless", "events.jsonl")
	zmqpub.Require(t)
	want := replayQuery(t, path)
	reqs := fixture.Requests(t, "a_array_random_seedless")
	for _, name := range []string{"hybrid-multi", "media", "new-fields", "seq-from-0"} {
		t.Run(name, func(t *testing.T) {
			s := serveMessages(t, derive.Messages(t, path, derive.Find(t, name)))
			for _, sp := range servedPods(s.base) {
				if sp.Stale {
					t.Errorf("pod %s stale", sp.Name)
				}
			}
			for i, r := range reqs {
				if got := httpMatch(t, s.base, r.Body); got != want[i] {
					t.Fatalf("request %d:\n%s\noriginal:\n%s", i, got, want[i])
				}
			}
			body := s.metrics(t)
			switch name {
			case "hybrid-multi":
				for _, pod := range []string{"127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"} {
					fa := sampleSum(body, "prefixd_pod_stored_blocks_total", `pod="`+pod+`"`, `kind="full_attention"`, `outcome="indexed"`)
					sw := sampleSum(body, "prefixd_pod_stored_blocks_total", `pod="`+pod+`"`, `kind="sliding_window"`, `outcome="skipped"`)
					groups := sampleSum(body, "prefixd_pod_kv_cache_groups", `pod="`+pod+`"`, `kind="full_attention"`)
					if fa == 0 || sw != fa || groups != 2 {
						t.Errorf("pod %s: full attention indexed %v, sliding window skipped %v, %v full-attention groups", pod, fa, sw, groups)
					}
				}
			case "media":
				if n := sampleSum(body, "prefixd_blocks_skipped_total", `reason="remote"`); n == 0 {
					t.Error("no REMOTE blocks skipped")
				}
				if n := sampleSum(body, "prefixd_events_unknown_medium_total"); n == 0 {
					t.Error("no event on an unknown medium counted")
				}
			case "new-fields":
				if n := sampleSum(body, "prefixd_events_skipped_total", `type="BlockInactive"`); n == 0 {
					t.Error("unknown BlockInactive events not counted by name")
				}
				if n := sampleSum(body, "prefixd_event_fields_skipped_total", `field="event_version"`); n == 0 {
					t.Error("unknown field event_version not counted by name")
				}
				if n := sampleSum(body, "prefixd_blocks_skipped_total", `reason="copies_remain"`); n == 0 {
					t.Error("removals with copies left not counted")
				}
			case "seq-from-0":
				if n := sampleSum(body, "prefixd_replays_total") + sampleSum(body, "prefixd_gaps_total"); n != 0 {
					t.Errorf("seqs from 0 taken for a gap: %v replays and gaps", n)
				}
			}
		})
	}
}

// prefixd serve --block-size 32 in front of a fleet whose block size is 16
// learns 16 from the events: it answers as a correctly configured prefixd,
// in engine key mode, without dropping a block, and says what it learned.
func TestServeLearnsBlockSize(t *testing.T) {
	path := fixture.Path(t, "a_array_random_seedless", "events.jsonl")
	zmqpub.Require(t)
	want := replayQuery(t, path)
	s := serveMessages(t, liveMessages(t, path), "--block-size", "32")
	for i, r := range fixture.Requests(t, "a_array_random_seedless") {
		if got := httpMatch(t, s.base, r.Body); got != want[i] {
			t.Fatalf("request %d:\n%s\nwith --block-size 16:\n%s", i, got, want[i])
		}
	}
	body := s.metrics(t)
	if n := sampleSum(body, "prefixd_blocks_dropped_total", `reason="block_size"`); n != 0 {
		t.Errorf("%v blocks dropped for their block size", n)
	}
	if n := sampleSum(body, "prefixd_model_block_size", `model="sim-model"`); n != 16 {
		t.Errorf("model block size %v, want 16", n)
	}
	if n := sampleSum(body, "prefixd_key_mode", `model="sim-model"`, `mode="engine"`); n != 1 {
		t.Errorf("key mode engine %v", n)
	}
	if !strings.Contains(s.stderr.String(), "block size differs from the configured one") {
		t.Errorf("the learned block size was not logged:\n%s", s.stderr.String())
	}
}
