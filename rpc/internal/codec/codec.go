// Package codec is the gRPC codec of prefixd's server and client: gRPC's
// proto codec over a buffer pool with a tier per power of two, and a
// decoder for query requests that reuses their slices.
//
// # Basics
//
// Codec implements encoding.CodecV2 under the name "proto", so it speaks
// the standard wire format: the server installs it with
// grpc.ForceServerCodecV2, the client with grpc.ForceCodecV2. Pool is the
// buffer pool both sides also give gRPC's transport.
//
// Query, the request of Match and Score, is decoded by DecodeQuery, which
// reuses the capacity of the message's token_ids, block_hashes and pods
// slices: a server that decodes into pooled messages allocates for a block
// hash query only its strings. Every other message goes through
// proto.Unmarshal. The decoder's field numbers are written by hand; a test
// walks Query's descriptor, so that a field added to the .proto that the
// decoder does not read, or a number, kind or cardinality that changed,
// fails it.
//
// A server decodes a query under its limits by passing gRPC's dec func a
// *Target rather than the request: the token ids, block hashes and chat
// messages over a limit are not decoded, and every slice, string and
// message the decoding allocates is first asked of Target.Reserve, so that
// a query cannot cost the server more memory than its budget grants.
// Failures of a Target's decode are kept in Target.Err, not returned: gRPC
// would answer them to the client itself, as Internal, before the server's
// handler could say which limit the query is over.
//
// # Caveats
//
// gRPC's default pool has tiers of 256 B, 4 KiB, 16 KiB, 32 KiB and 1 MiB
// and clears the whole buffer on every Get: a query of 8192 token ids (32
// KiB and a few bytes) cleared 1 MiB twice, a quarter of the CPU of such
// queries in profiles. Pool's tiers stop at 4 MiB; larger messages get
// plain allocations.
package codec

import (
	"fmt"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	prefixdv1 "github.com/prefixd/prefixd/proto/prefixd/v1"
)

// Pool has a tier per power of two from 256 bytes to 4 MiB.
var Pool = mustPool()

func mustPool() mem.BufferPool {
	p, err := mem.NewBinaryTieredBufferPool(8, 10, 12, 14, 15, 16, 17, 18, 19, 20, 21, 22)
	if err != nil {
		panic(err) // constant, valid exponents
	}
	return p
}

// Codec is a gRPC CodecV2 for proto messages; see the package doc.
type Codec struct{}

// Name returns "proto": the codec is wire compatible with gRPC's own.
func (Codec) Name() string { return "proto" }

// Marshal encodes v into a buffer from Pool (below gRPC's pooling
// threshold, into a plain slice).
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("codec: cannot marshal %T: not a proto message", v)
	}
	size := proto.Size(m)
	opts := proto.MarshalOptions{UseCachedSize: true} // Size just ran
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := Pool.Get(size)
	b, err := opts.MarshalAppend((*buf)[:0], m)
	if err != nil {
		Pool.Put(buf)
		return nil, err
	}
	*buf = b
	return mem.BufferSlice{mem.NewBuffer(buf, Pool)}, nil
}

// Unmarshal decodes data into v: query requests with DecodeQuery, other
// messages with proto.Unmarshal.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	var b []byte
	if t, ok := v.(*Target); ok && len(data) > 1 {
		// The copy of a message that came in pieces is the decode's too.
		if t.Err = t.reserve(data.Len()); t.Err != nil {
			return nil
		}
	}
	if len(data) == 1 {
		b = data[0].ReadOnlyData()
	} else {
		buf := data.MaterializeToBuffer(Pool)
		defer buf.Free()
		b = buf.ReadOnlyData()
	}
	switch m := v.(type) {
	case *Target:
		m.decode(b)
		return nil
	case *prefixdv1.Query:
		return DecodeQuery(b, m)
	case proto.Message:
		return proto.Unmarshal(b, m)
	}
	return fmt.Errorf("codec: cannot unmarshal into %T: not a proto message", v)
}
