package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/tokenize"
	"github.com/prefixd/prefixd/rpc/querybody"
	"github.com/prefixd/prefixd/rpc/querylimit"
)

// QueryJSON is the body of POST /v1/match and POST /v1/score: Query's
// fields under their proto names. An OpenAI chat-completions or
// completions request body is one as it is: fields a query does not use
// (max_tokens, stream, tools, ...) are skipped, and a completions prompt
// may also be an array of one string or of token ids (see package
// rpc/querybody, which decodes it). Messages' content is a string or an
// array of OpenAI content parts. Block hashes are decimal strings (as
// Hashes writes them) or numbers.
type QueryJSON struct {
	Model       string             `json:"model"`
	LoRA        string             `json:"lora,omitempty"`
	CacheSalt   string             `json:"cache_salt,omitempty"`
	TokenIDs    []uint32           `json:"token_ids,omitempty"`
	BlockHashes querybody.Hashes   `json:"block_hashes,omitempty"`
	Prompt      string             `json:"prompt,omitempty"`
	Messages    []tokenize.Message `json:"messages,omitempty"`
	Pods        []string           `json:"pods,omitempty"`
}

// MatchResponseJSON is the answer of POST /v1/match.
type MatchResponseJSON struct {
	Model       string         `json:"model"`
	BlockSize   int            `json:"block_size"`
	Tokens      int            `json:"tokens"`
	TotalBlocks int            `json:"total_blocks"`
	Pods        []PodMatchJSON `json:"pods"`
	// Explanation says why Pods is empty when the reason is not the
	// query's own (no event has come yet); absent otherwise.
	Explanation string `json:"explanation,omitempty"`
}

// PodMatchJSON is one pod of MatchResponseJSON.
type PodMatchJSON struct {
	Pod        string  `json:"pod"`
	Blocks     int     `json:"blocks"`
	Tokens     int     `json:"tokens"`
	GPUBlocks  int     `json:"gpu_blocks"`
	CPUBlocks  int     `json:"cpu_blocks"`
	DiskBlocks int     `json:"disk_blocks"`
	Score      float64 `json:"score"`
	Stale      bool    `json:"stale"`
	// Incomplete is set when the index forgot blocks the pod still holds,
	// to make room: it may hold a longer prefix than Blocks.
	Incomplete bool `json:"incomplete"`
}

// ScoreResponseJSON is the answer of POST /v1/score: pod -> score as
// Score answers it, and the scored pods that are stale or incomplete,
// sorted (empty when none is).
type ScoreResponseJSON struct {
	Scores         map[string]float64 `json:"scores"`
	StalePods      []string           `json:"stale_pods"`
	IncompletePods []string           `json:"incomplete_pods"`
}

// PodsResponseJSON is the answer of GET /v1/pods.
type PodsResponseJSON struct {
	Pods []PodStatusJSON `json:"pods"`
}

// PodStatusJSON is one pod of PodsResponseJSON. Seq, 64 bits, is a
// decimal string, as protojson writes it. LastEventTime is absent when no
// batch was applied.
type PodStatusJSON struct {
	Name          string     `json:"name"`
	Model         string     `json:"model"`
	Blocks        int        `json:"blocks"`
	Seq           uint64     `json:"seq,string"`
	HasSeq        bool       `json:"has_seq"`
	LastEventTime *time.Time `json:"last_event_time,omitempty"`
	Stale         bool       `json:"stale"`
	// Incomplete is set while EvictedBlocks is above 0.
	Incomplete bool `json:"incomplete"`
	// EvictedBlocks counts the pod's blocks the index forgot to make room
	// since the pod was last cleared.
	EvictedBlocks int `json:"evicted_blocks"`
}

// StatsResponseJSON is the answer of GET /v1/stats: StatsResponse's
// fields.
type StatsResponseJSON struct {
	Pods             uint64  `json:"pods"`
	IndexBlocks      uint64  `json:"index_blocks"`
	MemoryBytes      uint64  `json:"memory_bytes"`
	HeapInuseBytes   uint64  `json:"heap_inuse_bytes"`
	BatchesPerSecond float64 `json:"batches_per_second"`
	EventsPerSecond  float64 `json:"events_per_second"`
}

// ErrorJSON is the body of every HTTP error answer: the message and the
// gRPC code's name, and for a query refused by a limit the limit's reason
// as prefixd_query_refused_total counts it: concurrency, memory,
// too_large, tokens or block_hashes.
type ErrorJSON struct {
	Error  string `json:"error"`
	Code   string `json:"code"`
	Reason string `json:"reason,omitempty"`
}

// NewHTTPHandler returns a handler serving POST /v1/match, POST
// /v1/score, GET /v1/pods and GET /v1/stats from ix; see
// Server.HTTPHandler.
func NewHTTPHandler(ix *indexer.Indexer, opts Options) (http.Handler, error) {
	s, err := New(ix, opts)
	if err != nil {
		return nil, err
	}
	return s.HTTPHandler(), nil
}

// HTTPHandler returns a handler serving the IndexService as JSON over
// HTTP: POST /v1/match with a QueryJSON body answers a MatchResponseJSON,
// POST /v1/score with the same body a ScoreResponseJSON, GET /v1/pods a
// PodsResponseJSON and GET /v1/stats a StatsResponseJSON. It shares the
// server's limits, concurrency slots and byte budget with gRPC.
//
// A match or score takes its concurrency slot before it reads the body,
// then reserves the body's bytes (its Content-Length, or MaxMessageBytes
// and a half for a body of unknown length, given back down to what came)
// and reads it into one buffer; decoding reserves each string and slice
// before allocating it, stops at the first token id or block hash over
// the limit, and text is tokenized up to the token limit; the reservation
// is kept until the answer is written. The body must arrive within 30
// seconds. A refused body that was not read into memory is read and
// dropped after the answer (up to twice MaxMessageBytes, for up to 5
// seconds), so that a client still sending it reads the answer rather
// than a reset connection.
//
// Errors answer an ErrorJSON: 400 for bad JSON or an invalid query (over
// the token or block hash limit: its reason names it), 404 for an unknown
// model, 413 for a body over the message size limit (refused by its
// Content-Length without reading it), 429 over the concurrency limit or
// the byte budget, 500 for a bug (a recovered panic), 504 past the
// deadline.
func (s *Server) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/match", s.httpQuery(methodHTTPMatch, httpMatchAnswer))
	mux.HandleFunc("POST /v1/score", s.httpQuery(methodHTTPScore, httpScoreAnswer))
	mux.HandleFunc("GET /v1/pods", s.httpListing(methodHTTPPods, s.httpPods))
	mux.HandleFunc("GET /v1/stats", s.httpListing(methodHTTPStats, s.httpStats))
	return mux
}

// drainTimeout bounds the reading of a refused body, dropped so that the
// client gets its answer rather than a reset.
const drainTimeout = 5 * time.Second

// httpAnswer makes the JSON answer to q of its match res.
type httpAnswer func(res *indexer.Result, q *indexer.Query) any

func httpMatchAnswer(res *indexer.Result, _ *indexer.Query) any {
	out := MatchResponseJSON{
		Model: res.Model, BlockSize: res.BlockSize, Tokens: res.Tokens, TotalBlocks: res.TotalBlocks,
		Pods: make([]PodMatchJSON, len(res.Pods)), Explanation: res.Explanation,
	}
	for i, p := range res.Pods {
		out.Pods[i] = PodMatchJSON{
			Pod: p.Pod, Blocks: p.Blocks, Tokens: p.Tokens,
			GPUBlocks: p.TierBlocks[0], CPUBlocks: p.TierBlocks[1], DiskBlocks: p.TierBlocks[2],
			Score: p.Score, Stale: p.Stale, Incomplete: p.Incomplete,
		}
	}
	return out
}

func httpScoreAnswer(res *indexer.Result, q *indexer.Query) any {
	stale, incomplete := flagged(res)
	if stale == nil {
		stale = []string{}
	}
	if incomplete == nil {
		incomplete = []string{}
	}
	return ScoreResponseJSON{Scores: Scores(res, q.Pods), StalePods: stale, IncompletePods: incomplete}
}

// httpQuery returns the handler of a query method: the body decoded into
// a query, answered with answer.
func (s *Server) httpQuery(method string, answer httpAnswer) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		var (
			res      *indexer.Result
			err      error
			answered bool // the answer's header was written
		)
		defer func() {
			if p := recover(); p != nil {
				res, err = nil, s.recovered(p, whereHTTP)
				if !answered {
					writeError(w, err)
				}
			}
			s.done(method, start, res, err)
		}()
		var unread bool
		res, unread, err = s.serveHTTPQuery(w, r, answer, &answered)
		if err != nil {
			answered = true
			writeError(w, err)
			if unread {
				s.drain(w, r)
			}
		}
	}
}

// serveHTTPQuery answers a query, the answer written under the query's
// concurrency slot and reservation, or returns the error to answer, and
// unread when it came before any of the body was read.
func (s *Server) serveHTTPQuery(w http.ResponseWriter, r *http.Request, answer httpAnswer, answered *bool) (res *indexer.Result, unread bool, err error) {
	if err := s.acquire(); err != nil {
		return nil, true, err
	}
	defer s.release()
	rsv := reservation{b: &s.budget}
	defer rsv.release()
	body, unread, err := s.readBody(w, r, &rsv)
	if err != nil {
		return nil, unread, err
	}
	qb := getQueryBuf()
	defer qb.put()
	if err := querybody.Decode(body, &qb.q, s.queryLimits, rsv.grow); err != nil {
		var le *querylimit.Error
		var se *querybody.SyntaxError
		switch {
		case errors.As(err, &le):
			return nil, false, limitRefusal(le.Field, le.Limit)
		case errors.As(err, &se):
			return nil, false, status.Errorf(codes.InvalidArgument, "bad request body: %v", err)
		}
		return nil, false, err
	}
	if res, err = s.answer(r.Context(), qb, rsv.grow); err != nil {
		return nil, false, err
	}
	*answered = true
	writeJSON(w, http.StatusOK, answer(res, &qb.q))
	return res, false, nil
}

// readBody reads r's body into one buffer of its size, reserving its bytes
// first: the Content-Length when the client gave one (over the limit, the
// body is refused unread), else MaxMessageBytes and a half (the buffer
// doubles as it fills), given back down to the buffer read into. unread
// reports a refusal before any byte was read, for the caller to drain.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, rsv *reservation) (body []byte, unread bool, err error) {
	limit := int64(s.limits.MaxMessageBytes)
	size := r.ContentLength
	if size > limit {
		return nil, true, s.tooLarge(size) // unread; drained if not too long
	}
	want := size
	if size < 0 {
		want = limit + limit/2
	}
	if err := rsv.grow(int(want)); err != nil {
		return nil, true, err
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.limits.ReadTimeout)) // not every ResponseWriter can
	if size >= 0 {
		body = make([]byte, size)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			return nil, false, status.Errorf(codes.InvalidArgument, "reading the body of %d bytes: %v", size, err)
		}
		return body, false, nil
	}
	body = make([]byte, 0, min(16<<10, limit+1))
	for {
		if len(body) == cap(body) {
			if int64(len(body)) > limit {
				return nil, false, s.tooLarge(-1)
			}
			grown := make([]byte, len(body), min(2*int64(cap(body)), limit+1))
			copy(grown, body)
			body = grown
		}
		n, err := r.Body.Read(body[len(body):cap(body)])
		body = body[:len(body)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, false, status.Errorf(codes.InvalidArgument, "reading the body: %v", err)
		}
	}
	if int64(len(body)) > limit {
		return nil, false, s.tooLarge(-1)
	}
	rsv.shrinkTo(cap(body))
	return body, false, nil
}

// drain reads and drops what the client sends of a refused body, once the
// answer is flushed, for at most drainTimeout: closing a connection with
// unread data resets it, and a client still sending its body may then never
// read its answer. A body declared longer than twice MaxMessageBytes is
// not drained (nor more than that of a body of unknown length): its
// connection is closed after the answer.
func (s *Server) drain(w http.ResponseWriter, r *http.Request) {
	most := 2 * int64(s.limits.MaxMessageBytes)
	if r.ContentLength > most {
		return
	}
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	_ = rc.SetReadDeadline(time.Now().Add(drainTimeout))
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, most))
}

// httpListing returns the handler of a method that matches nothing (pods,
// stats): answer's JSON, under a concurrency slot.
func (s *Server) httpListing(method string, answer func(context.Context) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		var (
			err      error
			answered bool
		)
		defer func() {
			if p := recover(); p != nil {
				err = s.recovered(p, whereHTTP)
				if !answered {
					writeError(w, err)
				}
			}
			s.done(method, start, nil, err)
		}()
		if err = s.acquire(); err != nil {
			answered = true
			writeError(w, err)
			return
		}
		defer s.release()
		var out any
		if out, err = answer(r.Context()); err != nil {
			answered = true
			writeError(w, err)
			return
		}
		answered = true
		writeJSON(w, http.StatusOK, out)
	}
}

func (s *Server) httpPods(ctx context.Context) (any, error) {
	pods, err := s.pods(ctx)
	if err != nil {
		return nil, err
	}
	out := PodsResponseJSON{Pods: make([]PodStatusJSON, len(pods))}
	for i, p := range pods {
		out.Pods[i] = PodStatusJSON{
			Name: p.Name, Model: p.Model, Blocks: p.Blocks, Seq: p.Seq, HasSeq: p.HasSeq, Stale: p.Stale,
			Incomplete: p.Incomplete, EvictedBlocks: p.Evicted,
		}
		if !p.LastEvent.IsZero() {
			t := p.LastEvent.UTC()
			out.Pods[i].LastEventTime = &t
		}
	}
	return out, nil
}

func (s *Server) httpStats(ctx context.Context) (any, error) {
	st, err := s.statsResponse(ctx)
	if err != nil {
		return nil, err
	}
	return StatsResponseJSON{
		Pods: st.GetPods(), IndexBlocks: st.GetIndexBlocks(), MemoryBytes: st.GetMemoryBytes(), HeapInuseBytes: st.GetHeapInuseBytes(),
		BatchesPerSecond: st.GetBatchesPerSecond(), EventsPerSecond: st.GetEventsPerSecond(),
	}, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v) // the client went away; nothing to do
}

func writeError(w http.ResponseWriter, err error) {
	st := status.Convert(err)
	code := httpStatus(st.Code())
	var reason string
	if r := asRefusal(err); r != nil {
		reason = r.reason
		if r.reason == reasonTooLarge {
			code = http.StatusRequestEntityTooLarge
		}
	}
	writeJSON(w, code, ErrorJSON{Error: st.Message(), Code: st.Code().String(), Reason: reason})
}

func httpStatus(c codes.Code) int {
	switch c {
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.NotFound:
		return http.StatusNotFound
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.Canceled:
		return 499 // client closed request
	default:
		return http.StatusInternalServerError
	}
}
