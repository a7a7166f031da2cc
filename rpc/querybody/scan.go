package querybody

import (
	"encoding/binary"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth bounds the nesting of a body, as encoding/json bounds it: the
// outer object is at depth 1.
const maxDepth = 10000

// maxNameLen is the longest member name the decoder unescapes: the longest
// name it looks for, 12 bytes, written as \u escapes. A longer name with
// escapes matches no field.
const maxNameLen = 6 * 12

// SyntaxError reports a body that is not JSON, or not a query: a field
// of the wrong type, or a prompt prefixd cannot answer.
type SyntaxError struct {
	// Offset is the byte of the body where the error was found.
	Offset int
	Msg    string
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("at byte %d: %s", e.Offset, e.Msg) }

func (d *decoder) errorf(format string, args ...any) error {
	return &SyntaxError{Offset: d.i, Msg: fmt.Sprintf(format, args...)}
}

// have describes the input at d.i for an error.
func (d *decoder) have() string {
	if d.i >= len(d.b) {
		return "end of body"
	}
	return fmt.Sprintf("%.24q", d.b[d.i:])
}

func (d *decoder) charge(n int) error {
	if d.reserve == nil || n == 0 {
		return nil
	}
	return d.reserve(n)
}

// enter counts one more level of nesting, refused past maxDepth as
// encoding/json refuses it; leave counts it out.
func (d *decoder) enter() error {
	if d.depth++; d.depth > maxDepth {
		return d.errorf("nested more than %d deep", maxDepth)
	}
	return nil
}

func (d *decoder) leave() { d.depth-- }

// ws skips JSON whitespace.
func (d *decoder) ws() {
	b, i := d.b, d.i
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	d.i = i
}

func (d *decoder) peek() byte {
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

// literal consumes lit (true, false, null) when it comes next.
func (d *decoder) literal(lit string) bool {
	if string(d.b[d.i:min(d.i+len(lit), len(d.b))]) != lit {
		return false
	}
	d.i += len(lit)
	return true
}

// null consumes a null when it comes next.
func (d *decoder) null() bool { return d.peek() == 'n' && d.literal("null") }

// list reads the elements of an array with elem, d.i at its '['. elem is
// called with d.i at each element.
func (d *decoder) list(what string, elem func(n int) error) error {
	if d.peek() != '[' {
		return d.errorf("%s: want an array, have %s", what, d.have())
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	d.i++
	d.ws()
	if d.peek() == ']' {
		d.i++
		return nil
	}
	for n := 0; ; n++ {
		d.ws()
		if err := elem(n); err != nil {
			return err
		}
		d.ws()
		switch d.peek() {
		case ',':
			d.i++
		case ']':
			d.i++
			return nil
		default:
			return d.errorf("%s: want ',' or ']' after element %d, have %s", what, n, d.have())
		}
	}
}

// object reads the members of an object with member, d.i at its '{'.
// member is called with the index of the member's name in fields (see
// lookup; 0 for none of them) and d.i at its value.
func (d *decoder) object(what string, fields []string, member func(field int) error) error {
	if d.peek() != '{' {
		return d.errorf("%s: want an object, have %s", what, d.have())
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	d.i++
	d.ws()
	if d.peek() == '}' {
		d.i++
		return nil
	}
	for {
		d.ws()
		if d.peek() != '"' {
			return d.errorf("%s: want a member name, have %s", what, d.have())
		}
		raw, plain, err := d.scanString()
		if err != nil {
			return err
		}
		// Unescaped on the stack: the name does not outlive the lookup.
		var buf [maxNameLen]byte
		name := raw
		if !plain && len(raw) <= maxNameLen {
			name = unescape(buf[:0], raw)
		}
		field := lookup(fields, name)
		d.ws()
		if d.peek() != ':' {
			return d.errorf("%s: want ':' after member %.40q, have %s", what, raw, d.have())
		}
		d.i++
		d.ws()
		if err := member(field); err != nil {
			return err
		}
		d.ws()
		switch d.peek() {
		case ',':
			d.i++
		case '}':
			d.i++
			return nil
		default:
			return d.errorf("%s: want ',' or '}' after member %.40q, have %s", what, raw, d.have())
		}
	}
}

// string reads a string value, allocating it (after reserving its bytes)
// unless it is empty.
func (d *decoder) string(what string) (string, error) {
	if d.peek() != '"' {
		return "", d.errorf("%s: want a string, have %s", what, d.have())
	}
	raw, plain, err := d.scanString()
	if err != nil {
		return "", err
	}
	n := len(raw)
	if !plain {
		n = unescapedLen(raw)
	}
	if err := d.charge(n); err != nil {
		return "", err
	}
	if plain {
		return string(raw), nil
	}
	var sb strings.Builder
	sb.Grow(n)
	unescapeTo(&sb, raw)
	return sb.String(), nil
}

// scanString checks the string at d.i and moves past it. It returns its
// raw contents, and plain when they need no unescaping (no escapes, valid
// UTF-8).
func (d *decoder) scanString() (raw []byte, plain bool, err error) {
	start := d.i + 1
	plain = true
	for i := start; i < len(d.b); {
		// Eight plain bytes at a time: no quote, backslash, control
		// character or non-ASCII byte.
		for i+8 <= len(d.b) && plain8(binary.LittleEndian.Uint64(d.b[i:])) {
			i += 8
		}
		if i >= len(d.b) {
			break
		}
		c := d.b[i]
		switch {
		case c == '"':
			d.i = i + 1
			return d.b[start:i], plain, nil
		case c == '\\':
			plain = false
			if i+1 >= len(d.b) {
				d.i = i
				return nil, false, d.errorf("string: escape at the end of the body")
			}
			switch d.b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if hex4(d.b[i+2:]) < 0 {
					d.i = i
					return nil, false, d.errorf(`string: want \u and 4 hex digits, have %s`, d.have())
				}
				i += 6
			default:
				d.i = i
				return nil, false, d.errorf("string: invalid escape %s", d.have())
			}
		case c < ' ':
			d.i = i
			return nil, false, d.errorf("string: control character %q", c)
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(d.b[i:])
			if r == utf8.RuneError && size == 1 {
				plain = false
			}
			i += size
		}
	}
	d.i = len(d.b)
	return nil, false, d.errorf("string: not terminated")
}

// plain8 reports whether none of the 8 bytes of x is a quote, a backslash,
// a control character or a non-ASCII byte (the classic SWAR tests: a byte
// is below n when (b - n) borrows into its top bit while b's top bit is
// clear; a byte equals c when b ^ c is below 1).
func plain8(x uint64) bool {
	const (
		ones = 0x0101010101010101
		high = 0x8080808080808080
	)
	below := func(x uint64, n uint64) uint64 { return (x - ones*n) &^ x & high }
	special := below(x, 0x20) | below(x^(ones*'"'), 1) | below(x^(ones*'\\'), 1) | x&high
	return special == 0
}

// hex4 returns the value of 4 hex digits at the start of b, or -1.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// u4 returns the rune of a \uXXXX escape at the start of s, or -1.
func u4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	return hex4(s[2:])
}

// decodeEscape decodes the escape at the start of s (checked by
// scanString) as encoding/json does: a surrogate pair is one rune, a lone
// surrogate U+FFFD. It returns the rune, or the byte when r is -1, and the
// bytes of s it used.
func decodeEscape(s []byte) (r rune, c byte, used int) {
	switch s[1] {
	case 'b':
		return -1, '\b', 2
	case 'f':
		return -1, '\f', 2
	case 'n':
		return -1, '\n', 2
	case 'r':
		return -1, '\r', 2
	case 't':
		return -1, '\t', 2
	case 'u':
		r = u4(s)
		if utf16.IsSurrogate(r) {
			if dec := utf16.DecodeRune(r, u4(s[6:])); dec != unicode.ReplacementChar {
				return dec, 0, 12
			}
			return unicode.ReplacementChar, 0, 6
		}
		return r, 0, 6
	}
	return -1, s[1], 2 // '"', '\\', '/'
}

// unescapedLen returns the length of raw (checked by scanString) unescaped.
func unescapedLen(raw []byte) int {
	n := 0
	for i := 0; i < len(raw); {
		switch c := raw[i]; {
		case c == '\\':
			r, _, used := decodeEscape(raw[i:])
			if r < 0 {
				n++
			} else {
				n += utf8.RuneLen(r)
			}
			i += used
		case c < utf8.RuneSelf:
			n++
			i++
		default:
			r, size := utf8.DecodeRune(raw[i:])
			n += utf8.RuneLen(r) // RuneError: 3 bytes for one invalid byte
			i += size
		}
	}
	return n
}

// unescapeTo writes raw (checked by scanString) unescaped to sb.
func unescapeTo(sb *strings.Builder, raw []byte) {
	for i := 0; i < len(raw); {
		switch c := raw[i]; {
		case c == '\\':
			r, b, used := decodeEscape(raw[i:])
			if r < 0 {
				sb.WriteByte(b)
			} else {
				sb.WriteRune(r)
			}
			i += used
		case c < utf8.RuneSelf:
			j := i + 1
			for j < len(raw) && raw[j] != '\\' && raw[j] < utf8.RuneSelf {
				j++
			}
			sb.Write(raw[i:j])
			i = j
		default:
			r, size := utf8.DecodeRune(raw[i:])
			sb.WriteRune(r)
			i += size
		}
	}
}

// unescape appends raw (checked by scanString) unescaped to dst.
func unescape(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		switch c := raw[i]; {
		case c == '\\':
			r, b, used := decodeEscape(raw[i:])
			if r < 0 {
				dst = append(dst, b)
			} else {
				dst = utf8.AppendRune(dst, r)
			}
			i += used
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			i++
		default:
			r, size := utf8.DecodeRune(raw[i:])
			dst = utf8.AppendRune(dst, r)
			i += size
		}
	}
	return dst
}

// uint reads an unsigned integer of at most max, or null (0).
func (d *decoder) uint(what string, max uint64) (uint64, error) {
	if d.null() {
		return 0, nil
	}
	start := d.i
	var v uint64
	for d.i < len(d.b) && '0' <= d.b[d.i] && d.b[d.i] <= '9' {
		digit := uint64(d.b[d.i] - '0')
		if v > (max-digit)/10 {
			d.i = start
			return 0, d.errorf("%s: want an integer of at most %d, have %s", what, max, d.have())
		}
		v = v*10 + digit
		d.i++
	}
	switch {
	case d.i == start:
		return 0, d.errorf("%s: want an unsigned integer, have %s", what, d.have())
	case d.b[start] == '0' && d.i > start+1:
		d.i = start
		return 0, d.errorf("%s: number with a leading zero: %s", what, d.have())
	}
	switch d.peek() {
	case '.', 'e', 'E':
		d.i = start
		return 0, d.errorf("%s: want an unsigned integer, have %s", what, d.have())
	}
	return v, nil
}

// skip checks and skips the JSON value at d.i, without recursion: what is
// open is kept one bit a level (object or array), so a value nested
// maxDepth deep costs no stack.
func (d *decoder) skip() error {
	n := 0 // levels open in this value
	for {
		// At a value.
		switch c := d.peek(); {
		case c == '{' || c == '[':
			if d.depth+n+1 > maxDepth {
				return d.errorf("nested more than %d deep", maxDepth)
			}
			d.i++
			d.ws()
			if (c == '{' && d.peek() == '}') || (c == '[' && d.peek() == ']') {
				d.i++ // empty: a value read
				break
			}
			d.open.set(n, c == '{')
			n++
			if c == '{' {
				if err := d.memberName(); err != nil {
					return err
				}
			}
			continue // to the first element
		case c == '"':
			if _, _, err := d.scanString(); err != nil {
				return err
			}
		case c == '-' || '0' <= c && c <= '9':
			if err := d.number(); err != nil {
				return err
			}
		case d.literal("true"), d.literal("false"), d.literal("null"):
		default:
			return d.errorf("want a JSON value, have %s", d.have())
		}
		// After a value: close what ends here, up to the next element.
		for {
			if n == 0 {
				return nil
			}
			d.ws()
			c, obj := d.peek(), d.open.object(n-1)
			if c == ',' {
				d.i++
				d.ws()
				if obj {
					if err := d.memberName(); err != nil {
						return err
					}
				}
				break
			}
			if (obj && c == '}') || (!obj && c == ']') {
				d.i++
				n--
				continue
			}
			if obj {
				return d.errorf("want ',' or '}' in an object, have %s", d.have())
			}
			return d.errorf("want ',' or ']' in an array, have %s", d.have())
		}
	}
}

// levels records, for skip, whether each open level is an object: the
// first 64 in a word, deeper ones in an array made for the first value
// nested that deep (and kept for the body's others).
type levels struct {
	first uint64
	deep  *[maxDepth/64 + 1]uint64
}

func (l *levels) set(n int, object bool) {
	w, bit := &l.first, uint64(1)<<(n%64)
	if n >= 64 {
		if l.deep == nil {
			l.deep = new([maxDepth/64 + 1]uint64)
		}
		w = &l.deep[n/64-1]
	}
	if object {
		*w |= bit
	} else {
		*w &^= bit
	}
}

func (l *levels) object(n int) bool {
	w := l.first
	if n >= 64 {
		w = l.deep[n/64-1]
	}
	return w&(1<<(n%64)) != 0
}

// memberName checks and skips a member's name and its ':', d.i at the
// name, and leaves d.i at the value.
func (d *decoder) memberName() error {
	if d.peek() != '"' {
		return d.errorf("want a member name, have %s", d.have())
	}
	if _, _, err := d.scanString(); err != nil {
		return err
	}
	d.ws()
	if d.peek() != ':' {
		return d.errorf("want ':' after a member name, have %s", d.have())
	}
	d.i++
	d.ws()
	return nil
}

// number checks and skips a JSON number.
func (d *decoder) number() error {
	start := d.i
	digits := func() int {
		n := 0
		for d.i < len(d.b) && '0' <= d.b[d.i] && d.b[d.i] <= '9' {
			d.i++
			n++
		}
		return n
	}
	if d.peek() == '-' {
		d.i++
	}
	switch {
	case d.peek() == '0':
		d.i++
	case digits() == 0:
		d.i = start
		return d.errorf("want a number, have %s", d.have())
	}
	if d.peek() == '.' {
		d.i++
		if digits() == 0 {
			return d.errorf("want digits after '.', have %s", d.have())
		}
	}
	if c := d.peek(); c == 'e' || c == 'E' {
		d.i++
		if c := d.peek(); c == '+' || c == '-' {
			d.i++
		}
		if digits() == 0 {
			return d.errorf("want digits in the exponent, have %s", d.have())
		}
	}
	return nil
}
