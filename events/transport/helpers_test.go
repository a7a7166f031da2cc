package transport

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitLimit bounds every wait in these tests. It is far above what any wait
// takes; reaching it means the behaviour is missing, not slow.
const waitLimit = 20 * time.Second

// testOptions are DefaultOptions with backoffs short enough for tests.
func testOptions() Options {
	o := DefaultOptions()
	o.MinBackoff = 10 * time.Millisecond
	o.MaxBackoff = 200 * time.Millisecond
	o.HandshakeTimeout = 2 * time.Second
	o.Logger = slog.New(slog.DiscardHandler)
	return o
}

// newSub starts a Subscriber whose metrics go to a registry of its own; it
// is closed when the test ends.
func newSub(t *testing.T, edit func(*Options)) (*Subscriber, *prometheus.Registry) {
	t.Helper()
	o := testOptions()
	if edit != nil {
		edit(&o)
	}
	reg := prometheus.NewRegistry()
	s, err := NewSubscriber(o, NewMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, reg
}

func bind(t *testing.T, s *Subscriber) string {
	t.Helper()
	ep, err := s.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ep
}

// detach returns a copy of m that owns its frames, and releases m.
func detach(m Message) Message {
	frames := make([][]byte, len(m.Frames))
	for i, f := range m.Frames {
		frames[i] = append([]byte{}, f...)
	}
	m.Release()
	m.Frames, m.lease = frames, nil
	return m
}

// recv returns the next n messages, failing the test if they do not come.
// They are released (and copied first): the Subscriber's budget does not
// count them.
func recv(t *testing.T, s *Subscriber, n int) []Message {
	t.Helper()
	return recvAll(t, s, n, false)
}

// recvAll is recv, with the notices of connections that closed (Closed)
// counted among the n messages when closed is set, and skipped otherwise.
func recvAll(t *testing.T, s *Subscriber, n int, closed bool) []Message {
	t.Helper()
	out := make([]Message, 0, n)
	deadline := time.NewTimer(waitLimit)
	defer deadline.Stop()
	for len(out) < n {
		select {
		case m, ok := <-s.Messages():
			if !ok {
				t.Fatalf("queue closed after %d of %d messages", len(out), n)
			}
			if m.Closed && !closed {
				continue
			}
			out = append(out, detach(m))
		case <-deadline.C:
			t.Fatalf("received %d of %d messages within %v", len(out), n, waitLimit)
		}
	}
	return out
}

// counter returns the value of a counter or gauge in reg with exactly these
// labels, or 0 when it does not exist yet.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue metrics
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// waitFor polls cond until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, waitLimit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recording reads the frames of every line of a JSONL recording.
func recording(t *testing.T, path string) [][][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var out [][][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var line struct {
			Frames []string `json:"frames_b64"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		frames := make([][]byte, len(line.Frames))
		for i, s := range line.Frames {
			if frames[i], err = base64.StdEncoding.DecodeString(s); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
		}
		out = append(out, frames)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// liveFrames reads a recording as the live messages a publisher sends: the
// 3-frame messages, and a replay file's messages without the leading empty
// frame and without the end marker.
func liveFrames(t *testing.T, path string) [][][]byte {
	t.Helper()
	var out [][][]byte
	for _, frames := range recording(t, path) {
		if len(frames) == 4 && len(frames[0]) == 0 {
			frames = frames[1:]
		}
		if len(frames) == 3 && string(frames[1]) == "\xff\xff\xff\xff\xff\xff\xff\xff" {
			continue
		}
		out = append(out, frames)
	}
	return out
}

func sameFrames(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if string(a[i]) != string(b[i]) {
			return false
		}
	}
	return true
}

// checkStream fails unless got holds exactly want's messages, in order.
func checkStream(t *testing.T, name string, got []Message, want [][][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d messages; want %d", name, len(got), len(want))
	}
	for i := range want {
		if !sameFrames(got[i].Frames, want[i]) {
			t.Fatalf("%s: message %d differs from the recording: %d frames %q...; want %q...", name, i, len(got[i].Frames), head(got[i].Frames), head(want[i]))
		}
	}
}

func head(frames [][]byte) []byte {
	if len(frames) == 0 {
		return nil
	}
	return frames[0]
}
