package indexer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/events/recording"
)

// Recorded holds the batches of recordings, by pod, ready to apply.
type Recorded struct {
	// Pods maps each pod to its batches in seq order, each seq once.
	Pods map[string][]*events.Batch
	// Sources maps each pod to what identifies it when its topic does not.
	Sources map[string]Source
	// Messages counts messages read; Duplicates those already read from
	// another file (a live recording and a replay of the same stream).
	Messages   int
	Duplicates int
	// TornTails lists files that end inside a record (still being written).
	TornTails []string
	// Ranks holds the data-parallel ranks seen on each topic, so that pods
	// are named as if every rank had been seen from the start.
	Ranks map[string]uint64
}

type recordedBatch struct {
	batch   *events.Batch
	payload []byte
}

// ReadRecordings reads and decodes every message of the recordings at paths
// (native or JSONL). Batches are grouped by pod, ordered by seq, and a
// batch present in several files is kept once. A message that does not
// decode, or a seq that comes twice with different payloads (an engine
// restart inside the recording), is an error that names file and record.
// Publishers whose topic names no pod are named by their source endpoint,
// or by the file when the recording does not say, and serve defaultModel.
func ReadRecordings(paths []string, defaultModel string) (*Recorded, error) {
	rec := &Recorded{Pods: make(map[string][]*events.Batch), Sources: make(map[string]Source), Ranks: make(map[string]uint64)}
	var read []readBatch
	for _, path := range paths {
		var err error
		if read, err = rec.read(path, defaultModel, read); err != nil {
			return nil, err
		}
	}
	for _, rb := range read {
		if _, _, ok := events.ParseTopic(rb.batch.Topic); ok {
			rec.Ranks[string(rb.batch.Topic)] |= rankBit(rb.batch.DPRank)
		}
	}
	bySeq := make(map[string]map[uint64]recordedBatch)
	for _, rb := range read {
		b := rb.batch
		name, _ := appendName(nil, b.Topic, b.DPRank, rb.src, rec.Ranks[string(b.Topic)])
		pod := string(name)
		rec.Sources[pod] = rb.src
		seqs := bySeq[pod]
		if seqs == nil {
			seqs = make(map[uint64]recordedBatch)
			bySeq[pod] = seqs
		}
		if prev, ok := seqs[b.Seq]; ok {
			if !bytes.Equal(prev.payload, rb.payload) {
				return nil, fmt.Errorf("%s record %d: pod %s seq %d was read before with a different payload (did the engine restart inside the recording?)", rb.path, rb.index, pod, b.Seq)
			}
			rec.Duplicates++
			continue
		}
		seqs[b.Seq] = recordedBatch{batch: b, payload: rb.payload}
	}
	for pod, seqs := range bySeq {
		batches := make([]*events.Batch, 0, len(seqs))
		for _, rb := range seqs {
			batches = append(batches, rb.batch)
		}
		sort.Slice(batches, func(i, j int) bool { return batches[i].Seq < batches[j].Seq })
		rec.Pods[pod] = batches
	}
	return rec, nil
}

// readBatch is one decoded message of a recording, and where it was read.
type readBatch struct {
	batch   *events.Batch
	payload []byte
	src     Source
	path    string
	index   int
}

// read appends the decoded messages of one recording to out.
func (rec *Recorded) read(path, defaultModel string, out []readBatch) ([]readBatch, error) {
	r, err := recording.Open(path)
	if err != nil {
		return out, err
	}
	defer func() { _ = r.Close() }() // read-only: nothing to lose
	for m, err := range r.All() {
		if errors.Is(err, recording.ErrTornTail) {
			rec.TornTails = append(rec.TornTails, path)
			break
		}
		if err != nil {
			return out, fmt.Errorf("%s: %w", path, err)
		}
		rec.Messages++
		b := new(events.Batch)
		if err := events.Decode(m.Topic, m.Seq, m.Payload, b); err != nil {
			return out, fmt.Errorf("%s record %d: %w", path, m.Index, err)
		}
		src := Source{Pod: m.Source, Model: defaultModel}
		if src.Pod == "" {
			src.Pod = path
		}
		out = append(out, readBatch{batch: b, payload: bytes.Clone(m.Payload), src: src, path: path, index: m.Index})
	}
	return out, nil
}

// ApplyRecorded applies recorded batches: each pod's in order, pods in
// parallel. A batch the indexer refuses (RefusedError: a name that is not
// valid, a limit reached) is skipped and counted in the result by reason;
// any other error stops its pod's batches and is returned, the first one.
func (ix *Indexer) ApplyRecorded(ctx context.Context, rec *Recorded) (refused map[string]int, err error) {
	var (
		wg sync.WaitGroup
		mu sync.Mutex // protects refused and err
	)
	refused = make(map[string]int)
	for topic, mask := range rec.Ranks {
		ix.seeRanks([]byte(topic), mask)
	}
	for pod, batches := range rec.Pods {
		wg.Go(func() {
			for _, b := range batches {
				_, aerr := ix.Apply(ctx, b, rec.Sources[pod])
				if aerr == nil {
					continue
				}
				mu.Lock()
				reason := RefusedReason(aerr)
				if reason != "" {
					refused[reason]++
				} else if err == nil {
					err = aerr
				}
				mu.Unlock()
				if reason == "" {
					return
				}
			}
		})
	}
	wg.Wait()
	return refused, err
}
