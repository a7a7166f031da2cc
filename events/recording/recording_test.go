package recording

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/internal/fixture"
)

func seq(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

// testMessages covers every frame shape and field of a Message.
func testMessages() []Message {
	t0 := time.Unix(1795981110, 121297702)
	topic := []byte("kv@127.0.0.1:8001@sim-model")
	return []Message{
		{RecvTime: t0, Source: "tcp://127.0.0.1:5557", Peer: "127.0.0.1:40312", Frames: [][]byte{topic, seq(1), {0x93, 0x01, 0x90, 0x00}}},
		{RecvTime: t0.Add(time.Millisecond), Source: "tcp://10.0.0.2:5557", Frames: [][]byte{{}, seq(2), {0x92, 0x01, 0x90}}},
		{RecvTime: t0.Add(2 * time.Millisecond), Source: "tcp://127.0.0.1:5601", Replay: true, Frames: [][]byte{{}, topic, seq(1), {0x92, 0x01, 0x90}}},
		{RecvTime: t0.Add(3 * time.Millisecond), Replay: true, Frames: [][]byte{{}, seq(3), {0x92, 0x01, 0x90}}},
		{RecvTime: t0.Add(4 * time.Millisecond), Frames: [][]byte{seq(4), {0x92, 0x01, 0x90}}},
		{Frames: [][]byte{topic, seq(5), bytes.Repeat([]byte{0xab}, 70000)}},
		{RecvTime: t0.Add(5 * time.Millisecond), Replay: true, Frames: [][]byte{{}, {}, seq(1<<64 - 1), {}}},
	}
}

// split fills the views of m as a reader returns them.
func split(tb testing.TB, m Message) Message {
	tb.Helper()
	if err := m.Split(); err != nil {
		tb.Fatalf("split %v: %v", m.Frames, err)
	}
	return m
}

func diffMessage(a, b Message) string {
	switch {
	case a.Index != b.Index:
		return fmt.Sprintf("index %d vs %d", a.Index, b.Index)
	case !a.RecvTime.Equal(b.RecvTime):
		return fmt.Sprintf("recv time %v vs %v", a.RecvTime, b.RecvTime)
	case a.Source != b.Source || a.Peer != b.Peer:
		return fmt.Sprintf("source %q/%q vs %q/%q", a.Source, a.Peer, b.Source, b.Peer)
	case a.Replay != b.Replay:
		return fmt.Sprintf("replay %v vs %v", a.Replay, b.Replay)
	case len(a.Frames) != len(b.Frames):
		return fmt.Sprintf("%d frames vs %d", len(a.Frames), len(b.Frames))
	case !bytes.Equal(a.Topic, b.Topic) || !bytes.Equal(a.Seq, b.Seq) || !bytes.Equal(a.Payload, b.Payload):
		return "topic, seq or payload"
	}
	for i := range a.Frames {
		if !bytes.Equal(a.Frames[i], b.Frames[i]) {
			return fmt.Sprintf("frame %d", i)
		}
	}
	return ""
}

// nativeFile encodes msgs as a native recording.
func nativeFile(tb testing.TB, msgs []Message) []byte {
	tb.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for _, m := range msgs {
		if err := w.Append(m); err != nil {
			tb.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// readAll reads until io.EOF or an error that ends reading, and returns the
// messages and that error (nil at io.EOF).
func readAll(r *Reader) ([]Message, error) {
	var msgs []Message
	for {
		m, err := r.Next()
		switch {
		case errors.Is(err, io.EOF):
			return msgs, nil
		case errors.Is(err, ErrFrames):
			msgs = append(msgs, m)
		case err != nil:
			return msgs, err
		default:
			msgs = append(msgs, m)
		}
	}
}

func TestNativeRoundTrip(t *testing.T) {
	in := testMessages()
	r := NewReader(bytes.NewReader(nativeFile(t, in)))
	got, err := readAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if r.Format() != FormatNative {
		t.Errorf("format %v", r.Format())
	}
	// The end marker is skipped and counted.
	want := in[:len(in)-1]
	if len(got) != len(want) {
		t.Fatalf("read %d messages, want %d", len(got), len(want))
	}
	for i := range want {
		w := split(t, want[i])
		w.Index = i
		if d := diffMessage(got[i], w); d != "" {
			t.Errorf("message %d differs: %s", i, d)
		}
	}
	if st := r.Stats(); st != (Stats{Records: len(in), Messages: len(in) - 1, ReplayEnds: 1}) {
		t.Errorf("stats %+v", st)
	}
	// Messages without Frames are written from their views.
	views := Message{Topic: []byte("t"), Seq: seq(9), Payload: []byte{0x90}, Replay: true}
	got, err = readAll(NewReader(bytes.NewReader(nativeFile(t, []Message{views}))))
	if err != nil || len(got) != 1 {
		t.Fatalf("read %v, %v", got, err)
	}
	if len(got[0].Frames) != 4 || string(got[0].Topic) != "t" || !got[0].Replay {
		t.Errorf("message from views read back as %+v", got[0])
	}
}

func TestNativeFrameShapeIsNotFatal(t *testing.T) {
	msgs := []Message{
		{Frames: [][]byte{{1}, {2}, {3}, {4}, {5}}},
		{Frames: [][]byte{{1}, []byte("t"), seq(1), {0x90}}},
		{Frames: [][]byte{[]byte("t"), seq(2), {0x90}}},
	}
	r := NewReader(bytes.NewReader(nativeFile(t, msgs)))
	for i := range msgs {
		m, err := r.Next()
		if (i < 2) != errors.Is(err, ErrFrames) {
			t.Fatalf("message %d: err = %v", i, err)
		}
		var re *RecordError
		if err != nil && (!errors.As(err, &re) || re.Record != i) {
			t.Fatalf("message %d: error %v does not name the record", i, err)
		}
		if len(m.Frames) != len(msgs[i].Frames) {
			t.Errorf("message %d: frames not kept with the error", i)
		}
	}
	if _, err := r.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("at end: %v", err)
	}
}

// growing is an input that a test appends to between reads, like a file
// being written: Read returns io.EOF when it has nothing, and data later.
type growing struct{ data []byte }

func (g *growing) Read(p []byte) (int, error) {
	if len(g.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p, g.data)
	g.data = g.data[n:]
	return n, nil
}

// TestNativeTornTail cuts a native recording at every offset: the reader
// returns the complete records, then ErrTornTail (or io.EOF on a record
// boundary), and once the rest arrives it reads on to the end.
func TestNativeTornTail(t *testing.T) {
	msgs := testMessages()[:5]
	file := nativeFile(t, msgs)
	for cut := 0; cut <= len(file); cut++ {
		g := &growing{data: bytes.Clone(file[:cut])}
		r := NewReader(g)
		first, err := readAll(r)
		if err != nil && !errors.Is(err, ErrTornTail) {
			t.Fatalf("cut at %d: %v", cut, err)
		}
		// Reading again with nothing new changes nothing.
		if again, err2 := readAll(r); len(again) != 0 || (err2 == nil) != (err == nil) {
			t.Fatalf("cut at %d: second read gave %d messages, %v", cut, len(again), err2)
		}
		g.data = bytes.Clone(file[cut:])
		rest, err := readAll(r)
		if err != nil {
			t.Fatalf("cut at %d: after the rest arrived: %v", cut, err)
		}
		if got := len(first) + len(rest); got != len(msgs) {
			t.Fatalf("cut at %d: read %d+%d messages, want %d", cut, len(first), len(rest), len(msgs))
		}
		for i, m := range append(first, rest...) {
			w := split(t, msgs[i])
			w.Index = i
			if d := diffMessage(m, w); d != "" {
				t.Fatalf("cut at %d: message %d differs: %s", cut, i, d)
			}
		}
	}
}

// TestNativeCorruption damages one byte of each record's header or body:
// the records before it are read, then a sticky ErrCorrupt, also when the
// damaged record is the last one.
func TestNativeCorruption(t *testing.T) {
	msgs := testMessages()[:4]
	file := nativeFile(t, msgs)
	// Record start offsets.
	var starts []int
	for off := headerSize; off < len(file); {
		starts = append(starts, off)
		off += recHeaderSize + int(binary.BigEndian.Uint32(file[off:]))
	}
	for rec, start := range starts {
		for _, at := range []int{0, 3, 5, 9, recHeaderSize, recHeaderSize + 4} {
			t.Run(fmt.Sprintf("record %d byte %d", rec, at), func(t *testing.T) {
				bad := bytes.Clone(file)
				bad[start+at] ^= 0x40
				r := NewReader(bytes.NewReader(bad))
				got, err := readAll(r)
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("err = %v, want ErrCorrupt", err)
				}
				var re *RecordError
				if !errors.As(err, &re) || re.Record != rec || re.Offset != int64(start) {
					t.Fatalf("error %v, want record %d at offset %d", err, rec, start)
				}
				if len(got) != rec {
					t.Fatalf("read %d messages before the damage, want %d", len(got), rec)
				}
				if _, err2 := r.Next(); !errors.Is(err2, ErrCorrupt) {
					t.Fatalf("corruption is not sticky: %v", err2)
				}
			})
		}
	}
}

func TestOpenSniffs(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	native := nativeFile(t, testMessages()[:1])
	wrongVersion := bytes.Clone(native)
	wrongVersion[len(magic)+3] = 9
	tests := []struct {
		name    string
		data    []byte
		openErr error
		format  Format
		nextErr error
	}{
		{"native", native, nil, FormatNative, nil},
		{"jsonl", []byte(`{"recv_ts_ns": 1, "nframes": 3, "frames_b64": ["", "AAAAAAAAAAE=", "kA=="]}` + "\n"), nil, FormatJSONL, nil},
		{"empty", nil, nil, FormatUnknown, io.EOF},
		{"header only", native[:headerSize], nil, FormatNative, io.EOF},
		{"partial magic", native[:3], nil, FormatUnknown, ErrTornTail},
		{"bad magic", []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0d"), ErrFormat, 0, nil},
		{"wrong version", wrongVersion, ErrFormat, 0, nil},
		{"text", []byte("hello\n"), ErrFormat, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Open(write(tt.name, tt.data))
			if !errors.Is(err, tt.openErr) {
				t.Fatalf("Open: %v, want %v", err, tt.openErr)
			}
			if err != nil {
				return
			}
			defer closeReader(t, r)
			if r.Format() != tt.format {
				t.Errorf("format %v, want %v", r.Format(), tt.format)
			}
			if _, err := r.Next(); !errors.Is(err, tt.nextErr) {
				t.Errorf("Next: %v, want %v", err, tt.nextErr)
			}
		})
	}
	if _, err := Open(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open of a missing file: %v", err)
	}
}

// TestTailWhileWriting reads a native file with Open while a Writer
// appends to it, the way `prefixd inspect` may follow `prefixd record`.
func TestTailWhileWriting(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rec.pfxd")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer closeReader(t, r)
	if r.Format() != FormatNative {
		t.Fatalf("format of a new recording: %v", r.Format())
	}
	msgs := testMessages()[:5]
	read := 0
	for i, m := range msgs {
		if err := w.Append(m); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Next(); !errors.Is(err, io.EOF) {
			t.Fatalf("before Flush: %v, want io.EOF", err)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		got, err := r.Next()
		if err != nil {
			t.Fatalf("message %d after Flush: %v", i, err)
		}
		if got.Index != i || !bytes.Equal(got.Payload, m.Frames[len(m.Frames)-1]) {
			t.Fatalf("message %d read back as index %d", i, got.Index)
		}
		read++
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := w.Append(msgs[0]); err == nil {
		t.Fatal("Append after Close succeeded")
	}
	if _, err := r.Next(); !errors.Is(err, io.EOF) || read != len(msgs) {
		t.Fatalf("end: %v after %d", err, read)
	}
}

func TestJSONL(t *testing.T) {
	line := func(frames ...string) string {
		return fmt.Sprintf(`{"idx": 0, "recv_ts_ns": 1795981110121297702, "nframes": %d, "frames_b64": [%s]}`,
			len(frames), strings.Join(frames, ", "))
	}
	live := line(`"a3Y="`, `"AAAAAAAAAAE="`, `"kA=="`)
	tests := []struct {
		name     string
		data     string
		messages int
		errs     []error // record errors in order; the last may be ErrTornTail
	}{
		{"one line", live + "\n", 1, nil},
		{"last line without newline", live, 1, nil},
		{"blank lines", "\n" + live + "\n\n  \n" + live + "\n", 2, nil},
		{"torn last line", live + "\n" + live[:40], 1, []error{ErrTornTail}},
		{"bad line in the middle", live + "\n{nope}\n" + live + "\n", 2, []error{ErrCorrupt}},
		{"bad base64", line(`"!!"`, `"AAAAAAAAAAE="`, `"kA=="`) + "\n" + live + "\n", 1, []error{ErrCorrupt}},
		{"nframes disagrees", strings.Replace(live, `"nframes": 3`, `"nframes": 4`, 1) + "\n", 0, []error{ErrCorrupt}},
		{"no frames", `{"idx": 0}` + "\n" + live + "\n", 1, []error{ErrCorrupt}},
		{"one frame", line(`"kA=="`) + "\n" + live + "\n", 1, []error{ErrFrames}},
		{"source, peer and replay", `{"recv_ts_ns": 5, "source": "tcp://h:1", "peer": "h:2", "replay": true, "frames_b64": ["", "AAAAAAAAAAE=", "kA=="]}` + "\n", 1, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewReader(strings.NewReader(tt.data))
			var msgs int
			var errs []error
			for m, err := range r.All() {
				if err != nil {
					errs = append(errs, err)
					continue
				}
				msgs++
				if tt.name == "source, peer and replay" && (m.Source != "tcp://h:1" || m.Peer != "h:2" || !m.Replay || m.RecvTime.UnixNano() != 5) {
					t.Errorf("optional fields read as %+v", m)
				}
			}
			if msgs != tt.messages {
				t.Errorf("%d messages, want %d", msgs, tt.messages)
			}
			if len(errs) != len(tt.errs) {
				t.Fatalf("errors %v, want %v", errs, tt.errs)
			}
			for i := range errs {
				if !errors.Is(errs[i], tt.errs[i]) {
					t.Errorf("error %d: %v, want %v", i, errs[i], tt.errs[i])
				}
			}
		})
	}
}

// TestFixtures reads every recording of the shared fixtures, in JSONL and
// converted to the native format.
func TestFixtures(t *testing.T) {
	sim := fixture.SimDir(t)
	files, err := filepath.Glob(filepath.Join(sim, "*", "*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		base := filepath.Base(f)
		if strings.HasSuffix(base, ".decoded.jsonl") || strings.HasPrefix(base, "requests") {
			continue
		}
		n++
		t.Run(filepath.Base(filepath.Dir(f))+"/"+base, func(t *testing.T) {
			r, err := Open(f)
			if err != nil {
				t.Fatal(err)
			}
			defer closeReader(t, r)
			msgs, err := readAll(r)
			if err != nil {
				t.Fatal(err)
			}
			st := r.Stats()
			replay := strings.HasPrefix(base, "replay-")
			wantEnds := 0
			if replay {
				wantEnds = 1
			}
			if r.Format() != FormatJSONL || st.ReplayEnds != wantEnds || st.Errors != 0 || st.Messages != len(msgs) || len(msgs) == 0 {
				t.Fatalf("format %v, stats %+v", r.Format(), st)
			}
			for i, m := range msgs {
				if m.Index != i || m.Replay != replay || len(m.Seq) != 8 || len(m.Payload) == 0 ||
					!strings.HasPrefix(string(m.Topic), "kv@127.0.0.1:") || m.RecvTime.IsZero() {
					t.Fatalf("message %d: %+v", i, m)
				}
			}
			// The same messages through the native format.
			back, err := readAll(NewReader(bytes.NewReader(nativeFile(t, msgs))))
			if err != nil || len(back) != len(msgs) {
				t.Fatalf("native copy: %d messages, %v", len(back), err)
			}
			for i := range msgs {
				if d := diffMessage(back[i], msgs[i]); d != "" {
					t.Fatalf("native copy of message %d differs: %s", i, d)
				}
			}
		})
	}
	if n < 10 {
		t.Fatalf("only %d fixture recordings found", n)
	}
}

func TestWriterAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	w := NewWriter(io.Discard)
	m := testMessages()[0]
	if err := w.Append(m); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(50, func() { _ = w.Append(m) }); n != 0 {
		t.Errorf("Append allocates %v times", n)
	}
}

func TestWriterLimits(t *testing.T) {
	w := NewWriter(io.Discard)
	if err := w.Append(Message{Frames: make([][]byte, maxFrames+1)}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("too many frames: %v", err)
	}
	if err := w.Append(Message{Frames: [][]byte{make([]byte, MaxRecordSize)}}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("too large: %v", err)
	}
	if err := w.Append(testMessages()[0]); err != nil {
		t.Errorf("a rejected message broke the writer: %v", err)
	}
}

// FuzzReadNative checks that reading any bytes as a native recording never
// panics and ends, and that what it reads survives a write and read back.
func FuzzReadNative(f *testing.F) {
	small := testMessages()
	small = append(small[:5], small[6:]...) // without the 70 kB payload
	file := nativeFile(f, small)
	f.Add(file)
	f.Add(file[:len(file)-7])
	f.Add(file[:headerSize])
	f.Add(nativeFile(f, []Message{{Frames: [][]byte{{1}, {2}, {3}, {4}, {5}}}}))
	f.Add([]byte(magic))
	bad := bytes.Clone(file)
	bad[headerSize+20] ^= 1
	f.Add(bad)
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bytes.NewReader(data))
		var msgs []Message
		for i := 0; ; i++ {
			if i > len(data)+1 {
				t.Fatalf("no end after %d calls", i)
			}
			m, err := r.Next()
			if errors.Is(err, io.EOF) || errors.Is(err, ErrTornTail) || errors.Is(err, ErrFormat) ||
				(err != nil && r.err != nil) {
				break
			}
			if errors.Is(err, ErrFrames) || errors.Is(err, ErrCorrupt) {
				continue
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if err := m.Split(); err != nil {
				t.Fatalf("a message read without error does not split: %v", err)
			}
			msgs = append(msgs, m)
		}
		back, err := readAll(NewReader(bytes.NewReader(nativeFile(t, msgs))))
		if err != nil || len(back) != len(msgs) {
			t.Fatalf("write and read back: %d of %d messages, %v", len(back), len(msgs), err)
		}
		for i := range msgs {
			want := msgs[i]
			want.Index = i
			if d := diffMessage(back[i], want); d != "" {
				t.Fatalf("message %d differs after write and read back: %s", i, d)
			}
		}
	})
}

func closeReader(tb testing.TB, r *Reader) {
	tb.Helper()
	if err := r.Close(); err != nil {
		tb.Error(err)
	}
}

// ReadFile returns every message in order, and the messages before a torn
// tail with the error.
func TestReadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.rec")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := w.Append(Message{Frames: [][]byte{[]byte("kv@127.0.0.1:8000@m"), {0, 0, 0, 0, 0, 0, 0, byte(i + 1)}, {0x90}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	msgs, err := ReadFile(path)
	if err != nil || len(msgs) != 3 || msgs[2].Seq[7] != 3 {
		t.Fatalf("ReadFile = %d messages, %v", len(msgs), err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, fi.Size()-2); err != nil {
		t.Fatal(err)
	}
	msgs, err = ReadFile(path)
	if !errors.Is(err, ErrTornTail) || len(msgs) != 2 {
		t.Fatalf("torn: ReadFile = %d messages, %v; want 2 and ErrTornTail", len(msgs), err)
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Fatal("ReadFile of a missing file: no error")
	}
}
