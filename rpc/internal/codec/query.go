package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	prefixdv1 "github.com/prefixd/prefixd/proto/prefixd/v1"
	"github.com/prefixd/prefixd/rpc/querylimit"
)

// Field numbers of Query, and of ChatMessage's parts, as the decoder
// knows them; TestDecoderKnowsEveryField holds them to the descriptor.
const (
	fieldModel       = 1
	fieldLoRA        = 2
	fieldCacheSalt   = 3
	fieldTokenIDs    = 4
	fieldBlockHashes = 5
	fieldPrompt      = 6
	fieldMessages    = 7
	fieldPods        = 8

	fieldMessageParts = 3
)

var errTruncated = errors.New("codec: query truncated or malformed")

// Target is a Query to decode under Limits, with the memory it will hold
// asked of Reserve first (see the package doc). Pass a *Target to gRPC's
// dec func; Codec.Unmarshal decodes into Msg.
type Target struct {
	// Msg is the request decoded into.
	Msg *prefixdv1.Query
	// Limits are applied as the query is read: what is over a limit is not
	// decoded, and Err is a *querylimit.Error.
	Limits querylimit.Limits
	// Reserve, when not nil, is asked for the bytes of each slice, string
	// and chat message before it is allocated, and for the copy of a
	// message that arrived in pieces; an error from it ends the decode and
	// is kept in Err as it is.
	Reserve func(n int) error

	// Err is why the last decode failed, nil when it did not. The request
	// is then partly decoded and must not be answered.
	Err error
	// Held is what the decoded request holds: its slices' capacity, its
	// strings and messages, in bytes as they were reserved.
	Held int
}

// NewTarget returns a Target decoding into m.
func NewTarget(m *prefixdv1.Query) *Target { return &Target{Msg: m} }

// ProtoReflect returns the request's, so that a Target is a proto.Message
// to whatever looks at what gRPC received (stats handlers).
func (t *Target) ProtoReflect() protoreflect.Message { return t.Msg.ProtoReflect() }

func (t *Target) reserve(n int) error {
	if t.Reserve == nil || n == 0 {
		return nil
	}
	return t.Reserve(n)
}

func (t *Target) decode(b []byte) {
	d := queryDecoder{t: t}
	t.Err = d.decode(b, t.Msg)
	t.Held = d.held
}

// Sizes of what decoding a chat message allocates besides its bytes' worth
// of strings: the message, and per content part the part and what
// proto.Unmarshal allocates with it (measured by TestTargetReserves: its
// size class, its pointer with the slice's growth, 120 bytes in all).
var (
	sizeMessage = int(reflect.TypeFor[prefixdv1.ChatMessage]().Size()) + 16
	sizePart    = int(reflect.TypeFor[prefixdv1.ContentPart]().Size()) + 56
)

// DecodeQuery decodes a Query from b into m as proto.Unmarshal would,
// except that the token_ids, block_hashes and pods slices are reset to
// length 0 and appended to, reusing their capacity.
// Packed and unpacked repeated scalars are both accepted; unknown fields
// are skipped; strings must be valid UTF-8.
func DecodeQuery(b []byte, m *prefixdv1.Query) error {
	var d queryDecoder
	return d.decode(b, m)
}

// queryDecoder is DecodeQuery, with a Target's limits and reservations
// when t is not nil.
type queryDecoder struct {
	t    *Target
	held int // bytes the decoded request holds
}

func (d *queryDecoder) reserve(n int) error {
	if d.t == nil {
		return nil
	}
	return d.t.reserve(n)
}

func (d *queryDecoder) limits() querylimit.Limits {
	if d.t == nil {
		return querylimit.Limits{}
	}
	return d.t.Limits
}

func (d *queryDecoder) decode(b []byte, m *prefixdv1.Query) error {
	m.Model, m.Lora, m.CacheSalt, m.Prompt = "", "", "", ""
	m.TokenIds = m.TokenIds[:0]
	m.BlockHashes = m.BlockHashes[:0]
	m.Messages = nil
	m.Pods = m.Pods[:0]
	d.held = 4*cap(m.TokenIds) + 8*cap(m.BlockHashes) + 16*cap(m.Pods)
	lim := d.limits()
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
				if err = d.roomTokens(m, len(v)/4, lim, true); err == nil {
					m.TokenIds = appendFixed32(m.TokenIds, v)
				}
			}
		case num == fieldTokenIDs && typ == protowire.Fixed32Type:
			var v uint32
			if v, n = protowire.ConsumeFixed32(b); n >= 0 {
				if err = d.roomTokens(m, 1, lim, false); err == nil {
					m.TokenIds = append(m.TokenIds, v)
				}
			}
		case num == fieldBlockHashes && typ == protowire.BytesType:
			var v []byte
			if v, n = protowire.ConsumeBytes(b); n >= 0 {
				if len(v)%8 != 0 {
					return fmt.Errorf("%w: packed block_hashes of %d bytes, want a multiple of 8", errTruncated, len(v))
				}
				if err = d.roomHashes(m, len(v)/8, lim, true); err == nil {
					m.BlockHashes = appendFixed64(m.BlockHashes, v)
				}
			}
		case num == fieldBlockHashes && typ == protowire.Fixed64Type:
			var v uint64
			if v, n = protowire.ConsumeFixed64(b); n >= 0 {
				if err = d.roomHashes(m, 1, lim, false); err == nil {
					m.BlockHashes = append(m.BlockHashes, v)
				}
			}
		case typ == protowire.BytesType && (num == fieldModel || num == fieldLoRA || num == fieldCacheSalt || num == fieldPrompt || num == fieldPods):
			var v []byte
			if v, n = protowire.ConsumeBytes(b); n >= 0 {
				err = d.setString(m, num, v)
			}
		case num == fieldMessages && typ == protowire.BytesType:
			var v []byte
			if v, n = protowire.ConsumeBytes(b); n >= 0 {
				err = d.appendMessage(m, v, lim)
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

// newCap returns the capacity to grow a slice of length n and capacity c
// to for more elements: exactly n+more for a packed field, which comes
// whole, else twice c, as append would.
func newCap(n, c, more int, exact bool) int {
	if exact {
		return n + more
	}
	return max(n+more, 2*c)
}

// roomTokens makes room for more token ids in q, within the limit, and
// reserves what a larger slice holds before allocating it.
func (d *queryDecoder) roomTokens(m *prefixdv1.Query, more int, lim querylimit.Limits, exact bool) error {
	s := m.TokenIds
	if lim.MaxTokens > 0 && len(s)+more > lim.MaxTokens {
		return &querylimit.Error{Field: "token_ids", Limit: lim.MaxTokens}
	}
	if len(s)+more <= cap(s) {
		return nil
	}
	c := newCap(len(s), cap(s), more, exact)
	if err := d.reserve(4 * c); err != nil {
		return err
	}
	d.held += 4 * (c - cap(s))
	grown := make([]uint32, len(s), c)
	copy(grown, s)
	m.TokenIds = grown
	return nil
}

// roomHashes is roomTokens for block hashes.
func (d *queryDecoder) roomHashes(m *prefixdv1.Query, more int, lim querylimit.Limits, exact bool) error {
	s := m.BlockHashes
	if lim.MaxBlockHashes > 0 && len(s)+more > lim.MaxBlockHashes {
		return &querylimit.Error{Field: "block_hashes", Limit: lim.MaxBlockHashes}
	}
	if len(s)+more <= cap(s) {
		return nil
	}
	c := newCap(len(s), cap(s), more, exact)
	if err := d.reserve(8 * c); err != nil {
		return err
	}
	d.held += 8 * (c - cap(s))
	grown := make([]uint64, len(s), c)
	copy(grown, s)
	m.BlockHashes = grown
	return nil
}

// appendMessage decodes one chat message, within the limit, reserving
// first what it will hold: the message, a part and a pointer per content
// part (counted in v), and at most len(v) bytes of strings.
func (d *queryDecoder) appendMessage(m *prefixdv1.Query, v []byte, lim querylimit.Limits) error {
	ms := m.Messages
	if lim.MaxTokens > 0 && len(ms) >= lim.MaxTokens/4 {
		return &querylimit.Error{Field: "messages", Limit: lim.MaxTokens}
	}
	n := sizeMessage + len(v) + sizePart*countParts(v)
	if len(ms) == cap(ms) {
		n += 8 * max(1, 2*cap(ms))
	}
	if err := d.reserve(n); err != nil {
		return err
	}
	d.held += n
	cm := new(prefixdv1.ChatMessage)
	if err := proto.Unmarshal(v, cm); err != nil {
		return err
	}
	if len(ms) == cap(ms) {
		grown := make([]*prefixdv1.ChatMessage, len(ms), max(1, 2*cap(ms)))
		copy(grown, ms)
		ms = grown
	}
	m.Messages = append(ms, cm)
	return nil
}

// countParts returns how many content parts (fieldMessageParts) the encoded chat
// message v holds; malformed input counts what came before the damage,
// and proto.Unmarshal refuses it.
func countParts(v []byte) int {
	n := 0
	for len(v) > 0 {
		num, typ, k := protowire.ConsumeTag(v)
		if k < 0 {
			return n
		}
		v = v[k:]
		k = protowire.ConsumeFieldValue(num, typ, v)
		if k < 0 {
			return n
		}
		if num == fieldMessageParts {
			n++
		}
		v = v[k:]
	}
	return n
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

func (d *queryDecoder) setString(m *prefixdv1.Query, num protowire.Number, v []byte) error {
	if !utf8.Valid(v) {
		return fmt.Errorf("codec: field %d: string is not valid UTF-8", num)
	}
	n := len(v)
	if num == fieldPods && len(m.Pods) == cap(m.Pods) {
		n += 16 * max(1, 2*cap(m.Pods))
	}
	if err := d.reserve(n); err != nil {
		return err
	}
	d.held += n
	switch num {
	case fieldModel:
		m.Model = string(v)
	case fieldLoRA:
		m.Lora = string(v)
	case fieldCacheSalt:
		m.CacheSalt = string(v)
	case fieldPrompt:
		m.Prompt = string(v)
	case fieldPods:
		ps := m.Pods
		if len(ps) == cap(ps) {
			grown := make([]string, len(ps), max(1, 2*cap(ps)))
			copy(grown, ps)
			ps = grown
		}
		m.Pods = append(ps, string(v))
	}
	return nil
}
