package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/tokenize"
	"github.com/prefixd/prefixd/internal/fixture"
	prefixdv1 "github.com/prefixd/prefixd/proto/prefixd/v1"
	"github.com/prefixd/prefixd/store/memory"
)

func TestHTTPMatch(t *testing.T) {
	f := newFleet(t)
	h, err := NewHTTPHandler(f.ix, Options{Limits: Limits{MaxTokens: 1 << 16, MaxBlockHashes: 1024, MaxMessageBytes: 64 << 10, MaxConcurrent: 4, MaxInflightBytes: 1 << 20, ReadTimeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	post := func(body string) (int, []byte) {
		t.Helper()
		resp, err := http.Post(srv.URL+"/v1/match", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var raw json.RawMessage
		if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
			t.Fatalf("answer is not JSON: %v", err)
		}
		return resp.StatusCode, raw
	}
	marshal := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	n := len(f.hashes)
	for name, body := range map[string]string{
		"messages":     marshal(map[string]any{"model": testModel, "messages": f.messages}),
		"prompt":       marshal(map[string]any{"model": testModel, "prompt": string(tokenize.AppendFlat(nil, f.messages))}),
		"token_ids":    marshal(map[string]any{"model": testModel, "token_ids": f.tokens}),
		"block_hashes": marshal(map[string]any{"model": testModel, "block_hashes": f.hashes}),
		// Hashes as protojson writes them, and an OpenAI body as it is.
		"block_hashes as strings": marshal(QueryJSON{Model: testModel, BlockHashes: f.hashes}),
		"OpenAI chat body": marshal(map[string]any{
			"model": testModel, "messages": f.messages, "max_tokens": 32, "stream": true, "stream_options": map[string]any{"include_usage": true},
			"temperature": 0.2, "n": 1, "tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "f", "parameters": map[string]any{"type": "object"}}}},
		}),
		"OpenAI completions body": marshal(map[string]any{"model": testModel, "prompt": []string{string(tokenize.AppendFlat(nil, f.messages))}, "max_tokens": 8, "echo": false}),
		"prompt of token ids":     marshal(map[string]any{"model": testModel, "prompt": f.tokens, "logprobs": nil}),
	} {
		t.Run(name, func(t *testing.T) {
			code, raw := post(body)
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, raw)
			}
			var got MatchResponseJSON
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatal(err)
			}
			if got.Model != testModel || got.BlockSize != 16 || got.TotalBlocks != n || len(got.Pods) != 2 {
				t.Fatalf("answer %s", raw)
			}
			a, b := got.Pods[0], got.Pods[1]
			if a.Pod != podA || a.Blocks != n || a.GPUBlocks != n || a.Tokens != 16*n || a.Score != 1 || b.Pod != podB || b.Blocks != n/2 {
				t.Errorf("answer %s", raw)
			}
		})
	}

	for _, tc := range []struct {
		name, body string
		code       int
		msg        string
	}{
		{"bad JSON", `{"model": "m", "token_ids": [1, 2,`, http.StatusBadRequest, "bad request body"},
		{"bad JSON in a skipped field", `{"model": "m", "token_ids": [1], "tools": [}`, http.StatusBadRequest, "bad request body"},
		{"no input, other fields", `{"model": "m", "tokens": [1], "max_tokens": 3}`, http.StatusBadRequest, "empty query"},
		{"a batch of prompts", `{"model": "m", "prompt": ["a", "b"]}`, http.StatusBadRequest, "a batch of more than one prompt"},
		{"a bad hash", `{"model": "m", "block_hashes": ["0x12"]}`, http.StatusBadRequest, "block_hashes: want an integer"},
		{"two values", `{"model": "m", "token_ids": [1]} {}`, http.StatusBadRequest, "more than one value"},
		{"empty prompt", `{"model": "m", "prompt": ""}`, http.StatusBadRequest, "empty query"},
		{"unknown model", `{"model": "nope", "token_ids": [1]}`, http.StatusNotFound, "known models are m"},
		{"oversized", marshal(map[string]any{"model": testModel, "prompt": strings.Repeat("word ", 20<<10)}), http.StatusRequestEntityTooLarge, "the limit is 65536 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, raw := post(tc.body)
			var e ErrorJSON
			if err := json.Unmarshal(raw, &e); err != nil {
				t.Fatal(err)
			}
			if code != tc.code || !strings.Contains(e.Error, tc.msg) || e.Code == "" {
				t.Errorf("status %d %s, want %d with %q", code, raw, tc.code, tc.msg)
			}
		})
	}

	resp, err := http.Get(srv.URL + "/v1/match")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/match: %d", resp.StatusCode)
	}
}

func TestHTTPPods(t *testing.T) {
	f := newFleet(t)
	s := newServer(t, f, Options{})
	rec := httptest.NewRecorder()
	s.HTTPHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/pods", nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d %q: %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	var got PodsResponseJSON
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Pods) != 2 {
		t.Fatalf("pods %s", rec.Body)
	}
	a := got.Pods[0]
	if a.Name != podA || a.Model != testModel || a.Blocks != len(f.hashes) || a.Seq != 7 || !a.HasSeq || a.LastEventTime == nil || a.Stale {
		t.Errorf("pod A %+v", a)
	}
	if !strings.Contains(rec.Body.String(), `"seq":"7"`) {
		t.Errorf("seq not a string: %s", rec.Body)
	}
	// Over the concurrency limit: 429.
	for range cap(s.sem) {
		s.sem <- struct{}{}
	}
	rec = httptest.NewRecorder()
	s.HTTPHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/pods", nil))
	for range cap(s.sem) {
		<-s.sem
	}
	if rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), "too many concurrent queries") {
		t.Errorf("at the limit: %d %s", rec.Code, rec.Body)
	}
}

func TestHTTPScoreAndStats(t *testing.T) {
	f := newFleet(t)
	_ = f.ix.SetStale(context.Background(), podB, true)
	s := newServer(t, f, Options{Stats: fakeStats{BatchesPerSecond: 3, EventsPerSecond: 48, MemoryBytes: 12345}})
	do := func(method, path, body string) (int, string) {
		t.Helper()
		rec := httptest.NewRecorder()
		s.HTTPHandler().ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" && rec.Code != http.StatusMethodNotAllowed {
			t.Errorf("%s %s: Content-Type %q", method, path, ct)
		}
		return rec.Code, rec.Body.String()
	}
	const other = "10.0.0.9:8000"
	body, _ := json.Marshal(map[string]any{"model": testModel, "token_ids": f.tokens, "pods": []string{podA, podB, other}, "max_tokens": 1})
	code, out := do(http.MethodPost, "/v1/score", string(body))
	var got ScoreResponseJSON
	if err := json.Unmarshal([]byte(out), &got); code != http.StatusOK || err != nil {
		t.Fatalf("POST /v1/score: %d %s", code, out)
	}
	if len(got.Scores) != 3 || got.Scores[podA] != 1 || got.Scores[podB] != 0 || got.Scores[other] != 0 ||
		len(got.StalePods) != 1 || got.StalePods[0] != podB || got.IncompletePods == nil || len(got.IncompletePods) != 0 {
		t.Errorf("POST /v1/score: %s", out)
	}
	// The same answer as gRPC's Score.
	resp, err := s.Score(context.Background(), &prefixdv1.Query{Model: testModel, TokenIds: f.tokens, Pods: []string{podA, podB, other}})
	if err != nil || !maps.Equal(resp.GetScores(), got.Scores) || !slices.Equal(resp.GetStalePods(), got.StalePods) || len(resp.GetIncompletePods()) != 0 {
		t.Errorf("Score: %v, %v; HTTP %+v", resp, err, got)
	}
	if code, out := do(http.MethodPost, "/v1/score", `{"model":"nope","prompt":"hi"}`); code != http.StatusNotFound || !strings.Contains(out, "known models are m") {
		t.Errorf("unknown model: %d %s", code, out)
	}
	if code, _ := do(http.MethodGet, "/v1/score", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/score: %d", code)
	}

	code, out = do(http.MethodGet, "/v1/stats", "")
	var st StatsResponseJSON
	if err := json.Unmarshal([]byte(out), &st); code != http.StatusOK || err != nil {
		t.Fatalf("GET /v1/stats: %d %s", code, out)
	}
	n := uint64(len(f.hashes))
	if st.Pods != 2 || st.IndexBlocks != n+n/2 || st.MemoryBytes != 12345 || st.HeapInuseBytes == 0 || st.BatchesPerSecond != 3 || st.EventsPerSecond != 48 {
		t.Errorf("GET /v1/stats: %s", out)
	}
	// Over the concurrency limit: 429, as every endpoint.
	for range cap(s.sem) {
		s.sem <- struct{}{}
	}
	for _, r := range [][2]string{{http.MethodGet, "/v1/stats"}, {http.MethodPost, "/v1/score"}} {
		if code, out := do(r[0], r[1], string(body)); code != http.StatusTooManyRequests || !strings.Contains(out, `"reason":"concurrency"`) {
			t.Errorf("%s %s at the limit: %d %s", r[0], r[1], code, out)
		}
	}
	for range cap(s.sem) {
		<-s.sem
	}
	for _, m := range []string{methodHTTPScore, methodHTTPStats} {
		if got := testutil.ToFloat64(s.metrics.queries.WithLabelValues(m, resultRejected)); got != 1 {
			t.Errorf("queries{%s,rejected} = %v, want 1", m, got)
		}
	}
}

// Every recorded request body, as the workload sent it to the sim, is
// accepted by POST /v1/match and POST /v1/score, and tokenized to the
// sim's own prompt_tokens.
func TestHTTPRecordedBodies(t *testing.T) {
	st, err := memory.New(memory.Options{CapacityBlocks: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	opts := indexer.DefaultOptions()
	opts.Models = map[string]indexer.ModelOptions{"sim-model": {HashScheme: "llmd", BlockSize: 16, KeyMode: indexer.KeyModeEngine}}
	ix, err := indexer.New(st, opts, nil, quiet)
	if err != nil {
		t.Fatal(err)
	}
	s := newServer(t, &fleet{ix: ix}, Options{})
	h := s.HTTPHandler()
	checked := 0
	for _, r := range fixture.Requests(t, "") {
		for _, path := range []string{"/v1/match", "/v1/score"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(r.Body)))
			if rec.Code != http.StatusOK {
				t.Fatalf("%s:%d: POST %s: %d %s", r.File, r.Line, path, rec.Code, rec.Body)
			}
			if path != "/v1/match" || r.PromptTokens < 0 {
				continue
			}
			var m MatchResponseJSON
			if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil || m.Tokens != r.PromptTokens {
				t.Fatalf("%s:%d: %d tokens (%v), the sim counted %d", r.File, r.Line, m.Tokens, err, r.PromptTokens)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no recorded request with prompt_tokens")
	}
}
