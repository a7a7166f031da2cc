package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/prefixd/prefixd/events/recording"
	"github.com/prefixd/prefixd/internal/fixture"
	"github.com/prefixd/prefixd/rpc/querybody"
)

func runInspectTest(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), append([]string{"inspect"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

var batchLine = regexp.MustCompile(`^(\S+):(\d+) (live|replay) (\S+) seq=(\d+) rank=(\S+) BlockStored=(\d+) BlockRemoved=(\d+) AllBlocksCleared=(\d+) skipped=(\d+) unknown_fields=(\d+)$`)

func TestInspectCounts(t *testing.T) {
	file := fixture.Path(t, "b_map_affinity_seed42_sleepwake", "events.jsonl")
	code, out, errOut := runInspectTest(t, file)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	// verification.txt of recording b: per topic batches and event counts.
	want := map[string][4]int{
		"kv@127.0.0.1:8001@sim-model": {9, 25, 59, 0},
		"kv@127.0.0.1:8002@sim-model": {11, 37, 40, 1},
		"kv@127.0.0.1:8003@sim-model": {11, 30, 62, 0},
	}
	got := map[string][4]int{}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for _, l := range lines {
		m := batchLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		if m[1] != file || m[3] != "live" || m[6] != "0" || m[10] != "0" || m[11] != "0" {
			t.Errorf("unexpected line %q", l)
		}
		c := got[m[4]]
		c[0]++
		for i := 1; i <= 3; i++ {
			n, _ := strconv.Atoi(m[6+i])
			c[i] += n
		}
		got[m[4]] = c
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("counts per topic %v, want %v", got, want)
	}
	for _, w := range []string{
		"summary: 1 files, 31 records, 31 batches, 0 failed",
		"  kv@127.0.0.1:8001@sim-model rank=0: 9 batches, seq 1..9, no gaps",
		"  kv@127.0.0.1:8002@sim-model rank=0: 11 batches, seq 1..11, no gaps",
		"  kv@127.0.0.1:8003@sim-model rank=0: 11 batches, seq 1..11, no gaps",
	} {
		if !strings.Contains(out, w+"\n") {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

// TestInspectGaps runs inspect over recording c's live part files, which
// missed batches while the recorder was down, then with the replay files
// that fill the gaps: a batch in two files counts once.
func TestInspectGaps(t *testing.T) {
	dir := fixture.Path(t, "c_dp2_late_subscriber_restart")
	parts, err := filepath.Glob(filepath.Join(dir, "events-rank*-part*.jsonl"))
	if err != nil || len(parts) != 4 {
		t.Fatalf("part files %v, %v", parts, err)
	}
	code, out, errOut := runInspectTest(t, parts...)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, w := range []string{
		"summary: 4 files, 18 records, 18 batches, 0 failed",
		"  kv@127.0.0.1:8001@sim-model rank=0: 9 batches, seq 3..14, 3 missing in gaps 7..9",
		"  kv@127.0.0.1:8002@sim-model rank=1: 9 batches, seq 2..14, 4 missing in gaps 7..10",
	} {
		if !strings.Contains(out, w+"\n") {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}

	replays, _ := filepath.Glob(filepath.Join(dir, "replay-rank*-from-0.jsonl"))
	code, out, errOut = runInspectTest(t, append(parts, replays...)...)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, w := range []string{
		"summary: 6 files, 46 records, 46 batches, 0 failed",
		"  kv@127.0.0.1:8001@sim-model rank=0: 14 batches, seq 1..14, no gaps",
		"  kv@127.0.0.1:8002@sim-model rank=1: 14 batches, seq 1..14, no gaps",
	} {
		if !strings.Contains(out, w+"\n") {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	if n := strings.Count(out, " replay kv@"); n != 28 {
		t.Errorf("%d replay lines, want 28", n)
	}
}

func TestInspectJSON(t *testing.T) {
	file := fixture.Path(t, "a_array_random_seedless", "events.jsonl")
	code, out, errOut := runInspectTest(t, "--json", file)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	type event struct {
		Type        string           `json:"type"`
		BlockHashes querybody.Hashes `json:"block_hashes"`
		Parent      *string          `json:"parent_block_hash"`
		TokenIDs    []uint32         `json:"token_ids"`
		BlockSize   int              `json:"block_size"`
		Medium      string           `json:"medium"`
		LoRAID      *int64           `json:"lora_id"`
		LoRAName    *string          `json:"lora_name"`
		Raw         json.RawMessage  `json:"-"`
	}
	type batch struct {
		File    string          `json:"file"`
		Record  int             `json:"record"`
		Topic   string          `json:"topic"`
		Seq     uint64          `json:"seq,string"`
		DPRank  *int            `json:"dp_rank"`
		Events  []event         `json:"events"`
		Summary json.RawMessage `json:"summary"`
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	var batches []batch
	var summary json.RawMessage
	stored, removed := 0, 0
	for sc.Scan() {
		var b batch
		// Hashes and seqs are strings, decoded exactly: a float would fail.
		if err := json.Unmarshal(sc.Bytes(), &b); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if b.Summary != nil {
			summary = b.Summary
			continue
		}
		batches = append(batches, b)
		for _, e := range b.Events {
			switch e.Type {
			case "BlockStored":
				stored++
				if e.Parent != nil {
					if _, err := strconv.ParseUint(*e.Parent, 10, 64); err != nil {
						t.Errorf("record %d: parent_block_hash %q: %v", b.Record, *e.Parent, err)
					}
				}
				if len(e.TokenIDs) != 16*len(e.BlockHashes) || e.BlockSize != 16 || e.Medium != "GPU" ||
					e.LoRAID != nil || e.LoRAName != nil {
					t.Errorf("record %d: BlockStored %+v", b.Record, e)
				}
			case "BlockRemoved":
				removed++
			}
		}
	}
	if len(batches) != 34 || stored != 68 || removed != 314 {
		t.Fatalf("%d batches, %d BlockStored, %d BlockRemoved; want 34, 68, 314", len(batches), stored, removed)
	}
	// The first message, checked against its reference decoding.
	first := batches[0]
	if first.File != file || first.Topic != "kv@127.0.0.1:8002@sim-model" || first.Seq != 1 || first.DPRank == nil || *first.DPRank != 0 {
		t.Errorf("first batch %+v", first)
	}
	e := first.Events[0]
	if e.Type != "BlockStored" || len(e.BlockHashes) != 15 || e.BlockHashes[0] != 9294734529213721759 ||
		e.BlockHashes[5] != 12820169052450236838 || e.Parent != nil || e.TokenIDs[0] != 638357778 {
		t.Errorf("first event %+v", e)
	}
	if !strings.Contains(string(summary), `"batches":34,"failed":0`) ||
		!strings.Contains(string(summary), `{"topic":"kv@127.0.0.1:8003@sim-model","dp_rank":0,"batches":13,"first_seq":"1","last_seq":"13","missing":0,"restarts":0,"gaps":[]}`) {
		t.Errorf("summary %s", summary)
	}
}

// TestInspectFailures checks that bad records are reported with their file
// and index, counted, and make the command exit non-zero, while the good
// records around them are still printed.
func TestInspectFailures(t *testing.T) {
	dir := t.TempDir()
	line := func(idx int, frames ...[]byte) string {
		enc := make([]string, len(frames))
		for i, f := range frames {
			enc[i] = strconv.Quote(base64.StdEncoding.EncodeToString(f))
		}
		return fmt.Sprintf(`{"idx": %d, "recv_ts_ns": 1, "nframes": %d, "frames_b64": [%s]}`, idx, len(frames), strings.Join(enc, ", "))
	}
	seq := func(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }
	topic := []byte("kv@10.0.0.1:8000@m")
	good := []byte{0x93, 0x01, 0x91, 0x91, 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd', 0x00}
	bad := filepath.Join(dir, "bad.jsonl")
	content := strings.Join([]string{
		line(0, topic, seq(1), good),
		line(1, topic, seq(2), good[:10]), // truncated msgpack
		line(2, topic, seq(3)[:4], good),  // short seq frame
		line(3, topic),                    // one frame
		line(4, topic, seq(5), good),
	}, "\n") + "\n"
	if err := os.WriteFile(bad, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	// A native recording with a torn last record: a warning, not a failure.
	native := filepath.Join(dir, "torn.pfxd")
	w, err := recording.Create(native)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := w.Append(recording.Message{Frames: [][]byte{topic, seq(uint64(10 + i)), good}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(native)
	if err := os.WriteFile(native, data[:len(data)-3], 0o644); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := runInspectTest(t, bad, native, filepath.Join(dir, "missing.jsonl"))
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	for _, w := range []string{
		bad + ": record 1: decode kv events: truncated msgpack",
		bad + ": record 2: decode kv events: seq frame is not 8 bytes",
		bad + ": record 3 at offset",
		native + ": warning: record 1 at offset",
		"missing.jsonl: no such file or directory",
		"prefixd inspect: 3 of 6 records failed; 1 files could not be read",
	} {
		if !strings.Contains(errOut, w) {
			t.Errorf("stderr lacks %q:\n%s", w, errOut)
		}
	}
	for _, w := range []string{
		bad + ":0 live kv@10.0.0.1:8000@m seq=1 rank=0 BlockStored=0 BlockRemoved=0 AllBlocksCleared=1",
		bad + ":4 live kv@10.0.0.1:8000@m seq=5 rank=0",
		native + ":0 live kv@10.0.0.1:8000@m seq=10 rank=0",
		"summary: 3 files, 6 records, 3 batches, 3 failed, 1 files unreadable",
		"  kv@10.0.0.1:8000@m rank=0: 3 batches, seq 1..10, 7 missing in gaps 2..4 6..9",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("stdout lacks %q:\n%s", w, out)
		}
	}
}

func TestInspectUsage(t *testing.T) {
	code, _, errOut := runInspectTest(t)
	if code != 2 || !strings.Contains(errOut, "Usage: prefixd inspect") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
}

// TestInspectNewFields checks that inspect shows the fields of current
// vLLM (groups, spec kinds, sliding windows, locality, ownership, session
// ids, remaining copy counts) in both encodings, and the names of unknown
// event types and fields, while an event without them prints as before.
func TestInspectNewFields(t *testing.T) {
	topic := []byte("kv@10.0.0.1:8000@m")
	seq := func(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }
	pack := func(v any) []byte {
		t.Helper()
		p, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	payloads := [][]byte{
		// The array encoding, every position filled, one element beyond.
		pack([]any{1.5, []any{
			[]any{"BlockStored", []uint64{7, 8}, uint64(6), []uint32{1, 2, 3, 4}, 2, nil, "GPU", nil, nil,
				1, "sliding_window", 4096, "LOCAL", "lmcache", "session-1"},
			[]any{"BlockRemoved", []uint64{7}, "STORAGE", 1, "REMOTE", "lmcache", []uint64{0, 2}, "later"},
			[]any{"BlockInactive", []uint64{7}},
		}, 0}),
		// The map encoding.
		pack(map[string]any{"ts": 2.5, "data_parallel_rank": 0, "events": []any{
			map[string]any{"type": "BlockStored", "block_hashes": []uint64{9}, "parent_block_hash": nil,
				"token_ids": []uint32{5, 6}, "block_size": 2, "medium": "CPU", "group_idx": 0,
				"kv_cache_spec_kind": "full_attention", "locality": "local", "ownership": "offload\x00tier"},
			map[string]any{"type": "BlockRemoved", "block_hashes": []uint64{9}, "medium": "FS",
				"remaining_copy_counts": []uint64{3}, "event_version": 2},
		}}),
		// An event as the recordings hold them: none of the new fields.
		pack([]any{3.5, []any{
			[]any{"BlockStored", []uint64{10}, nil, []uint32{1, 2}, 2, nil, "GPU", nil, nil},
			[]any{"BlockRemoved", []uint64{10}, "GPU"},
		}, 0}),
	}
	file := filepath.Join(t.TempDir(), "new-fields.pfxd")
	w, err := recording.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range payloads {
		if err := w.Append(recording.Message{Frames: [][]byte{topic, seq(uint64(i + 1)), p}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := runInspectTest(t, "--json", file)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines:\n%s", len(lines), out)
	}
	for _, l := range lines {
		if !json.Valid([]byte(l)) {
			t.Errorf("invalid JSON line %s", l)
		}
	}
	for i, want := range [][]string{
		{`"unknown_fields":1,"skipped_types":{"BlockInactive":1},"unknown_field_names":{"BlockRemoved[7]":1},"events":[`,
			`{"type":"BlockStored","block_hashes":["7","8"],"parent_block_hash":"6","token_ids":[1,2,3,4],"block_size":2,"medium":"GPU","lora_id":null,"lora_name":null,` +
				`"group_idx":1,"kv_cache_spec_kind":"sliding_window","kv_cache_spec_sliding_window":4096,"locality":"LOCAL","ownership":"lmcache","session_id":"session-1"}`,
			`{"type":"BlockRemoved","block_hashes":["7"],"medium":"STORAGE","group_idx":1,"locality":"REMOTE","ownership":"lmcache","remaining_copy_counts":[0,2]}]`,
		},
		{`"skipped":0,"unknown_fields":1,"unknown_field_names":{"event_version":1},"events":[`,
			`"medium":"CPU","lora_id":null,"lora_name":null,"group_idx":0,"kv_cache_spec_kind":"full_attention","locality":"LOCAL","ownership":"offload\u0000tier"}`,
			`{"type":"BlockRemoved","block_hashes":["9"],"medium":"FS","remaining_copy_counts":[3]}]`,
		},
		{`"skipped":0,"unknown_fields":0,"events":[` +
			`{"type":"BlockStored","block_hashes":["10"],"parent_block_hash":null,"token_ids":[1,2],"block_size":2,"medium":"GPU","lora_id":null,"lora_name":null},` +
			`{"type":"BlockRemoved","block_hashes":["10"],"medium":"GPU"}]}`,
		},
	} {
		for _, w := range want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("line %d lacks %s:\n%s", i, w, lines[i])
			}
		}
	}

	code, out, errOut = runInspectTest(t, file)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, w := range []string{
		file + `:0 live kv@10.0.0.1:8000@m seq=1 rank=0 BlockStored=1 BlockRemoved=1 AllBlocksCleared=0 skipped=1 unknown_fields=1 skipped_types={"BlockInactive":1} unknown_field_names={"BlockRemoved[7]":1}` + "\n",
		file + `:1 live kv@10.0.0.1:8000@m seq=2 rank=0 BlockStored=1 BlockRemoved=1 AllBlocksCleared=0 skipped=0 unknown_fields=1 unknown_field_names={"event_version":1}` + "\n",
		file + `:2 live kv@10.0.0.1:8000@m seq=3 rank=0 BlockStored=1 BlockRemoved=1 AllBlocksCleared=0 skipped=0 unknown_fields=0` + "\n",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}
