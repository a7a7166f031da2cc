package main

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/internal/fixture"
)

func TestReplayAnswersQueries(t *testing.T) {
	dir := fixture.Path(t, "a_array_random_seedless")
	code, out, errOut := runCmd(t, "replay", filepath.Join(dir, "events.jsonl"), "--query", filepath.Join(dir, "requests.jsonl"))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 78 {
		t.Fatalf("%d answers, want one per request (78)", len(lines))
	}
	matched := 0
	for i, l := range lines {
		var a struct {
			TotalBlocks int `json:"total_blocks"`
			Pods        map[string]struct {
				Blocks int `json:"blocks"`
				Tokens int `json:"tokens"`
			} `json:"pods"`
		}
		if err := json.Unmarshal([]byte(l), &a); err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		if a.TotalBlocks <= 0 {
			t.Fatalf("line %d: total_blocks %d", i, a.TotalBlocks)
		}
		for pod, p := range a.Pods {
			if !regexp.MustCompile(`^127\.0\.0\.1:800[123]$`).MatchString(pod) || p.Blocks < 1 || p.Blocks > a.TotalBlocks || p.Tokens != 16*p.Blocks {
				t.Fatalf("line %d: pod %s %+v of %d blocks", i, pod, p, a.TotalBlocks)
			}
			matched++
		}
	}
	if matched == 0 {
		t.Fatal("no query matched any pod")
	}
	// The final per-pod block counts of verification.txt.
	for _, pod := range []string{"8001", "8002", "8003"} {
		if !strings.Contains(errOut, "pod 127.0.0.1:"+pod+" model sim-model blocks 64 ") {
			t.Errorf("stderr lacks pod %s with 64 blocks:\n%s", pod, errOut)
		}
	}
}

// A live recording with gaps and the complete replay of the same stream
// apply each batch once; the result equals the replay's alone.
func TestReplayDeduplicatesAcrossFiles(t *testing.T) {
	dir := fixture.Path(t, "c_dp2_late_subscriber_restart")
	all, _ := filepath.Glob(filepath.Join(dir, "events-rank*-part*.jsonl"))
	replays, _ := filepath.Glob(filepath.Join(dir, "replay-rank?-from-0.jsonl"))
	code, _, both := runCmd(t, append(append([]string{"replay"}, all...), replays...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, both)
	}
	code, _, alone := runCmd(t, append([]string{"replay"}, replays...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, alone)
	}
	podLines := func(s string) string {
		return strings.Join(regexp.MustCompile(`(?m)^pod .*$`).FindAllString(s, -1), "\n")
	}
	if podLines(both) != podLines(alone) || !strings.Contains(alone, "pod 127.0.0.1:8002 model sim-model blocks 64 seq 14") {
		t.Errorf("with part files:\n%s\nreplays alone:\n%s", podLines(both), podLines(alone))
	}
	if !regexp.MustCompile(`\(18 duplicates\)`).MatchString(both) {
		t.Errorf("duplicates not reported: %s", both)
	}
}

func TestReplayUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"replay"},
		{"replay", "--key-mode", "sometimes", "x.jsonl"},
		{"replay", "--hash-scheme", "md5", "x.jsonl"},
		{"replay", "--block-size", "0", "x.jsonl"},
	} {
		if code, _, errOut := runCmd(t, args...); code != 2 || errOut == "" {
			t.Errorf("%v: exit %d, stderr %q; want 2 and a message", args, code, errOut)
		}
	}
	if code, _, errOut := runCmd(t, "replay", filepath.Join(t.TempDir(), "missing.jsonl")); code != 1 || !strings.Contains(errOut, "missing.jsonl") {
		t.Errorf("missing file: exit %d, %q", code, errOut)
	}
}
