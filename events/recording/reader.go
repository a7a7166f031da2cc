package recording

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"os"
	"time"
)

// Format is the encoding of a recording file.
type Format uint8

const (
	// FormatUnknown: not known yet (nothing read so far).
	FormatUnknown Format = iota
	// FormatNative is prefixd's own binary format, written by Writer.
	FormatNative
	// FormatJSONL is one JSON object per line with base64 frames, the format
	// of the shared fixture recordings.
	FormatJSONL
)

func (f Format) String() string {
	switch f {
	case FormatNative:
		return "native"
	case FormatJSONL:
		return "jsonl"
	}
	return "unknown"
}

// Stats counts what a Reader has read so far.
type Stats struct {
	// Records counts every record read, end markers and bad ones included.
	Records int
	// Messages counts the messages Next returned without error.
	Messages int
	// ReplayEnds counts replay end markers, which Next skips.
	ReplayEnds int
	// Errors counts records Next returned with an error.
	Errors int
}

// Reader reads the messages of a recording in either format, telling them
// apart by the first bytes. It reads a file that is still being written: at
// the end of what is there, Next returns io.EOF (or ErrTornTail when a
// record is cut short), and a later call goes on with whatever has been
// appended since. A Reader is for one goroutine at a time.
type Reader struct {
	r      io.Reader
	closer io.Closer
	buf    []byte // buf[pos:] is read from r but not yet parsed
	pos    int
	off    int64 // file offset of buf[pos]
	format Format
	index  int   // index of the next record
	err    error // sticky
	stats  Stats
}

// Open opens the recording at path and reads enough to tell its format;
// a file that is neither format fails with ErrFormat. An empty file is
// accepted: its format is known once something is written to it.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open recording: %w", err)
	}
	r := NewReader(f)
	r.closer = f
	if err := r.sniff(); err != nil {
		return nil, errors.Join(fmt.Errorf("open recording %s: %w", path, err), f.Close())
	}
	return r, nil
}

// NewReader returns a Reader of the recording that r yields.
func NewReader(r io.Reader) *Reader {
	return &Reader{r: r}
}

// Close closes the file of a Reader from Open.
func (r *Reader) Close() error {
	if r.closer == nil {
		return nil
	}
	err := r.closer.Close()
	r.closer = nil
	return err
}

// Format returns the recording's format, FormatUnknown until it is known.
func (r *Reader) Format() Format { return r.format }

// Stats returns what has been read so far.
func (r *Reader) Stats() Stats { return r.stats }

// Offset returns the byte offset of the next record to read.
func (r *Reader) Offset() int64 { return r.off }

// sniff reads until the format is known, the input ends or fails.
func (r *Reader) sniff() error {
	for r.format == FormatUnknown {
		ok, err := r.detect()
		if err != nil {
			r.err = err
			return err
		}
		if ok {
			return nil
		}
		n, err := r.fill()
		if n > 0 {
			continue
		}
		if err == nil || errors.Is(err, io.EOF) {
			return nil
		}
		r.err = fmt.Errorf("read recording: %w", err)
		return r.err
	}
	return nil
}

// detect decides the format from the buffered bytes; ok is false when it
// needs more of them.
func (r *Reader) detect() (ok bool, err error) {
	b := r.buf[r.pos:]
	if len(b) == 0 {
		return false, nil
	}
	switch b[0] {
	case magic[0]:
		n := min(len(b), headerSize)
		if !bytes.HasPrefix([]byte(magic), b[:min(n, len(magic))]) {
			return false, fmt.Errorf("%w: bad magic % x", ErrFormat, b[:min(n, len(magic))])
		}
		if len(b) < headerSize {
			return false, nil
		}
		if v := binary.BigEndian.Uint32(b[len(magic):]); v != version {
			return false, fmt.Errorf("%w: native recording version %d, this reads %d", ErrFormat, v, version)
		}
		r.format = FormatNative
		r.pos += headerSize
		r.off += int64(headerSize)
		return true, nil
	case '{', ' ', '\t', '\r', '\n':
		r.format = FormatJSONL
		return true, nil
	}
	return false, fmt.Errorf("%w: starts with byte 0x%02x", ErrFormat, b[0])
}

// Next returns the next message, skipping replay end markers. At the end of
// the input it returns io.EOF, or an error wrapping ErrTornTail when the
// input ends inside a record; either way a later call reads on from there.
// Errors wrapping ErrFrames, and ErrCorrupt for a JSONL line, concern one
// record, and the next call reads the next one. Any other error is sticky.
func (r *Reader) Next() (Message, error) {
	atEOF := false
	for {
		if r.err != nil {
			return Message{}, r.err
		}
		m, n, err := r.parse(atEOF)
		if n > 0 {
			start := r.off
			r.pos += n
			r.off += int64(n)
			r.index++
			r.stats.Records++
			if err != nil {
				r.stats.Errors++
				return m, &RecordError{Record: m.Index, Offset: start, Err: err}
			}
			if m.IsReplayEnd() {
				r.stats.ReplayEnds++
				continue
			}
			r.stats.Messages++
			return m, nil
		}
		if err != nil && !errors.Is(err, errNeedMore) {
			r.err = &RecordError{Record: r.index, Offset: r.off, Err: err}
			return Message{}, r.err
		}
		if atEOF {
			if r.pos == len(r.buf) {
				return Message{}, io.EOF
			}
			return Message{}, &RecordError{Record: r.index, Offset: r.off,
				Err: fmt.Errorf("%w: %d bytes of an incomplete record", ErrTornTail, len(r.buf)-r.pos)}
		}
		k, rerr := r.fill()
		if k > 0 {
			continue
		}
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			r.err = fmt.Errorf("read recording: %w", rerr)
			return Message{}, r.err
		}
		atEOF = true
	}
}

// All iterates over the messages until the end of the input, yielding
// record errors with the message they concern. It stops after a sticky
// error or a torn tail.
func (r *Reader) All() iter.Seq2[Message, error] {
	return func(yield func(Message, error) bool) {
		for {
			m, err := r.Next()
			if errors.Is(err, io.EOF) {
				return
			}
			if !yield(m, err) {
				return
			}
			if err != nil && (r.err != nil || errors.Is(err, ErrTornTail)) {
				return
			}
		}
	}
}

// ReadFile returns every message of the recording at path, in order, or
// the first error reading it (a record that does not parse, a torn tail).
func ReadFile(path string) ([]Message, error) {
	r, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var out []Message
	for m, err := range r.All() {
		if err != nil {
			return out, err
		}
		out = append(out, m)
	}
	return out, nil
}

// parse parses one record from the buffer. n > 0 when a record was
// consumed (err then concerns that record alone); n == 0 with errNeedMore
// when more input is needed, or with another error that is sticky.
func (r *Reader) parse(atEOF bool) (m Message, n int, err error) {
	if r.format == FormatUnknown {
		ok, err := r.detect()
		if err != nil {
			return m, 0, err
		}
		if !ok {
			return m, 0, errNeedMore
		}
	}
	m.Index = r.index
	b := r.buf[r.pos:]
	if r.format == FormatNative {
		n, sticky, err := parseNative(b, &m)
		if sticky {
			return m, 0, err
		}
		m.Index = r.index
		return m, n, err
	}
	return r.parseJSONL(b, atEOF)
}

// parseJSONL parses the next non-empty line. Blank lines are consumed
// without counting as records.
func (r *Reader) parseJSONL(b []byte, atEOF bool) (m Message, n int, err error) {
	for {
		i := bytes.IndexByte(b[n:], '\n')
		var line []byte
		switch {
		case i >= 0:
			line = b[n : n+i]
		case atEOF && n < len(b):
			line = b[n:]
		default:
			// Blank lines consumed so far are dropped from the buffer.
			r.pos += n
			r.off += int64(n)
			return m, 0, errNeedMore
		}
		end := n + len(line)
		if i >= 0 {
			end++
		}
		if len(bytes.TrimSpace(line)) == 0 {
			n = end
			continue
		}
		m.Index = r.index
		if err := parseJSONLine(line, &m); err != nil {
			if i < 0 && !errors.Is(err, ErrFrames) {
				// The last line, with no newline yet, does not parse:
				// the writer has not finished it.
				r.pos += n
				r.off += int64(n)
				return m, 0, errNeedMore
			}
			return m, end, err
		}
		return m, end, nil
	}
}

type jsonRecord struct {
	RecvTSNs  int64    `json:"recv_ts_ns"`
	NFrames   *int     `json:"nframes"`
	FramesB64 []string `json:"frames_b64"`
	Source    string   `json:"source"`
	Peer      string   `json:"peer"`
	Replay    bool     `json:"replay"`
}

func parseJSONLine(line []byte, m *Message) error {
	var rec jsonRecord
	if err := json.Unmarshal(line, &rec); err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if rec.FramesB64 == nil {
		return fmt.Errorf("%w: no frames_b64", ErrCorrupt)
	}
	if rec.NFrames != nil && *rec.NFrames != len(rec.FramesB64) {
		return fmt.Errorf("%w: nframes %d but %d frames", ErrCorrupt, *rec.NFrames, len(rec.FramesB64))
	}
	frames := make([][]byte, len(rec.FramesB64))
	for i, s := range rec.FramesB64 {
		f, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return fmt.Errorf("%w: frame %d: %w", ErrCorrupt, i, err)
		}
		frames[i] = f
	}
	var recv time.Time
	if rec.RecvTSNs != 0 {
		recv = time.Unix(0, rec.RecvTSNs)
	}
	*m = Message{Index: m.Index, RecvTime: recv, Source: rec.Source, Peer: rec.Peer,
		Frames: frames, Replay: rec.Replay}
	return m.Split()
}

// fill reads more input into the buffer and returns how many bytes came.
func (r *Reader) fill() (int, error) {
	const chunk = 64 << 10
	if r.pos == len(r.buf) {
		r.buf, r.pos = r.buf[:0], 0
	} else if r.pos > 0 && cap(r.buf)-len(r.buf) < chunk {
		n := copy(r.buf, r.buf[r.pos:])
		r.buf, r.pos = r.buf[:n], 0
	}
	if cap(r.buf)-len(r.buf) < chunk {
		nb := make([]byte, len(r.buf), 2*cap(r.buf)+chunk)
		copy(nb, r.buf)
		r.buf = nb
	}
	n, err := r.r.Read(r.buf[len(r.buf):cap(r.buf)])
	r.buf = r.buf[:len(r.buf)+n]
	return n, err
}
