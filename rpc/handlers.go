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
// Match and Score also reserve the request's memory before reading it, and
// decode it with the query limits into pooled requests: with the codec's
// Target, a block hash query reuses the slices of an earlier one instead
// of allocating 8 bytes per hash.
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
			d.Methods[i].Handler = matchHandler
		case "Score":
			d.Methods[i].Handler = scoreHandler
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

// Requests kept in the pools keep slices up to these capacities.
const (
	keepTokenIDs    = 64 << 10
	keepBlockHashes = 4 << 10
)

// pooledMatch is a MatchRequest with what decoding it needs, reused.
type pooledMatch struct {
	req prefixdv1.MatchRequest
	t   codec.Target // decodes into req
	rsv reservation
	// grow is rsv.grow, bound once: a method value made per call would be
	// allocated per call.
	grow func(int) error
}

// pooledScore is pooledMatch for Score.
type pooledScore struct {
	req  prefixdv1.ScoreRequest
	t    codec.Target
	rsv  reservation
	grow func(int) error
}

var (
	matchRequests = sync.Pool{New: func() any {
		p := new(pooledMatch)
		p.grow = p.rsv.grow
		p.t = codec.Target{Msg: &p.req, Query: codec.QueryOf(&p.req), Reserve: p.grow}
		return p
	}}
	scoreRequests = sync.Pool{New: func() any {
		p := new(pooledScore)
		p.grow = p.rsv.grow
		p.t = codec.Target{Msg: &p.req, Query: codec.ScoreQueryOf(&p.req), Reserve: p.grow}
		return p
	}}
)

func (p *pooledMatch) put() {
	t, h, ps := reuse(p.req.TokenIds, p.req.BlockHashes, p.req.Pods)
	p.req = prefixdv1.MatchRequest{TokenIds: t, BlockHashes: h, Pods: ps}
	p.t.Err, p.t.Held = nil, 0
	matchRequests.Put(p)
}

func (p *pooledScore) put() {
	t, h, ps := reuse(p.req.TokenIds, p.req.BlockHashes, p.req.Pods)
	p.req = prefixdv1.ScoreRequest{TokenIds: t, BlockHashes: h, Pods: ps}
	p.t.Err, p.t.Held = nil, 0
	scoreRequests.Put(p)
}

// reuse returns the slices of a finished request emptied, or nil when they
// grew past what is worth keeping.
func reuse(tokens []uint32, hashes []uint64, pods []string) ([]uint32, []uint64, []string) {
	if cap(tokens) > keepTokenIDs {
		tokens = nil
	}
	if cap(hashes) > keepBlockHashes {
		hashes = nil
	}
	clear(pods)
	return tokens[:0], hashes[:0], pods[:0]
}

// matchHandler answers Match, decoding into a pooled request (with an
// interceptor, see interceptMatch).
func matchHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (out any, err error) {
	s := srv.(*Server)
	start := time.Now()
	var res *indexer.Result
	defer func() {
		if r := recover(); r != nil {
			out, res, err = nil, nil, s.recovered(r, whereGRPC)
		}
		s.done(methodMatch, start, res, err)
	}()
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.release()
	if interceptor != nil {
		out, res, err = s.interceptMatch(ctx, dec, interceptor)
		return out, err
	}
	p := matchRequests.Get().(*pooledMatch)
	defer p.put()
	defer p.rsv.release() // before put: a panic may leave bytes reserved
	if err := s.decode(dec, &p.t, &p.rsv); err != nil {
		return nil, err
	}
	resp, r, err := s.match(ctx, &p.req, p.grow)
	res = r
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// scoreHandler is matchHandler for Score.
func scoreHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (out any, err error) {
	s := srv.(*Server)
	start := time.Now()
	var res *indexer.Result
	defer func() {
		if r := recover(); r != nil {
			out, res, err = nil, nil, s.recovered(r, whereGRPC)
		}
		s.done(methodScore, start, res, err)
	}()
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.release()
	if interceptor != nil {
		out, res, err = s.interceptScore(ctx, dec, interceptor)
		return out, err
	}
	p := scoreRequests.Get().(*pooledScore)
	defer p.put()
	defer p.rsv.release()
	if err := s.decode(dec, &p.t, &p.rsv); err != nil {
		return nil, err
	}
	resp, r, err := s.score(ctx, &p.req, p.grow)
	res = r
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// interceptMatch is matchHandler's path through an interceptor, which may
// keep the request: it is decoded into a fresh one. (Apart, so that what
// the interceptor's handler captures is not allocated on the pooled path.)
func (s *Server) interceptMatch(ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, *indexer.Result, error) {
	in := new(prefixdv1.MatchRequest)
	rsv := new(reservation)
	t := codec.NewTarget(in)
	t.Reserve = rsv.grow
	defer rsv.release()
	if err := s.decode(dec, t, rsv); err != nil {
		return nil, nil, err
	}
	var res *indexer.Result
	info := &grpc.UnaryServerInfo{Server: s, FullMethod: prefixdv1.IndexService_Match_FullMethodName}
	out, err := interceptor(ctx, in, info, func(ctx context.Context, req any) (any, error) {
		resp, r, err := s.match(ctx, req.(*prefixdv1.MatchRequest), rsv.grow)
		res = r
		return resp, err
	})
	return out, res, err
}

// interceptScore is interceptMatch for Score.
func (s *Server) interceptScore(ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, *indexer.Result, error) {
	in := new(prefixdv1.ScoreRequest)
	rsv := new(reservation)
	t := codec.NewScoreTarget(in)
	t.Reserve = rsv.grow
	defer rsv.release()
	if err := s.decode(dec, t, rsv); err != nil {
		return nil, nil, err
	}
	var res *indexer.Result
	info := &grpc.UnaryServerInfo{Server: s, FullMethod: prefixdv1.IndexService_Score_FullMethodName}
	out, err := interceptor(ctx, in, info, func(ctx context.Context, req any) (any, error) {
		resp, r, err := s.score(ctx, req.(*prefixdv1.ScoreRequest), rsv.grow)
		res = r
		return resp, err
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
