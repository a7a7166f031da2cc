package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/prefixd/prefixd/internal/fixture"
	"github.com/prefixd/prefixd/testutil/zmqpub"
)

func TestParseEndpoints(t *testing.T) {
	got, err := parseEndpoints([]byte("# fleet\n\n10.0.0.7:8000=tcp://10.0.0.7:5557,replay=tcp://10.0.0.7:5601\n  tcp://10.0.0.8:5557  \n"))
	if err != nil || len(got) != 2 || got["tcp://10.0.0.7:5557"].src.Replay != "tcp://10.0.0.7:5601" || got["tcp://10.0.0.8:5557"].endpoint == "" {
		t.Fatalf("parseEndpoints = %+v, %v", got, err)
	}
	for _, bad := range []string{
		"tcp://a:1\ntcp://a:1\n", "not an endpoint\n", "tcp://a:1,colour=red\n",
		"tcp://10.0.0.8:5557\ntcp://*:5557\n", "tcp://10.0.0.8:0\n", "tcp://a:1,replay=tcp://*:1\n",
	} {
		if _, err := parseEndpoints([]byte(bad)); err == nil || !strings.Contains(err.Error(), "line ") {
			t.Errorf("parseEndpoints(%q): %v, want an error naming the line", bad, err)
		}
	}
}

// TestServeEndpointsFile connects to a publisher once it is listed in the
// endpoints file, and disconnects when its line is removed: the pods it
// published leave the index and /metrics. Listed again, it is taken anew.
func TestServeEndpointsFile(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	path := fixture.Path(t, "a_array_random_seedless", "events.jsonl")
	file := filepath.Join(t.TempDir(), "endpoints")
	if err := os.WriteFile(file, []byte("# no publishers yet\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	s := startCmd(t, "serve", "--grpc-addr", "127.0.0.1:0", "--zmq-endpoints", file, "--zmq-endpoints-interval", "20ms", "--http-addr", strings.TrimPrefix(base, "http://"))

	pub := zmqpub.Start(t)
	pubEP := pub.Bind("tcp://127.0.0.1:0")
	// A file with a line that cannot be right applies nothing, and says so.
	if err := os.WriteFile(file, []byte(pubEP+"\ntcp://*:5557\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the bad file refused", s, func() bool { return strings.Contains(s.stderr.String(), "endpoints file not applied") })
	if strings.Contains(s.stderr.String(), "endpoint added") {
		t.Fatalf("a file with a bad line was half applied:\n%s", s.stderr.String())
	}
	if err := os.WriteFile(file, []byte(pubEP+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pub.WaitSubscribed()
	if n := pub.SendFile(path); n != 34 {
		t.Fatalf("sent %d, want 34", n)
	}
	waitFor(t, "three pods at 64 blocks", s, func() bool {
		n := 0
		for _, p := range servedPods(base) {
			if p.Blocks == 64 {
				n++
			}
		}
		return n == 3
	})
	if err := os.WriteFile(file, []byte("# gone again\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "endpoint removed", s, func() bool { return strings.Contains(s.stderr.String(), "endpoint removed") })
	if !strings.Contains(s.stderr.String(), `pods="[127.0.0.1:8001 127.0.0.1:8002 127.0.0.1:8003]"`) {
		t.Errorf("the removal does not name the three pods:\n%s", s.stderr.String())
	}
	waitFor(t, "no pods", s, func() bool { pods := servedPods(base); return pods != nil && len(pods) == 0 })
	if _, metrics := get(base + "/metrics"); !bytes.Contains(metrics, []byte("prefixd_batches_applied_total 34")) ||
		bytes.Contains(metrics, []byte(`pod="127.0.0.1:800`)) {
		t.Errorf("/metrics after removal: want 34 batches applied and no series of the pods gone:\n%s", metrics)
	}

	// Listed again: the same pods start anew from seq 1.
	if err := os.WriteFile(file, []byte(pubEP+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pub.WaitSubscribed()
	if n := pub.SendFile(path); n != 34 {
		t.Fatalf("sent %d, want 34", n)
	}
	want := map[string]uint64{"127.0.0.1:8001": 10, "127.0.0.1:8002": 11, "127.0.0.1:8003": 13}
	waitFor(t, "three pods back at their last seq", s, func() bool {
		at := 0
		for _, p := range servedPods(base) {
			if want[p.Name] == p.Seq && p.Blocks == 64 && !p.Stale {
				at++
			}
		}
		return at == len(want)
	})
	if _, metrics := get(base + "/metrics"); bytes.Contains(metrics, []byte("prefixd_resets_total")) {
		t.Errorf("pods taken anew were reset: their old seqs were kept")
	}
	if code := s.stop(t); code != 0 {
		t.Fatalf("serve exit %d; stderr:\n%s", code, s.stderr.String())
	}
}
