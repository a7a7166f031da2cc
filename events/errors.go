package events

import (
	"errors"
	"fmt"
	"strconv"
)

// Sentinel kinds of decode failure. Every error returned by Decode and
// DecodeFrames matches exactly one of them with errors.Is; most are a
// *DecodeError that also says where in the payload it happened.
var (
	// ErrShortSeq: the seq frame is not exactly 8 bytes.
	ErrShortSeq = errors.New("seq frame is not 8 bytes")
	// ErrFrames: a message has a number or shape of frames that is not a
	// KV event message (3 frames live, 4 frames or 2 frames replay).
	ErrFrames = errors.New("unexpected frames")
	// ErrReplayEnd: the message is a replay end marker (seq 2^64-1 with an
	// empty payload). It carries no events; it is not damage.
	ErrReplayEnd = errors.New("replay end marker")
	// ErrTruncated: the payload ends inside a msgpack value.
	ErrTruncated = errors.New("truncated msgpack")
	// ErrType: a msgpack value has a type the field cannot take.
	ErrType = errors.New("wrong msgpack type")
	// ErrRange: an integer does not fit the field (a negative hash, a token
	// id above 2^32-1, a negative block size).
	ErrRange = errors.New("integer out of range")
	// ErrTooLarge: a length prefix claims more elements or bytes than the
	// payload has left, or a string an Event keeps (ownership, session_id)
	// is longer than MaxNameBytes. It is rejected before anything is
	// allocated.
	ErrTooLarge = errors.New("length exceeds payload or limit")
	// ErrMissing: a required field is absent (a map batch without events).
	ErrMissing = errors.New("required field missing")
	// ErrTrailing: bytes are left over after the batch.
	ErrTrailing = errors.New("trailing bytes after batch")
)

// DecodeError says where a payload failed to decode, what was expected there
// and what came instead. Kind is one of the sentinel errors above, so
// errors.Is(err, ErrTruncated) and the like work on it.
type DecodeError struct {
	Kind error
	// Offset is the byte offset in the payload where the bad value starts.
	Offset int
	// Field names the value: "ts", "events[3].block_hashes[2]", ...
	Field string
	// Want says what the field takes; Got what was found instead.
	Want string
	Got  string
}

func (e *DecodeError) Error() string {
	field := e.Field
	if field == "" {
		field = "batch"
	}
	return fmt.Sprintf("decode kv events: %v: %s at offset %d: want %s, got %s",
		e.Kind, field, e.Offset, e.Want, e.Got)
}

func (e *DecodeError) Unwrap() error { return e.Kind }

// describe names the msgpack value that starts with code c, for DecodeError.Got.
func describe(c byte) string {
	var name string
	switch {
	case c <= 0x7f:
		name = "positive fixint"
	case c <= 0x8f:
		name = "fixmap"
	case c <= 0x9f:
		name = "fixarray"
	case c <= 0xbf:
		name = "fixstr"
	case c >= 0xe0:
		name = "negative fixint"
	default:
		name = codeNames[c-0xc0]
	}
	return name + " (0x" + strconv.FormatUint(uint64(c), 16) + ")"
}

var codeNames = [0xe0 - 0xc0]string{
	"nil", "never-used code", "false", "true",
	"bin8", "bin16", "bin32",
	"ext8", "ext16", "ext32",
	"float32", "float64",
	"uint8", "uint16", "uint32", "uint64",
	"int8", "int16", "int32", "int64",
	"fixext1", "fixext2", "fixext4", "fixext8", "fixext16",
	"str8", "str16", "str32",
	"array16", "array32",
	"map16", "map32",
}
