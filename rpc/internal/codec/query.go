package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	prefixdv1 "github.com/prefixd/prefixd/proto/prefixd/v1"
)

// Query points at the fields of a MatchRequest or ScoreRequest, which share
// their field numbers.
type Query struct {
	Model, LoRA, CacheSalt, Prompt *string
	TokenIDs                       *[]uint32
	BlockHashes                    *[]uint64
	Messages                       *[]*prefixdv1.ChatMessage
	Pods                           *[]string
}

// QueryOf returns the fields of m.
func QueryOf(m *prefixdv1.MatchRequest) Query {
	return Query{&m.Model, &m.Lora, &m.CacheSalt, &m.Prompt, &m.TokenIds, &m.BlockHashes, &m.Messages, &m.Pods}
}

// ScoreQueryOf returns the fields of m.
func ScoreQueryOf(m *prefixdv1.ScoreRequest) Query {
	return Query{&m.Model, &m.Lora, &m.CacheSalt, &m.Prompt, &m.TokenIds, &m.BlockHashes, &m.Messages, &m.Pods}
}

// Field numbers of MatchRequest and ScoreRequest.
const (
	fieldModel       = 1
	fieldLoRA        = 2
	fieldCacheSalt   = 3
	fieldTokenIDs    = 4
	fieldBlockHashes = 5
	fieldPrompt      = 6
	fieldMessages    = 7
	fieldPods        = 8
)

var errTruncated = errors.New("codec: query truncated or malformed")

// DecodeQuery decodes a MatchRequest or ScoreRequest from b into q as
// proto.Unmarshal would, except that the token_ids, block_hashes and pods
// slices are reset to length 0 and appended to, reusing their capacity.
// Packed and unpacked repeated scalars are both accepted; unknown fields
// are skipped; strings must be valid UTF-8.
func DecodeQuery(b []byte, q Query) error {
	*q.Model, *q.LoRA, *q.CacheSalt, *q.Prompt = "", "", "", ""
	*q.TokenIDs = (*q.TokenIDs)[:0]
	*q.BlockHashes = (*q.BlockHashes)[:0]
	*q.Messages = nil
	*q.Pods = (*q.Pods)[:0]
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: %w", errTruncated, protowire.ParseError(n))
		}
		b = b[n:]
		var err error
		switch {
		case num == fieldTokenIDs && typ == protowire.BytesType:
			var v []byte
			if v, n = protowire.ConsumeBytes(b); n >= 0 {
				if len(v)%4 != 0 {
					return fmt.Errorf("%w: packed token_ids of %d bytes, want a multiple of 4", errTruncated, len(v))
				}
				*q.TokenIDs = appendFixed32(*q.TokenIDs, v)
			}
		case num == fieldTokenIDs && typ == protowire.Fixed32Type:
			var v uint32
			if v, n = protowire.ConsumeFixed32(b); n >= 0 {
				*q.TokenIDs = append(*q.TokenIDs, v)
			}
		case num == fieldBlockHashes && typ == protowire.BytesType:
			var v []byte
			if v, n = protowire.ConsumeBytes(b); n >= 0 {
				if len(v)%8 != 0 {
					return fmt.Errorf("%w: packed block_hashes of %d bytes, want a multiple of 8", errTruncated, len(v))
				}
				*q.BlockHashes = appendFixed64(*q.BlockHashes, v)
			}
		case num == fieldBlockHashes && typ == protowire.Fixed64Type:
			var v uint64
			if v, n = protowire.ConsumeFixed64(b); n >= 0 {
				*q.BlockHashes = append(*q.BlockHashes, v)
			}
		case typ == protowire.BytesType && (num == fieldModel || num == fieldLoRA || num == fieldCacheSalt || num == fieldPrompt || num == fieldPods):
			var v []byte
			if v, n = protowire.ConsumeBytes(b); n >= 0 {
				err = setString(q, num, v)
			}
		case num == fieldMessages && typ == protowire.BytesType:
			var v []byte
			if v, n = protowire.ConsumeBytes(b); n >= 0 {
				m := new(prefixdv1.ChatMessage)
				if err = proto.Unmarshal(v, m); err == nil {
					*q.Messages = append(*q.Messages, m)
				}
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("%w: field %d: %w", errTruncated, num, protowire.ParseError(n))
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// appendFixed32 appends the little-endian uint32s of v, len(v) a multiple of 4.
func appendFixed32(s []uint32, v []byte) []uint32 {
	n := len(v) / 4
	s = slices.Grow(s, n)
	out := s[len(s) : len(s)+n]
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(v[4*i:])
	}
	return s[:len(s)+n]
}

// appendFixed64 appends the little-endian uint64s of v, len(v) a multiple of 8.
func appendFixed64(s []uint64, v []byte) []uint64 {
	n := len(v) / 8
	s = slices.Grow(s, n)
	out := s[len(s) : len(s)+n]
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(v[8*i:])
	}
	return s[:len(s)+n]
}

func setString(q Query, num protowire.Number, v []byte) error {
	if !utf8.Valid(v) {
		return fmt.Errorf("codec: field %d: string is not valid UTF-8", num)
	}
	switch num {
	case fieldModel:
		*q.Model = string(v)
	case fieldLoRA:
		*q.LoRA = string(v)
	case fieldCacheSalt:
		*q.CacheSalt = string(v)
	case fieldPrompt:
		*q.Prompt = string(v)
	case fieldPods:
		*q.Pods = append(*q.Pods, string(v))
	}
	return nil
}
