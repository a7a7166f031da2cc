package rpc

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/prefixd/prefixd/indexer/tokenize"
	prefixdv1 "github.com/prefixd/prefixd/proto/prefixd/v1"
	"github.com/prefixd/prefixd/store"
)

func protoMessages(msgs []tokenize.Message) []*prefixdv1.ChatMessage {
	out := make([]*prefixdv1.ChatMessage, len(msgs))
	for i, m := range msgs {
		out[i] = &prefixdv1.ChatMessage{Role: m.Role, Content: m.Content.Text}
	}
	return out
}

func TestMatchEachInput(t *testing.T) {
	f := newFleet(t)
	api := prefixdv1.NewIndexServiceClient(serveBufconn(t, newServer(t, f, Options{})))
	n := len(f.hashes)
	parts := make([]*prefixdv1.ChatMessage, len(f.messages))
	for i, m := range f.messages {
		// Parts render as their text plus one space: split the text so the
		// rendering differs from the string content only by that space.
		parts[i] = &prefixdv1.ChatMessage{Role: m.Role, Parts: []*prefixdv1.ContentPart{{Type: "text", Text: m.Content.Text}}}
	}
	for _, tc := range []struct {
		name       string
		req        *prefixdv1.Query
		tokens     int
		wantBlocks int // pod A's
	}{
		{"token_ids", &prefixdv1.Query{Model: testModel, TokenIds: f.tokens}, len(f.tokens), n},
		{"block_hashes", &prefixdv1.Query{Model: testModel, BlockHashes: f.hashes}, 0, n},
		{"prompt", &prefixdv1.Query{Model: testModel, Prompt: string(tokenize.AppendFlat(nil, f.messages))}, len(f.tokens), n},
		{"messages", &prefixdv1.Query{Model: testModel, Messages: protoMessages(f.messages)}, len(f.tokens), n},
		{"content parts", &prefixdv1.Query{Model: testModel, Messages: parts}, -1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := api.Match(context.Background(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetModel() != testModel || resp.GetBlockSize() != 16 {
				t.Errorf("model %q block size %d", resp.GetModel(), resp.GetBlockSize())
			}
			if tc.wantBlocks < 0 { // only that it answers; block 0 matches
				if len(resp.GetPods()) == 0 || resp.GetPods()[0].GetBlocks() == 0 {
					t.Errorf("no match: %v", resp)
				}
				return
			}
			if int(resp.GetTokens()) != tc.tokens || int(resp.GetTotalBlocks()) != n {
				t.Errorf("tokens %d total blocks %d, want %d, %d", resp.GetTokens(), resp.GetTotalBlocks(), tc.tokens, n)
			}
			pods := resp.GetPods()
			if len(pods) != 2 {
				t.Fatalf("pods %v, want 2", pods)
			}
			a, b := pods[0], pods[1]
			if a.GetPod() != podA || int(a.GetBlocks()) != tc.wantBlocks || int(a.GetTokens()) != 16*tc.wantBlocks ||
				int(a.GetGpuBlocks()) != tc.wantBlocks || a.GetCpuBlocks() != 0 || a.GetScore() != 1 || a.GetStale() {
				t.Errorf("pod A: %v", a)
			}
			if b.GetPod() != podB || int(b.GetBlocks()) != n/2 || b.GetScore() != float64(n/2)/float64(n) {
				t.Errorf("pod B: %v", b)
			}
		})
	}
}

func TestMatchCandidatesAndLoRA(t *testing.T) {
	f := newFleet(t)
	api := prefixdv1.NewIndexServiceClient(serveBufconn(t, newServer(t, f, Options{})))
	resp, err := api.Match(context.Background(), &prefixdv1.Query{Model: testModel, BlockHashes: f.hashes, Pods: []string{podB}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetPods()) != 1 || resp.GetPods()[0].GetPod() != podB {
		t.Errorf("candidates [%s]: %v", podB, resp.GetPods())
	}
	// An adapter's name answers for its base model; nothing was stored
	// under the adapter's root.
	resp, err = api.Match(context.Background(), &prefixdv1.Query{Model: testLoRA, TokenIds: f.tokens})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetModel() != testModel || len(resp.GetPods()) != 0 {
		t.Errorf("adapter query: %v", resp)
	}
}

func TestScore(t *testing.T) {
	f := newFleet(t)
	api := prefixdv1.NewIndexServiceClient(serveBufconn(t, newServer(t, f, Options{})))
	const other = "10.0.0.9:8000"
	resp, err := api.Score(context.Background(), &prefixdv1.Query{Model: testModel, TokenIds: f.tokens, Pods: []string{podA, podB, other}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{podA: 1, podB: 0, other: 0}
	got := resp.GetScores()
	if len(got) != len(want) {
		t.Fatalf("scores %v, want %v", got, want)
	}
	for pod, s := range want {
		if v, ok := got[pod]; !ok || v != s {
			t.Errorf("score %s = %v (%v), want %v", pod, v, ok, s)
		}
	}
	// Only pod B holds the first block's prefix from block 0 when asked
	// alone: equal scores all normalize to 1.
	resp, err = api.Score(context.Background(), &prefixdv1.Query{Model: testModel, BlockHashes: f.hashes[:1]})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetScores(); len(got) != 2 || got[podA] != 1 || got[podB] != 1 {
		t.Errorf("one-block scores %v, want both 1", got)
	}
	if len(resp.GetStalePods()) != 0 || len(resp.GetIncompletePods()) != 0 {
		t.Errorf("no pod is stale or incomplete: %v", resp)
	}
	// A stale pod is named, and only a matched one: a candidate without a
	// match is not checked.
	f.store(t, other, []uint64{12345})
	_ = f.ix.SetStale(context.Background(), podB, true)
	_ = f.ix.SetStale(context.Background(), other, true)
	resp, err = api.Score(context.Background(), &prefixdv1.Query{Model: testModel, BlockHashes: f.hashes, Pods: []string{podA, podB, other}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetStalePods(); !slices.Equal(got, []string{podB}) {
		t.Errorf("stale pods %v, want [%s]", got, podB)
	}
}

type fakeStats IngestStats

func (f fakeStats) IngestStats() IngestStats { return IngestStats(f) }

func TestPodsAndStats(t *testing.T) {
	f := newFleet(t)
	_ = f.ix.SetStale(context.Background(), podB, true)
	api := prefixdv1.NewIndexServiceClient(serveBufconn(t, newServer(t, f, Options{
		Stats: fakeStats{BatchesPerSecond: 3, EventsPerSecond: 48, MemoryBytes: 12345},
	})))
	pods, err := api.Pods(context.Background(), &prefixdv1.PodsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	n := len(f.hashes)
	ps := pods.GetPods()
	if len(ps) != 2 || ps[0].GetName() != podA || ps[1].GetName() != podB {
		t.Fatalf("pods %v", ps)
	}
	for i, want := range []uint64{uint64(n), uint64(n / 2)} {
		p := ps[i]
		if p.GetModel() != testModel || p.GetBlocks() != want || p.GetSeq() != 7 || !p.GetHasSeq() ||
			p.GetLastEventTime() == nil || time.Since(p.GetLastEventTime().AsTime()) > time.Hour || p.GetStale() != (i == 1) {
			t.Errorf("pod %d: %v", i, p)
		}
	}
	st, err := api.Stats(context.Background(), &prefixdv1.StatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetPods() != 2 || st.GetIndexBlocks() != uint64(n+n/2) || st.GetMemoryBytes() != 12345 ||
		st.GetHeapInuseBytes() == 0 || st.GetBatchesPerSecond() != 3 || st.GetEventsPerSecond() != 48 {
		t.Errorf("stats %v", st)
	}

	// Without a StatsSource, memory is the heap in use.
	api = prefixdv1.NewIndexServiceClient(serveBufconn(t, newServer(t, f, Options{})))
	st, err = api.Stats(context.Background(), &prefixdv1.StatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetMemoryBytes() == 0 || st.GetMemoryBytes() < st.GetHeapInuseBytes()/2 || st.GetEventsPerSecond() != 0 {
		t.Errorf("stats without source %v", st)
	}
}

func TestHealthAndReflection(t *testing.T) {
	s := newServer(t, newFleet(t), Options{})
	conn := serveBufconn(t, s)
	hc := healthpb.NewHealthClient(conn)
	for _, svc := range []string{"", "prefixd.v1.IndexService"} {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v %v", svc, resp, err)
		}
	}
	s.SetServing(false)
	if resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health after SetServing(false): %v %v", resp, err)
	}

	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, svc := range resp.GetListServicesResponse().GetService() {
		names = append(names, svc.GetName())
	}
	if !strings.Contains(strings.Join(names, " "), "prefixd.v1.IndexService") {
		t.Errorf("reflection lists %v", names)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
}

func TestDeadlineHonoured(t *testing.T) {
	f := newFleet(t)
	s := newServer(t, f, Options{})
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	// The server itself refuses work whose deadline passed.
	_, err := s.Match(ctx, &prefixdv1.Query{Model: testModel, TokenIds: f.tokens})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("Match past its deadline: %v, want DeadlineExceeded", err)
	}
	if _, err := s.Pods(ctx, &prefixdv1.PodsRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("Pods past its deadline: %v", err)
	}
	// And over the wire.
	api := prefixdv1.NewIndexServiceClient(serveBufconn(t, s))
	ctx, cancel = context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	if _, err := api.Match(ctx, &prefixdv1.Query{Model: testModel, TokenIds: f.tokens}); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("Match with a 1ns timeout: %v", err)
	}
}

func TestErrors(t *testing.T) {
	f := newFleet(t)
	s := newServer(t, f, Options{Limits: Limits{MaxTokens: 32, MaxBlockHashes: 4, MaxMessageBytes: 1024, MaxConcurrent: 2, MaxInflightBytes: 1 << 20, ReadTimeout: time.Minute}})
	api := prefixdv1.NewIndexServiceClient(serveBufconn(t, s))
	for _, tc := range []struct {
		name string
		req  *prefixdv1.Query
		code codes.Code
		msg  string
	}{
		{"unknown model", &prefixdv1.Query{Model: "nope", TokenIds: f.tokens[:16]}, codes.NotFound, `unknown model "nope": known models are m`},
		{"no model", &prefixdv1.Query{TokenIds: f.tokens[:16]}, codes.InvalidArgument, "model is required"},
		{"empty", &prefixdv1.Query{Model: testModel}, codes.InvalidArgument, "empty query"},
		{"empty prompt", &prefixdv1.Query{Model: testModel, Prompt: "  \n "}, codes.InvalidArgument, "empty prompt"},
		{"two inputs", &prefixdv1.Query{Model: testModel, TokenIds: f.tokens[:16], Prompt: "hi"}, codes.InvalidArgument, "give exactly one"},
		{"max tokens", &prefixdv1.Query{Model: testModel, TokenIds: f.tokens[:33]}, codes.InvalidArgument, "more than 32 tokens: the limit is 32"},
		{"max tokens of text", &prefixdv1.Query{Model: testModel, Messages: protoMessages(f.messages)}, codes.InvalidArgument, "the limit is 32"},
		{"max block hashes", &prefixdv1.Query{Model: testModel, BlockHashes: f.hashes[:5]}, codes.InvalidArgument, "more than 4 block hashes: the limit is 4"},
		{"message size", &prefixdv1.Query{Model: testModel, Prompt: strings.Repeat("x ", 600)}, codes.ResourceExhausted, "1024"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := api.Match(context.Background(), tc.req)
			if st := status.Convert(err); st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
				t.Errorf("got %v %q, want %v containing %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
		})
	}

	// Every concurrency slot taken: the next query is refused at once.
	s.sem <- struct{}{}
	s.sem <- struct{}{}
	_, err := api.Score(context.Background(), &prefixdv1.Query{Model: testModel, TokenIds: f.tokens[:16]})
	<-s.sem
	<-s.sem
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "the limit is 2") {
		t.Errorf("over the concurrency limit: %v", err)
	}
	if _, err := api.Score(context.Background(), &prefixdv1.Query{Model: testModel, TokenIds: f.tokens[:16]}); err != nil {
		t.Errorf("after slots freed: %v", err)
	}
}

func TestLimitsValidate(t *testing.T) {
	if err := DefaultLimits().Validate(); err != nil {
		t.Fatal(err)
	}
	l := DefaultLimits()
	l.MaxConcurrent = 0
	if err := l.Validate(); err == nil || !strings.Contains(err.Error(), "max concurrent queries 0") {
		t.Errorf("Validate: %v", err)
	}
	var fl Limits
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fl.AddFlags(fs)
	if err := fs.Parse([]string{"--query-max-concurrent", "3"}); err != nil {
		t.Fatal(err)
	}
	if err := fs.Parse([]string{"--query-max-inflight-bytes", "9000000"}); err != nil {
		t.Fatal(err)
	}
	d := DefaultLimits()
	if want := (Limits{d.MaxTokens, d.MaxBlockHashes, d.MaxMessageBytes, 3, 9000000, d.ReadTimeout}); fl != want {
		t.Errorf("flags gave %+v, want %+v", fl, want)
	}
	l = DefaultLimits()
	l.MaxInflightBytes = 2*l.MaxMessageBytes - 1
	if err := l.Validate(); err == nil || !strings.Contains(err.Error(), "want at least twice max message bytes") {
		t.Errorf("Validate with room for no largest query: %v", err)
	}
	if _, err := New(nil, DefaultOptions()); err == nil {
		t.Error("New(nil indexer) succeeded")
	}
}

func TestMetrics(t *testing.T) {
	f := newFleet(t)
	reg := prometheus.NewPedanticRegistry()
	s := newServer(t, f, Options{Metrics: NewMetrics(reg)})
	ctx := context.Background()
	if _, err := s.Match(ctx, &prefixdv1.Query{Model: testModel, BlockHashes: f.hashes}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Match(ctx, &prefixdv1.Query{Model: testModel, BlockHashes: []uint64{1, 2}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Match(ctx, &prefixdv1.Query{Model: "nope", BlockHashes: []uint64{1}}); err == nil {
		t.Fatal("unknown model answered")
	}
	if _, err := s.Pods(ctx, &prefixdv1.PodsRequest{}); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(s.metrics.queries.WithLabelValues(methodPods, resultOK)); got != 1 {
		t.Errorf("queries{Pods,ok} = %v, want 1", got)
	}
	for result, want := range map[string]float64{resultHit: 1, resultMiss: 1, resultError: 1, resultRejected: 0, resultOK: 0} {
		if got := testutil.ToFloat64(s.metrics.queries.WithLabelValues(methodMatch, result)); got != want {
			t.Errorf("queries{Match,%s} = %v, want %v", result, got, want)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "prefixd_query_duration_seconds"); err != nil || n != len(allMethods) {
		t.Errorf("duration series %d, %v", n, err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var observed uint64
	for _, mf := range mfs {
		if mf.GetName() != "prefixd_query_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			observed += m.GetHistogram().GetSampleCount()
		}
	}
	if observed != 4 {
		t.Errorf("latency observations %d, want 4", observed)
	}
}

// Concurrent queries of different lengths through pooled requests each get
// their own answer.
func TestPooledRequestsConcurrent(t *testing.T) {
	f := newFleet(t)
	s := newServer(t, f, Options{})
	api := prefixdv1.NewIndexServiceClient(serveBufconn(t, s))
	n := len(f.hashes)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := range 50 {
				k := 1 + (w*50+i)%n
				var (
					total int
					pods  []*prefixdv1.PodMatch
					err   error
				)
				if i%2 == 0 {
					var r *prefixdv1.MatchResponse
					r, err = api.Match(context.Background(), &prefixdv1.Query{Model: testModel, BlockHashes: f.hashes[:k]})
					total, pods = int(r.GetTotalBlocks()), r.GetPods()
				} else {
					var r *prefixdv1.MatchResponse
					r, err = api.Match(context.Background(), &prefixdv1.Query{Model: testModel, TokenIds: f.tokens[:16*k], Pods: []string{podA}})
					total, pods = int(r.GetTotalBlocks()), r.GetPods()
				}
				if err != nil {
					errs <- err
					return
				}
				if total != k || len(pods) == 0 || int(pods[0].GetBlocks()) != k || pods[0].GetPod() != podA || (i%2 == 1 && len(pods) != 1) {
					errs <- fmt.Errorf("query of %d blocks (%d): total %d, pods %v", k, i%2, total, pods)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A store that cannot be reached is Unavailable over gRPC and 503 over
// HTTP: a router retries another replica instead of taking it for a bug.
func TestStoreUnavailableStatus(t *testing.T) {
	err := statusOf(fmt.Errorf("lookup: %w", fmt.Errorf("dial tcp: %w", store.ErrUnavailable)))
	if st := status.Convert(err); st.Code() != codes.Unavailable {
		t.Fatalf("code %v, want Unavailable", st.Code())
	}
	if c := httpStatus(codes.Unavailable); c != http.StatusServiceUnavailable {
		t.Fatalf("HTTP %d, want 503", c)
	}
}
