package events

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/events/recording"
	"github.com/prefixd/prefixd/internal/fixture"
)

// readRecording returns every message of a recording file; any read error
// fails the test.
func readRecording(tb testing.TB, path string) ([]recording.Message, recording.Stats) {
	tb.Helper()
	r, err := recording.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() {
		if err := r.Close(); err != nil {
			tb.Error(err)
		}
	}()
	var msgs []recording.Message
	for m, err := range r.All() {
		if err != nil {
			tb.Fatalf("%s: %v", path, err)
		}
		msgs = append(msgs, m)
	}
	return msgs, r.Stats()
}

// recordingFiles lists the message recordings of one fixture directory:
// events*.jsonl and replay*.jsonl, without the derived *.decoded.jsonl.
func recordingFiles(tb testing.TB, dir string) []string {
	tb.Helper()
	var files []string
	for _, pat := range []string{"events*.jsonl", "replay*.jsonl"} {
		m, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			tb.Fatal(err)
		}
		for _, f := range m {
			if !strings.HasSuffix(f, ".decoded.jsonl") {
				files = append(files, f)
			}
		}
	}
	slices.Sort(files)
	if len(files) == 0 {
		tb.Fatalf("no recordings in %s", dir)
	}
	return files
}

// streamCounts is what verification.txt says about one topic.
type streamCounts struct {
	batches             int
	firstSeq, lastSeq   uint64
	gaps                string
	stored, removed, cl int
}

var verificationLine = regexp.MustCompile(`^\[(\S+)\] batches=(\d+) seq (\d+)\.\.(\d+) gaps=\[(.*?)\] events=\{(.*?)\}`)

func parseVerification(tb testing.TB, path string) map[string]streamCounts {
	tb.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]streamCounts{}
	for _, line := range strings.Split(string(data), "\n") {
		m := verificationLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var c streamCounts
		c.batches, _ = strconv.Atoi(m[2])
		c.firstSeq, _ = strconv.ParseUint(m[3], 10, 64)
		c.lastSeq, _ = strconv.ParseUint(m[4], 10, 64)
		c.gaps = m[5]
		for _, kv := range strings.Split(m[6], ",") {
			name, num, ok := strings.Cut(kv, ":")
			if !ok {
				tb.Fatalf("%s: bad events entry %q", path, kv)
			}
			n, err := strconv.Atoi(strings.TrimSpace(num))
			if err != nil {
				tb.Fatalf("%s: bad events count %q", path, kv)
			}
			switch strings.Trim(strings.TrimSpace(name), "'") {
			case "BlockStored":
				c.stored = n
			case "BlockRemoved":
				c.removed = n
			case "AllBlocksCleared":
				c.cl = n
			default:
				tb.Fatalf("%s: unknown event type in %q", path, kv)
			}
		}
		out[m[1]] = c
	}
	if len(out) == 0 {
		tb.Fatalf("%s: no per-topic lines", path)
	}
	return out
}

// decoded is one message of a recording with its decoded batch (copied).
type decoded struct {
	msg   recording.Message
	batch Batch
}

// decodeFile decodes every message of a recording, failing on any error.
func decodeFile(tb testing.TB, path string) ([]decoded, recording.Stats) {
	tb.Helper()
	msgs, stats := readRecording(tb, path)
	out := make([]decoded, 0, len(msgs))
	var b Batch
	for _, m := range msgs {
		if err := DecodeFrames(m.Frames, &b); err != nil {
			tb.Fatalf("%s record %d: %v", path, m.Index, err)
		}
		if b.Skipped != 0 || b.UnknownFields != 0 || len(b.SkippedTypes) != 0 || len(b.UnknownFieldNames) != 0 {
			tb.Errorf("%s record %d: skipped %d events %s and %d fields %s", path, m.Index,
				b.Skipped, fmtNames(b.SkippedTypes), b.UnknownFields, fmtNames(b.UnknownFieldNames))
		}
		out = append(out, decoded{m, *b.Clone()})
	}
	return out, stats
}

// tally counts batches and events per topic, and checks seq continuity.
func tally(tb testing.TB, batches []decoded) map[string]streamCounts {
	tb.Helper()
	out := map[string]streamCounts{}
	seqs := map[string][]uint64{}
	for _, d := range batches {
		topic := string(d.batch.Topic)
		c := out[topic]
		c.batches++
		seqs[topic] = append(seqs[topic], d.batch.Seq)
		for _, e := range d.batch.Events {
			switch e.Kind {
			case KindBlockStored:
				c.stored++
			case KindBlockRemoved:
				c.removed++
			case KindAllBlocksCleared:
				c.cl++
			}
		}
		out[topic] = c
	}
	for topic, s := range seqs {
		slices.Sort(s)
		c := out[topic]
		c.firstSeq, c.lastSeq = s[0], s[len(s)-1]
		var gaps []string
		for i := 1; i < len(s); i++ {
			if s[i] != s[i-1]+1 {
				gaps = append(gaps, fmt.Sprintf("%d..%d", s[i-1]+1, s[i]-1))
			}
		}
		c.gaps = strings.Join(gaps, ", ")
		out[topic] = c
	}
	return out
}

func TestRecordingsDecode(t *testing.T) {
	sim := fixture.SimDir(t)
	for _, name := range fixture.Recordings {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(sim, name)
			files := recordingFiles(t, dir)
			byFile := map[string][]decoded{}
			for _, f := range files {
				batches, stats := decodeFile(t, f)
				byFile[filepath.Base(f)] = batches
				replay := strings.HasPrefix(filepath.Base(f), "replay-")
				if wantEnds := map[bool]int{true: 1, false: 0}[replay]; stats.ReplayEnds != wantEnds {
					t.Errorf("%s: %d replay end markers, want %d", f, stats.ReplayEnds, wantEnds)
				}
				for _, d := range batches {
					checkSimBatch(t, f, d, replay)
				}
			}
			switch name {
			case "c_dp2_late_subscriber_restart":
				checkLateSubscriber(t, dir, byFile)
			case "d_capacity_error":
				got := tally(t, byFile["events.jsonl"])
				want := map[string]streamCounts{"kv@127.0.0.1:8001@sim-model": {batches: 1, firstSeq: 1, lastSeq: 1, stored: 1}}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("counts = %+v, want %+v", got, want)
				}
				if e := byFile["events.jsonl"][0].batch.Events[0]; len(e.BlockHashes) != 5 || len(e.TokenIDs) != 5*16 {
					t.Errorf("the one BlockStored has %d hashes and %d tokens, want 5 and 80", len(e.BlockHashes), len(e.TokenIDs))
				}
			default:
				live := byFile["events.jsonl"]
				compareCounts(t, tally(t, live), parseVerification(t, filepath.Join(dir, "verification.txt")))
				for _, f := range []string{"replay-sim-1-from-0.jsonl", "replay-sim-1-from-5.jsonl"} {
					checkSubset(t, f, byFile[f], live)
				}
				if first := byFile["replay-sim-1-from-5.jsonl"][0].batch.Seq; first != 5 {
					t.Errorf("replay from 5 starts at seq %d", first)
				}
			}
		})
	}
}

// checkSimBatch checks what holds for every batch of the sim recordings.
func checkSimBatch(t *testing.T, file string, d decoded, replay bool) {
	t.Helper()
	b := &d.batch
	pod, model, ok := ParseTopic(b.Topic)
	if !ok || string(model) != "sim-model" || !strings.HasPrefix(string(pod), "127.0.0.1:800") {
		t.Errorf("%s record %d: topic %q", file, d.msg.Index, b.Topic)
	}
	// Data-parallel rank r serves on port 8001+r in recording c; every
	// other replica is rank 0.
	wantRank := 0
	if strings.Contains(file, "c_dp2") {
		wantRank = int(pod[len(pod)-1] - '1')
	}
	if !b.HasDPRank || b.DPRank != wantRank {
		t.Errorf("%s record %d: dp rank %d (present %v), want %d", file, d.msg.Index, b.DPRank, b.HasDPRank, wantRank)
	}
	if d.msg.Replay != replay {
		t.Errorf("%s record %d: replay = %v", file, d.msg.Index, d.msg.Replay)
	}
	if len(b.Events) == 0 {
		t.Errorf("%s record %d: no events", file, d.msg.Index)
	}
	for i, e := range b.Events {
		switch e.Kind {
		case KindBlockStored:
			if e.BlockSize != 16 || len(e.TokenIDs) != 16*len(e.BlockHashes) || len(e.BlockHashes) == 0 {
				t.Errorf("%s record %d event %d: %d hashes, %d tokens, block size %d",
					file, d.msg.Index, i, len(e.BlockHashes), len(e.TokenIDs), e.BlockSize)
			}
		case KindBlockRemoved:
			if len(e.BlockHashes) != 1 {
				t.Errorf("%s record %d event %d: BlockRemoved of %d hashes", file, d.msg.Index, i, len(e.BlockHashes))
			}
		}
		if e.Medium != MediumGPU || e.HasLoRAID || len(e.LoRAName) != 0 || len(e.ExtraKeys) != 0 || e.HasGroupIdx ||
			e.SpecKind != SpecNone || e.SlidingWindow != 0 || e.Locality != LocalityNone ||
			len(e.Ownership) != 0 || len(e.SessionID) != 0 || len(e.RemainingCopies) != 0 {
			t.Errorf("%s record %d event %d: unexpected optional fields %+v", file, d.msg.Index, i, e)
		}
	}
}

func compareCounts(t *testing.T, got, want map[string]streamCounts) {
	t.Helper()
	for topic, w := range want {
		if g := got[topic]; g != w {
			t.Errorf("%s: decoded %+v, verification.txt says %+v", topic, g, w)
		}
	}
	for topic := range got {
		if _, ok := want[topic]; !ok {
			t.Errorf("topic %s is not in verification.txt", topic)
		}
	}
}

// checkSubset checks that every batch of part is in whole, with the same
// topic, seq and payload bytes.
func checkSubset(t *testing.T, file string, part, whole []decoded) {
	t.Helper()
	type key struct {
		topic string
		seq   uint64
	}
	index := map[key][]byte{}
	for _, d := range whole {
		index[key{string(d.batch.Topic), d.batch.Seq}] = d.msg.Payload
	}
	if len(part) == 0 {
		t.Errorf("%s: no batches", file)
	}
	for _, d := range part {
		p, ok := index[key{string(d.batch.Topic), d.batch.Seq}]
		if !ok {
			t.Errorf("%s: %s seq %d is not in the complete stream", file, d.batch.Topic, d.batch.Seq)
			continue
		}
		if !bytes.Equal(p, d.msg.Payload) {
			t.Errorf("%s: %s seq %d differs from the complete stream's", file, d.batch.Topic, d.batch.Seq)
		}
	}
}

// checkLateSubscriber checks recording c: the replies to a replay from 0
// hold the complete streams that verification.txt counts, and the live
// part files, which missed batches, are subsets of them.
func checkLateSubscriber(t *testing.T, dir string, byFile map[string][]decoded) {
	t.Helper()
	var complete []decoded
	for _, rank := range []string{"rank0", "rank1"} {
		whole := byFile["replay-"+rank+"-from-0.jsonl"]
		complete = append(complete, whole...)
		var parts []decoded
		for _, part := range []string{"part1", "part2"} {
			f := "events-" + rank + "-" + part + ".jsonl"
			checkSubset(t, f, byFile[f], whole)
			parts = append(parts, byFile[f]...)
		}
		if len(parts) >= len(whole) {
			t.Errorf("%s: the part files hold %d batches of %d: no gap", rank, len(parts), len(whole))
		}
	}
	compareCounts(t, tally(t, complete), parseVerification(t, filepath.Join(dir, "verification.txt")))
}

// TestRecordingsMatchDecodedJSONL compares every decoded event with the
// *.decoded.jsonl files that a msgpack library produced from the same bytes.
func TestRecordingsMatchDecodedJSONL(t *testing.T) {
	sim := fixture.SimDir(t)
	pairs, err := filepath.Glob(filepath.Join(sim, "*", "*.decoded.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pairs) < 4 {
		t.Fatalf("found only %d decoded files", len(pairs))
	}
	for _, dec := range pairs {
		src := strings.TrimSuffix(dec, ".decoded.jsonl") + ".jsonl"
		t.Run(filepath.Base(filepath.Dir(dec))+"/"+filepath.Base(src), func(t *testing.T) {
			batches, _ := decodeFile(t, src)
			byIndex := map[int]decoded{}
			for _, d := range batches {
				byIndex[d.msg.Index] = d
			}
			refs := readDecodedJSONL(t, dec)
			n := 0
			for _, ref := range refs {
				if ref.Sentinel {
					continue
				}
				n++
				d, ok := byIndex[ref.Idx]
				if !ok {
					t.Errorf("record %d: not decoded", ref.Idx)
					continue
				}
				compareDecoded(t, ref, d)
			}
			if n != len(batches) {
				t.Errorf("%d reference batches, %d decoded", n, len(batches))
			}
		})
	}
}

type refBatch struct {
	Idx      int               `json:"idx"`
	RecvTSNs int64             `json:"recv_ts_ns"`
	Topic    string            `json:"topic"`
	Seq      uint64            `json:"seq"`
	BatchTS  float64           `json:"batch_ts"`
	DPRank   *int              `json:"dp_rank"`
	Sentinel bool              `json:"sentinel"`
	Events   []json.RawMessage `json:"events"`
}

func readDecodedJSONL(tb testing.TB, path string) []refBatch {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = f.Close() }() // read only
	var out []refBatch
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var r refBatch
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			tb.Fatalf("%s: %v", path, err)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// refEvent is an event as the reference decoder wrote it, in either form.
type refEvent struct {
	kind      string
	hashes    []uint64
	parent    uint64
	tokens    []uint32
	blockSize int
	medium    string
}

func parseRefEvent(tb testing.TB, raw json.RawMessage) refEvent {
	tb.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		tb.Fatal(err)
	}
	var fields map[string]any
	switch ev := v.(type) {
	case map[string]any:
		fields = ev
	case []any:
		names := map[string][]string{
			"BlockStored":      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys"},
			"BlockRemoved":     {"block_hashes", "medium"},
			"AllBlocksCleared": {},
		}
		kind, _ := ev[0].(string)
		fields = map[string]any{"type": kind}
		for i, name := range names[kind] {
			if i+1 < len(ev) {
				fields[name] = ev[i+1]
			}
		}
	}
	num := func(x any) uint64 {
		if x == nil {
			return 0
		}
		n, err := strconv.ParseUint(string(x.(json.Number)), 10, 64)
		if err != nil {
			tb.Fatalf("reference number %v: %v", x, err)
		}
		return n
	}
	r := refEvent{kind: fields["type"].(string), parent: num(fields["parent_block_hash"]), blockSize: int(num(fields["block_size"]))}
	if hs, ok := fields["block_hashes"].([]any); ok {
		for _, h := range hs {
			r.hashes = append(r.hashes, num(h))
		}
	}
	if ts, ok := fields["token_ids"].([]any); ok {
		for _, x := range ts {
			n := num(x)
			if n > math.MaxUint32 {
				tb.Fatalf("reference token %d", n)
			}
			r.tokens = append(r.tokens, uint32(n))
		}
	}
	r.medium, _ = fields["medium"].(string)
	return r
}

func compareDecoded(t *testing.T, ref refBatch, d decoded) {
	t.Helper()
	b := &d.batch
	where := fmt.Sprintf("record %d (%s seq %d)", ref.Idx, ref.Topic, ref.Seq)
	if string(b.Topic) != ref.Topic || b.Seq != ref.Seq {
		t.Errorf("%s: decoded topic %q seq %d", where, b.Topic, b.Seq)
	}
	if b.TS != ref.BatchTS {
		t.Errorf("%s: ts %v, reference %v", where, b.TS, ref.BatchTS)
	}
	if ref.DPRank == nil || !b.HasDPRank || b.DPRank != *ref.DPRank {
		t.Errorf("%s: dp rank %d (present %v), reference %v", where, b.DPRank, b.HasDPRank, ref.DPRank)
	}
	if got := d.msg.RecvTime.UnixNano(); got != ref.RecvTSNs {
		t.Errorf("%s: receive time %d, reference %d", where, got, ref.RecvTSNs)
	}
	if len(b.Events) != len(ref.Events) {
		t.Errorf("%s: %d events, reference %d", where, len(b.Events), len(ref.Events))
		return
	}
	for i, raw := range ref.Events {
		r := parseRefEvent(t, raw)
		e := b.Events[i]
		medium := r.medium
		if medium == "" {
			medium = "GPU"
		}
		switch {
		case e.Kind.String() != r.kind:
			t.Errorf("%s event %d: kind %v, reference %s", where, i, e.Kind, r.kind)
		case !slices.Equal(e.BlockHashes, r.hashes):
			t.Errorf("%s event %d: hashes %v, reference %v", where, i, e.BlockHashes, r.hashes)
		case e.ParentHash != r.parent || e.HasParent != (r.parent != 0):
			t.Errorf("%s event %d: parent %d (%v), reference %d", where, i, e.ParentHash, e.HasParent, r.parent)
		case !slices.Equal(e.TokenIDs, r.tokens):
			t.Errorf("%s event %d: tokens differ", where, i)
		case e.BlockSize != r.blockSize:
			t.Errorf("%s event %d: block size %d, reference %d", where, i, e.BlockSize, r.blockSize)
		case e.Medium.String() != medium:
			t.Errorf("%s event %d: medium %v, reference %q", where, i, e.Medium, r.medium)
		}
	}
}
