package rpc

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/tokenize"
)

// MatchRequestJSON is the body of POST /v1/match: MatchRequest's fields
// under their proto names. Messages' content is a string or an array of
// OpenAI content parts.
type MatchRequestJSON struct {
	Model       string             `json:"model"`
	LoRA        string             `json:"lora,omitempty"`
	CacheSalt   string             `json:"cache_salt,omitempty"`
	TokenIDs    []uint32           `json:"token_ids,omitempty"`
	BlockHashes []uint64           `json:"block_hashes,omitempty"`
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
}

// PodsResponseJSON is the answer of GET /v1/pods.
type PodsResponseJSON struct {
	Pods []PodStatusJSON `json:"pods"`
}

// PodStatusJSON is one pod of PodsResponseJSON. LastEventTime is absent
// when no batch was applied.
type PodStatusJSON struct {
	Name          string     `json:"name"`
	Model         string     `json:"model"`
	Blocks        int        `json:"blocks"`
	Seq           uint64     `json:"seq"`
	HasSeq        bool       `json:"has_seq"`
	LastEventTime *time.Time `json:"last_event_time,omitempty"`
	Stale         bool       `json:"stale"`
}

// ErrorJSON is the body of every HTTP error answer: the message and the
// gRPC code's name.
type ErrorJSON struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

// NewHTTPHandler returns a handler serving POST /v1/match and GET /v1/pods
// from ix; see Server.HTTPHandler.
func NewHTTPHandler(ix *indexer.Indexer, opts Options) (http.Handler, error) {
	s, err := New(ix, opts)
	if err != nil {
		return nil, err
	}
	return s.HTTPHandler(), nil
}

// HTTPHandler returns a handler serving Match and Pods as JSON over HTTP:
// POST /v1/match with a MatchRequestJSON body answers a MatchResponseJSON,
// GET /v1/pods a PodsResponseJSON. It shares the server's limits and
// concurrency slots. Errors answer an ErrorJSON: 400 for bad JSON or an
// invalid query, 404 for an unknown model, 413 for a body over the message
// size limit, 429 over the concurrency limit, 504 past the deadline.
func (s *Server) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/match", s.httpMatch)
	mux.HandleFunc("GET /v1/pods", s.httpPods)
	return mux
}

func (s *Server) httpMatch(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	var req MatchRequestJSON
	res, err := s.decodeAndMatch(w, r, &req)
	s.done(methodHTTPMatch, start, res, err)
	if err != nil {
		writeError(w, err)
		return
	}
	out := MatchResponseJSON{
		Model: res.Model, BlockSize: res.BlockSize, Tokens: res.Tokens, TotalBlocks: res.TotalBlocks,
		Pods: make([]PodMatchJSON, len(res.Pods)),
	}
	for i, p := range res.Pods {
		out.Pods[i] = PodMatchJSON{
			Pod: p.Pod, Blocks: p.Blocks, Tokens: p.Tokens,
			GPUBlocks: p.TierBlocks[0], CPUBlocks: p.TierBlocks[1], DiskBlocks: p.TierBlocks[2],
			Score: p.Score, Stale: p.Stale,
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// errBodyTooLarge marks a body over the message size limit.
var errBodyTooLarge = errors.New("request body too large")

func (s *Server) decodeAndMatch(w http.ResponseWriter, r *http.Request, req *MatchRequestJSON) (*indexer.Result, error) {
	body := http.MaxBytesReader(w, r.Body, int64(s.limits.MaxMessageBytes))
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(req); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, fmt.Errorf("%w: the limit is %d bytes", errBodyTooLarge, tooLarge.Limit)
		}
		return nil, status.Errorf(codes.InvalidArgument, "bad JSON body: %v", err)
	}
	if dec.More() {
		return nil, status.Error(codes.InvalidArgument, "bad JSON body: more than one value")
	}
	qb := getQueryBuf()
	defer qb.put()
	qb.q = indexer.Query{
		Model: req.Model, LoRA: req.LoRA, CacheSalt: req.CacheSalt,
		TokenIDs: req.TokenIDs, BlockHashes: req.BlockHashes, Prompt: req.Prompt,
		Messages: req.Messages, Pods: req.Pods,
	}
	return s.match(r.Context(), qb)
}

func (s *Server) httpPods(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	pods, err := s.pods(r.Context())
	s.done(methodHTTPPods, start, nil, err)
	if err != nil {
		writeError(w, err)
		return
	}
	out := PodsResponseJSON{Pods: make([]PodStatusJSON, len(pods))}
	for i, p := range pods {
		out.Pods[i] = PodStatusJSON{Name: p.Name, Model: p.Model, Blocks: p.Blocks, Seq: p.Seq, HasSeq: p.HasSeq, Stale: p.Stale}
		if !p.LastEvent.IsZero() {
			t := p.LastEvent.UTC()
			out.Pods[i].LastEventTime = &t
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v) // the client went away; nothing to do
}

func writeError(w http.ResponseWriter, err error) {
	if errors.Is(err, errBodyTooLarge) {
		writeJSON(w, http.StatusRequestEntityTooLarge, ErrorJSON{Error: err.Error(), Code: codes.InvalidArgument.String()})
		return
	}
	st := status.Convert(err)
	writeJSON(w, httpStatus(st.Code()), ErrorJSON{Error: st.Message(), Code: st.Code().String()})
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
	case codes.Canceled:
		return 499 // client closed request
	default:
		return http.StatusInternalServerError
	}
}
