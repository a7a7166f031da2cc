package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/prefixd/prefixd/events/recording"
	"github.com/prefixd/prefixd/indexer/blockhash"
	"github.com/prefixd/prefixd/internal/fixture"
	"github.com/prefixd/prefixd/testutil/zmqpub"
)

// liveMessages returns the live messages of a recording, in order.
func liveMessages(t *testing.T, path string) []recording.Message {
	t.Helper()
	msgs, err := recording.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

// prefixd restarts while its publishers go on, the publishers keeping
// their batches for replay (as llm-d-inference-sim's
// --kv-events-replay-endpoint does): the new process's first batch of each
// pod comes long after the publisher's first, the batches before it are
// fetched from the replay endpoint, and once they are, every answer equals
// an uninterrupted run's (prefixd replay of the whole recording), no pod
// stale.
func TestServeRestartRecoversFromReplay(t *testing.T) {
	path := fixture.Path(t, "a_array_random_seedless", "events.jsonl")
	zmqpub.Require(t)
	msgs := liveMessages(t, path)
	pub := zmqpub.Start(t)
	replayEP := pub.ReplayBind("tcp://127.0.0.1:0", zmqpub.ShapeTopic)
	replays := []string{"--zmq-replay", "127.0.0.1:8001=" + replayEP, "--zmq-replay", "127.0.0.1:8002=" + replayEP, "--zmq-replay", "127.0.0.1:8003=" + replayEP}

	first := startServe(t, replays...)
	pub.Connect(first.zmq)
	pub.WaitSubscribed()
	half := len(msgs) / 2
	for _, m := range msgs[:half] {
		pub.Send(m.Frames...)
	}
	first.waitUntil(t, "the first half applied", func() bool {
		return first.metric(t, "prefixd_batches_applied_total") == float64(half)
	})
	_ = first.cmd.Process.Kill()
	<-first.exited

	// The second process binds the same address; libzmq reconnects.
	second := startServe(t, append([]string{"--zmq-bind", first.zmq}, replays...)...)
	pub.WaitSubscribed()
	for _, m := range msgs[half:] {
		pub.Send(m.Frames...)
	}
	last := map[string]uint64{"127.0.0.1:8001": 10, "127.0.0.1:8002": 11, "127.0.0.1:8003": 13}
	second.waitUntil(t, "every pod at its last seq, consistent", func() bool {
		at := 0
		for _, sp := range servedPods(second.base) {
			if last[sp.Name] == sp.Seq && !sp.Stale {
				at++
			}
		}
		return at == len(last)
	})
	code, want, errOut := runCmd(t, "replay", path, "--query", fixture.Path(t, "a_array_random_seedless", "requests.jsonl"))
	if code != 0 {
		t.Fatalf("replay: %s", errOut)
	}
	wants := strings.Split(strings.TrimSpace(want), "\n")
	for i, r := range fixture.Requests(t, "a_array_random_seedless") {
		chat := filepath.Join(t.TempDir(), "chat.json")
		if err := os.WriteFile(chat, r.Body, 0o600); err != nil {
			t.Fatal(err)
		}
		code, got, errOut := runCmd(t, "query", "--addr", second.grpc, "--json", "--chat", chat)
		if code != 0 {
			t.Fatalf("query: exit %d: %s", code, errOut)
		}
		if strings.TrimSpace(got) != wants[i] {
			t.Fatalf("request %d: after the restart and replay, the answer differs from an uninterrupted run's:\n%s\nwant:\n%s", i, got, wants[i])
		}
	}
	if n := second.metric(t, "prefixd_replays_total", `result="ok"`); n != 3 {
		t.Errorf("%v ok replays, want one for each pod", n)
	}
}

// The shipped example configuration serves a vLLM model hashed with
// sha256_cbor and keyed by engine hashes: with vLLM's own seed (it sets no
// PYTHONHASHSEED), so that a query hashed by prefixd matches what vLLM
// published.
func TestShippedConfigMatchesVLLM(t *testing.T) {
	p := startServe(t, "--config", filepath.Join("..", "..", "testdata", "prefixd.yaml"))
	engine, err := blockhash.New(blockhash.Config{Scheme: blockhash.VLLMSHA256CBOR, Seed: blockhash.VLLMDefaultSeed, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]uint32, 64)
	for i := range tokens {
		tokens[i] = uint32(1000 + i)
	}
	hashes, err := engine.AppendPrompt(nil, tokens, blockhash.Prompt{})
	if err != nil {
		t.Fatal(err)
	}
	payload, err := msgpack.Marshal([]any{1.5, []any{[]any{"BlockStored", hashes, nil, tokens, 16, nil, "GPU", nil, nil}}, nil})
	if err != nil {
		t.Fatal(err)
	}
	pub := dialRaw(t, p.zmq, "127.0.0.1")
	pub.send(t, []byte("kv@127.0.0.1:8000@llama-3-8b"), seqBytes(0), payload)
	p.waitUntil(t, "the vLLM pod's blocks", func() bool {
		for _, sp := range servedPods(p.base) {
			if sp.Name == "127.0.0.1:8000" && sp.Blocks == 4 {
				return true
			}
		}
		return false
	})
	body, _ := json.Marshal(map[string]any{"model": "llama-3-8b", "token_ids": tokens})
	resp, err := httpClient.Post(p.base+"/v1/match", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Pods []struct {
			Pod    string  `json:"pod"`
			Blocks int     `json:"blocks"`
			Score  float64 `json:"score"`
		} `json:"pods"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if len(out.Pods) != 1 || out.Pods[0].Blocks != 4 || out.Pods[0].Score != 1 {
		t.Fatalf("a query of the prompt vLLM stored: %+v, want 127.0.0.1:8000 with all 4 blocks", out.Pods)
	}
}

// While a publisher sends batches that name new LoRA adapters, 200
// concurrent /v1/pods and /v1/match calls are all answered, each within
// 2 s (the bound a deadlock between applying and listing would break; the
// calls take milliseconds).
func TestServeAnswersWhileAdaptersArrive(t *testing.T) {
	p := startServe(t, "--key-mode", "engine")
	pub := dialRaw(t, p.zmq, "127.0.0.1")
	stop := make(chan struct{})
	sent := make(chan int, 1)
	go func() {
		n := 0
		defer func() { sent <- n }()
		for ; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			e := []any{"BlockStored", []uint64{uint64(n)*2 + 1, uint64(n)*2 + 2}, nil, make([]uint32, 32), 16, nil, "GPU", fmt.Sprintf("adapter-%d", n), nil}
			payload, _ := msgpack.Marshal([]any{1.5, []any{e}, nil})
			topic := fmt.Appendf(nil, "kv@127.0.0.1:%d@sim-model", 8000+n%8)
			if _, err := pub.c.Write(zmqpub.Message(topic, seqBytes(uint64(n/8+1)), payload)); err != nil {
				return
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 200}}
	defer client.CloseIdleConnections()
	match := []byte(`{"model":"sim-model","token_ids":[` + strings.TrimSuffix(strings.Repeat("7,", 64), ",") + `]}`)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex // protects calls, slowest, failures
		calls   int
		slowest time.Duration
		failed  []string
	)
	deadline := time.Now().Add(3 * time.Second)
	for i := range 200 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				start := time.Now()
				var (
					resp *http.Response
					err  error
				)
				if i%2 == 0 {
					resp, err = client.Get(p.base + "/v1/pods")
				} else {
					resp, err = client.Post(p.base+"/v1/match", "application/json", bytes.NewReader(match))
				}
				took := time.Since(start)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %s", resp.Status)
					}
				}
				mu.Lock()
				calls++
				slowest = max(slowest, took)
				if err != nil && len(failed) < 5 {
					failed = append(failed, err.Error())
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(stop)
	n := <-sent
	t.Logf("%d calls while %d batches with new adapters were sent; slowest %v", calls, n, slowest)
	if len(failed) > 0 {
		t.Fatalf("calls not answered within 2 s: %v", failed)
	}
	if n < 100 {
		t.Fatalf("only %d batches sent meanwhile", n)
	}
	p.alive(t)
}

// The first queries of a fleet, before any event, answer no pods and say
// why; a configured model no pod has sent events for does the same; a
// name that cannot be right, once models are known, is 404 naming them.
func TestServeEarlyQueries(t *testing.T) {
	config := filepath.Join(t.TempDir(), "prefixd.yaml")
	ask := func(p *proc, model string) (int, string) {
		body, _ := json.Marshal(map[string]any{"model": model, "prompt": "the first question of the day"})
		resp, err := httpClient.Post(p.base+"/v1/match", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	p := startServe(t)
	if code, body := ask(p, "sim-model"); code != http.StatusOK || !strings.Contains(body, `"pods":[]`) || !strings.Contains(body, `"explanation":"no pod has sent events yet`) {
		t.Fatalf("before any event: %d %s", code, body)
	}
	if err := os.WriteFile(config, []byte("models:\n  sim-model: {loras: [sql-lora]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p = startServe(t, "--config", config)
	for _, model := range []string{"sim-model", "sql-lora"} {
		if code, body := ask(p, model); code != http.StatusOK || !strings.Contains(body, `no pod serving model \"sim-model\" has sent events yet`) {
			t.Fatalf("configured %s before its events: %d %s", model, code, body)
		}
	}
	if code, body := ask(p, "sim-modle"); code != http.StatusNotFound || !strings.Contains(body, "sim-model") || !strings.Contains(body, "sql-lora") {
		t.Fatalf("a misspelt model: %d %s", code, body)
	}
}
