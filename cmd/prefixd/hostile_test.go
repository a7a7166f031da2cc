package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/prefixd/prefixd/internal/fixture"
	"github.com/prefixd/prefixd/testutil/zmqpub"
)

// storedBatch is a batch of one BlockStored event of blocks of 16 tokens,
// in the sim's array form, with lora, medium and the event type as given.
func storedBatch(t testing.TB, typ string, hashes []uint64, lora, medium string) []byte {
	t.Helper()
	toks := make([]uint32, 16*len(hashes))
	for i := range toks {
		toks[i] = uint32(i)
	}
	var l, md any
	if lora != "" {
		l = lora
	}
	if medium != "" {
		md = medium
	}
	b, err := msgpack.Marshal([]any{1.5, []any{[]any{typ, hashes, nil, toks, 16, nil, md, l, nil}}, nil})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// hostileMessages are messages with every string that prefixd keeps as a
// name (pod, model, adapter) or reads (medium, event type) not valid UTF-8
// or far too long, then one good message for pod 127.0.0.1:9100.
func hostileMessages(t *testing.T) [][][]byte {
	t.Helper()
	long := strings.Repeat("m", 100<<10)
	good := storedBatch(t, "BlockStored", []uint64{1, 2}, "", "")
	var msgs [][][]byte
	add := func(topic string, payload []byte) {
		msgs = append(msgs, [][]byte{[]byte(topic), seqBytes(uint64(len(msgs) + 1)), payload})
	}
	add("kv@\xff\xfe:1@sim-model", good)                                                                // pod not UTF-8
	add("kv@"+strings.Repeat("1", 300)+"@sim-model", good)                                              // pod too long
	add("kv@127.0.0.1:9001@sim\xff", good)                                                              // model not UTF-8
	add("kv@127.0.0.1:9002@"+long, good)                                                                // a 100 KB topic
	add("kv@127.0.0.1:9003@sim-model", storedBatch(t, "BlockStored", []uint64{3}, "\xff\xfe", ""))      // adapter not UTF-8
	add("kv@127.0.0.1:9004@sim-model", storedBatch(t, "BlockStored", []uint64{4}, long, ""))            // adapter too long
	add("kv@127.0.0.1:9005@sim-model", storedBatch(t, "BlockStored", []uint64{5}, "", "\xff\xfe"+long)) // medium: a tier, not a name
	add("kv@127.0.0.1:9006@sim-model", storedBatch(t, "\xff"+long, []uint64{6}, "", ""))                // event type: skipped, counted
	add("kv@127.0.0.1:9100@sim-model", good)
	return msgs
}

// prefixd serve lives through every string field of a message being
// invalid UTF-8 or over-long: each is refused with a counted reason, the
// metrics still scrape, and good messages are applied. With topics
// trusted, the pod names reach the indexer's own check.
func TestServeSurvivesHostileStrings(t *testing.T) {
	for _, trust := range []bool{false, true} {
		t.Run(fmt.Sprintf("trust-topics=%v", trust), func(t *testing.T) {
			extra := []string{"--key-mode", "engine"} // the batches' hashes are made up
			if trust {
				extra = append(extra, "--zmq-trust-topics")
			}
			p := startServe(t, extra...)
			pub := dialRaw(t, p.zmq, "127.0.0.1")
			for _, m := range hostileMessages(t) {
				pub.send(t, m...)
			}
			p.waitUntil(t, "the good pod applied", func() bool {
				for _, sp := range servedPods(p.base) {
					if sp.Name == "127.0.0.1:9100" && sp.Blocks == 2 {
						return true
					}
				}
				return false
			})
			podReason, podsRefused := "foreign_topic", 2.0
			if trust {
				podReason = "invalid_pod"
			}
			p.waitUntil(t, "every refusal counted", func() bool {
				body := p.metrics(t)
				return sampleSum(body, "prefixd_ingest_dropped_total", `reason="`+podReason+`"`) == podsRefused &&
					sampleSum(body, "prefixd_ingest_dropped_total", `reason="invalid_model"`) == 2 &&
					sampleSum(body, "prefixd_ingest_dropped_total", `reason="invalid_lora"`) == 2
			})
			p.alive(t)
			got := map[string]int{}
			for _, sp := range servedPods(p.base) {
				got[sp.Name] = sp.Blocks
			}
			// The medium is a tier (an unknown one is the slowest), the
			// unknown event type is skipped: both pods exist, 9006 empty.
			want := map[string]int{"127.0.0.1:9003": 0, "127.0.0.1:9004": 0, "127.0.0.1:9005": 1, "127.0.0.1:9006": 0, "127.0.0.1:9100": 2}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("pods %v, want %v", got, want)
			}
			if n := p.metric(t, "prefixd_events_total", `type="Unknown"`); n != 1 {
				t.Errorf("unknown events counted %v, want 1", n)
			}
		})
	}
}

// prefixd replay of a recording holding the same messages refuses the same
// batches, says so, and answers from the rest.
func TestReplaySurvivesHostileStrings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hostile.jsonl")
	var b strings.Builder
	for _, m := range hostileMessages(t) {
		frames := make([]string, len(m))
		for i, f := range m {
			frames[i] = base64.StdEncoding.EncodeToString(f)
		}
		line, _ := json.Marshal(map[string]any{"frames_b64": frames})
		b.Write(line)
		b.WriteByte('\n')
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCmd(t, "replay", "--key-mode", "engine", path)
	if code != 0 {
		t.Fatalf("replay exit %d:\n%s", code, errOut)
	}
	for _, want := range []string{
		"refused 2 batches: invalid_pod", "refused 2 batches: invalid_model", "refused 2 batches: invalid_lora",
		"pod 127.0.0.1:9100 model sim-model blocks 2",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("replay's report lacks %q:\n%s", want, errOut)
		}
	}
}

// A publisher at another address that sends AllBlocksCleared on a real
// pod's topic changes nothing: the real pods' answers stay as they were.
func TestServeSpoofedClearChangesNothing(t *testing.T) {
	p := startServe(t)
	sendRecordingA(t, p)
	last := map[string]uint64{"127.0.0.1:8001": 10, "127.0.0.1:8002": 11, "127.0.0.1:8003": 13}
	before := allAnswers(t, p.base)
	if !strings.Contains(before, "127.0.0.1:8001") {
		t.Fatalf("no answer names 127.0.0.1:8001 before the spoof:\n%s", before)
	}

	spoof := zmqpub.Start(t)
	spoof.Connect("tcp://127.0.0.2:0;" + strings.TrimPrefix(p.zmq, "tcp://")) // libzmq's source;destination form
	spoof.WaitSubscribed()
	clearAll, err := msgpack.Marshal([]any{1.5, []any{[]any{"AllBlocksCleared"}}, nil})
	if err != nil {
		t.Fatal(err)
	}
	for pod, seq := range last {
		spoof.Send([]byte("kv@"+pod+"@sim-model"), seqBytes(seq+1), clearAll)
	}
	p.waitUntil(t, "spoofed clears refused", func() bool {
		return p.metric(t, "prefixd_ingest_dropped_total", `reason="foreign_topic"`) == float64(len(last))
	})
	if after := allAnswers(t, p.base); after != before {
		t.Fatalf("answers changed after a spoofed clear:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// allAnswers asks POST /v1/match every recorded request of recording a and
// returns the answers as they came, one a line.
func allAnswers(t *testing.T, base string) string {
	t.Helper()
	var b strings.Builder
	for _, r := range fixture.Requests(t, "a_array_random_seedless") {
		resp, err := httpClient.Post(base+"/v1/match", "application/json", bytes.NewReader(r.Body))
		if err != nil {
			t.Fatal(err)
		}
		answer, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("POST /v1/match: %s %v: %s", resp.Status, err, answer)
		}
		b.Write(bytes.TrimSpace(answer))
		b.WriteByte('\n')
	}
	return b.String()
}

// sendRecordingA publishes recording a into p from a real libzmq publisher
// and waits until its pods are at their last seq.
func sendRecordingA(t *testing.T, p *proc) {
	t.Helper()
	events := fixture.Path(t, "a_array_random_seedless", "events.jsonl")
	zmqpub.Require(t)
	pub := zmqpub.Start(t)
	pub.Connect(p.zmq)
	pub.WaitSubscribed()
	pub.SendFile(events)
	last := map[string]uint64{"127.0.0.1:8001": 10, "127.0.0.1:8002": 11, "127.0.0.1:8003": 13}
	p.waitUntil(t, "pods at their last seq", func() bool {
		at := 0
		for _, sp := range servedPods(p.base) {
			if last[sp.Name] == sp.Seq {
				at++
			}
		}
		return at == len(last)
	})
	time.Sleep(100 * time.Millisecond) // Pods reads seqs before blocks; let the last batch's blocks land
}

// 20,000 topics, each a pod of its own, from one publisher: prefixd keeps
// at most --max-pods of them, refuses and counts the rest, and /metrics
// stays small.
func TestServeManyTopicsBoundedMetrics(t *testing.T) {
	p := startServe(t)
	size := sendManyTopics(t, p)
	if size > 5<<20 {
		t.Fatalf("/metrics is %d bytes for %d topics; want under 5 MiB", size, manyTopics)
	}
	if n := p.metric(t, "prefixd_ingest_dropped_total", `reason="max_pods"`); n != manyTopics-4096 {
		t.Fatalf("max_pods refusals %v, want %d", n, manyTopics-4096)
	}
	t.Logf("/metrics: %d bytes for %d topics (%d pods)", size, manyTopics, 4096)
}

// manyTopics is how many topics sendManyTopics sends.
const manyTopics = 20_000

// sendManyTopics sends one batch on each of manyTopics topics, each naming
// a pod of its own, from one publisher, and returns the size of /metrics
// once every one is applied or refused.
func sendManyTopics(tb testing.TB, p *proc) int {
	pub := dialRaw(tb, p.zmq, "127.0.0.1")
	payload := storedBatch(tb, "BlockStored", []uint64{42}, "", "")
	for i := range manyTopics {
		pub.send(tb, fmt.Appendf(nil, "kv@127.0.0.1:%d@sim-model", 10_000+i), seqBytes(1), payload)
	}
	p.waitUntil(tb, "every topic handled", func() bool {
		body := p.metrics(tb)
		return sampleSum(body, "prefixd_batches_applied_total")+sampleSum(body, "prefixd_ingest_dropped_total", `reason="max_pods"`) == manyTopics
	})
	p.alive(tb)
	return len(p.metrics(tb))
}

// Connections that never send a byte are closed after the handshake
// timeout, and are visible in the metrics while they wait.
func TestServeClosesSilentConnections(t *testing.T) {
	p := startServe(t, "--zmq-handshake-timeout", "2s")
	const n = 500
	conns := make([]net.Conn, 0, n)
	for i := range n {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%5))}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", strings.TrimPrefix(p.zmq, "tcp://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		conns = append(conns, c)
	}
	p.waitUntil(t, "connections in the handshake visible", func() bool {
		return p.metric(t, "prefixd_ingest_handshakes") == n
	})
	closed := make(chan error, n)
	for _, c := range conns {
		go func() {
			_ = c.SetReadDeadline(time.Now().Add(serveWait))
			buf := make([]byte, 256)
			for {
				if _, err := c.Read(buf); err != nil {
					closed <- err
					return
				}
			}
		}()
	}
	for range n {
		if err := <-closed; isTimeout(err) {
			t.Fatalf("a silent connection still open after %v", serveWait)
		}
	}
	p.waitUntil(t, "the handshake gauge back to 0", func() bool { return p.metric(t, "prefixd_ingest_handshakes") == 0 })
	p.alive(t)
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// 20 connections each sending 7 frames of 16 MiB with MORE set, never
// ending their messages: prefixd refuses them within its frame budget,
// its memory stays bounded, and a good publisher is served afterwards.
func TestServeFrameFloodBoundedMemory(t *testing.T) {
	p := startServe(t, "--key-mode", "engine")
	frame := zmqpub.Frame(make([]byte, 16<<20), true)
	done := make(chan error, 20)
	for range 20 {
		r := dialRaw(t, p.zmq, "127.0.0.1")
		go func() {
			var err error
			for range 7 {
				if _, err = r.c.Write(frame); err != nil {
					break
				}
			}
			done <- err
		}()
	}
	for range 20 {
		<-done // written, or refused: the connection was closed under it
	}
	p.waitUntil(t, "the flood refused", func() bool {
		return p.metric(t, "prefixd_ingest_connection_errors_total", `reason="oversize"`) == 20
	})
	p.alive(t)
	bound := int64(512 << 20)
	if raceBuild() {
		bound = 2 << 30
	}
	rss := p.peakRSS(t)
	t.Logf("peak RSS %d MiB", rss>>20)
	if rss > bound {
		t.Fatalf("peak RSS %d MiB under a flood of 20 x 7 x 16 MiB frames; want under %d MiB", rss>>20, bound>>20)
	}
	pub := dialRaw(t, p.zmq, "127.0.0.1")
	pub.send(t, []byte("kv@127.0.0.1:9200@sim-model"), seqBytes(1), storedBatch(t, "BlockStored", []uint64{7, 8, 9}, "", ""))
	p.waitUntil(t, "a good publisher served after the flood", func() bool {
		for _, sp := range servedPods(p.base) {
			if sp.Name == "127.0.0.1:9200" && sp.Blocks == 3 {
				return true
			}
		}
		return false
	})
}

// A pod that sends far more blocks than its share into a full index loses
// its own blocks, and says so; the real pods' answers are unchanged and
// complete.
func TestServeFairCapacity(t *testing.T) {
	p := startServe(t, "--store-capacity-blocks", "4096")
	sendRecordingA(t, p)
	before := allAnswers(t, p.base)
	if strings.Contains(before, `"incomplete":true`) {
		t.Fatalf("answers incomplete before the flood:\n%s", before)
	}

	greedy := dialRaw(t, p.zmq, "127.0.0.1")
	const batches, perBatch = 40, 500
	for i := range batches {
		hashes := make([]uint64, perBatch)
		for j := range hashes {
			hashes[j] = uint64(i*perBatch+j)*0x9e3779b97f4a7c15 + 1
		}
		greedy.send(t, []byte("kv@127.0.0.1:9999@sim-model"), seqBytes(uint64(i+1)), storedBatch(t, "BlockStored", hashes, "", ""))
	}
	var pods []servedPod
	p.waitUntil(t, "the greedy pod's batches applied", func() bool {
		pods = servedPods(p.base)
		for _, sp := range pods {
			if sp.Name == "127.0.0.1:9999" && sp.Seq == batches {
				return true
			}
		}
		return false
	})
	for _, sp := range pods {
		greedy := sp.Name == "127.0.0.1:9999"
		switch {
		case greedy && (!sp.Incomplete || sp.EvictedBlocks == 0 || sp.Blocks >= batches*perBatch):
			t.Errorf("the greedy pod is not marked incomplete: %+v", sp)
		case !greedy && (sp.Incomplete || sp.EvictedBlocks != 0 || sp.Blocks != 64):
			t.Errorf("a real pod lost blocks to the greedy one: %+v", sp)
		}
	}
	if after := allAnswers(t, p.base); after != before {
		t.Fatalf("the real pods' answers changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if n := p.metric(t, "prefixd_store_pod_evicted_blocks", `pod="127.0.0.1:9999"`); n == 0 {
		t.Errorf("the greedy pod's evictions are not in the metrics")
	}
	t.Logf("pods after the flood: %+v", pods)
}
