package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/prefixd/prefixd/events/recording"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/fixture"
	"github.com/prefixd/prefixd/testutil/zmqpub"
)

// countRecords returns how many whole records a recording in progress holds.
func countRecords(path string) int {
	r, err := recording.Open(path)
	if err != nil {
		return 0
	}
	defer r.Close()
	n := 0
	for _, err := range r.All() {
		if err != nil {
			break
		}
		n++
	}
	return n
}

// `prefixd record` of a real publisher sending recording a writes every
// message verbatim: the file holds the same batches as the source, and
// `prefixd replay` of it gives the same index.
func TestRecordWritesWhatPublishersSend(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	path := fixture.Path(t, "a_array_random_seedless", "events.jsonl")
	zmqpub.Require(t)

	out := filepath.Join(t.TempDir(), "live.pfxd")
	zmqEP := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	s := startCmd(t, "record", "--zmq-bind", zmqEP, "--out", out, "--flush-interval", "20ms")
	pub := zmqpub.Start(t)
	pub.Connect(zmqEP)
	pub.WaitSubscribed()
	if n := pub.SendFile(path); n != 34 {
		t.Fatalf("sent %d", n)
	}
	waitFor(t, "34 records", s, func() bool { return countRecords(out) == 34 })
	pub.Kill()
	if code := s.stop(t); code != 0 {
		t.Fatalf("record exit %d; stderr:\n%s", code, s.stderr.String())
	}
	if !strings.Contains(s.stderr.String(), "messages=34") {
		t.Errorf("no summary of 34 messages:\n%s", s.stderr.String())
	}

	r, err := recording.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Format() != recording.FormatNative {
		t.Errorf("format %v", r.Format())
	}
	src, err := recording.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	for want, err := range src.All() {
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.Next()
		if err != nil {
			t.Fatalf("record %d: %v", want.Index, err)
		}
		if got.Source != zmqEP || got.Peer == "" || got.RecvTime.IsZero() || got.Replay {
			t.Errorf("record %d: source %q peer %q time %v replay %v", got.Index, got.Source, got.Peer, got.RecvTime, got.Replay)
		}
		if len(got.Frames) != len(want.Frames) {
			t.Fatalf("record %d: %d frames, want %d", got.Index, len(got.Frames), len(want.Frames))
		}
		for i := range want.Frames {
			if !bytes.Equal(got.Frames[i], want.Frames[i]) {
				t.Errorf("record %d frame %d differs", got.Index, i)
			}
		}
	}
	if _, err := r.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("after the last record: %v", err)
	}

	// The same batches, and the same index.
	a, err := indexer.ReadRecordings([]string{path}, "default")
	if err != nil {
		t.Fatal(err)
	}
	b, err := indexer.ReadRecordings([]string{out}, "default")
	if err != nil {
		t.Fatal(err)
	}
	for pod, batches := range a.Pods {
		if len(b.Pods[pod]) != len(batches) {
			t.Errorf("pod %s: %d batches recorded, want %d", pod, len(b.Pods[pod]), len(batches))
		}
	}
	podLines := func(args ...string) string {
		t.Helper()
		code, _, errOut := runCmd(t, args...)
		if code != 0 {
			t.Fatalf("%q: exit %d: %s", args, code, errOut)
		}
		return strings.Join(regexp.MustCompile(`(?m)^pod .*$`).FindAllString(errOut, -1), "\n")
	}
	if got, want := podLines("replay", out), podLines("replay", path); got != want || got == "" {
		t.Errorf("replay of the recording:\n%s\nof the source:\n%s", got, want)
	}
	inspect := func(file string) string {
		t.Helper()
		code, stdout, errOut := runCmd(t, "inspect", file)
		if code != 0 {
			t.Fatalf("inspect %s: exit %d: %s", file, code, errOut)
		}
		return strings.ReplaceAll(stdout, file+":", "")
	}
	if got, want := inspect(out), inspect(path); got != want || strings.Count(got, "\n") < 34 {
		t.Errorf("inspect of the recording:\n%s\nof the source:\n%s", got, want)
	}
}

// --duration ends the recording by itself; with nothing received the
// file is a valid empty recording.
func TestRecordDuration(t *testing.T) {
	out := filepath.Join(t.TempDir(), "empty.pfxd")
	code, _, errOut := runCmd(t, "record", "--zmq-bind", "tcp://127.0.0.1:0", "--out", out, "--duration", "50ms")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	r, err := recording.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("empty recording: %v", err)
	}
}

func TestRecordFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"record"},
		{"record", "--out", filepath.Join(t.TempDir(), "x"), "--duration", "-1s"},
		{"record", "--out", filepath.Join(t.TempDir(), "x"), "--zmq-connect", "nope"},
	} {
		if code, _, errOut := runCmd(t, args...); code != 2 {
			t.Errorf("%q: exit %d, want 2; stderr:\n%s", args, code, errOut)
		}
	}
}
