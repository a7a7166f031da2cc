package recording

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"time"
)

// The native format (docs/recordings.md): a 12-byte file header, magic then
// version, followed by records of
//
//	uint32 BE  body length
//	uint32 BE  CRC-32C of the 4 length bytes
//	uint32 BE  CRC-32C of the body
//	body:      uvarint flags, varint receive time (Unix ns), uvarint len + source,
//	           uvarint len + peer, uvarint frame count, per frame uvarint len + bytes
//
// The length has its own checksum so that a damaged length (corruption)
// is told apart from a record cut short at the end of the file (torn).
const (
	magic         = "\x89PFXD\r\n\x1a"
	version       = 1
	headerSize    = len(magic) + 4
	recHeaderSize = 12

	// MaxRecordSize bounds the body of one record. Longer lengths are
	// corruption to a reader and ErrTooLarge to a writer.
	MaxRecordSize = 64 << 20
	// maxFrames bounds the frames of one record.
	maxFrames = 64

	flagReplay = 1 << 0
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Writer appends messages to a native recording. It buffers: call Flush to
// make what was appended visible to readers, Close at the end. A Writer is
// for one goroutine at a time.
type Writer struct {
	bw     *bufio.Writer
	closer io.Closer
	body   []byte // reused record body
	hdr    [recHeaderSize]byte
	err    error // sticky write error; errClosed after Close
}

var errClosed = errors.New("recording writer is closed")

// Create creates (or truncates) the file at path and writes a native
// recording header to it, flushed so that readers see a valid empty
// recording at once.
func Create(path string) (*Writer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("create recording: %w", err)
	}
	w := NewWriter(f)
	w.closer = f
	if err := w.Flush(); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return w, nil
}

// NewWriter returns a Writer that writes a native recording, header first,
// to w. Close flushes but does not close w.
func NewWriter(w io.Writer) *Writer {
	nw := &Writer{bw: bufio.NewWriterSize(w, 64<<10)}
	var h [headerSize]byte
	copy(h[:], magic)
	binary.BigEndian.PutUint32(h[len(magic):], version)
	_, nw.err = nw.bw.Write(h[:])
	return nw
}

// Append adds one message: its receive time, source, replay flag and
// frames (Frames, or when nil frames rebuilt from Topic, Seq and Payload).
// Index is not stored. It allocates nothing once its buffer has grown to
// the largest message.
func (w *Writer) Append(m Message) error {
	if w.err != nil {
		return w.err
	}
	frames := m.wireFrames()
	if len(frames) > maxFrames {
		return fmt.Errorf("append message: %w: %d frames, at most %d", ErrTooLarge, len(frames), maxFrames)
	}
	b := w.body[:0]
	var flags uint64
	if m.Replay {
		flags |= flagReplay
	}
	b = binary.AppendUvarint(b, flags)
	var ns int64
	if !m.RecvTime.IsZero() {
		ns = m.RecvTime.UnixNano()
	}
	b = binary.AppendVarint(b, ns)
	b = binary.AppendUvarint(b, uint64(len(m.Source)))
	b = append(b, m.Source...)
	b = binary.AppendUvarint(b, uint64(len(m.Peer)))
	b = append(b, m.Peer...)
	b = binary.AppendUvarint(b, uint64(len(frames)))
	for _, f := range frames {
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	w.body = b
	if len(b) > MaxRecordSize {
		return fmt.Errorf("append message: %w: %d bytes, at most %d", ErrTooLarge, len(b), MaxRecordSize)
	}
	binary.BigEndian.PutUint32(w.hdr[0:], uint32(len(b)))
	binary.BigEndian.PutUint32(w.hdr[4:], crc32.Checksum(w.hdr[0:4], castagnoli))
	binary.BigEndian.PutUint32(w.hdr[8:], crc32.Checksum(b, castagnoli))
	if _, err := w.bw.Write(w.hdr[:]); err != nil {
		w.err = fmt.Errorf("append message: %w", err)
		return w.err
	}
	if _, err := w.bw.Write(b); err != nil {
		w.err = fmt.Errorf("append message: %w", err)
		return w.err
	}
	return nil
}

// Flush writes buffered records to the underlying writer.
func (w *Writer) Flush() error {
	if w.err != nil {
		return w.err
	}
	if err := w.bw.Flush(); err != nil {
		w.err = fmt.Errorf("flush recording: %w", err)
	}
	return w.err
}

// Close flushes and, for a Writer from Create, closes the file. It may be
// called more than once.
func (w *Writer) Close() error {
	if errors.Is(w.err, errClosed) {
		return nil
	}
	err := w.Flush()
	if w.closer != nil {
		if cerr := w.closer.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close recording: %w", cerr)
		}
		w.closer = nil
	}
	w.err = errClosed
	return err
}

// errNeedMore says a record is not complete in the buffer yet.
var errNeedMore = errors.New("need more bytes")

// parseNative parses one record from the start of buf. It returns the
// number of bytes the record takes, errNeedMore when buf holds only part of
// it, a sticky ErrCorrupt error when its framing is damaged, or a
// non-sticky ErrCorrupt error (n > 0) when the body is malformed.
func parseNative(buf []byte, m *Message) (n int, sticky bool, err error) {
	if len(buf) < recHeaderSize {
		return 0, false, errNeedMore
	}
	size := binary.BigEndian.Uint32(buf[0:])
	if crc32.Checksum(buf[0:4], castagnoli) != binary.BigEndian.Uint32(buf[4:]) {
		return 0, true, fmt.Errorf("%w: record header checksum mismatch", ErrCorrupt)
	}
	if size > MaxRecordSize {
		return 0, true, fmt.Errorf("%w: record length %d exceeds %d", ErrCorrupt, size, MaxRecordSize)
	}
	n = recHeaderSize + int(size)
	if len(buf) < n {
		return 0, false, errNeedMore
	}
	body := buf[recHeaderSize:n]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(buf[8:]) {
		return 0, true, fmt.Errorf("%w: record body checksum mismatch", ErrCorrupt)
	}
	if err := parseBody(body, m); err != nil {
		var fe *framesError
		if errors.As(err, &fe) {
			return n, false, fe.err
		}
		return n, false, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return n, false, nil
}

// parseBody fills m from a record body that passed its checksum. The
// frames are copied into one new buffer so that m outlives the read buffer.
func parseBody(body []byte, m *Message) error {
	p := body
	uv := func(what string) (uint64, error) {
		v, k := binary.Uvarint(p)
		if k <= 0 {
			return 0, fmt.Errorf("bad %s varint", what)
		}
		p = p[k:]
		return v, nil
	}
	flags, err := uv("flags")
	if err != nil {
		return err
	}
	ns, k := binary.Varint(p)
	if k <= 0 {
		return errors.New("bad receive time varint")
	}
	p = p[k:]
	str := func(what string) (string, error) {
		n, err := uv(what + " length")
		if err != nil {
			return "", err
		}
		if n > uint64(len(p)) {
			return "", fmt.Errorf("%s of %d bytes with %d left", what, n, len(p))
		}
		s := string(p[:n])
		p = p[n:]
		return s, nil
	}
	source, err := str("source")
	if err != nil {
		return err
	}
	peer, err := str("peer")
	if err != nil {
		return err
	}
	nframes, err := uv("frame count")
	if err != nil {
		return err
	}
	if nframes > maxFrames {
		return fmt.Errorf("%d frames, at most %d", nframes, maxFrames)
	}
	data := make([]byte, len(p))
	copy(data, p)
	p = data
	frames := make([][]byte, nframes)
	for i := range frames {
		l, err := uv("frame length")
		if err != nil {
			return err
		}
		if l > uint64(len(p)) {
			return fmt.Errorf("frame %d of %d bytes with %d left", i, l, len(p))
		}
		frames[i] = p[:l:l]
		p = p[l:]
	}
	if len(p) != 0 {
		return fmt.Errorf("%d bytes after the last frame", len(p))
	}
	var recv time.Time
	if ns != 0 {
		recv = time.Unix(0, ns)
	}
	*m = Message{Index: m.Index, RecvTime: recv, Source: source, Peer: peer,
		Frames: frames, Replay: flags&flagReplay != 0}
	if err := m.Split(); err != nil {
		// A well-formed record of an odd message: the caller reports it
		// with ErrFrames, not as corruption.
		return &framesError{err}
	}
	return nil
}

// framesError marks a record whose framing is fine but whose frames are
// not a message shape.
type framesError struct{ err error }

func (e *framesError) Error() string { return e.err.Error() }
func (e *framesError) Unwrap() error { return e.err }
