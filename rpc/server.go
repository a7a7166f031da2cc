package rpc

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"runtime"
	"runtime/metrics"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/tokenize"
	prefixdv1 "github.com/prefixd/prefixd/proto/prefixd/v1"
	"github.com/prefixd/prefixd/rpc/internal/codec"
)

// Server answers prefix queries over an Indexer, by gRPC (IndexService,
// with the standard health service and server reflection) and by JSON over
// HTTP (HTTPHandler). It is safe for concurrent use.
type Server struct {
	prefixdv1.UnimplementedIndexServiceServer

	ix      *indexer.Indexer
	limits  Limits
	metrics *Metrics
	stats   StatsSource
	log     *slog.Logger
	health  *health.Server
	// sem holds one token per query in flight, gRPC and HTTP together.
	sem chan struct{}
}

var _ prefixdv1.IndexServiceServer = (*Server)(nil)

// New returns a Server answering from ix.
func New(ix *indexer.Indexer, opts Options) (*Server, error) {
	if ix == nil {
		return nil, errors.New("rpc: nil indexer")
	}
	if err := opts.Limits.Validate(); err != nil {
		return nil, err
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(nil)
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		ix:      ix,
		limits:  opts.Limits,
		metrics: opts.Metrics,
		stats:   opts.Stats,
		log:     opts.Log,
		health:  health.NewServer(),
		sem:     make(chan struct{}, opts.Limits.MaxConcurrent),
	}
	s.health.SetServingStatus(prefixdv1.IndexService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	return s, nil
}

// GRPCServerOptions are the options a grpc.Server serving s needs: the
// message size limit, and a codec and buffer pool sized for queries (see
// package rpc/internal/codec).
func (s *Server) GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(s.limits.MaxMessageBytes),
		grpc.ForceServerCodecV2(codec.Codec{}),
		experimental.BufferPool(codec.Pool),
		// Long-lived workers with grown stacks instead of a goroutine per
		// call (gRPC still starts one when every worker is busy).
		grpc.NumStreamWorkers(uint32(2 * runtime.GOMAXPROCS(0))),
		// Windows of many queries: with gRPC's 64 KiB a connection sent a
		// WINDOW_UPDATE every few 4 KiB queries (and ran BDP pings).
		grpc.InitialWindowSize(1 << 20),
		grpc.InitialConnWindowSize(1 << 22),
	}
}

// NewGRPCServer returns a grpc.Server with s registered (see Register),
// built with GRPCServerOptions followed by opts.
func (s *Server) NewGRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	g := grpc.NewServer(append(s.GRPCServerOptions(), opts...)...)
	s.Register(g)
	return g
}

// Register registers the IndexService, the health service and server
// reflection on g.
func (s *Server) Register(g *grpc.Server) {
	g.RegisterService(&serviceDesc, s)
	healthpb.RegisterHealthServer(g, s.health)
	reflection.Register(g)
}

// SetServing sets the health status of the server and of the IndexService
// to SERVING or NOT_SERVING (when shutting down).
func (s *Server) SetServing(serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(prefixdv1.IndexService_ServiceDesc.ServiceName, st)
}

// Match answers a prefix query with every matched pod's blocks, tiers and score.
func (s *Server) Match(ctx context.Context, req *prefixdv1.MatchRequest) (*prefixdv1.MatchResponse, error) {
	start := time.Now()
	qb := getQueryBuf()
	defer qb.put()
	qb.fromProto(req.GetModel(), req.GetLora(), req.GetCacheSalt(), req.GetTokenIds(), req.GetBlockHashes(), req.GetPrompt(), req.GetMessages(), req.GetPods())
	res, err := s.match(ctx, qb)
	s.done(methodMatch, start, res, err)
	if err != nil {
		return nil, err
	}
	return matchResponse(res), nil
}

// Score answers a prefix query with pod -> normalized score.
func (s *Server) Score(ctx context.Context, req *prefixdv1.ScoreRequest) (*prefixdv1.ScoreResponse, error) {
	start := time.Now()
	qb := getQueryBuf()
	defer qb.put()
	qb.fromProto(req.GetModel(), req.GetLora(), req.GetCacheSalt(), req.GetTokenIds(), req.GetBlockHashes(), req.GetPrompt(), req.GetMessages(), req.GetPods())
	res, err := s.match(ctx, qb)
	s.done(methodScore, start, res, err)
	if err != nil {
		return nil, err
	}
	return &prefixdv1.ScoreResponse{Scores: Scores(res, req.GetPods())}, nil
}

// Pods lists the known pods.
func (s *Server) Pods(ctx context.Context, _ *prefixdv1.PodsRequest) (*prefixdv1.PodsResponse, error) {
	start := time.Now()
	pods, err := s.pods(ctx)
	s.done(methodPods, start, nil, err)
	if err != nil {
		return nil, err
	}
	out := &prefixdv1.PodsResponse{Pods: make([]*prefixdv1.PodStatus, len(pods))}
	for i, p := range pods {
		ps := &prefixdv1.PodStatus{
			Name: p.Name, Model: p.Model, Blocks: uint64(p.Blocks),
			Seq: p.Seq, HasSeq: p.HasSeq, Stale: p.Stale,
		}
		if !p.LastEvent.IsZero() {
			ps.LastEventTime = timestamppb.New(p.LastEvent)
		}
		out.Pods[i] = ps
	}
	return out, nil
}

// Stats reports the index's size, memory and ingest rates.
func (s *Server) Stats(ctx context.Context, _ *prefixdv1.StatsRequest) (*prefixdv1.StatsResponse, error) {
	start := time.Now()
	pods, err := s.pods(ctx)
	s.done(methodStats, start, nil, err)
	if err != nil {
		return nil, err
	}
	out := &prefixdv1.StatsResponse{Pods: uint64(len(pods))}
	for _, p := range pods {
		out.IndexBlocks += uint64(p.Blocks)
	}
	out.HeapInuseBytes = heapInuse()
	out.MemoryBytes = out.HeapInuseBytes
	if s.stats != nil {
		in := s.stats.IngestStats()
		out.BatchesPerSecond, out.EventsPerSecond = in.BatchesPerSecond, in.EventsPerSecond
		if in.MemoryBytes > 0 {
			out.MemoryBytes = in.MemoryBytes
		}
	}
	return out, nil
}

// match validates a query, takes a concurrency slot and answers it. Errors
// are gRPC statuses.
func (s *Server) match(ctx context.Context, qb *queryBuf) (*indexer.Result, error) {
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.release()
	if err := ctx.Err(); err != nil {
		return nil, statusOf(err)
	}
	if err := qb.prepare(s.ix, s.limits); err != nil {
		return nil, err
	}
	res, err := s.ix.Match(ctx, &qb.q)
	if err != nil {
		return nil, statusOf(err)
	}
	return res, nil
}

func (s *Server) pods(ctx context.Context) ([]indexer.PodStatus, error) {
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.release()
	if err := ctx.Err(); err != nil {
		return nil, statusOf(err)
	}
	pods, err := s.ix.Pods(ctx)
	if err != nil {
		return nil, statusOf(err)
	}
	return pods, nil
}

func (s *Server) acquire() error {
	select {
	case s.sem <- struct{}{}:
		return nil
	default:
		return status.Errorf(codes.ResourceExhausted, "too many concurrent queries: the limit is %d", s.limits.MaxConcurrent)
	}
}

func (s *Server) release() { <-s.sem }

// done records a query's latency and result; res is nil for methods that
// match nothing.
func (s *Server) done(method string, start time.Time, res *indexer.Result, err error) {
	result := resultHit
	switch {
	case status.Code(err) == codes.ResourceExhausted:
		result = resultRejected
	case err != nil:
		result = resultError
		if s.log.Enabled(context.Background(), slog.LevelDebug) {
			s.log.Debug("query failed", "method", method, "err", err)
		}
	case res == nil:
		result = resultOK
	case len(res.Pods) == 0:
		result = resultMiss
	}
	s.metrics.observe(method, result, time.Since(start).Seconds())
}

// statusOf turns an error of the indexer or of a context into a gRPC status.
func statusOf(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, indexer.ErrUnknownModel):
		code = codes.NotFound
	case errors.Is(err, indexer.ErrEmptyQuery), errors.Is(err, indexer.ErrBadQuery):
		code = codes.InvalidArgument
	}
	return status.Error(code, err.Error())
}

// Scores turns a match into pod -> score as llm-d's precise-prefix-cache-
// scorer does: the matched pods' scores min-max normalized to 0..1 (all 1
// when they are equal), and 0 for each candidate pod without a match.
func Scores(res *indexer.Result, candidates []string) map[string]float64 {
	out := make(map[string]float64, max(len(res.Pods), len(candidates)))
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, p := range res.Pods {
		lo, hi = min(lo, p.Score), max(hi, p.Score)
	}
	for _, p := range res.Pods {
		if lo == hi {
			out[p.Pod] = 1
		} else {
			out[p.Pod] = (p.Score - lo) / (hi - lo)
		}
	}
	for _, c := range candidates {
		if _, ok := out[c]; !ok {
			out[c] = 0
		}
	}
	return out
}

func matchResponse(res *indexer.Result) *prefixdv1.MatchResponse {
	out := &prefixdv1.MatchResponse{
		Model:       res.Model,
		BlockSize:   uint32(res.BlockSize),
		Tokens:      uint32(res.Tokens),
		TotalBlocks: uint32(res.TotalBlocks),
		Pods:        make([]*prefixdv1.PodMatch, len(res.Pods)),
	}
	// One allocation for all pods.
	pms := make([]prefixdv1.PodMatch, len(res.Pods))
	for i, p := range res.Pods {
		pm := &pms[i]
		pm.Pod = p.Pod
		pm.Blocks = uint32(p.Blocks)
		pm.Tokens = uint32(p.Tokens)
		pm.GpuBlocks = uint32(p.TierBlocks[0])
		pm.CpuBlocks = uint32(p.TierBlocks[1])
		pm.DiskBlocks = uint32(p.TierBlocks[2])
		pm.Score = p.Score
		pm.Stale = p.Stale
		out.Pods[i] = pm
	}
	return out
}

var heapSamples = sync.Pool{New: func() any {
	return &[2]metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
	}
}}

// heapInuse returns the bytes of in-use heap spans, as runtime.MemStats'
// HeapInuse, without stopping the world.
func heapInuse() uint64 {
	s := heapSamples.Get().(*[2]metrics.Sample)
	defer heapSamples.Put(s)
	metrics.Read(s[:])
	var n uint64
	for _, v := range s {
		if v.Value.Kind() == metrics.KindUint64 {
			n += v.Value.Uint64()
		}
	}
	return n
}

// queryBuf is one query's reused memory: the indexer query, tokens of
// tokenized text and converted chat messages.
type queryBuf struct {
	q        indexer.Query
	tokens   []uint32
	messages []tokenize.Message
	tok      tokenize.Tokenizer
}

var queryBufs = sync.Pool{New: func() any { return new(queryBuf) }}

func getQueryBuf() *queryBuf { return queryBufs.Get().(*queryBuf) }

// put returns qb to the pool, dropping references to request memory and
// buffers grown past what a typical query needs.
func (qb *queryBuf) put() {
	const keepTokens = 64 << 10
	qb.q = indexer.Query{}
	if cap(qb.tokens) > keepTokens {
		qb.tokens = nil
	}
	clear(qb.messages[:cap(qb.messages)])
	qb.messages = qb.messages[:0]
	queryBufs.Put(qb)
}

func (qb *queryBuf) fromProto(model, lora, salt string, tokens []uint32, hashes []uint64, prompt string, msgs []*prefixdv1.ChatMessage, pods []string) {
	qb.q = indexer.Query{
		Model: model, LoRA: lora, CacheSalt: salt,
		TokenIDs: tokens, BlockHashes: hashes, Prompt: prompt, Pods: pods,
	}
	if len(msgs) == 0 {
		return
	}
	ms := qb.messages[:0]
	for _, m := range msgs {
		tm := tokenize.Message{Role: m.GetRole(), Content: tokenize.Content{Text: m.GetContent()}}
		if tm.Content.Text == "" && len(m.GetParts()) > 0 {
			tm.Content.Parts = make([]tokenize.Part, len(m.GetParts()))
			for i, p := range m.GetParts() {
				tm.Content.Parts[i] = tokenize.Part{Type: p.GetType(), Text: p.GetText()}
			}
		}
		ms = append(ms, tm)
	}
	qb.messages = ms
	qb.q.Messages = ms
}

// prepare checks the query against the limits and tokenizes its text, so
// the indexer gets token ids or block hashes. Errors are gRPC statuses.
func (qb *queryBuf) prepare(ix *indexer.Indexer, l Limits) error {
	q := &qb.q
	if q.Model == "" {
		return status.Error(codes.InvalidArgument, "model is required: the served model name or a LoRA adapter's name")
	}
	var given []string
	if len(q.TokenIDs) > 0 {
		given = append(given, "token_ids")
	}
	if len(q.BlockHashes) > 0 {
		given = append(given, "block_hashes")
	}
	if q.Prompt != "" {
		given = append(given, "prompt")
	}
	if len(q.Messages) > 0 {
		given = append(given, "messages")
	}
	switch {
	case len(given) == 0:
		return status.Error(codes.InvalidArgument, "empty query: give token_ids, block_hashes, prompt or messages")
	case len(given) > 1:
		return status.Errorf(codes.InvalidArgument, "query gives %v: give exactly one of token_ids, block_hashes, prompt, messages", given)
	}
	if n := len(q.BlockHashes); n > l.MaxBlockHashes {
		return status.Errorf(codes.InvalidArgument, "query has %d block hashes: the limit is %d", n, l.MaxBlockHashes)
	}
	if n := len(q.BlockHashes); n > 0 && ix.KeyMode(q.Model) == indexer.KeyModeTokens {
		return status.Errorf(codes.InvalidArgument, "model %q is keyed by prefixd's own token chains (key mode tokens): query by token ids or text, not engine block hashes", q.Model)
	}
	switch {
	case q.Prompt != "":
		qb.tokens = tokenize.AppendIDs(qb.tokens[:0], q.Prompt)
		q.TokenIDs, q.Prompt = qb.tokens, ""
	case len(q.Messages) > 0:
		qb.tokens = qb.tok.AppendChat(qb.tokens[:0], q.Messages)
		q.TokenIDs, q.Messages = qb.tokens, nil
	}
	if n := len(q.TokenIDs); n > l.MaxTokens {
		return status.Errorf(codes.InvalidArgument, "query has %d tokens: the limit is %d", n, l.MaxTokens)
	}
	if len(q.TokenIDs) == 0 && len(q.BlockHashes) == 0 {
		return status.Errorf(codes.InvalidArgument, "empty prompt: the %s holds no tokens", given[0])
	}
	return nil
}
