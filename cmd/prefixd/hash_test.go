package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/blockhash"
	"github.com/prefixd/prefixd/indexer/tokenize"
	"github.com/prefixd/prefixd/internal/fixture"
	"github.com/prefixd/prefixd/rpc/querybody"
	"github.com/prefixd/prefixd/rpc/querylimit"
)

// runCmd runs prefixd with args and returns its exit code and output.
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// writeFirstRequest writes the body of recording a's first chat request to
// a file of its own, one line, as --chat and replay --query read it.
func writeFirstRequest(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "chat.json")
	body := fixture.Requests(t, "a_array_random_seedless")[0].Body
	if err := os.WriteFile(path, append(body, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// firstRecorded returns the first chat request of recording a, written to a
// file, and the block hashes of the first BlockStored it caused.
func firstRecorded(t *testing.T) (chatFile string, want []uint64) {
	t.Helper()
	dir := fixture.Path(t, "a_array_random_seedless")
	chatFile = writeFirstRequest(t)
	// That request's prompt was the first stored: batch 0, event 0.
	ev, err := os.ReadFile(filepath.Join(dir, "events.decoded.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	d := json.NewDecoder(bytes.NewReader(ev))
	d.UseNumber()
	var batch struct {
		Events [][]any `json:"events"`
	}
	if err := d.Decode(&batch); err != nil {
		t.Fatal(err)
	}
	for _, x := range batch.Events[0][1].([]any) {
		v, err := strconv.ParseUint(x.(json.Number).String(), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, v)
	}
	return chatFile, want
}

func parseLines(t *testing.T, s string) []uint64 {
	t.Helper()
	var out []uint64
	for line := range strings.Lines(s) {
		v, err := strconv.ParseUint(strings.TrimSpace(line), 10, 64)
		if err != nil {
			t.Fatalf("output line %q: %v", line, err)
		}
		out = append(out, v)
	}
	return out
}

func TestHashChatMatchesRecording(t *testing.T) {
	chat, want := firstRecorded(t)
	code, out, errOut := runCmd(t, "hash", "--hash-scheme", "llmd", "--hash-seed", "", "--model", "sim-model", "--block-size", "16", "--chat", chat)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if got := parseLines(t, out); !slices.Equal(got, want) {
		t.Errorf("hashes %v, want the recorded %v", got, want)
	}

	// --json, with the model taken from the request body.
	code, out, errOut = runCmd(t, "hash", "--chat", chat, "--json")
	if code != 0 {
		t.Fatalf("--json: exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, `"block_hashes":["`) {
		t.Errorf("--json: hashes are not strings: %s", out)
	}
	var res struct {
		TokenCount  int              `json:"token_count"`
		TokenIDs    []uint32         `json:"token_ids"`
		BlockHashes querybody.Hashes `json:"block_hashes"`
	}
	d := json.NewDecoder(strings.NewReader(out))
	d.DisallowUnknownFields()
	if err := d.Decode(&res); err != nil {
		t.Fatalf("--json output %q: %v", out, err)
	}
	// 248 is the sim's usage.prompt_tokens for that request.
	if res.TokenCount != 248 || len(res.TokenIDs) != 248 || !slices.Equal([]uint64(res.BlockHashes), want) {
		t.Errorf("--json: %d tokens (%d ids), hashes %v", res.TokenCount, len(res.TokenIDs), res.BlockHashes)
	}

	// The same chat as a bare messages array, and as token ids.
	var body struct {
		Messages json.RawMessage `json:"messages"`
	}
	data, _ := os.ReadFile(chat)
	if err := json.Unmarshal(data, &body); err != nil {
		t.Fatal(err)
	}
	bare := filepath.Join(t.TempDir(), "messages.json")
	if err := os.WriteFile(bare, body.Messages, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runCmd(t, "hash", "--model", "sim-model", "--chat", bare)
	if code != 0 || !slices.Equal(parseLines(t, out), want) {
		t.Errorf("bare messages: exit %d, %q, %s", code, out, errOut)
	}
	ids := make([]string, len(res.TokenIDs))
	for i, id := range res.TokenIDs {
		ids[i] = strconv.FormatUint(uint64(id), 10)
	}
	code, out, errOut = runCmd(t, "hash", "--model", "sim-model", "--tokens", strings.Join(ids, ","))
	if code != 0 || !slices.Equal(parseLines(t, out), want) {
		t.Errorf("--tokens: exit %d, %q, %s", code, out, errOut)
	}
	// A completions body of the flattened chat, and of its token ids.
	for name, prompt := range map[string]any{"text": string(tokenize.AppendFlat(nil, chatMessages(t, data))), "token ids": res.TokenIDs} {
		file := filepath.Join(t.TempDir(), "completion.json")
		b, _ := json.Marshal(map[string]any{"model": "sim-model", "prompt": prompt, "max_tokens": 16, "echo": false})
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errOut = runCmd(t, "hash", "--chat", file)
		if code != 0 || !slices.Equal(parseLines(t, out), want) {
			t.Errorf("completions body of %s: exit %d, %q, %s", name, code, out, errOut)
		}
	}
}

func chatMessages(t *testing.T, body []byte) []tokenize.Message {
	t.Helper()
	var q indexer.Query
	if err := querybody.Decode(body, &q, querylimit.Limits{}, nil); err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// Every recorded request, as a body and as its recorded line, is hashed
// from the sim's own token count, and a recorded line hashes as its body.
func TestHashEveryRecordedRequest(t *testing.T) {
	for _, dir := range fixture.Recordings {
		files, _ := filepath.Glob(fixture.Path(t, dir, "requests*.jsonl"))
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			reqs := fixture.Requests(t, dir)
			lines := bytes.Split(bytes.TrimSpace(data), []byte("\n"))
			for i, line := range lines {
				r := findRequest(t, reqs, file, i+1)
				lineFile := filepath.Join(t.TempDir(), "line.json")
				bodyFile := filepath.Join(t.TempDir(), "body.json")
				if err := os.WriteFile(lineFile, line, 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(bodyFile, r.Body, 0o600); err != nil {
					t.Fatal(err)
				}
				code, fromLine, errOut := runCmd(t, "hash", "--chat", lineFile, "--json")
				if code != 0 {
					t.Fatalf("%s:%d: exit %d: %s", file, i+1, code, errOut)
				}
				code, fromBody, errOut := runCmd(t, "hash", "--chat", bodyFile, "--json")
				if code != 0 || fromBody != fromLine {
					t.Fatalf("%s:%d: the body (exit %d, %s) hashes to\n%s\nthe recorded line to\n%s", file, i+1, code, errOut, fromBody, fromLine)
				}
				var res struct {
					TokenCount int `json:"token_count"`
				}
				if err := json.Unmarshal([]byte(fromLine), &res); err != nil {
					t.Fatal(err)
				}
				if r.PromptTokens >= 0 && res.TokenCount != r.PromptTokens {
					t.Errorf("%s:%d: %d tokens, the sim counted %d", file, i+1, res.TokenCount, r.PromptTokens)
				}
			}
		}
	}
}

// findRequest returns the request recorded at file:line.
func findRequest(t *testing.T, reqs []fixture.Request, file string, line int) fixture.Request {
	t.Helper()
	for _, r := range reqs {
		if r.File == file && r.Line == line {
			return r
		}
	}
	t.Fatalf("no request at %s:%d", file, line)
	return fixture.Request{}
}

func TestHashSchemes(t *testing.T) {
	tokens := "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16, 17"
	cases := []struct {
		args []string
		want string
	}{
		// vLLM sha256_cbor with PYTHONHASHSEED=0 (vectors_test.go).
		{[]string{"--hash-scheme", "vllm-sha256-cbor", "--hash-seed", "0", "--tokens", tokens}, "3236607068019569386\n"},
		// Without --hash-seed: vLLM's default seed.
		{[]string{"--hash-scheme", "vllm-sha256-cbor", "--tokens", tokens[:strings.LastIndex(tokens, ",")] + ",17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32"},
			"8866452693264111234\n807986237951177663\n"},
		// vLLM xxhash_cbor with PYTHONHASHSEED=0 (vectors_test.go); like
		// sha256_cbor it hashes no model name.
		{[]string{"--hash-scheme", "vllm-xxhash-cbor", "--hash-seed", "0", "--tokens", tokens}, "882618318818381833\n"},
		{[]string{"--hash-scheme", "vllm-xxhash-cbor", "--hash-seed", "0", "--model", "any", "--cache-salt", "salt-xyz",
			"--tokens", tokens[:strings.LastIndex(tokens, ",")] + ",17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32"},
			"13007029935467775460\n9366013002441041378\n"},
		// Fewer tokens than a block: no hashes.
		{[]string{"--model", "m", "--prompt", "too short"}, ""},
	}
	for _, c := range cases {
		code, out, errOut := runCmd(t, append([]string{"hash"}, c.args...)...)
		if code != 0 || out != c.want {
			t.Errorf("%q: exit %d, %q, want %q; %s", c.args, code, out, c.want, errOut)
		}
	}
	code, out, errOut := runCmd(t, "hash", "--hash-scheme", "xxh3", "--model", "m", "--cache-salt", "s", "--block-size", "4",
		"--prompt", "the quick brown fox jumps over the lazy dog, again and again")
	if code != 0 || len(parseLines(t, out)) != 3 {
		t.Errorf("xxh3 prompt: exit %d, %q, %s", code, out, errOut)
	}
}

// TestHashHelp checks that hash --help names every scheme and what prefixd
// does for the vLLM algorithms it cannot reproduce.
func TestHashHelp(t *testing.T) {
	code, _, errOut := runCmd(t, "hash", "--help")
	if code != 0 {
		t.Fatalf("hash --help: exit %d", code)
	}
	want := append(strings.Split(blockhash.SchemeNames, "|"), "sha256_cbor", "xxhash_cbor", "PYTHONHASHSEED",
		"default algorithm, sha256", "xxhash hash Python pickle", "tokens key mode")
	for _, w := range want {
		if !strings.Contains(errOut, w) {
			t.Errorf("hash --help does not say %q:\n%s", w, errOut)
		}
	}
}

func TestHashUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--model", "m"},
		{"--model", "m", "--prompt", "a", "--tokens", "1"},
		{"--model", "m", "--tokens", "1,x"},
		{"--model", "m", "--tokens", "4294967296"},
		{"--model", "m", "--tokens", ""},
		{"--hash-scheme", "sha256", "--model", "m", "--tokens", "1"},
		{"--hash-scheme", "xxhash_cbor", "--tokens", "1"}, // vLLM's name, not prefixd's
		{"--hash-scheme", "xxh3", "--tokens", "1"},        // xxh3 needs a model
		{"--model", "m", "--block-size", "0", "--tokens", "1"},
		{"--model", "m", "--cache-salt", "s", "--tokens", "1"},
		{"--tokens", "1"}, // llmd needs a model
		{"--model", "m", "--tokens", "1", "extra"},
		{"--no-such-flag"},
	} {
		code, out, errOut := runCmd(t, append([]string{"hash"}, args...)...)
		if code != 2 || out != "" || !strings.Contains(errOut, "Usage: prefixd hash") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want a usage error", args, code, out, errOut)
		}
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"model":"m","messages":"no"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, chat := range []string{bad, filepath.Join(t.TempDir(), "missing.json")} {
		code, _, errOut := runCmd(t, "hash", "--chat", chat)
		if code != 1 || !strings.Contains(errOut, "prefixd hash: --chat") {
			t.Errorf("--chat %s: exit %d, %q", chat, code, errOut)
		}
	}
}
