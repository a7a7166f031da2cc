package events

import (
	"errors"
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// Limits on the strings of a message that prefixd keeps as names: a pod
// and a model become metric labels, log fields and answers, an adapter's
// name a model a query may name.
const (
	// MaxTopicBytes bounds a topic frame.
	MaxTopicBytes = 512
	// MaxNameBytes bounds a pod, model or LoRA adapter name.
	MaxNameBytes = 256
)

// ErrName is wrapped by the errors of CheckLabel and CheckName.
var ErrName = errors.New("invalid name")

// CheckLabel reports whether name may name a pod or a model: 1 to
// MaxNameBytes bytes of ASCII letters, digits and . _ - : / @ + [ ] % # = ~
// (enough for ip:port, [v6]:port and served model names such as
// meta-llama/Llama-3.1-8B-Instruct). Such names are metric label values,
// which must be valid UTF-8 and had better be printable.
func CheckLabel(name []byte) error {
	if err := checkLen(name); err != nil {
		return err
	}
	for i, c := range name {
		if !labelByte[c] {
			return fmt.Errorf("%w: byte %#02x at offset %d is not a letter, digit or one of . _ - : / @ + [ ] %% # = ~", ErrName, c, i)
		}
	}
	return nil
}

// CheckName reports whether name may name a LoRA adapter: 1 to
// MaxNameBytes bytes of valid UTF-8 without control characters.
func CheckName(name []byte) error {
	if err := checkLen(name); err != nil {
		return err
	}
	for i := 0; i < len(name); {
		r, n := utf8.DecodeRune(name[i:])
		if r == utf8.RuneError && n <= 1 {
			return fmt.Errorf("%w: not valid UTF-8 at offset %d", ErrName, i)
		}
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: control character %U at offset %d", ErrName, r, i)
		}
		i += n
	}
	return nil
}

// Quote returns name quoted for a log line or an error, cut to its first
// 64 bytes when longer (with its length said): names that failed a check
// are a hostile peer's to choose, and may be megabytes.
func Quote(name []byte) string {
	const show = 64
	if len(name) <= show {
		return strconv.Quote(string(name))
	}
	return fmt.Sprintf("%q... (%d bytes)", name[:show], len(name))
}

func checkLen(name []byte) error {
	switch {
	case len(name) == 0:
		return fmt.Errorf("%w: empty", ErrName)
	case len(name) > MaxNameBytes:
		return fmt.Errorf("%w: %d bytes; the limit is %d", ErrName, len(name), MaxNameBytes)
	}
	return nil
}

// labelByte marks the bytes CheckLabel accepts.
var labelByte = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "._-:/@+[]%#=~" {
		t[c] = true
	}
	return t
}()
