package recording

import (
	"errors"
	"fmt"
)

// Sentinel errors of reading recordings; test for them with errors.Is.
var (
	// ErrFormat: the file is neither a native recording nor JSONL, or is a
	// native recording of a version this code does not read.
	ErrFormat = errors.New("not a recording prefixd reads")
	// ErrTornTail: the file ends inside a record. A writer still appending
	// (or one that died mid-write) leaves this; calling Next again after
	// more bytes arrived reads the record. Not sticky.
	ErrTornTail = errors.New("file ends inside a record")
	// ErrCorrupt: a complete record is damaged. In a native recording a bad
	// header or checksum loses the framing, so the error is sticky: nothing
	// after it is read. A malformed JSONL line is skipped and the next
	// call goes on with the next line.
	ErrCorrupt = errors.New("corrupt record")
	// ErrFrames: a record's frames are not a KV event message shape. The
	// Message returned with it still holds the frames; reading goes on.
	ErrFrames = errors.New("unexpected frames")
	// ErrTooLarge: a message is larger than MaxRecordSize.
	ErrTooLarge = errors.New("record too large")
)

// RecordError says which record of a recording failed and where it starts.
type RecordError struct {
	// Record is the record's index, from 0.
	Record int
	// Offset is the byte offset where the record starts.
	Offset int64
	Err    error
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("record %d at offset %d: %v", e.Record, e.Offset, e.Err)
}

func (e *RecordError) Unwrap() error { return e.Err }
