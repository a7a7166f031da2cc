package rpc

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/indexer/tokenize"
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
		{"bad JSON", `{"model": "m", "token_ids": [1, 2,`, http.StatusBadRequest, "bad JSON body"},
		{"unknown field", `{"model": "m", "tokens": [1]}`, http.StatusBadRequest, `unknown field "tokens"`},
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
