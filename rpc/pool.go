package rpc

import (
	"context"
	"sync"

	"google.golang.org/grpc"

	prefixdv1 "github.com/prefixd/prefixd/proto/prefixd/v1"
)

// serviceDesc is the generated IndexService description with Match and
// Score decoding into pooled requests: with the codec's DecodeQuery, a
// block hash query reuses the slice of an earlier one instead of
// allocating 8 bytes per hash.
var serviceDesc = func() grpc.ServiceDesc {
	d := prefixdv1.IndexService_ServiceDesc
	d.Methods = append([]grpc.MethodDesc(nil), d.Methods...)
	for i := range d.Methods {
		switch d.Methods[i].MethodName {
		case "Match":
			d.Methods[i].Handler = matchHandler
		case "Score":
			d.Methods[i].Handler = scoreHandler
		}
	}
	return d
}()

// Requests kept in the pools keep slices up to these capacities.
const (
	keepTokenIDs    = 64 << 10
	keepBlockHashes = 4 << 10
)

var (
	matchRequests = sync.Pool{New: func() any { return new(prefixdv1.MatchRequest) }}
	scoreRequests = sync.Pool{New: func() any { return new(prefixdv1.ScoreRequest) }}
)

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

// matchHandler is the generated handler with a pooled request. With an
// interceptor, which may keep the request, it uses a fresh one.
func matchHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	s := srv.(*Server)
	if interceptor != nil {
		in := new(prefixdv1.MatchRequest)
		if err := dec(in); err != nil {
			return nil, err
		}
		info := &grpc.UnaryServerInfo{Server: srv, FullMethod: prefixdv1.IndexService_Match_FullMethodName}
		return interceptor(ctx, in, info, func(ctx context.Context, req any) (any, error) {
			return s.Match(ctx, req.(*prefixdv1.MatchRequest))
		})
	}
	in := matchRequests.Get().(*prefixdv1.MatchRequest)
	defer func() {
		t, h, p := reuse(in.TokenIds, in.BlockHashes, in.Pods)
		*in = prefixdv1.MatchRequest{TokenIds: t, BlockHashes: h, Pods: p}
		matchRequests.Put(in)
	}()
	if err := dec(in); err != nil {
		return nil, err
	}
	return s.Match(ctx, in)
}

// scoreHandler is matchHandler for Score.
func scoreHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	s := srv.(*Server)
	if interceptor != nil {
		in := new(prefixdv1.ScoreRequest)
		if err := dec(in); err != nil {
			return nil, err
		}
		info := &grpc.UnaryServerInfo{Server: srv, FullMethod: prefixdv1.IndexService_Score_FullMethodName}
		return interceptor(ctx, in, info, func(ctx context.Context, req any) (any, error) {
			return s.Score(ctx, req.(*prefixdv1.ScoreRequest))
		})
	}
	in := scoreRequests.Get().(*prefixdv1.ScoreRequest)
	defer func() {
		t, h, p := reuse(in.TokenIds, in.BlockHashes, in.Pods)
		*in = prefixdv1.ScoreRequest{TokenIds: t, BlockHashes: h, Pods: p}
		scoreRequests.Put(in)
	}()
	if err := dec(in); err != nil {
		return nil, err
	}
	return s.Score(ctx, in)
}
