package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/events/recording"
	"github.com/prefixd/prefixd/rpc/querybody"
)

// runInspect prints what recordings hold: one line (or JSON object) per
// batch, then the seq gaps of every stream across all the files.
func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("inspect", "FILE...", stderr)
	asJSON := fs.Bool("json", false, "print one JSON object per batch with its decoded events\n(hashes and seqs as decimal strings, as protojson writes 64-bit integers)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return usageErrorf(fs, "inspect needs at least one recording file")
	}
	out := bufio.NewWriter(stdout)
	in := inspector{out: out, stderr: stderr, json: *asJSON, streams: map[streamKey]*streamSeqs{}}
	for _, path := range fs.Args() {
		in.files++
		r, err := recording.Open(path)
		if err != nil {
			in.warnf("%v", err)
			in.unreadable++
			continue
		}
		err = in.read(ctx, path, r)
		_ = r.Close() // read only: nothing is lost
		if err != nil {
			return errors.Join(err, out.Flush())
		}
	}
	in.summary()
	if in.werr != nil {
		return fmt.Errorf("write output: %w", in.werr)
	}
	if err := out.Flush(); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	switch {
	case in.unreadable > 0:
		return fmt.Errorf("%d of %d records failed; %d files could not be read", in.failed, in.records, in.unreadable)
	case in.failed > 0:
		return fmt.Errorf("%d of %d records failed", in.failed, in.records)
	}
	return nil
}

type inspector struct {
	out    *bufio.Writer
	stderr io.Writer
	json   bool

	files, unreadable        int
	records, batches, failed int
	streams                  map[streamKey]*streamSeqs

	batch events.Batch
	line  []byte // reused output line
	werr  error  // first error writing to out
}

// emit writes one piece of output; after a write error it does nothing
// and the error is returned at the end.
func (in *inspector) emit(l []byte) {
	if in.werr == nil {
		_, in.werr = in.out.Write(l)
	}
}

// streamKey identifies one publisher's sequence: its topic, or the source
// endpoint when the topic is empty, and its data-parallel rank (-1 when
// the batch has none).
type streamKey struct {
	topic string
	rank  int
}

type streamSeqs struct {
	seqs     map[uint64]struct{}
	restarts int // times seq went backwards within one file
	last     uint64
	lastFile int
}

func (in *inspector) warnf(format string, a ...any) {
	// A failing stderr has nowhere to be reported.
	_, _ = fmt.Fprintf(in.stderr, "prefixd inspect: "+format+"\n", a...)
}

// read prints every batch of one recording and tracks its seqs. It fails
// only when ctx is done; bad records are reported and counted.
func (in *inspector) read(ctx context.Context, path string, r *recording.Reader) error {
	for m, err := range r.All() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if errors.Is(err, recording.ErrTornTail) {
			in.warnf("%s: warning: %v (is the file still being written?)", path, err)
			continue
		}
		in.records++
		if err != nil {
			in.failed++
			in.warnf("%s: %v", path, err)
			continue
		}
		if err := events.Decode(m.Topic, m.Seq, m.Payload, &in.batch); err != nil {
			in.failed++
			in.warnf("%s: record %d: %v", path, m.Index, err)
			continue
		}
		in.batches++
		in.track(&m)
		if in.json {
			in.printJSON(path, &m)
		} else {
			in.printLine(path, &m)
		}
	}
	return nil
}

func (in *inspector) track(m *recording.Message) {
	b := &in.batch
	key := streamKey{topic: string(b.Topic), rank: -1}
	if key.topic == "" {
		key.topic = "source " + m.Source + " " + m.Peer
	}
	if b.HasDPRank {
		key.rank = b.DPRank
	}
	s := in.streams[key]
	if s == nil {
		s = &streamSeqs{seqs: map[uint64]struct{}{}}
		in.streams[key] = s
	}
	if s.lastFile == in.files && len(s.seqs) > 0 && b.Seq < s.last {
		s.restarts++
	}
	s.last, s.lastFile = b.Seq, in.files
	s.seqs[b.Seq] = struct{}{}
}

func (in *inspector) counts() (stored, removed, cleared int) {
	for i := range in.batch.Events {
		switch in.batch.Events[i].Kind {
		case events.KindBlockStored:
			stored++
		case events.KindBlockRemoved:
			removed++
		case events.KindAllBlocksCleared:
			cleared++
		}
	}
	return stored, removed, cleared
}

func (in *inspector) printLine(path string, m *recording.Message) {
	b := &in.batch
	stored, removed, cleared := in.counts()
	rank := "-"
	if b.HasDPRank {
		rank = strconv.Itoa(b.DPRank)
	}
	topic := string(b.Topic)
	if topic == "" {
		topic = `""`
	}
	kind := "live"
	if m.Replay {
		kind = "replay"
	}
	l := fmt.Appendf(in.line[:0], "%s:%d %s %s seq=%d rank=%s BlockStored=%d BlockRemoved=%d AllBlocksCleared=%d skipped=%d unknown_fields=%d",
		path, m.Index, kind, topic, b.Seq, rank, stored, removed, cleared, b.Skipped, b.UnknownFields)
	if len(b.SkippedTypes) > 0 {
		l = append(l, " skipped_types="...)
		l = appendNameCounts(l, b.SkippedTypes)
	}
	if len(b.UnknownFieldNames) > 0 {
		l = append(l, " unknown_field_names="...)
		l = appendNameCounts(l, b.UnknownFieldNames)
	}
	in.line = append(l, '\n')
	in.emit(in.line)
}

func (in *inspector) printJSON(path string, m *recording.Message) {
	b := &in.batch
	l := in.line[:0]
	l = append(l, `{"file":`...)
	l = appendJSONString(l, path)
	l = append(l, `,"record":`...)
	l = strconv.AppendInt(l, int64(m.Index), 10)
	l = append(l, `,"recv_ts_ns":`...)
	if m.RecvTime.IsZero() {
		l = append(l, "null"...)
	} else {
		l = strconv.AppendInt(l, m.RecvTime.UnixNano(), 10)
	}
	l = append(l, `,"source":`...)
	l = appendJSONString(l, m.Source)
	l = append(l, `,"replay":`...)
	l = strconv.AppendBool(l, m.Replay)
	l = append(l, `,"topic":`...)
	l = appendJSONString(l, string(b.Topic))
	l = append(l, `,"seq":`...)
	l = querybody.AppendHash(l, b.Seq)
	l = append(l, `,"ts":`...)
	l = appendFloat(l, b.TS)
	l = append(l, `,"dp_rank":`...)
	if b.HasDPRank {
		l = strconv.AppendInt(l, int64(b.DPRank), 10)
	} else {
		l = append(l, "null"...)
	}
	l = append(l, `,"skipped":`...)
	l = strconv.AppendInt(l, int64(b.Skipped), 10)
	l = append(l, `,"unknown_fields":`...)
	l = strconv.AppendInt(l, int64(b.UnknownFields), 10)
	if len(b.SkippedTypes) > 0 {
		l = append(l, `,"skipped_types":`...)
		l = appendNameCounts(l, b.SkippedTypes)
	}
	if len(b.UnknownFieldNames) > 0 {
		l = append(l, `,"unknown_field_names":`...)
		l = appendNameCounts(l, b.UnknownFieldNames)
	}
	l = append(l, `,"events":[`...)
	for i := range b.Events {
		if i > 0 {
			l = append(l, ',')
		}
		l = appendEventJSON(l, &b.Events[i])
	}
	l = append(l, "]}\n"...)
	in.line = l
	in.emit(l)
}

// appendEventJSON writes one event; hashes are decimal strings (exact for
// every uint64, in JavaScript too), tokens JSON integers.
func appendEventJSON(l []byte, e *events.Event) []byte {
	l = append(l, `{"type":`...)
	l = appendJSONString(l, e.Kind.String())
	if e.Kind == events.KindAllBlocksCleared {
		return append(l, '}')
	}
	l = append(l, `,"block_hashes":`...)
	l = querybody.AppendHashes(l, e.BlockHashes)
	if e.Kind == events.KindBlockStored {
		l = append(l, `,"parent_block_hash":`...)
		if e.HasParent {
			l = querybody.AppendHash(l, e.ParentHash)
		} else {
			l = append(l, "null"...)
		}
		l = append(l, `,"token_ids":[`...)
		for i, t := range e.TokenIDs {
			if i > 0 {
				l = append(l, ',')
			}
			l = strconv.AppendUint(l, uint64(t), 10)
		}
		l = append(l, `],"block_size":`...)
		l = strconv.AppendInt(l, int64(e.BlockSize), 10)
	}
	l = append(l, `,"medium":`...)
	l = appendJSONString(l, e.Medium.String())
	if e.Kind == events.KindBlockStored {
		l = append(l, `,"lora_id":`...)
		if e.HasLoRAID {
			l = strconv.AppendInt(l, e.LoRAID, 10)
		} else {
			l = append(l, "null"...)
		}
		l = append(l, `,"lora_name":`...)
		if len(e.LoRAName) > 0 {
			l = appendJSONString(l, string(e.LoRAName))
		} else {
			l = append(l, "null"...)
		}
	}
	// The fields of current vLLM, written only when an event has them, so
	// that the lines of older publishers' events stay as they were.
	if e.HasGroupIdx {
		l = append(l, `,"group_idx":`...)
		l = strconv.AppendInt(l, e.GroupIdx, 10)
	}
	if e.SpecKind != events.SpecNone {
		l = append(l, `,"kv_cache_spec_kind":`...)
		l = appendJSONString(l, e.SpecKind.String())
	}
	if e.SlidingWindow != 0 {
		l = append(l, `,"kv_cache_spec_sliding_window":`...)
		l = strconv.AppendInt(l, e.SlidingWindow, 10)
	}
	if e.Locality != events.LocalityNone {
		l = append(l, `,"locality":`...)
		l = appendJSONString(l, e.Locality.String())
	}
	if len(e.Ownership) > 0 {
		l = append(l, `,"ownership":`...)
		l = appendJSONString(l, string(e.Ownership))
	}
	if len(e.SessionID) > 0 {
		l = append(l, `,"session_id":`...)
		l = appendJSONString(l, string(e.SessionID))
	}
	if len(e.RemainingCopies) > 0 {
		l = append(l, `,"remaining_copy_counts":[`...)
		for i, c := range e.RemainingCopies {
			if i > 0 {
				l = append(l, ',')
			}
			l = strconv.AppendUint(l, c, 10)
		}
		l = append(l, ']')
	}
	return append(l, '}')
}

// appendNameCounts writes the names of unknown event types or fields as a
// JSON object of name: count. The names are a publisher's bytes; invalid
// UTF-8 in them is written as U+FFFD.
func appendNameCounts(l []byte, names []events.NameCount) []byte {
	l = append(l, '{')
	for i, n := range names {
		if i > 0 {
			l = append(l, ',')
		}
		l = appendJSONString(l, string(n.Name))
		l = append(l, ':')
		l = strconv.AppendInt(l, int64(n.Count), 10)
	}
	return append(l, '}')
}

// appendJSONString appends s as a JSON string.
func appendJSONString(l []byte, s string) []byte {
	q, err := json.Marshal(s)
	if err != nil { // a string always marshals
		return append(l, `""`...)
	}
	return append(l, q...)
}

func appendFloat(l []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(l, "null"...)
	}
	return strconv.AppendFloat(l, f, 'f', -1, 64)
}

// gap is a run of missing seqs, first..last.
type gap struct{ first, last uint64 }

type streamSummary struct {
	key         streamKey
	batches     int
	first, last uint64
	gaps        []gap
	missing     uint64
	restarts    int
}

func (in *inspector) summarize() []streamSummary {
	var out []streamSummary
	for key, s := range in.streams {
		seqs := make([]uint64, 0, len(s.seqs))
		for q := range s.seqs {
			seqs = append(seqs, q)
		}
		slices.Sort(seqs)
		sum := streamSummary{key: key, batches: len(seqs), first: seqs[0], last: seqs[len(seqs)-1], restarts: s.restarts}
		for i := 1; i < len(seqs); i++ {
			if seqs[i] != seqs[i-1]+1 {
				g := gap{seqs[i-1] + 1, seqs[i] - 1}
				sum.gaps = append(sum.gaps, g)
				sum.missing += g.last - g.first + 1
			}
		}
		out = append(out, sum)
	}
	slices.SortFunc(out, func(a, b streamSummary) int {
		return cmp.Or(cmp.Compare(a.key.topic, b.key.topic), cmp.Compare(a.key.rank, b.key.rank))
	})
	return out
}

func (in *inspector) summary() {
	sums := in.summarize()
	if in.json {
		l := fmt.Appendf(nil, `{"summary":{"files":%d,"unreadable_files":%d,"records":%d,"batches":%d,"failed":%d,"streams":[`,
			in.files, in.unreadable, in.records, in.batches, in.failed)
		for i, s := range sums {
			if i > 0 {
				l = append(l, ',')
			}
			l = append(l, `{"topic":`...)
			l = appendJSONString(l, s.key.topic)
			l = append(l, `,"dp_rank":`...)
			if s.key.rank >= 0 {
				l = strconv.AppendInt(l, int64(s.key.rank), 10)
			} else {
				l = append(l, "null"...)
			}
			l = fmt.Appendf(l, `,"batches":%d,"first_seq":"%d","last_seq":"%d","missing":%d,"restarts":%d,"gaps":[`,
				s.batches, s.first, s.last, s.missing, s.restarts)
			for j, g := range s.gaps {
				if j > 0 {
					l = append(l, ',')
				}
				l = fmt.Appendf(l, `["%d","%d"]`, g.first, g.last)
			}
			l = append(l, "]}"...)
		}
		l = append(l, "]}}\n"...)
		in.emit(l)
		return
	}
	l := fmt.Appendf(nil, "summary: %d files, %d records, %d batches, %d failed", in.files, in.records, in.batches, in.failed)
	if in.unreadable > 0 {
		l = fmt.Appendf(l, ", %d files unreadable", in.unreadable)
	}
	l = append(l, '\n')
	for _, s := range sums {
		rank := "-"
		if s.key.rank >= 0 {
			rank = strconv.Itoa(s.key.rank)
		}
		l = fmt.Appendf(l, "  %s rank=%s: %d batches, seq %d..%d, ", s.key.topic, rank, s.batches, s.first, s.last)
		if len(s.gaps) == 0 {
			l = append(l, "no gaps"...)
		} else {
			l = fmt.Appendf(l, "%d missing in gaps", s.missing)
			for _, g := range s.gaps {
				if g.first == g.last {
					l = fmt.Appendf(l, " %d", g.first)
				} else {
					l = fmt.Appendf(l, " %d..%d", g.first, g.last)
				}
			}
		}
		if s.restarts > 0 {
			l = fmt.Appendf(l, ", seq went back %d times (publisher restarts)", s.restarts)
		}
		l = append(l, '\n')
	}
	in.emit(l)
}
