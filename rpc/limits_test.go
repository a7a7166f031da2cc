package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/recovery"
	prefixdv1 "github.com/prefixd/prefixd/proto/prefixd/v1"
	"github.com/prefixd/prefixd/rpc/internal/codec"
	"github.com/prefixd/prefixd/store"
	"github.com/prefixd/prefixd/store/memory"
)

var quiet = slog.New(slog.DiscardHandler)

// smallLimits leave room for a few queries of a 64 KiB message at once.
func smallLimits() Limits {
	return Limits{MaxTokens: 4096, MaxBlockHashes: 256, MaxMessageBytes: 64 << 10, MaxConcurrent: 4, MaxInflightBytes: 256 << 10, ReadTimeout: time.Minute}
}

func refusedCount(s *Server, reason string) float64 {
	return testutil.ToFloat64(s.metrics.refused.WithLabelValues(reason))
}

// httpDo serves one request with s's handler and returns the status and
// error answer (empty for a 200).
func httpDo(t *testing.T, s *Server, r *http.Request) (int, ErrorJSON) {
	t.Helper()
	rec := httptest.NewRecorder()
	s.HTTPHandler().ServeHTTP(rec, r)
	var e ErrorJSON
	if rec.Code != http.StatusOK {
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
			t.Fatalf("status %d, answer is not an ErrorJSON: %s", rec.Code, rec.Body)
		}
	}
	return rec.Code, e
}

// countingReader counts what is read of a body.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// POST /v1/match and POST /v1/score are admitted alike.
func TestHTTPAdmission(t *testing.T) {
	for path, method := range map[string]string{"/v1/match": methodHTTPMatch, "/v1/score": methodHTTPScore} {
		t.Run(path, func(t *testing.T) { testHTTPAdmission(t, path, method) })
	}
}

func testHTTPAdmission(t *testing.T, path, method string) {
	f := newFleet(t)
	s := newServer(t, f, Options{Limits: smallLimits(), Metrics: NewMetrics(nil)})
	body, _ := json.Marshal(map[string]any{"model": testModel, "token_ids": f.tokens})
	post := func(body io.Reader, size int64) *http.Request {
		r := httptest.NewRequest(http.MethodPost, path, body)
		r.ContentLength = size
		return r
	}
	check := func(name string, r *http.Request, wantCode int, wantReason, wantMsg string) {
		t.Helper()
		code, e := httpDo(t, s, r)
		if code != wantCode || e.Reason != wantReason || !strings.Contains(e.Error, wantMsg) {
			t.Errorf("%s: %d %+v, want %d, reason %q, %q", name, code, e, wantCode, wantReason, wantMsg)
		}
		if n := s.budget.inUse.Load(); n != 0 {
			t.Errorf("%s: %d bytes still reserved after the answer", name, n)
		}
	}
	check("known length", post(bytes.NewReader(body), int64(len(body))), http.StatusOK, "", "")
	check("unknown length", post(bytes.NewReader(body), -1), http.StatusOK, "", "")

	// Over the size limit by Content-Length: refused before reading, then
	// drained when it is not too long, left unread when it is.
	big := &countingReader{r: strings.NewReader(strings.Repeat(" ", 100<<10))}
	check("too large", post(big, 100<<10), http.StatusRequestEntityTooLarge, reasonTooLarge, "a body of 102400 bytes, the limit is 65536 bytes")
	if big.n != 100<<10 {
		t.Errorf("drained %d bytes of a body refused by its Content-Length", big.n)
	}
	huge := &countingReader{r: strings.NewReader(strings.Repeat(" ", 200<<10))}
	check("far too large", post(huge, 200<<10), http.StatusRequestEntityTooLarge, reasonTooLarge, "a body of 204800 bytes")
	if huge.n != 0 {
		t.Errorf("read %d bytes of a body of more than twice the limit", huge.n)
	}
	chunked := post(strings.NewReader(`{"model":"m","prompt":"`+strings.Repeat("x", 70<<10)+`"}`), -1)
	check("too large, unknown length", chunked, http.StatusRequestEntityTooLarge, reasonTooLarge, "more than 65536 bytes")

	// The byte budget taken by other queries: refused before reading, and
	// the body is drained after the answer.
	s.budget.inUse.Store(s.budget.max - int64(len(body)) + 1)
	refused := &countingReader{r: bytes.NewReader(body)}
	code, e := httpDo(t, s, post(refused, int64(len(body))))
	s.budget.inUse.Store(0)
	if code != http.StatusTooManyRequests || e.Reason != reasonMemory || e.Code != "ResourceExhausted" || !strings.Contains(e.Error, "the limit is 262144 bytes") {
		t.Errorf("over the byte budget: %d %+v", code, e)
	}
	if refused.n != len(body) {
		t.Errorf("drained %d bytes of the refused body of %d", refused.n, len(body))
	}
	// Room for the body but not for what decoding it holds.
	s.budget.inUse.Store(s.budget.max - int64(len(body)) - 8)
	code, e = httpDo(t, s, post(bytes.NewReader(body), int64(len(body))))
	s.budget.inUse.Store(0)
	if code != http.StatusTooManyRequests || e.Reason != reasonMemory {
		t.Errorf("no room to decode: %d %+v", code, e)
	}

	// Every slot taken.
	for range cap(s.sem) {
		s.sem <- struct{}{}
	}
	check("concurrency", post(bytes.NewReader(body), int64(len(body))), http.StatusTooManyRequests, reasonConcurrency, "too many concurrent queries: the limit is 4")
	for range cap(s.sem) {
		<-s.sem
	}

	// Limits applied while parsing and tokenizing.
	ids := strings.TrimSuffix(strings.Repeat("7,", 4097), ",")
	check("tokens", post(strings.NewReader(`{"model":"m","token_ids":[`+ids+`]}`), -1), http.StatusBadRequest, reasonTokens, "query has more than 4096 tokens: the limit is 4096")
	hashes := strings.TrimSuffix(strings.Repeat("7,", 257), ",")
	check("block hashes", post(strings.NewReader(`{"model":"m","block_hashes":[`+hashes+`]}`), -1), http.StatusBadRequest, reasonBlockHashes, "query has more than 256 block hashes: the limit is 256")
	check("prompt", post(strings.NewReader(`{"model":"m","prompt":"`+strings.Repeat("a ", 4097)+`"}`), -1), http.StatusBadRequest, reasonTokens, "more than 4096 tokens: the limit is 4096")
	msgs := strings.TrimSuffix(strings.Repeat(`{"role":"user","content":"hi"},`, 1025), ",")
	check("messages", post(strings.NewReader(`{"model":"m","messages":[`+msgs+`]}`), -1), http.StatusBadRequest, reasonTokens, "more than 4096 tokens: the limit is 4096")
	check("chat text", post(strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"`+strings.Repeat("a ", 4097)+`"}]}`), -1), http.StatusBadRequest, reasonTokens, "more than 4096 tokens")

	for reason, want := range map[string]float64{reasonMemory: 2, reasonConcurrency: 1, reasonTooLarge: 3, reasonTokens: 4, reasonBlockHashes: 1} {
		if got := refusedCount(s, reason); got != want {
			t.Errorf("refused{%s} = %v, want %v", reason, got, want)
		}
	}
	if got := testutil.ToFloat64(s.metrics.queries.WithLabelValues(method, resultRejected)); got != 11 {
		t.Errorf("queries{%s,rejected} = %v, want 11", method, got)
	}
}

// A client sending a body the server refuses before reading it gets the
// answer, over a real connection, and the connection stays usable.
func TestHTTPRefusedBodyAnswered(t *testing.T) {
	f := newFleet(t)
	s := newServer(t, f, Options{Limits: smallLimits()})
	srv := httptest.NewServer(s.HTTPHandler())
	defer srv.Close()
	body, _ := json.Marshal(map[string]any{"model": testModel, "prompt": strings.Repeat("word ", 12<<10)})
	s.budget.inUse.Store(s.budget.max - 1)
	for i := range 3 {
		resp, err := http.Post(srv.URL+"/v1/match", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || resp.Close {
			t.Errorf("request %d: %s, close %v", i, resp.Status, resp.Close)
		}
	}
	s.budget.inUse.Store(0)
}

func TestGRPCAdmission(t *testing.T) {
	f := newFleet(t)
	s := newServer(t, f, Options{Limits: smallLimits()})
	api := prefixdv1.NewIndexServiceClient(serveBufconn(t, s))
	ctx := context.Background()
	req := &prefixdv1.Query{Model: testModel, TokenIds: f.tokens}
	if _, err := api.Match(ctx, req); err != nil {
		t.Fatal(err)
	}
	// Less than a message's worth of the budget left: refused unread.
	s.budget.inUse.Store(s.budget.max - int64(s.limits.MaxMessageBytes) + 1)
	for _, call := range []func() error{
		func() error { _, err := api.Match(ctx, req); return err },
		func() error {
			_, err := api.Score(ctx, &prefixdv1.Query{Model: testModel, TokenIds: f.tokens})
			return err
		},
	} {
		if st := status.Convert(call()); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "too many query bytes in flight") {
			t.Errorf("over the byte budget: %v", st)
		}
	}
	s.budget.inUse.Store(s.budget.max - int64(s.limits.MaxMessageBytes) - 1)
	if _, err := api.Match(ctx, &prefixdv1.Query{Model: testModel, Prompt: "hi there"}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("no room for the decoded query: %v", err)
	}
	s.budget.inUse.Store(0)
	// Pods and Stats take no bytes.
	s.budget.inUse.Store(s.budget.max)
	if _, err := api.Pods(ctx, &prefixdv1.PodsRequest{}); err != nil {
		t.Errorf("Pods with the byte budget taken: %v", err)
	}
	s.budget.inUse.Store(0)

	// A message of a million token ids is refused; what is kept of it is
	// the limit's worth.
	if _, err := api.Match(ctx, &prefixdv1.Query{Model: testModel, TokenIds: make([]uint32, 16<<10)}); status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "larger than max") {
		t.Errorf("a message over the size limit: %v", err)
	}
	if _, err := api.Match(ctx, &prefixdv1.Query{Model: testModel, TokenIds: make([]uint32, 4097)}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(status.Convert(err).Message(), "query has more than 4096 tokens: the limit is 4096") {
		t.Errorf("over the token limit: %v", err)
	}
	if n := s.budget.inUse.Load(); n != 0 {
		t.Errorf("%d bytes still reserved", n)
	}
	for reason, want := range map[string]float64{reasonMemory: 3, reasonTooLarge: 1, reasonTokens: 1} {
		if got := refusedCount(s, reason); got != want {
			t.Errorf("refused{%s} = %v, want %v", reason, got, want)
		}
	}
}

// Through an interceptor the request is decoded under the same limits and
// budget, and the interceptor sees it whole.
func TestInterceptorPath(t *testing.T) {
	f := newFleet(t)
	s := newServer(t, f, Options{Limits: smallLimits()})
	var seen []string
	intercept := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		seen = append(seen, fmt.Sprintf("%s %d", info.FullMethod, proto.Size(req.(proto.Message))))
		return h(ctx, req)
	}
	api := prefixdv1.NewIndexServiceClient(serveBufconn(t, s, grpc.UnaryInterceptor(intercept)))
	ctx := context.Background()
	req := &prefixdv1.Query{Model: testModel, BlockHashes: f.hashes}
	resp, err := api.Match(ctx, req)
	if err != nil || len(resp.GetPods()) != 2 {
		t.Fatalf("Match: %v %v", resp, err)
	}
	if _, err := api.Score(ctx, &prefixdv1.Query{Model: testModel, BlockHashes: f.hashes}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Pods(ctx, &prefixdv1.PodsRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Stats(ctx, &prefixdv1.StatsRequest{}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		fmt.Sprintf("%s %d", prefixdv1.IndexService_Match_FullMethodName, proto.Size(req)),
		fmt.Sprintf("%s %d", prefixdv1.IndexService_Score_FullMethodName, proto.Size(req)),
		prefixdv1.IndexService_Pods_FullMethodName + " 0",
		prefixdv1.IndexService_Stats_FullMethodName + " 0",
	}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Errorf("the interceptor saw %q, want %q", seen, want)
	}
	if _, err := api.Match(ctx, &prefixdv1.Query{Model: testModel, BlockHashes: make([]uint64, 257)}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("over the block hash limit: %v", err)
	}
	if n := s.budget.inUse.Load(); n != 0 {
		t.Errorf("%d bytes still reserved", n)
	}
}

// panicStore is a store whose Lookup and Pods panic: no real store panics
// on demand, and a panic at the query boundary is what is tested.
type panicStore struct {
	*memory.Store
}

func (panicStore) Lookup(context.Context, []uint64, []string, []store.Match) ([]store.Match, error) {
	panic("test: Lookup panics")
}

func (panicStore) Pods(context.Context) ([]store.PodInfo, error) {
	panic("test: Pods panics")
}

// A panic answering any method, gRPC with and without an interceptor and
// HTTP, is answered Internal / 500, counted and logged; the server goes on.
func TestPanicAnsweredInternal(t *testing.T) {
	recovery.KeepRecovered(t)
	mem, err := memory.New(memory.Options{CapacityBlocks: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	opts := indexer.DefaultOptions()
	opts.Models = map[string]indexer.ModelOptions{testModel: {HashScheme: "llmd", BlockSize: 16, KeyMode: indexer.KeyModeEngine}}
	ix, err := indexer.New(panicStore{mem}, opts, nil, quiet)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	s, err := New(ix, Options{Limits: smallLimits(), Metrics: NewMetrics(reg), Recovery: recovery.New(reg, quiet)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tokens := make([]uint32, 64)
	pass := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(ctx, req)
	}
	for name, conn := range map[string]*grpc.ClientConn{"pooled": serveBufconn(t, s), "interceptor": serveBufconn(t, s, grpc.UnaryInterceptor(pass))} {
		api := prefixdv1.NewIndexServiceClient(conn)
		for method, call := range map[string]func() error{
			"Match": func() error {
				_, err := api.Match(ctx, &prefixdv1.Query{Model: testModel, TokenIds: tokens})
				return err
			},
			"Score": func() error {
				_, err := api.Score(ctx, &prefixdv1.Query{Model: testModel, TokenIds: tokens})
				return err
			},
			"Pods":  func() error { _, err := api.Pods(ctx, &prefixdv1.PodsRequest{}); return err },
			"Stats": func() error { _, err := api.Stats(ctx, &prefixdv1.StatsRequest{}); return err },
		} {
			if st := status.Convert(call()); st.Code() != codes.Internal || !strings.Contains(st.Message(), "recovered") {
				t.Errorf("%s %s: %v, want Internal", name, method, st)
			}
		}
	}
	h := s.HTTPHandler()
	for _, r := range []*http.Request{
		httptest.NewRequest(http.MethodPost, "/v1/match", strings.NewReader(`{"model":"m","token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}`)),
		httptest.NewRequest(http.MethodPost, "/v1/score", strings.NewReader(`{"model":"m","token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}`)),
		httptest.NewRequest(http.MethodGet, "/v1/pods", nil),
		httptest.NewRequest(http.MethodGet, "/v1/stats", nil),
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), `"code":"Internal"`) {
			t.Errorf("%s %s: %d %s", r.Method, r.URL, rec.Code, rec.Body)
		}
	}
	if n := s.budget.inUse.Load(); n != 0 || len(s.sem) != 0 {
		t.Errorf("after the panics: %d bytes reserved, %d slots taken", n, len(s.sem))
	}
	for where, want := range map[string]int{whereGRPC: 8, whereHTTP: 4} {
		if got := counterValue(t, reg, "prefixd_panics_total", "where", where); int(got) != want {
			t.Errorf("prefixd_panics_total{where=%q} = %v, want %d", where, got, want)
		}
	}
	if got := testutil.ToFloat64(s.metrics.queries.WithLabelValues(methodMatch, resultError)); got != 2 {
		t.Errorf("queries{Match,error} = %v, want 2", got)
	}
}

// counterValue returns the counter name{label=value} gathered from reg.
func counterValue(t *testing.T, reg prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// A pod whose blocks the store forgot to make room is incomplete in every
// answer: its matches and its status, over gRPC and HTTP.
func TestIncomplete(t *testing.T) {
	st, err := memory.New(memory.Options{CapacityBlocks: 256})
	if err != nil {
		t.Fatal(err)
	}
	opts := indexer.DefaultOptions()
	opts.Models = map[string]indexer.ModelOptions{testModel: {HashScheme: "llmd", BlockSize: 16, KeyMode: indexer.KeyModeEngine}}
	ix, err := indexer.New(st, opts, nil, quiet)
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{ix: ix}
	keys := make([]uint64, 400)
	for i := range keys {
		keys[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	f.store(t, podA, keys)
	s := newServer(t, f, Options{})
	api := prefixdv1.NewIndexServiceClient(serveBufconn(t, s))
	ctx := context.Background()
	pods, err := api.Pods(ctx, &prefixdv1.PodsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.GetPods()) != 1 || !pods.GetPods()[0].GetIncomplete() || pods.GetPods()[0].GetEvictedBlocks() == 0 {
		t.Fatalf("pods %v, want podA incomplete", pods)
	}
	evicted := pods.GetPods()[0].GetEvictedBlocks()
	// The last blocks stored are the ones kept: ask from where they start.
	resp, err := api.Match(ctx, &prefixdv1.Query{Model: testModel, BlockHashes: keys[len(keys)-16:]})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetPods()) != 1 || !resp.GetPods()[0].GetIncomplete() {
		t.Fatalf("match %v, want podA incomplete", resp)
	}
	sr, err := api.Score(ctx, &prefixdv1.Query{Model: testModel, BlockHashes: keys[len(keys)-16:]})
	if err != nil || len(sr.GetIncompletePods()) != 1 || sr.GetIncompletePods()[0] != podA || len(sr.GetStalePods()) != 0 {
		t.Fatalf("score %v, %v: want podA incomplete", sr, err)
	}

	rec := httptest.NewRecorder()
	s.HTTPHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/pods", nil))
	var pj PodsResponseJSON
	if err := json.Unmarshal(rec.Body.Bytes(), &pj); err != nil || len(pj.Pods) != 1 || !pj.Pods[0].Incomplete || pj.Pods[0].EvictedBlocks != int(evicted) {
		t.Errorf("GET /v1/pods: %s", rec.Body)
	}
	body, _ := json.Marshal(map[string]any{"model": testModel, "block_hashes": keys[len(keys)-16:]})
	rec = httptest.NewRecorder()
	s.HTTPHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/match", bytes.NewReader(body)))
	var mj MatchResponseJSON
	if err := json.Unmarshal(rec.Body.Bytes(), &mj); err != nil || len(mj.Pods) != 1 || !mj.Pods[0].Incomplete {
		t.Errorf("POST /v1/match: %s", rec.Body)
	}
	if !strings.Contains(rec.Body.String(), `"incomplete":true`) || !strings.Contains(rec.Body.String(), `"stale":false`) {
		t.Errorf("field names: %s", rec.Body)
	}
	rec = httptest.NewRecorder()
	s.HTTPHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/score", bytes.NewReader(body)))
	if want := `{"scores":{"` + podA + `":1},"stale_pods":[],"incomplete_pods":["` + podA + `"]}`; strings.TrimSpace(rec.Body.String()) != want {
		t.Errorf("POST /v1/score: %s, want %s", rec.Body, want)
	}
}

// The pooled gRPC path, admission and decoding included, allocates
// nothing for a block hash query beyond what answering it does.
func TestPooledPathAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts under the race detector are not the program's")
	}
	f := newFleet(t)
	s := newServer(t, f, Options{})
	ctx := context.Background()
	req := &prefixdv1.Query{Model: testModel, BlockHashes: f.hashes}
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	data := mem.BufferSlice{mem.SliceBuffer(b)}
	dec := func(v any) error { return codec.Codec{}.Unmarshal(data, v) }
	handler := testing.AllocsPerRun(200, func() {
		if _, err := matchMethod.handle(s, ctx, dec, nil); err != nil {
			t.Fatal(err)
		}
	})
	direct := testing.AllocsPerRun(200, func() {
		if _, err := s.Match(ctx, req); err != nil {
			t.Fatal(err)
		}
	})
	// The model's name is the one string decoded (one byte here: Go's
	// conversion of a one-byte string does not allocate).
	if handler > direct {
		t.Errorf("the handler allocates %v times per query, answering alone %v", handler, direct)
	}
	t.Logf("allocations per query: handler %v, Server.Match %v", handler, direct)
}

// Concurrent large queries over gRPC are answered or refused, never
// anything else, and leave nothing reserved.
func TestGRPCConcurrentLargeQueries(t *testing.T) {
	f := newFleet(t)
	s := newServer(t, f, Options{Limits: smallLimits()})
	api := prefixdv1.NewIndexServiceClient(serveBufconn(t, s))
	reqs := []*prefixdv1.Query{
		{Model: testModel, TokenIds: make([]uint32, 15<<10)},            // over the token limit
		{Model: testModel, Prompt: strings.Repeat("word ", 12<<10)},     // over it once tokenized
		{Model: testModel, Prompt: strings.Repeat("x", 60<<10)},         // one token
		{Model: testModel, BlockHashes: f.hashes, Pods: []string{podA}}, // a hit
	}
	var wg sync.WaitGroup
	answers := make(chan codes.Code, 64)
	for i := range 64 {
		wg.Go(func() {
			_, err := api.Match(context.Background(), reqs[i%len(reqs)])
			answers <- status.Code(err)
		})
	}
	wg.Wait()
	close(answers)
	seen := map[string]int{}
	for c := range answers {
		seen[c.String()]++
		if c != codes.OK && c != codes.InvalidArgument && c != codes.ResourceExhausted {
			t.Errorf("answered %v", c)
		}
	}
	t.Logf("answers: %v", seen)
	if n := s.budget.inUse.Load(); n != 0 || len(s.sem) != 0 {
		t.Errorf("after the load: %d bytes reserved, %d slots taken", n, len(s.sem))
	}
}

// A client that sends a call's headers and only part of its message loses
// the call after ReadTimeout, with the slot and bytes it held: it cannot
// hold a share of the byte budget for as long as it likes.
func TestGRPCSlowSenderCutOff(t *testing.T) {
	f := newFleet(t)
	lim := smallLimits()
	lim.ReadTimeout = 200 * time.Millisecond
	s := newServer(t, f, Options{Limits: lim})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := s.NewGRPCServer()
	done := make(chan error, 1)
	go func() { done <- g.Serve(l) }()
	t.Cleanup(func() {
		g.Stop()
		<-done
	})

	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	var hdr bytes.Buffer
	enc := hpack.NewEncoder(&hdr)
	for _, kv := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", prefixdv1.IndexService_Match_FullMethodName},
		{":authority", "prefixd"}, {"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		_ = enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
	}
	// A message announcing 32 KiB, of which 10 bytes are sent.
	msg := append([]byte{0, 0, 0, 0x80, 0}, make([]byte, 10)...)
	if err := errors.Join(fr.WriteSettings(), fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hdr.Bytes(), EndHeaders: true}), fr.WriteData(1, false, msg)); err != nil {
		t.Fatal(err)
	}
	dec := hpack.NewDecoder(4096, nil)
	for {
		frame, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no answer to the unfinished call: %v", err)
		}
		if rst, ok := frame.(*http2.RSTStreamFrame); ok {
			t.Logf("stream reset: %v", rst.ErrCode)
			break
		}
		hf, ok := frame.(*http2.HeadersFrame)
		if !ok {
			continue
		}
		fields, err := dec.DecodeFull(hf.HeaderBlockFragment())
		if err != nil {
			t.Fatal(err)
		}
		code := ""
		for _, f := range fields {
			if f.Name == "grpc-status" {
				code = f.Value
			}
		}
		if code != "" {
			if code != fmt.Sprint(int(codes.DeadlineExceeded)) {
				t.Fatalf("unfinished call ended with grpc-status %s, want DeadlineExceeded", code)
			}
			break
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.budget.inUse.Load() != 0 || len(s.sem) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after the cut: %d bytes and %d slots still held", s.budget.inUse.Load(), len(s.sem))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
