package rpc

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/prefixd/prefixd/indexer"
	prefixdv1 "github.com/prefixd/prefixd/proto/prefixd/v1"
	"github.com/prefixd/prefixd/rpc/internal/codec"
)

// serviceDesc is the generated IndexService description with handlers of
// its own. Each takes its concurrency slot before the request is read and
// turns a panic into an Internal answer, counted by Options.Recovery.
// Match and Score, one handler over their shared request, also reserve the
// request's memory before reading it, and decode it with the query limits
// into pooled requests: with the codec's Target, a block hash query reuses
// the slices of an earlier one instead of allocating 8 bytes per hash.
//
// gRPC calls a handler's dec to read the request (grpc-go v1.85: dec calls
// the stream's RecvMsg), so what a handler does before dec happens before
// the message is read.
var serviceDesc = func() grpc.ServiceDesc {
	d := prefixdv1.IndexService_ServiceDesc
	d.Methods = append([]grpc.MethodDesc(nil), d.Methods...)
	for i := range d.Methods {
		switch d.Methods[i].MethodName {
		case "Match":
			d.Methods[i].Handler = matchMethod.handle
		case "Score":
			d.Methods[i].Handler = scoreMethod.handle
		case "Pods":
			d.Methods[i].Handler = podsHandler
		case "Stats":
			d.Methods[i].Handler = statsHandler
		default:
			panic("rpc: IndexService method without a handler: " + d.Methods[i].MethodName)
		}
	}
	return d
}()

// queryMethod is a method answering a Query, Match or Score: they differ
// only in their name and in the response they make of a match.
type queryMethod struct {
	name       string // in metrics
	fullMethod string
	// respond makes the response to req of its match res.
	respond func(res *indexer.Result, req *prefixdv1.Query) any
}

var (
	matchMethod = &queryMethod{
		name: methodMatch, fullMethod: prefixdv1.IndexService_Match_FullMethodName,
		respond: func(res *indexer.Result, _ *prefixdv1.Query) any { return matchResponse(res) },
	}
	scoreMethod = &queryMethod{
		name: methodScore, fullMethod: prefixdv1.IndexService_Score_FullMethodName,
		respond: func(res *indexer.Result, req *prefixdv1.Query) any { return scoreResponse(res, req.GetPods()) },
	}
)

// Requests kept in the pool keep slices up to these capacities.
const (
	keepTokenIDs    = 64 << 10
	keepBlockHashes = 4 << 10
)

// pooledQuery is a Query with what decoding it needs, reused by Match and
// Score.
type pooledQuery struct {
	req prefixdv1.Query
	t   codec.Target // decodes into req
	rsv reservation
	// grow is rsv.grow, bound once: a method value made per call would be
	// allocated per call.
	grow func(int) error
}

var queries = sync.Pool{New: func() any {
	p := new(pooledQuery)
	p.grow = p.rsv.grow
	p.t = codec.Target{Msg: &p.req, Reserve: p.grow}
	return p
}}

// put returns p to the pool with its slices emptied, or dropped when they
// grew past what is worth keeping.
func (p *pooledQuery) put() {
	tokens, hashes, pods := p.req.TokenIds, p.req.BlockHashes, p.req.Pods
	if cap(tokens) > keepTokenIDs {
		tokens = nil
	}
	if cap(hashes) > keepBlockHashes {
		hashes = nil
	}
	clear(pods)
	p.req = prefixdv1.Query{TokenIds: tokens[:0], BlockHashes: hashes[:0], Pods: pods[:0]}
	p.t.Err, p.t.Held = nil, 0
	queries.Put(p)
}

// handle answers m, decoding into a pooled request (with an interceptor,
// see intercept).
func (m *queryMethod) handle(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (out any, err error) {
	s := srv.(*Server)
	start := time.Now()
	var res *indexer.Result
	defer func() {
		if r := recover(); r != nil {
			out, res, err = nil, nil, s.recovered(r, whereGRPC)
		}
		s.done(m.name, start, res, err)
	}()
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.release()
	if interceptor != nil {
		out, res, err = s.intercept(ctx, m, dec, interceptor)
		return out, err
	}
	p := queries.Get().(*pooledQuery)
	defer p.put()
	defer p.rsv.release() // before put: a panic may leave bytes reserved
	if err := s.decode(dec, &p.t, &p.rsv); err != nil {
		return nil, err
	}
	if res, err = s.query(ctx, &p.req, p.grow); err != nil {
		return nil, err
	}
	return m.respond(res, &p.req), nil
}

// intercept is handle's path through an interceptor, which may keep the
// request: it is decoded into a fresh one. (Apart, so that what the
// interceptor's handler captures is not allocated on the pooled path.)
func (s *Server) intercept(ctx context.Context, m *queryMethod, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, *indexer.Result, error) {
	rsv := new(reservation)
	t := codec.NewTarget(new(prefixdv1.Query))
	t.Reserve = rsv.grow
	defer rsv.release()
	if err := s.decode(dec, t, rsv); err != nil {
		return nil, nil, err
	}
	var res *indexer.Result
	info := &grpc.UnaryServerInfo{Server: s, FullMethod: m.fullMethod}
	out, err := interceptor(ctx, t.Msg, info, func(ctx context.Context, req any) (any, error) {
		q := req.(*prefixdv1.Query)
		r, err := s.query(ctx, q, rsv.grow)
		if err != nil {
			return nil, err
		}
		res = r
		return m.respond(r, q), nil
	})
	return out, res, err
}

// podsHandler answers Pods.
func podsHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	s := srv.(*Server)
	return s.serveListing(ctx, dec, interceptor, methodPods, new(prefixdv1.PodsRequest), prefixdv1.IndexService_Pods_FullMethodName,
		func(ctx context.Context) (any, error) { return s.podsResponse(ctx) })
}

// statsHandler answers Stats.
func statsHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	s := srv.(*Server)
	return s.serveListing(ctx, dec, interceptor, methodStats, new(prefixdv1.StatsRequest), prefixdv1.IndexService_Stats_FullMethodName,
		func(ctx context.Context) (any, error) { return s.statsResponse(ctx) })
}

// serveListing answers a method that matches nothing (Pods, Stats) with
// answer, under a concurrency slot; its request in is empty.
func (s *Server) serveListing(ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor,
	method string, in any, fullMethod string, answer func(context.Context) (any, error)) (out any, err error) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, s.recovered(r, whereGRPC)
		}
		s.done(method, start, nil, err)
	}()
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.release()
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return answer(ctx)
	}
	info := &grpc.UnaryServerInfo{Server: s, FullMethod: fullMethod}
	return interceptor(ctx, in, info, func(ctx context.Context, _ any) (any, error) { return answer(ctx) })
}
