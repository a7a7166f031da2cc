package events

import (
	"encoding/binary"
	"math"
	"strconv"
)

// decoder reads msgpack values from p starting at off. Every read checks
// the bytes it needs against what is left, so nothing here indexes out of
// range or allocates except to build an error.
type decoder struct {
	p   []byte
	off int
	// ev is the index of the event being decoded, for error field names;
	// -1 outside the events array.
	ev int
}

// path builds a field name for an error: "ts", "events[2].token_ids[7]".
func (d *decoder) path(field string, idx int) string {
	s := field
	if idx >= 0 {
		s += "[" + strconv.Itoa(idx) + "]"
	}
	if d.ev >= 0 {
		s = "events[" + strconv.Itoa(d.ev) + "]" + dotIfField(s)
	}
	return s
}

func dotIfField(s string) string {
	if s == "" || s[0] == '[' {
		return s
	}
	return "." + s
}

func (d *decoder) fail(kind error, off int, field string, idx int, want, got string) error {
	return &DecodeError{Kind: kind, Offset: off, Field: d.path(field, idx), Want: want, Got: got}
}

// truncated reports that the value starting at off needs need bytes in all.
func (d *decoder) truncated(off, need int, field string, idx int, want string) error {
	have := len(d.p) - off
	got := "end of payload"
	if have > 0 {
		got = describe(d.p[off]) + " needing " + strconv.Itoa(need) + " bytes, " + strconv.Itoa(have) + " left"
	}
	return d.fail(ErrTruncated, off, field, idx, want, got)
}

// wrongType reports the value at d.off as not being what the field takes.
func (d *decoder) wrongType(field string, idx int, want string) error {
	if d.off >= len(d.p) {
		return d.truncated(d.off, 1, field, idx, want)
	}
	return d.fail(ErrType, d.off, field, idx, want, describe(d.p[d.off]))
}

// peek returns the next type code, or an ErrTruncated error at the end.
func (d *decoder) peek(field string, idx int, want string) (byte, error) {
	if d.off >= len(d.p) {
		return 0, d.truncated(d.off, 1, field, idx, want)
	}
	return d.p[d.off], nil
}

// nextNil consumes a nil and reports whether there was one.
func (d *decoder) nextNil() bool {
	if d.off < len(d.p) && d.p[d.off] == 0xc0 {
		d.off++
		return true
	}
	return false
}

// fixed returns the n bytes following a one-byte type code at d.off and
// advances past them.
func (d *decoder) fixed(n int, field string, idx int, want string) ([]byte, error) {
	if len(d.p)-d.off < 1+n {
		return nil, d.truncated(d.off, 1+n, field, idx, want)
	}
	b := d.p[d.off+1 : d.off+1+n]
	d.off += 1 + n
	return b, nil
}

const wantUint = "non-negative integer"

// readUint reads an integer of any msgpack width that is >= 0.
func (d *decoder) readUint(field string, idx int) (uint64, error) {
	if d.off >= len(d.p) {
		return 0, d.truncated(d.off, 1, field, idx, wantUint)
	}
	c := d.p[d.off]
	if c <= 0x7f {
		d.off++
		return uint64(c), nil
	}
	var v uint64
	var neg bool
	start := d.off
	switch c {
	case 0xcc:
		b, err := d.fixed(1, field, idx, wantUint)
		if err != nil {
			return 0, err
		}
		v = uint64(b[0])
	case 0xcd:
		b, err := d.fixed(2, field, idx, wantUint)
		if err != nil {
			return 0, err
		}
		v = uint64(binary.BigEndian.Uint16(b))
	case 0xce:
		b, err := d.fixed(4, field, idx, wantUint)
		if err != nil {
			return 0, err
		}
		v = uint64(binary.BigEndian.Uint32(b))
	case 0xcf:
		b, err := d.fixed(8, field, idx, wantUint)
		if err != nil {
			return 0, err
		}
		v = binary.BigEndian.Uint64(b)
	case 0xd0, 0xd1, 0xd2, 0xd3:
		s, err := d.readSigned(field, idx, wantUint)
		if err != nil {
			return 0, err
		}
		v, neg = uint64(s), s < 0
	default:
		if c >= 0xe0 {
			neg = true
			break
		}
		return 0, d.wrongType(field, idx, wantUint)
	}
	if neg {
		return 0, d.fail(ErrRange, start, field, idx, wantUint, "negative integer")
	}
	return v, nil
}

// readSigned reads int8..int64 (codes 0xd0-0xd3) at d.off.
func (d *decoder) readSigned(field string, idx int, want string) (int64, error) {
	switch d.p[d.off] {
	case 0xd0:
		b, err := d.fixed(1, field, idx, want)
		if err != nil {
			return 0, err
		}
		return int64(int8(b[0])), nil
	case 0xd1:
		b, err := d.fixed(2, field, idx, want)
		if err != nil {
			return 0, err
		}
		return int64(int16(binary.BigEndian.Uint16(b))), nil
	case 0xd2:
		b, err := d.fixed(4, field, idx, want)
		if err != nil {
			return 0, err
		}
		return int64(int32(binary.BigEndian.Uint32(b))), nil
	default: // 0xd3
		b, err := d.fixed(8, field, idx, want)
		if err != nil {
			return 0, err
		}
		return int64(binary.BigEndian.Uint64(b)), nil
	}
}

const wantInt = "integer"

// readInt reads an integer of any msgpack width that fits an int64.
func (d *decoder) readInt(field string, idx int) (int64, error) {
	if d.off >= len(d.p) {
		return 0, d.truncated(d.off, 1, field, idx, wantInt)
	}
	c := d.p[d.off]
	switch {
	case c <= 0x7f:
		d.off++
		return int64(c), nil
	case c >= 0xe0:
		d.off++
		return int64(int8(c)), nil
	case c >= 0xd0 && c <= 0xd3:
		return d.readSigned(field, idx, wantInt)
	case c >= 0xcc && c <= 0xcf:
		start := d.off
		v, err := d.readUint(field, idx)
		if err != nil {
			return 0, err
		}
		if v > math.MaxInt64 {
			return 0, d.fail(ErrRange, start, field, idx, "integer below 2^63", strconv.FormatUint(v, 10))
		}
		return int64(v), nil
	}
	return 0, d.wrongType(field, idx, wantInt)
}

// readIntRange reads an integer in [lo, hi].
func (d *decoder) readIntRange(field string, idx int, lo, hi int64) (int64, error) {
	start := d.off
	v, err := d.readInt(field, idx)
	if err != nil {
		return 0, err
	}
	if v < lo || v > hi {
		return 0, d.fail(ErrRange, start, field, idx,
			"integer in ["+strconv.FormatInt(lo, 10)+", "+strconv.FormatInt(hi, 10)+"]",
			strconv.FormatInt(v, 10))
	}
	return v, nil
}

const wantFloat = "float or integer"

// readFloat reads a float64, a float32 or an integer as a float64.
func (d *decoder) readFloat(field string, idx int) (float64, error) {
	if d.off >= len(d.p) {
		return 0, d.truncated(d.off, 1, field, idx, wantFloat)
	}
	switch d.p[d.off] {
	case 0xcb:
		b, err := d.fixed(8, field, idx, wantFloat)
		if err != nil {
			return 0, err
		}
		return math.Float64frombits(binary.BigEndian.Uint64(b)), nil
	case 0xca:
		b, err := d.fixed(4, field, idx, wantFloat)
		if err != nil {
			return 0, err
		}
		return float64(math.Float32frombits(binary.BigEndian.Uint32(b))), nil
	}
	c := d.p[d.off]
	if c <= 0x7f || c >= 0xe0 || (c >= 0xd0 && c <= 0xd3) {
		v, err := d.readInt(field, idx)
		return float64(v), err
	}
	if c >= 0xcc && c <= 0xcf {
		v, err := d.readUint(field, idx)
		return float64(v), err
	}
	return 0, d.wrongType(field, idx, wantFloat)
}

// length reads a length prefix of size bytes (1, 2 or 4) after the type
// code at d.off, and checks that that many items (what: "elements", "bytes")
// of at least unit bytes each fit in what is left of the payload.
func (d *decoder) length(size, unit int, what string, field string, idx int, want string) (int, error) {
	start := d.off
	b, err := d.fixed(size, field, idx, want)
	if err != nil {
		return 0, err
	}
	var n uint64
	switch size {
	case 1:
		n = uint64(b[0])
	case 2:
		n = uint64(binary.BigEndian.Uint16(b))
	default:
		n = uint64(binary.BigEndian.Uint32(b))
	}
	left := uint64(len(d.p) - d.off)
	if n*uint64(unit) > left {
		return 0, d.fail(ErrTooLarge, start, field, idx, want,
			describe(d.p[start])+" claiming "+strconv.FormatUint(n, 10)+" "+what+" with "+strconv.FormatUint(left, 10)+" bytes left")
	}
	return int(n), nil
}

const (
	wantArray = "array"
	wantMap   = "map"
	wantStr   = "string"
)

// readArrayLen reads an array header and returns its element count, which
// is at most the number of bytes left.
func (d *decoder) readArrayLen(field string, idx int) (int, error) {
	if d.off >= len(d.p) {
		return 0, d.truncated(d.off, 1, field, idx, wantArray)
	}
	c := d.p[d.off]
	switch {
	case c >= 0x90 && c <= 0x9f:
		d.off++
		return int(c & 0x0f), nil
	case c == 0xdc:
		return d.length(2, 1, "elements", field, idx, wantArray)
	case c == 0xdd:
		return d.length(4, 1, "elements", field, idx, wantArray)
	}
	return 0, d.wrongType(field, idx, wantArray)
}

// readMapLen reads a map header and returns its number of key/value pairs.
func (d *decoder) readMapLen(field string, idx int) (int, error) {
	if d.off >= len(d.p) {
		return 0, d.truncated(d.off, 1, field, idx, wantMap)
	}
	c := d.p[d.off]
	switch {
	case c >= 0x80 && c <= 0x8f:
		d.off++
		return int(c & 0x0f), nil
	case c == 0xde:
		return d.length(2, 2, "pairs", field, idx, wantMap)
	case c == 0xdf:
		return d.length(4, 2, "pairs", field, idx, wantMap)
	}
	return 0, d.wrongType(field, idx, wantMap)
}

// fixstr reads a fixstr (up to 31 bytes) that lies whole in the payload
// and reports whether there was one; the bytes alias the payload.
func (d *decoder) fixstr() ([]byte, bool) {
	if d.off < len(d.p) {
		if c := d.p[d.off]; c >= 0xa0 && c <= 0xbf {
			if end := d.off + 1 + int(c&0x1f); end <= len(d.p) {
				s := d.p[d.off+1 : end]
				d.off = end
				return s, true
			}
		}
	}
	return nil, false
}

// readBytes reads a str (and, when bin is true, a bin) and returns its
// bytes, which alias the payload.
func (d *decoder) readBytes(field string, idx int, bin bool) ([]byte, error) {
	if s, ok := d.fixstr(); ok { // names and tags are fixstrs
		return s, nil
	}
	want := wantStr
	if bin {
		want = "string or binary"
	}
	if d.off >= len(d.p) {
		return nil, d.truncated(d.off, 1, field, idx, want)
	}
	c := d.p[d.off]
	var n int
	var err error
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n = int(c & 0x1f)
		if len(d.p)-d.off-1 < n {
			return nil, d.truncated(d.off, 1+n, field, idx, want)
		}
		d.off++
	case c == 0xd9 || (bin && c == 0xc4):
		n, err = d.length(1, 1, "bytes", field, idx, want)
	case c == 0xda || (bin && c == 0xc5):
		n, err = d.length(2, 1, "bytes", field, idx, want)
	case c == 0xdb || (bin && c == 0xc6):
		n, err = d.length(4, 1, "bytes", field, idx, want)
	default:
		return nil, d.wrongType(field, idx, want)
	}
	if err != nil {
		return nil, err
	}
	s := d.p[d.off : d.off+n]
	d.off += n
	return s, nil
}

const wantHash = "block hash (non-negative integer or binary of at least 8 bytes)"

// readHash reads a block hash: an integer >= 0 of any width, or a binary
// of at least 8 bytes whose last 8 bytes, big-endian, are the hash.
func (d *decoder) readHash(field string, idx int) (uint64, error) {
	if len(d.p)-d.off >= 9 && d.p[d.off] == 0xcf {
		v := binary.BigEndian.Uint64(d.p[d.off+1:])
		d.off += 9
		return v, nil
	}
	if d.off >= len(d.p) {
		return 0, d.truncated(d.off, 1, field, idx, wantHash)
	}
	c := d.p[d.off]
	if c == 0xcf {
		return 0, d.truncated(d.off, 9, field, idx, wantHash)
	}
	if c < 0xc4 || c > 0xc6 {
		if c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3) {
			return d.readUint(field, idx)
		}
		return 0, d.wrongType(field, idx, wantHash)
	}
	start := d.off
	size := 1 << (c - 0xc4) // bin8, bin16, bin32 length prefixes
	n, err := d.length(size, 1, "bytes", field, idx, wantHash)
	if err != nil {
		return 0, err
	}
	if n < 8 {
		return 0, d.fail(ErrType, start, field, idx, wantHash, "binary of "+strconv.Itoa(n)+" bytes")
	}
	v := binary.BigEndian.Uint64(d.p[d.off+n-8:])
	d.off += n
	return v, nil
}

// skip steps over one complete value of any type, nested ones included,
// without recursion: pending counts the values still to step over, and
// stays below the number of bytes left since each takes at least one.
func (d *decoder) skip(field string, idx int) error {
	const want = "msgpack value"
	pending := 1
	for pending > 0 {
		if d.off >= len(d.p) {
			return d.truncated(d.off, 1, field, idx, want)
		}
		pending--
		c := d.p[d.off]
		var n int
		var err error
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
			d.off++
			continue
		case c >= 0x80 && c <= 0x8f:
			d.off++
			n = int(c&0x0f) * 2
		case c >= 0x90 && c <= 0x9f:
			d.off++
			n = int(c & 0x0f)
		case c >= 0xa0 && c <= 0xbf:
			_, err = d.fixed(int(c&0x1f), field, idx, want)
		case c == 0xc4 || c == 0xd9:
			err = d.skipBytes(1, 0, field, idx)
		case c == 0xc5 || c == 0xda:
			err = d.skipBytes(2, 0, field, idx)
		case c == 0xc6 || c == 0xdb:
			err = d.skipBytes(4, 0, field, idx)
		case c == 0xc7:
			err = d.skipBytes(1, 1, field, idx)
		case c == 0xc8:
			err = d.skipBytes(2, 1, field, idx)
		case c == 0xc9:
			err = d.skipBytes(4, 1, field, idx)
		case c == 0xca:
			_, err = d.fixed(4, field, idx, want)
		case c == 0xcb:
			_, err = d.fixed(8, field, idx, want)
		case c == 0xcc || c == 0xd0:
			_, err = d.fixed(1, field, idx, want)
		case c == 0xcd || c == 0xd1:
			_, err = d.fixed(2, field, idx, want)
		case c == 0xce || c == 0xd2:
			_, err = d.fixed(4, field, idx, want)
		case c == 0xcf || c == 0xd3:
			_, err = d.fixed(8, field, idx, want)
		case c >= 0xd4 && c <= 0xd8: // fixext 1, 2, 4, 8, 16 plus the type byte
			_, err = d.fixed(1+(1<<(c-0xd4)), field, idx, want)
		case c == 0xdc:
			n, err = d.length(2, 1, "elements", field, idx, wantArray)
		case c == 0xdd:
			n, err = d.length(4, 1, "elements", field, idx, wantArray)
		case c == 0xde:
			n, err = d.length(2, 2, "pairs", field, idx, wantMap)
			n *= 2
		case c == 0xdf:
			n, err = d.length(4, 2, "pairs", field, idx, wantMap)
			n *= 2
		default: // 0xc1, never used
			return d.wrongType(field, idx, want)
		}
		if err != nil {
			return err
		}
		pending += n
		if left := len(d.p) - d.off; pending > left {
			return d.fail(ErrTooLarge, d.off, field, idx, want,
				strconv.Itoa(pending)+" nested values with "+strconv.Itoa(left)+" bytes left")
		}
	}
	return nil
}

// skipBytes steps over a bin, str or ext whose length prefix has size
// bytes, followed by extra bytes (the ext type) before the data.
func (d *decoder) skipBytes(size, extra int, field string, idx int) error {
	const want = "msgpack value"
	start := d.off
	b, err := d.fixed(size, field, idx, want)
	if err != nil {
		return err
	}
	var n uint64
	switch size {
	case 1:
		n = uint64(b[0])
	case 2:
		n = uint64(binary.BigEndian.Uint16(b))
	default:
		n = uint64(binary.BigEndian.Uint32(b))
	}
	n += uint64(extra)
	if left := uint64(len(d.p) - d.off); n > left {
		return d.fail(ErrTooLarge, start, field, idx, want,
			describe(d.p[start])+" claiming "+strconv.FormatUint(n, 10)+" bytes with "+strconv.FormatUint(left, 10)+" bytes left")
	}
	d.off += int(n)
	return nil
}

func isArray(c byte) bool { return c >= 0x90 && c <= 0x9f || c == 0xdc || c == 0xdd }

func isMap(c byte) bool { return c >= 0x80 && c <= 0x8f || c == 0xde || c == 0xdf }
