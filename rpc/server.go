package rpc

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/tokenize"
	"github.com/prefixd/prefixd/internal/recovery"
	prefixdv1 "github.com/prefixd/prefixd/proto/prefixd/v1"
	"github.com/prefixd/prefixd/rpc/internal/codec"
	"github.com/prefixd/prefixd/rpc/querylimit"
	"github.com/prefixd/prefixd/store"
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
	guard   *recovery.Guard
	// sem holds one token per query in flight, gRPC and HTTP together.
	sem chan struct{}
	// budget is the bytes queries in flight may hold, gRPC and HTTP
	// together.
	budget budget

	queryLimits querylimit.Limits // applied by the decoders
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
		guard:   opts.Recovery,
		sem:     make(chan struct{}, opts.Limits.MaxConcurrent),
		budget:  budget{max: int64(opts.Limits.MaxInflightBytes)},

		queryLimits: querylimit.Limits{MaxTokens: opts.Limits.MaxTokens, MaxBlockHashes: opts.Limits.MaxBlockHashes},
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
		grpc.InTapHandle(s.readDeadline),
	}
}

// readDeadline cuts the deadline of an IndexService call to ReadTimeout.
// It runs when the call's headers arrive, before its message is read: a
// client that never finishes sending its message then loses the call, and
// the slot and bytes it holds, after ReadTimeout.
func (s *Server) readDeadline(ctx context.Context, info *tap.Info) (context.Context, error) {
	if !strings.HasPrefix(info.FullMethodName, "/"+prefixdv1.IndexService_ServiceDesc.ServiceName+"/") {
		return ctx, nil
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= s.limits.ReadTimeout {
		return ctx, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.limits.ReadTimeout)
	context.AfterFunc(ctx, cancel) // gRPC cancels the call's context when it ends
	return ctx, nil
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

// Match answers a prefix query with every matched pod's blocks, tiers and
// score. Over gRPC the server's own handlers answer it, admitting the
// query before its request is read (see HTTPHandler and the package doc);
// called directly, Match takes a concurrency slot and checks req, already
// in memory, against the limits.
func (s *Server) Match(ctx context.Context, req *prefixdv1.Query) (*prefixdv1.MatchResponse, error) {
	out, err := s.call(ctx, matchMethod, req)
	if err != nil {
		return nil, err
	}
	return out.(*prefixdv1.MatchResponse), nil
}

// Score answers a prefix query with pod -> normalized score, and the
// scored pods that are stale or incomplete; see Match.
func (s *Server) Score(ctx context.Context, req *prefixdv1.Query) (*prefixdv1.ScoreResponse, error) {
	out, err := s.call(ctx, scoreMethod, req)
	if err != nil {
		return nil, err
	}
	return out.(*prefixdv1.ScoreResponse), nil
}

// call answers req, in memory, by m under a concurrency slot.
func (s *Server) call(ctx context.Context, m *queryMethod, req *prefixdv1.Query) (out any, err error) {
	start := time.Now()
	var res *indexer.Result
	defer func() { s.done(m.name, start, res, err) }()
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.release()
	if res, err = s.query(ctx, req, nil); err != nil {
		return nil, err
	}
	return m.respond(res, req), nil
}

// Pods lists the known pods.
func (s *Server) Pods(ctx context.Context, _ *prefixdv1.PodsRequest) (resp *prefixdv1.PodsResponse, err error) {
	start := time.Now()
	defer func() { s.done(methodPods, start, nil, err) }()
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.release()
	return s.podsResponse(ctx)
}

// Stats reports the index's size, memory and ingest rates.
func (s *Server) Stats(ctx context.Context, _ *prefixdv1.StatsRequest) (resp *prefixdv1.StatsResponse, err error) {
	start := time.Now()
	defer func() { s.done(methodStats, start, nil, err) }()
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.release()
	return s.statsResponse(ctx)
}

// query answers a decoded query with its match; grow, when not nil,
// reserves what answering allocates beyond the request (tokens of text).
// The caller holds a concurrency slot.
func (s *Server) query(ctx context.Context, req *prefixdv1.Query, grow func(int) error) (*indexer.Result, error) {
	qb := getQueryBuf()
	defer qb.put()
	if err := qb.fromProto(req, grow); err != nil {
		return nil, err
	}
	return s.answer(ctx, qb, grow)
}

func (s *Server) podsResponse(ctx context.Context) (*prefixdv1.PodsResponse, error) {
	pods, err := s.pods(ctx)
	if err != nil {
		return nil, err
	}
	out := &prefixdv1.PodsResponse{Pods: make([]*prefixdv1.PodStatus, len(pods))}
	for i, p := range pods {
		ps := &prefixdv1.PodStatus{
			Name: p.Name, Model: p.Model, Blocks: uint64(p.Blocks),
			Seq: p.Seq, HasSeq: p.HasSeq, Stale: p.Stale,
			Incomplete: p.Incomplete, EvictedBlocks: uint64(p.Evicted),
		}
		if !p.LastEvent.IsZero() {
			ps.LastEventTime = timestamppb.New(p.LastEvent)
		}
		out.Pods[i] = ps
	}
	return out, nil
}

func (s *Server) statsResponse(ctx context.Context) (*prefixdv1.StatsResponse, error) {
	pods, err := s.pods(ctx)
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

// decode reads a Query with dec into t, under the query limits: it
// reserves MaxMessageBytes for the read (the message's size is not known
// before), what decoding allocates before it is allocated, and then gives
// back all but what the decoded request holds. On error nothing
// stays reserved.
func (s *Server) decode(dec func(any) error, t *codec.Target, rsv *reservation) error {
	rsv.b = &s.budget
	if err := rsv.grow(s.limits.MaxMessageBytes); err != nil {
		return err
	}
	t.Limits = s.queryLimits
	if err := dec(t); err != nil {
		rsv.release()
		if status.Code(err) == codes.ResourceExhausted {
			// gRPC's own check of the message size, which gRPC has
			// already answered.
			return &refusal{reason: reasonTooLarge, st: status.Convert(err)}
		}
		return err
	}
	if t.Err != nil {
		rsv.release()
		return decodeError(t.Err)
	}
	rsv.shrinkTo(t.Held)
	return nil
}

// decodeError turns an error of a Target's decode into a status.
func decodeError(err error) error {
	var le *querylimit.Error
	switch {
	case errors.As(err, &le):
		return limitRefusal(le.Field, le.Limit)
	case errors.As(err, new(*refusal)):
		return err
	}
	return status.Errorf(codes.InvalidArgument, "bad request message: %v", err)
}

// limitRefusal is the refusal of a query found over a limit while it was
// read: field is "token_ids", "block_hashes", "messages" or "text".
func limitRefusal(field string, limit int) *refusal {
	switch field {
	case "block_hashes":
		return refuse(reasonBlockHashes, codes.InvalidArgument, "query has more than %d block hashes: the limit is %d", limit, limit)
	case "messages":
		return refuse(reasonTokens, codes.InvalidArgument, "query has more than %d tokens: the limit is %d (more than %d messages, each at least 4 tokens)", limit, limit, limit/4)
	}
	return refuse(reasonTokens, codes.InvalidArgument, "query has more than %d tokens: the limit is %d", limit, limit)
}

// Boundaries of recovered panics, as they appear in prefixd_panics_total.
const (
	whereGRPC = "grpc_query"
	whereHTTP = "http_query"
)

// recovered counts and logs a panic recovered while answering a query and
// returns the Internal status to answer it with.
func (s *Server) recovered(r any, where string) error {
	_ = s.guard.Error(r, where)
	return status.Error(codes.Internal, "internal error: the server recovered from a bug answering this query and logged it")
}

// answer validates a query and answers it; the caller holds a concurrency
// slot. Errors are gRPC statuses.
func (s *Server) answer(ctx context.Context, qb *queryBuf, grow func(int) error) (*indexer.Result, error) {
	if err := ctx.Err(); err != nil {
		return nil, statusOf(err)
	}
	if err := qb.prepare(s.ix, s.limits, grow); err != nil {
		return nil, err
	}
	res, err := s.ix.Match(ctx, &qb.q)
	if err != nil {
		return nil, statusOf(err)
	}
	return res, nil
}

// pods lists the pods; the caller holds a concurrency slot.
func (s *Server) pods(ctx context.Context) ([]indexer.PodStatus, error) {
	if err := ctx.Err(); err != nil {
		return nil, statusOf(err)
	}
	pods, err := s.ix.Pods(ctx)
	if err != nil {
		return nil, statusOf(err)
	}
	return pods, nil
}

// done records a query's latency and result; res is nil for methods that
// match nothing.
func (s *Server) done(method string, start time.Time, res *indexer.Result, err error) {
	result := resultHit
	switch {
	case err != nil:
		result = resultError
		if r := asRefusal(err); r != nil {
			result = resultRejected
			s.metrics.refusals[r.reason].Inc()
		} else if s.log.Enabled(context.Background(), slog.LevelDebug) {
			s.log.Debug("query failed", "method", method, "err", err)
		}
	case res == nil:
		result = resultOK
	case len(res.Pods) == 0:
		result = resultMiss
	}
	s.metrics.observe(method, result, time.Since(start).Seconds())
}

// asRefusal returns the refusal err is or wraps, or nil.
func asRefusal(err error) *refusal {
	if r, ok := err.(*refusal); ok {
		return r
	}
	var r *refusal
	if errors.As(err, &r) {
		return r
	}
	return nil
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
	case errors.Is(err, store.ErrUnavailable):
		// A shared store that cannot be reached: another prefixd replica,
		// or this one once the store is back, can answer.
		code = codes.Unavailable
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

// scoreResponse is Score's answer to a match of candidate pods.
func scoreResponse(res *indexer.Result, candidates []string) *prefixdv1.ScoreResponse {
	stale, incomplete := flagged(res)
	return &prefixdv1.ScoreResponse{Scores: Scores(res, candidates), StalePods: stale, IncompletePods: incomplete}
}

// flagged returns the matched pods that are stale, and those that are
// incomplete, each sorted, or nil.
func flagged(res *indexer.Result) (stale, incomplete []string) {
	for _, p := range res.Pods {
		if p.Stale {
			stale = append(stale, p.Pod)
		}
		if p.Incomplete {
			incomplete = append(incomplete, p.Pod)
		}
	}
	slices.Sort(stale)
	slices.Sort(incomplete)
	return stale, incomplete
}

func matchResponse(res *indexer.Result) *prefixdv1.MatchResponse {
	out := &prefixdv1.MatchResponse{
		Model:       res.Model,
		BlockSize:   uint32(res.BlockSize),
		Tokens:      uint32(res.Tokens),
		TotalBlocks: uint32(res.TotalBlocks),
		Pods:        make([]*prefixdv1.PodMatch, len(res.Pods)),
		Explanation: res.Explanation,
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
		pm.Incomplete = p.Incomplete
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
}

var queryBufs = sync.Pool{New: func() any { return new(queryBuf) }}

func getQueryBuf() *queryBuf { return queryBufs.Get().(*queryBuf) }

// put returns qb to the pool, dropping references to request memory and
// buffers grown past what a typical query needs.
func (qb *queryBuf) put() {
	const (
		keepTokens   = 64 << 10
		keepMessages = 1 << 10
	)
	qb.q = indexer.Query{}
	if cap(qb.tokens) > keepTokens {
		qb.tokens = nil
	}
	if cap(qb.messages) > keepMessages {
		qb.messages = nil
	}
	clear(qb.messages[:cap(qb.messages)])
	qb.messages = qb.messages[:0]
	queryBufs.Put(qb)
}

// Sizes of a converted chat message and content part, for reservations.
const (
	sizeMessage = 56 // tokenize.Message
	sizePart    = 32 // tokenize.Part
)

// fromProto sets the query from req, converting its chat messages; grow,
// when not nil, reserves the conversion first.
func (qb *queryBuf) fromProto(req *prefixdv1.Query, grow func(int) error) error {
	qb.q = indexer.Query{
		Model: req.GetModel(), LoRA: req.GetLora(), CacheSalt: req.GetCacheSalt(),
		TokenIDs: req.GetTokenIds(), BlockHashes: req.GetBlockHashes(), Prompt: req.GetPrompt(), Pods: req.GetPods(),
	}
	msgs := req.GetMessages()
	if len(msgs) == 0 {
		return nil
	}
	if grow != nil {
		n := 0
		if cap(qb.messages) < len(msgs) {
			n = sizeMessage * len(msgs)
		}
		for _, m := range msgs {
			if m.GetContent() == "" {
				n += sizePart * len(m.GetParts())
			}
		}
		if err := grow(n); err != nil {
			return err
		}
	}
	if cap(qb.messages) < len(msgs) {
		qb.messages = make([]tokenize.Message, 0, len(msgs))
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
	return nil
}

// roomForTokens makes room in qb.tokens for the tokens of text of n bytes:
// at most one a byte, and at most limit. What the pooled buffer lacks is
// reserved with grow first, when grow is not nil.
func (qb *queryBuf) roomForTokens(n, limit int, grow func(int) error) error {
	need := min(n, limit)
	if cap(qb.tokens) >= need {
		return nil
	}
	if grow != nil {
		if err := grow(4 * need); err != nil {
			return err
		}
	}
	qb.tokens = make([]uint32, 0, need)
	return nil
}

// renderedLen returns the length of msgs flattened as tokenize renders
// them.
func renderedLen(msgs []tokenize.Message) int {
	n := 0
	for i := range msgs {
		m := &msgs[i]
		n += len("### ") + len(m.Role) + len(": ") + len(m.Content.Text) + len("\n")
		if m.Content.Text == "" {
			for _, p := range m.Content.Parts {
				n += len(p.Text) + 1
			}
		}
	}
	return n
}

// inputNames are a query's inputs, as prepare checks them.
var inputNames = [...]string{"token_ids", "block_hashes", "prompt", "messages"}

// prepare checks the query against the limits and tokenizes its text, so
// the indexer gets token ids or block hashes; text is tokenized with the
// token limit applied as it goes. grow, when not nil, reserves the tokens'
// memory first. Errors are gRPC statuses.
func (qb *queryBuf) prepare(ix *indexer.Indexer, l Limits, grow func(int) error) error {
	q := &qb.q
	if q.Model == "" {
		return status.Error(codes.InvalidArgument, "model is required: the served model name or a LoRA adapter's name")
	}
	inputs := [...]bool{len(q.TokenIDs) > 0, len(q.BlockHashes) > 0, q.Prompt != "", len(q.Messages) > 0}
	var given []string // built only to say what came: it escapes into the error
	first := ""
	for i, ok := range inputs {
		if ok && first == "" {
			first = inputNames[i]
		} else if ok {
			given = append(given, inputNames[i])
		}
	}
	switch {
	case first == "":
		return status.Error(codes.InvalidArgument, "empty query: give token_ids, block_hashes, prompt or messages")
	case len(given) > 0:
		return status.Errorf(codes.InvalidArgument, "query gives %v: give exactly one of token_ids, block_hashes, prompt, messages", append([]string{first}, given...))
	}
	if n := len(q.BlockHashes); n > l.MaxBlockHashes {
		return refuse(reasonBlockHashes, codes.InvalidArgument, "query has %d block hashes: the limit is %d", n, l.MaxBlockHashes)
	}
	if n := len(q.BlockHashes); n > 0 && ix.KeyMode(q.Model) == indexer.KeyModeTokens {
		return status.Errorf(codes.InvalidArgument, "model %q is keyed by prefixd's own token chains (key mode tokens): query by token ids or text, not engine block hashes", q.Model)
	}
	var over bool
	switch {
	case q.Prompt != "":
		if err := qb.roomForTokens(len(q.Prompt), l.MaxTokens, grow); err != nil {
			return err
		}
		qb.tokens, over = tokenize.AppendIDsMax(qb.tokens[:0], q.Prompt, l.MaxTokens)
		q.TokenIDs, q.Prompt = qb.tokens, ""
	case len(q.Messages) > 0:
		if len(q.Messages) > l.MaxTokens/4 {
			return limitRefusal("messages", l.MaxTokens)
		}
		if err := qb.roomForTokens(renderedLen(q.Messages), l.MaxTokens, grow); err != nil {
			return err
		}
		qb.tokens, over = tokenize.AppendChatMax(qb.tokens[:0], q.Messages, l.MaxTokens)
		q.TokenIDs, q.Messages = qb.tokens, nil
	}
	if over {
		return limitRefusal("text", l.MaxTokens)
	}
	if n := len(q.TokenIDs); n > l.MaxTokens {
		return refuse(reasonTokens, codes.InvalidArgument, "query has %d tokens: the limit is %d", n, l.MaxTokens)
	}
	if len(q.TokenIDs) == 0 && len(q.BlockHashes) == 0 {
		return status.Errorf(codes.InvalidArgument, "empty prompt: the %s holds no tokens", first)
	}
	return nil
}
