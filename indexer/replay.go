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
	rec := &Recorded{Pods: make(map[string][]*events.Batch), Sources: make(map[string]Source)}
	bySeq := make(map[string]map[uint64]recordedBatch)
	for _, path := range paths {
		if err := rec.read(path, defaultModel, bySeq); err != nil {
			return nil, err
		}
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

func (rec *Recorded) read(path, defaultModel string, bySeq map[string]map[uint64]recordedBatch) error {
	r, err := recording.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = r.Close() }() // read-only: nothing to lose
	for m, err := range r.All() {
		if errors.Is(err, recording.ErrTornTail) {
			rec.TornTails = append(rec.TornTails, path)
			break
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		rec.Messages++
		b := new(events.Batch)
		if err := events.Decode(m.Topic, m.Seq, m.Payload, b); err != nil {
			return fmt.Errorf("%s record %d: %w", path, m.Index, err)
		}
		src := Source{Pod: m.Source, Model: defaultModel}
		if src.Pod == "" {
			src.Pod = path
		}
		pod, _ := PodName(b.Topic, b.DPRank, src)
		rec.Sources[pod] = src
		seqs := bySeq[pod]
		if seqs == nil {
			seqs = make(map[uint64]recordedBatch)
			bySeq[pod] = seqs
		}
		if prev, ok := seqs[b.Seq]; ok {
			if !bytes.Equal(prev.payload, m.Payload) {
				return fmt.Errorf("%s record %d: pod %s seq %d was read before with a different payload (did the engine restart inside the recording?)", path, m.Index, pod, b.Seq)
			}
			rec.Duplicates++
			continue
		}
		seqs[b.Seq] = recordedBatch{batch: b, payload: bytes.Clone(m.Payload)}
	}
	return nil
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
	for pod, batches := range rec.Pods {
		wg.Go(func() {
			for _, b := range batches {
				aerr := ix.Apply(ctx, b, rec.Sources[pod])
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
