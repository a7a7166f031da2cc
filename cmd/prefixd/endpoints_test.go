package main

import (
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
	for _, bad := range []string{"tcp://a:1\ntcp://a:1\n", "not an endpoint\n", "tcp://a:1,colour=red\n"} {
		if _, err := parseEndpoints([]byte(bad)); err == nil || !strings.Contains(err.Error(), "line ") {
			t.Errorf("parseEndpoints(%q): %v, want an error naming the line", bad, err)
		}
	}
}

// TestServeEndpointsFile connects to a publisher once it is listed in the
// endpoints file, and disconnects when its line is removed.
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
	if code := s.stop(t); code != 0 {
		t.Fatalf("serve exit %d; stderr:\n%s", code, s.stderr.String())
	}
}
