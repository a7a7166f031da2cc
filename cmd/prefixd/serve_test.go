package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/prefixd/prefixd/internal/fixture"
	"github.com/prefixd/prefixd/internal/syncbuf"
	"github.com/prefixd/prefixd/testutil/zmqpub"
)

// serveWait bounds every wait of these tests; reaching it means the
// behaviour is missing, not slow.
const serveWait = 20 * time.Second

// freePort returns a loopback port nothing listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// started is a command running in the background.
type started struct {
	cancel context.CancelFunc
	done   chan int
	stderr *syncbuf.Buffer
}

// startCmd runs a command in a goroutine until stop.
func startCmd(t *testing.T, args ...string) *started {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &started{cancel: cancel, done: make(chan int, 1), stderr: &syncbuf.Buffer{}}
	go func() { s.done <- run(ctx, args, io.Discard, s.stderr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(serveWait):
		}
	})
	return s
}

// stop cancels the command's context, as SIGTERM does, and returns its exit
// code.
func (s *started) stop(t *testing.T) int {
	t.Helper()
	s.cancel()
	select {
	case code := <-s.done:
		s.done <- code // for the cleanup
		return code
	case <-time.After(serveWait):
		t.Fatalf("command still running %v after cancel; stderr:\n%s", serveWait, s.stderr.String())
		return -1
	}
}

var httpClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// get returns the status and body of GET url, or status 0 when it fails.
func get(url string) (int, []byte) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// waitFor polls cond until it holds.
func waitFor(t *testing.T, what string, s *started, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(serveWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; stderr:\n%s", what, serveWait, s.stderr.String())
		}
		select {
		case code := <-s.done:
			s.done <- code
			t.Fatalf("%s: command exited with %d; stderr:\n%s", what, code, s.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

type servedPod struct {
	Name          string `json:"name"`
	Model         string `json:"model"`
	Blocks        int    `json:"blocks"`
	Seq           uint64 `json:"seq,string"` // 64 bits: a string
	Stale         bool   `json:"stale"`
	Incomplete    bool   `json:"incomplete"`
	EvictedBlocks int    `json:"evicted_blocks"`
}

func servedPods(base string) []servedPod {
	code, body := get(base + "/v1/pods")
	if code != http.StatusOK {
		return nil
	}
	var out struct {
		Pods []servedPod `json:"pods"`
	}
	if json.Unmarshal(body, &out) != nil {
		return nil
	}
	return out.Pods
}

// A real libzmq publisher sends recording a to `prefixd serve`: the served
// pods end where `prefixd replay` of the same file ends, and serve stops
// cleanly when its context is cancelled.
func TestServeIndexesLivePublisher(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // runs after the cleanups below
	path := fixture.Path(t, "a_array_random_seedless", "events.jsonl")
	zmqpub.Require(t)

	zmqEP := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	s := startCmd(t, "serve", "--grpc-addr", "127.0.0.1:0", "--zmq-bind", zmqEP, "--http-addr", strings.TrimPrefix(base, "http://"))
	waitFor(t, "ready", s, func() bool { code, _ := get(base + "/readyz"); return code == http.StatusOK })
	if code, _ := get(base + "/healthz"); code != http.StatusOK {
		t.Fatalf("healthz %d", code)
	}
	if !regexp.MustCompile(`msg="prefixd serving" zmq_bound=\[` + regexp.QuoteMeta(zmqEP) + `\].* startup=\S+`).MatchString(s.stderr.String()) {
		t.Errorf("no start-up line naming the bound endpoint and the start-up time:\n%s", s.stderr.String())
	}

	pub := zmqpub.Start(t)
	pub.Connect(zmqEP)
	pub.WaitSubscribed()
	if n := pub.SendFile(path); n != 34 {
		t.Fatalf("sent %d messages, want 34", n)
	}
	want := map[string]uint64{"127.0.0.1:8001": 10, "127.0.0.1:8002": 11, "127.0.0.1:8003": 13}
	var pods []servedPod
	waitFor(t, "pods at their last seq", s, func() bool {
		pods = servedPods(base)
		at := 0
		for _, p := range pods {
			if want[p.Name] == p.Seq {
				at++
			}
		}
		return at == len(want)
	})
	// indexer.Pods reads block counts before seqs, so the read that first
	// saw the last seq may predate that batch's blocks; nothing changes now.
	pods = servedPods(base)

	// The same as `prefixd replay` of the file.
	code, _, replayErr := runCmd(t, "replay", path)
	if code != 0 {
		t.Fatalf("replay exit %d: %s", code, replayErr)
	}
	var got []string
	for _, p := range pods {
		if p.Stale {
			t.Errorf("pod %s stale", p.Name)
		}
		if p.Blocks != 64 {
			t.Errorf("pod %s holds %d blocks, want 64", p.Name, p.Blocks)
		}
		got = append(got, fmt.Sprintf("pod %s model %s blocks %d seq %d", p.Name, p.Model, p.Blocks, p.Seq))
	}
	wantLines := regexp.MustCompile(`(?m)^pod .* seq \d+`).FindAllString(replayErr, -1)
	slices.Sort(wantLines)
	if strings.Join(got, "\n") != strings.Join(wantLines, "\n") {
		t.Errorf("served pods:\n%s\nreplay's:\n%s", strings.Join(got, "\n"), strings.Join(wantLines, "\n"))
	}

	_, metrics := get(base + "/metrics")
	for _, m := range []string{
		"prefixd_batches_applied_total 34",
		"prefixd_apply_lag_seconds_count 34",
		`prefixd_ingest_messages_total{source="` + zmqEP + `"} 34`,
		`prefixd_events_total{pod="127.0.0.1:8001",type="BlockStored"}`,
	} {
		if !bytes.Contains(metrics, []byte(m)) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
	pub.Kill()

	if code := s.stop(t); code != 0 {
		t.Fatalf("serve exit %d after cancel; stderr:\n%s", code, s.stderr.String())
	}
	if code, _ := get(base + "/healthz"); code != 0 {
		t.Errorf("HTTP still answers after serve returned (%d)", code)
	}
}

func TestServeFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--zmq-connect", "replay=tcp://127.0.0.1:1"},
		{"serve", "--zmq-connect", "tcp://127.0.0.1:1,colour=blue"},
		{"serve", "--zmq-replay", "tcp://127.0.0.1:1"},
		{"serve", "--key-mode", "fast"},
		{"serve", "extra"},
		{"serve", "--log-format", "xml"},
		{"serve", "--log-level", "loud"},
	} {
		if code, _, errOut := runCmd(t, args...); code != 2 {
			t.Errorf("%q: exit %d, want 2; stderr:\n%s", args, code, errOut)
		}
	}
	// A bind that fails is an error, not a usage error.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	code, _, errOut := runCmd(t, "serve", "--zmq-bind", "tcp://"+l.Addr().String(), "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0")
	if code != 1 || !strings.Contains(errOut, "bind") {
		t.Errorf("bind of a used port: exit %d; stderr:\n%s", code, errOut)
	}
}

func TestParseConnect(t *testing.T) {
	for _, c := range []struct {
		in, endpoint, replay, name, model string
	}{
		{"tcp://10.0.0.7:5557", "tcp://10.0.0.7:5557", "", "", ""},
		{"pod=tcp://10.0.0.7:5557,replay=tcp://10.0.0.7:5601", "tcp://10.0.0.7:5557", "tcp://10.0.0.7:5601", "", ""},
		{"tcp://10.0.0.7:5557,name=vllm-0,model=llama", "tcp://10.0.0.7:5557", "", "vllm-0", "llama"},
		{"10.0.0.7:8000=tcp://10.0.0.7:5557,replay=tcp://10.0.0.7:5601", "tcp://10.0.0.7:5557", "tcp://10.0.0.7:5601", "10.0.0.7:8000", ""},
	} {
		got, err := parseConnect(c.in)
		if err != nil || got.endpoint != c.endpoint || got.src.Replay != c.replay || got.src.Name != c.name || got.src.Model != c.model {
			t.Errorf("parseConnect(%q) = %+v, %v", c.in, got, err)
		}
	}
}

// serve connects to a publisher that binds, and repairs withheld batches
// from the replay endpoint given with --zmq-connect.
func TestServeConnectRepairsFromReplay(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	path := fixture.Path(t, "a_array_random_seedless", "events.jsonl")
	pub := zmqpub.Start(t)
	pubEP := pub.Bind("tcp://127.0.0.1:0")
	replayEP := pub.ReplayBind("tcp://127.0.0.1:0", zmqpub.ShapeTopic)
	pub.Skip(4)

	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	s := startCmd(t, "serve", "--grpc-addr", "127.0.0.1:0", "--zmq-connect", "pod="+pubEP+",replay="+replayEP, "--http-addr", strings.TrimPrefix(base, "http://"))
	pub.WaitSubscribed()
	if n := pub.SendFile(path); n != 31 {
		t.Fatalf("sent %d, want 31", n)
	}
	want := map[string]uint64{"127.0.0.1:8001": 10, "127.0.0.1:8002": 11, "127.0.0.1:8003": 13}
	waitFor(t, "pods at their last seq", s, func() bool {
		at := 0
		for _, p := range servedPods(base) {
			if want[p.Name] == p.Seq {
				at++
			}
		}
		return at == len(want)
	})
	for _, p := range servedPods(base) {
		if p.Blocks != 64 || p.Stale {
			t.Errorf("pod %+v, want 64 blocks, not stale", p)
		}
	}
	_, metrics := get(base + "/metrics")
	for pod := range want {
		m := `prefixd_replays_total{pod="` + pod + `",result="ok"} 1`
		if !bytes.Contains(metrics, []byte(m)) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
	if code := s.stop(t); code != 0 {
		t.Fatalf("serve exit %d; stderr:\n%s", code, s.stderr.String())
	}
}
