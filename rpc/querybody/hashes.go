package querybody

import (
	"strconv"
)

// Hashes are 64-bit block hashes as prefixd writes them in JSON: an array
// of decimal strings, as protojson writes 64-bit integers, since
// JavaScript's numbers hold integers exactly only up to 2^53. They read
// back from strings or numbers, as Decode reads block_hashes.
type Hashes []uint64

// MarshalJSON writes h as an array of decimal strings; nil is [].
func (h Hashes) MarshalJSON() ([]byte, error) {
	return AppendHashes(make([]byte, 0, 2+len(h)*22), h), nil
}

// UnmarshalJSON reads an array of hashes, each a number or a decimal
// string; null leaves h as it is.
func (h *Hashes) UnmarshalJSON(b []byte) error {
	d := decoder{b: b}
	d.ws()
	if d.null() {
		return nil
	}
	var out Hashes
	err := d.list("hashes", func(int) error {
		v, err := d.hash("hashes")
		out = append(out, v)
		return err
	})
	if err != nil {
		return err
	}
	*h = out
	return nil
}

// AppendHashes appends hs to b as a JSON array of decimal strings.
func AppendHashes(b []byte, hs []uint64) []byte {
	b = append(b, '[')
	for i, v := range hs {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendHash(b, v)
	}
	return append(b, ']')
}

// AppendHash appends v to b as a JSON string of its decimal digits.
func AppendHash(b []byte, v uint64) []byte {
	b = append(b, '"')
	b = strconv.AppendUint(b, v, 10)
	return append(b, '"')
}
