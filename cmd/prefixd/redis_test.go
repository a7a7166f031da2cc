package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/events/recording"
	"github.com/prefixd/prefixd/internal/fixture"
	"github.com/prefixd/prefixd/testutil/redistest"
	"github.com/prefixd/prefixd/testutil/zmqpub"
)

// wantAnswers fails the test unless serve s answers every recorded request
// of recording a as want (prefixd replay's answers).
func wantAnswers(t *testing.T, s *proc, want []string, what string) {
	t.Helper()
	for i, r := range fixture.Requests(t, "a_array_random_seedless") {
		if got := httpMatch(t, s.base, r.Body); got != want[i] {
			t.Fatalf("%s: request %d:\n%s\nprefixd replay:\n%s", what, i, got, want[i])
		}
	}
}

// Two prefixd serve processes share one Redis (a single server, and a
// 3-master Redis Cluster): events go to the first, queries to the second,
// and the second answers as prefixd replay does.
func TestServeReplicasShareRedis(t *testing.T) {
	path := fixture.Path(t, "a_array_random_seedless", "events.jsonl")
	zmqpub.Require(t)
	want := replayQuery(t, path)
	for _, kind := range []string{"server", "cluster"} {
		t.Run(kind, func(t *testing.T) {
			url := redistest.Server(t)
			if kind == "cluster" {
				url = redistest.Cluster(t)
			}
			first := serveMessages(t, liveMessages(t, path), "--store", url)
			second := startServe(t, "--store", url)
			wantAnswers(t, second, want, "the second replica")
			wantAnswers(t, first, want, "the first replica")
		})
	}
}

// prefixd serve on Redis, SIGKILLed and started again, answers as before
// at once, before any new event.
func TestServeRestartOnRedisAnswersAtOnce(t *testing.T) {
	path := fixture.Path(t, "a_array_random_seedless", "events.jsonl")
	zmqpub.Require(t)
	want := replayQuery(t, path)
	url := redistest.Server(t)
	first := serveMessages(t, liveMessages(t, path), "--store", url)
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-first.exited
	second := startServe(t, "--store", url)
	wantAnswers(t, second, want, "after SIGKILL and restart")
	if n := second.metric(t, "prefixd_batches_applied_total"); n != 0 {
		t.Fatalf("%v batches applied by the restarted process: the answers came from somewhere else", n)
	}
}

// lastSeqs returns each pod's last seq in msgs, by the pod name its topic
// gives.
func lastSeqs(t *testing.T, msgs []recording.Message) map[string]uint64 {
	t.Helper()
	last := map[string]uint64{}
	for _, m := range msgs {
		pod, _, ok := events.ParseTopic(m.Topic)
		if !ok {
			t.Fatalf("topic %q names no pod", m.Topic)
		}
		last[string(pod)] = binary.BigEndian.Uint64(m.Seq)
	}
	return last
}

// postStatus posts body to /v1/match and returns the HTTP status.
func postStatus(t *testing.T, base string, body []byte) int {
	t.Helper()
	resp, err := http.Post(base+"/v1/match", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Redis killed mid-ingest and started again, empty: while it is down
// queries fail with 503 (Unavailable) and /readyz says not ready, batches
// are dropped and counted; once it is back, the pods' gaps are repaired
// from their replay endpoints and every answer equals an uninterrupted
// run's.
func TestServeRedisDownAndBack(t *testing.T) {
	path := fixture.Path(t, "a_array_random_seedless", "events.jsonl")
	zmqpub.Require(t)
	want := replayQuery(t, path)
	msgs := liveMessages(t, path)
	before, during, after := msgs[:len(msgs)*2/5], msgs[len(msgs)*2/5:len(msgs)*3/5], msgs[len(msgs)*3/5:]
	if len(lastSeqs(t, after)) != 3 {
		t.Fatalf("the last part of the recording must hold batches of all three pods: %v", lastSeqs(t, after))
	}
	reqs := fixture.Requests(t, "a_array_random_seedless")

	rd := redistest.Start(t)
	pub := zmqpub.Start(t)
	replayEP := pub.ReplayBind("tcp://127.0.0.1:0", zmqpub.ShapeTopic)
	s := startServe(t, "--store", rd.URL(), "--redis-timeout", "500ms",
		"--zmq-replay", "127.0.0.1:8001="+replayEP, "--zmq-replay", "127.0.0.1:8002="+replayEP, "--zmq-replay", "127.0.0.1:8003="+replayEP)
	pub.Connect(s.zmq)
	pub.WaitSubscribed()
	for _, m := range before {
		pub.Send(m.Frames...)
	}
	s.waitUntil(t, "the first part applied", func() bool {
		return s.metric(t, "prefixd_batches_applied_total") == float64(len(before))
	})

	rd.Kill()
	if code := postStatus(t, s.base, reqs[0].Body); code != http.StatusServiceUnavailable {
		t.Fatalf("query while Redis is down: HTTP %d, want 503", code)
	}
	if code, _ := get(s.base + "/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz while Redis is down: %d, want 503", code)
	}
	for _, m := range during {
		pub.Send(m.Frames...)
	}
	s.waitUntil(t, "the batches sent while Redis is down dropped", func() bool {
		return s.metric(t, "prefixd_ingest_dropped_total", `reason="store_unavailable"`) >= float64(len(during))
	})

	rd.Restart()
	s.waitUntil(t, "ready again", func() bool { code, _ := get(s.base + "/readyz"); return code == http.StatusOK })
	for _, m := range after {
		pub.Send(m.Frames...)
	}
	last := lastSeqs(t, msgs)
	s.waitUntil(t, "every pod at its last seq, consistent", func() bool {
		at := 0
		for _, sp := range servedPods(s.base) {
			if last[sp.Name] == sp.Seq && !sp.Stale {
				at++
			}
		}
		return at == len(last)
	})
	wantAnswers(t, s, want, "after Redis came back")
}

// Redis paused (it hangs) while some pods send batches, with no replay
// endpoint: exactly the pods whose batches were dropped are stale once it
// answers again.
func TestServeRedisHangsMarksAffectedPodsStale(t *testing.T) {
	path := fixture.Path(t, "a_array_random_seedless", "events.jsonl")
	zmqpub.Require(t)
	msgs := liveMessages(t, path)
	rd := redistest.Start(t)
	s := startServe(t, "--store", rd.URL(), "--redis-timeout", "300ms")
	pub := zmqpub.Start(t)
	pub.Connect(s.zmq)
	pub.WaitSubscribed()
	for _, m := range msgs {
		pub.Send(m.Frames...)
	}
	s.waitUntil(t, "the recording applied", func() bool {
		return s.metric(t, "prefixd_batches_applied_total") == float64(len(msgs))
	})
	// One more batch of one pod, continuing its seq, while Redis hangs.
	extra := msgs[len(msgs)-1]
	pod, _, _ := events.ParseTopic(extra.Topic)
	seq := binary.BigEndian.Uint64(extra.Seq) + 1
	rd.Pause()
	pub.Send(extra.Topic, seqBytes(seq), extra.Payload)
	s.waitUntil(t, "the batch sent while Redis hangs dropped", func() bool {
		return s.metric(t, "prefixd_ingest_dropped_total", `reason="store_unavailable"`) == 1
	})
	rd.Resume()
	s.waitUntil(t, "exactly the affected pod stale", func() bool {
		pods := servedPods(s.base)
		stale := 0
		for _, sp := range pods {
			if sp.Stale {
				if sp.Name != string(pod) {
					t.Fatalf("pod %s stale: only %s lost a batch", sp.Name, pod)
				}
				stale++
			}
		}
		return len(pods) == 3 && stale == 1
	})
}

// A pod's publisher moves from one replica to another (its replica was
// killed, and the sim reconnects through a Service to the other): the
// second replica leaves the pod's batches to the first while the first's
// write lease holds, then takes the stream over from the applied seq in
// Redis, repairing what it left from the replay endpoint, and answers as
// an uninterrupted run.
func TestServeHandOverBetweenReplicas(t *testing.T) {
	path := fixture.Path(t, "a_array_random_seedless", "events.jsonl")
	zmqpub.Require(t)
	want := replayQuery(t, path)
	msgs := liveMessages(t, path)
	half := len(msgs) / 2
	url := redistest.Server(t)
	pub := zmqpub.Start(t)
	replayEP := pub.ReplayBind("tcp://127.0.0.1:0", zmqpub.ShapeTopic)
	flags := []string{"--store", url, "--redis-lease-ttl", "1s",
		"--zmq-replay", "127.0.0.1:8001=" + replayEP, "--zmq-replay", "127.0.0.1:8002=" + replayEP, "--zmq-replay", "127.0.0.1:8003=" + replayEP}
	a := startServe(t, flags...)
	b := startServe(t, flags...)
	pub.Connect(a.zmq)
	pub.WaitSubscribed()
	for _, m := range msgs[:half] {
		pub.Send(m.Frames...)
	}
	a.waitUntil(t, "the first half applied by the first replica", func() bool {
		return a.metric(t, "prefixd_batches_applied_total") == float64(half)
	})
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.exited
	pub.Connect(b.zmq)
	pub.WaitSubscribed()
	for _, m := range msgs[half:] {
		pub.Send(m.Frames...)
	}
	last := lastSeqs(t, msgs)
	b.waitUntil(t, "every pod at its last seq, consistent", func() bool {
		at := 0
		for _, sp := range servedPods(b.base) {
			if last[sp.Name] == sp.Seq && !sp.Stale {
				at++
			}
		}
		return at == len(last)
	})
	if n := b.metric(t, "prefixd_batches_not_owner_total"); n == 0 {
		t.Error("no batch was left to the first replica's lease: the hand-over was not exercised")
	}
	wantAnswers(t, b, want, "after the hand-over")
}

// A store URL that cannot be right is a usage error; one that cannot be
// reached fails start-up, naming it without its password.
func TestStoreFlag(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--store", "ftp://127.0.0.1:1"},
		{"serve", "--store", "127.0.0.1:6379"},
		{"replay", "--store", "redis://127.0.0.1:1", "--redis-lease-ttl", "0s", "x.jsonl"},
	} {
		if code, _, errOut := runCmd(t, args...); code != 2 || !strings.Contains(errOut, "--") {
			t.Errorf("%v: exit %d, want 2 (usage): %s", args, code, errOut)
		}
	}
	port := freePort(t)
	code, _, errOut := runCmd(t, "replay", "--store", fmt.Sprintf("redis://user:hunter2@127.0.0.1:%d/0", port), "--redis-timeout", "300ms",
		fixture.Path(t, "a_array_random_seedless", "events.jsonl"))
	if code == 0 || strings.Contains(errOut, "hunter2") || !strings.Contains(errOut, fmt.Sprint(port)) {
		t.Errorf("unreachable store: exit %d: %s", code, errOut)
	}
}

// prefixd replay --store loads an index into Redis from recordings; a
// prefixd serve on the same Redis then answers as replay does, without an
// event of its own.
func TestReplayLoadsRedis(t *testing.T) {
	path := fixture.Path(t, "a_array_random_seedless", "events.jsonl")
	want := replayQuery(t, path)
	url := redistest.Server(t)
	if code, _, errOut := runCmd(t, "replay", "--store", url, path); code != 0 {
		t.Fatalf("replay --store: exit %d: %s", code, errOut)
	}
	s := startServe(t, "--store", url)
	wantAnswers(t, s, want, "serve on the Redis replay loaded")
}

// Two replicas receive the same publishers (as with vLLM, which every
// replica connects to): the one holding a pod's lease applies its stream,
// and the other's connection closing does not mark the pod stale for
// everyone: the pod's stale mark is the lease holder's to set.
func TestServeNonOwnerConnectionCloseLeavesPodsConsistent(t *testing.T) {
	path := fixture.Path(t, "a_array_random_seedless", "events.jsonl")
	zmqpub.Require(t)
	msgs := liveMessages(t, path)
	url := redistest.Server(t)
	a := startServe(t, "--store", url)
	b := startServe(t, "--store", url)
	pub := zmqpub.Start(t)
	pub.Connect(a.zmq)
	pub.WaitSubscribed()
	raw := dialRaw(t, b.zmq, "127.0.0.1")
	for i, m := range msgs {
		// The first replica applies each batch before the second gets
		// it: the first holds every pod's lease.
		pub.Send(m.Frames...)
		a.waitUntil(t, "the batch applied by the first replica", func() bool {
			return a.metric(t, "prefixd_batches_applied_total") == float64(i+1)
		})
		raw.send(t, m.Frames...)
	}
	b.waitUntil(t, "the second replica left every batch to the first", func() bool {
		return b.metric(t, "prefixd_batches_not_owner_total")+b.metric(t, "prefixd_batches_duplicate_total") == float64(len(msgs))
	})
	_ = raw.c.Close()
	b.waitUntil(t, "the second replica handled its connection closing", func() bool {
		return strings.Contains(b.stderr.String(), "publisher connection closed")
	})
	for _, sp := range servedPods(a.base) {
		if sp.Stale {
			t.Errorf("pod %s stale after another replica's connection closed", sp.Name)
		}
	}
}
