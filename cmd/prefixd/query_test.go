package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/fixture"
	"github.com/prefixd/prefixd/rpc"
	"github.com/prefixd/prefixd/store/memory"
)

// serveRecording serves, on a loopback port, the index built from
// recording a as `prefixd replay` builds it, and returns its address.
func serveRecording(t *testing.T, events string) string {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // runs after the cleanups below
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts := indexer.DefaultOptions()
	opts.Default = indexer.ModelOptions{HashScheme: "llmd", BlockSize: 16, KeyMode: indexer.KeyModeAuto}
	ix, err := indexer.New(st, opts, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := indexer.ReadRecordings([]string{events}, "sim-model")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ix.ApplyRecorded(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	srv, err := rpc.New(ix, rpc.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := srv.NewGRPCServer()
	done := make(chan error, 1)
	go func() { done <- g.Serve(lis) }()
	t.Cleanup(func() {
		g.Stop()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return lis.Addr().String()
}

// query --json prints exactly what replay --query prints for the same
// request, answered by a server over the same recording.
func TestQueryEqualsReplay(t *testing.T) {
	dir := fixture.Path(t, "a_array_random_seedless")
	events := filepath.Join(dir, "events.jsonl")
	first := writeFirstRequest(t)
	code, want, errOut := runCmd(t, "replay", events, "--query", first)
	if code != 0 {
		t.Fatalf("replay: exit %d: %s", code, errOut)
	}
	addr := serveRecording(t, events)
	code, got, errOut := runCmd(t, "query", "--addr", addr, "--chat", first, "--json")
	if code != 0 {
		t.Fatalf("query: exit %d: %s", code, errOut)
	}
	if got != want {
		t.Errorf("query --json:\n%s\nreplay --query:\n%s", got, want)
	}
	if strings.Count(got, "\n") != 1 || !strings.Contains(got, `"127.0.0.1:800`) {
		t.Errorf("want one line with a matched pod: %q", got)
	}

	// For people: a table with the same pods.
	code, table, errOut := runCmd(t, "query", "--addr", addr, "--chat", first, "--model", "sim-model")
	if code != 0 {
		t.Fatalf("query: exit %d: %s", code, errOut)
	}
	if !strings.HasPrefix(table, "model sim-model: ") || !strings.Contains(table, "POD") || !strings.Contains(table, "127.0.0.1:800") {
		t.Errorf("table:\n%s", table)
	}

	// Token ids of a prompt nobody sent match no pod.
	code, out, errOut := runCmd(t, "query", "--addr", addr, "--tokens", strings.Repeat("7,", 40)+"7", "--model", "sim-model", "--json")
	if code != 0 || out != "{\"total_blocks\":2,\"pods\":{}}\n" {
		t.Errorf("tokens query: exit %d %q %s", code, out, errOut)
	}

	// An unknown model is the server's NotFound, naming the known models.
	code, _, errOut = runCmd(t, "query", "--addr", addr, "--prompt", "hello there", "--model", "nope")
	if code != 1 || !strings.Contains(errOut, "NotFound") || !strings.Contains(errOut, "sim-model") {
		t.Errorf("unknown model: exit %d: %s", code, errOut)
	}
}

func TestQueryUsage(t *testing.T) {
	for _, args := range [][]string{
		{"query", "--model", "m"},
		{"query", "--model", "m", "--prompt", "a", "--tokens", "1"},
		{"query", "--prompt", "a"},
		{"query", "--model", "m", "--tokens", "1,x"},
		{"query", "--model", "m", "--block-hashes", "-1"},
		{"query", "--model", "m", "--prompt", "a", "extra"},
	} {
		if code, _, errOut := runCmd(t, args...); code != 2 || !strings.Contains(errOut, "Usage: prefixd query") {
			t.Errorf("%q: exit %d: %s", args, code, errOut)
		}
	}
}

// Every recorded request is taken by query --chat as it was sent and as
// its recorded line: the body is tokenized to the sim's prompt_tokens, and
// both print what replay --query prints for the line.
func TestQueryEveryRecordedRequest(t *testing.T) {
	events := fixture.Path(t, "a_array_random_seedless", "events.jsonl")
	addr := serveRecording(t, events)
	var lines []string
	reqs := fixture.Requests(t, "")
	for _, r := range reqs {
		line, err := json.Marshal(map[string]any{"status": 200, "request": r.Body})
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, string(line))
	}
	all := filepath.Join(t.TempDir(), "requests.jsonl")
	if err := os.WriteFile(all, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCmd(t, "replay", events, "--query", all)
	if code != 0 {
		t.Fatalf("replay: exit %d: %s", code, errOut)
	}
	want := strings.SplitAfter(out, "\n")
	if len(want) != len(reqs)+1 {
		t.Fatalf("replay answered %d of %d requests", len(want)-1, len(reqs))
	}
	dir := t.TempDir()
	for i, r := range reqs {
		where := fmt.Sprintf("%s:%d", filepath.Base(r.File), r.Line)
		body, line := filepath.Join(dir, "body.json"), filepath.Join(dir, "line.json")
		if err := os.WriteFile(body, r.Body, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(line, []byte(lines[i]), 0o600); err != nil {
			t.Fatal(err)
		}
		code, got, errOut := runCmd(t, "query", "--addr", addr, "--chat", line, "--json")
		if code != 0 || got != want[i] {
			t.Fatalf("%s: query --chat LINE --json (exit %d, %s):\n%s\nreplay --query:\n%s", where, code, errOut, got, want[i])
		}
		code, table, errOut := runCmd(t, "query", "--addr", addr, "--chat", body)
		if code != 0 {
			t.Fatalf("%s: query --chat BODY: exit %d: %s", where, code, errOut)
		}
		if r.PromptTokens >= 0 && !strings.HasPrefix(table, fmt.Sprintf("model sim-model: %d tokens,", r.PromptTokens)) {
			t.Fatalf("%s: the sim counted %d tokens; query says:\n%s", where, r.PromptTokens, table)
		}
	}
}
