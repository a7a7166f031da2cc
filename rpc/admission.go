package rpc

import (
	"fmt"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Reasons a query is refused, as they appear in the reason label of
// prefixd_query_refused_total.
const (
	reasonConcurrency = "concurrency"  // MaxConcurrent queries in flight
	reasonMemory      = "memory"       // MaxInflightBytes held by queries in flight
	reasonTooLarge    = "too_large"    // a message or body over MaxMessageBytes
	reasonTokens      = "tokens"       // over MaxTokens
	reasonBlockHashes = "block_hashes" // over MaxBlockHashes
)

var allReasons = []string{reasonConcurrency, reasonMemory, reasonTooLarge, reasonTokens, reasonBlockHashes}

// refusal is the error of a query refused by a limit: a gRPC status, with
// the reason it is counted under.
type refusal struct {
	reason string
	st     *status.Status
}

func refuse(reason string, code codes.Code, format string, args ...any) *refusal {
	return &refusal{reason: reason, st: status.Newf(code, format, args...)}
}

func (r *refusal) Error() string { return r.st.Err().Error() }

// GRPCStatus makes a refusal its status to status.FromError and to gRPC.
func (r *refusal) GRPCStatus() *status.Status { return r.st }

// budget is the bytes that queries in flight may hold, gRPC and HTTP
// together: their messages or bodies as read, and what decoding them
// allocates. A reservation that does not fit is refused, not waited for.
type budget struct {
	max   int64
	inUse atomic.Int64
}

// reserve takes n bytes, or reports that they do not fit.
func (b *budget) reserve(n int64) bool {
	for {
		cur := b.inUse.Load()
		if cur+n > b.max {
			return false
		}
		if b.inUse.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// reservation is one query's share of the budget. It is not safe for
// concurrent use: a query's decoding runs on one goroutine.
type reservation struct {
	b *budget
	n int64 // bytes held
}

// grow reserves n more bytes, or returns a memory refusal. It is what the
// decoders call before they allocate.
func (r *reservation) grow(n int) error {
	if r.b.reserve(int64(n)) {
		r.n += int64(n)
		return nil
	}
	return refuse(reasonMemory, codes.ResourceExhausted,
		"too many query bytes in flight: this query needs %d more bytes, queries in flight hold %d, the limit is %d bytes", n, r.b.inUse.Load(), r.b.max)
}

// shrinkTo gives back what the query holds beyond n bytes.
func (r *reservation) shrinkTo(n int) {
	if d := r.n - int64(n); d > 0 {
		r.b.inUse.Add(-d)
		r.n = int64(n)
	}
}

// release gives back everything; the reservation may be grown again.
func (r *reservation) release() {
	if r.n != 0 {
		r.b.inUse.Add(-r.n)
		r.n = 0
	}
}

func (s *Server) acquire() error {
	select {
	case s.sem <- struct{}{}:
		return nil
	default:
		return refuse(reasonConcurrency, codes.ResourceExhausted, "too many concurrent queries: the limit is %d", s.limits.MaxConcurrent)
	}
}

func (s *Server) release() { <-s.sem }

// tooLarge is the refusal of a body of size bytes (-1: of more than the
// limit, read so far) over the size limit.
func (s *Server) tooLarge(size int64) *refusal {
	what := fmt.Sprintf("of more than %d bytes", s.limits.MaxMessageBytes)
	if size >= 0 {
		what = fmt.Sprintf("of %d bytes", size)
	}
	return refuse(reasonTooLarge, codes.InvalidArgument, "request body too large: a body %s, the limit is %d bytes", what, s.limits.MaxMessageBytes)
}
