package indexer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/store"
)

// Indexer applies replicas' KV events to a store and answers prefix queries.
//
// The store owns what must outlive this process or be shared with other
// prefixd replicas using it: each pod's applied seq, stale mark and
// tokens-mode engine-hash map, each model's key mode and adapters. The
// indexer keeps what is derived or local: hashers, metric series, the
// batches held while a model's key mode is undecided.
//
// Apply is safe for concurrent use by different pods; the batches of one pod
// must be applied in publish order, by one goroutine at a time (the pod's
// lock makes overlapping calls safe but cannot restore an order the caller
// lost). Match is safe for concurrent use with everything.
//
// Lock order: model.mu, then pod.mu, then loraMu; ix.mu is never taken
// while a pod's lock is held (and the store's own locks come last), so
// Pods, which reads the pods under ix.mu, cannot wait on an Apply that
// waits on it.
type Indexer struct {
	store   store.Store
	sizer   cacheSizer // store, when it shares capacity by cache size; else nil
	opts    Options
	metrics *Metrics
	log     *slog.Logger

	mu     sync.RWMutex // protects pods, models and topics
	pods   map[string]*pod
	models map[string]*model
	// topics holds the ranks seen on each kv@ topic (names.go).
	topics map[string]uint64

	loraMu sync.RWMutex      // protects loras
	loras  map[string]string // adapter name -> base model name, as the store has them

	// typeNames and fieldNames are the unknown event types and fields
	// counted by name so far (groups.go).
	typeNames, fieldNames skippedNames
}

// cacheSizer is a store that, when full, takes room first from pods
// holding more blocks than their own KV cache has (memory.Store).
type cacheSizer interface {
	SetCacheBlocks(pod string, blocks int)
}

// pod is one holder of blocks: a replica, or one data-parallel rank of it.
type pod struct {
	name  string
	model *model

	mu        sync.Mutex // serializes applies to this pod; protects the fields below
	lastEvent time.Time
	b         batcher  // turns event batches into store batches
	buf       []uint64 // hash check scratch
	// staleSeries is set once the pod's prefixd_pod_stale series exists: a
	// pod never stale has none, so that a fleet costs the series its
	// trouble needs.
	staleSeries atomic.Bool
	// lost is set when a batch held for an undecided key mode could not be
	// applied: the store's applied seq is then behind what the caller was
	// told, and the next Apply says so (ErrBehind) instead of applying.
	lost bool
	// events counts the pod's events by Kind, each series created when the
	// pod's first event of that kind comes, so that a pod costs the series
	// it uses and no more.
	events [events.KindAllBlocksCleared + 1]prometheus.Counter
	// groups is what its events said of its KV cache groups (groups.go);
	// groupKinds has bit k set once a group of kind k was named.
	groups     groups
	groupKinds uint32
	// stored counts BlockStored blocks by kind and outcome (groups.go).
	stored [events.NumSpecKinds][2]prometheus.Counter
	// blockSize is the block size of its last full-attention BlockStored.
	blockSize int
}

// countEvents counts n events of kind k.
func (p *pod) countEvents(ix *Indexer, k events.Kind, n int) {
	if int(k) >= len(p.events) || n == 0 {
		return
	}
	c := p.events[k]
	if c == nil {
		c = ix.metrics.events.WithLabelValues(k.String(), p.name)
		p.events[k] = c
	}
	c.Add(float64(n))
}

// ErrBehind is returned by Apply when batches the indexer accepted earlier
// (held while the model's key mode was undecided) could not be written to
// the store: the pod's applied seq in the store is behind, and its batches
// must be applied again from there (a gap).
var ErrBehind = errors.New("the store's applied seq of the pod is behind the batches accepted")

// New returns an Indexer over st, with the model state st already holds.
// metrics may be nil (NewMetrics(nil) is used).
func New(st store.Store, opts Options, metrics *Metrics, log *slog.Logger) (*Indexer, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sizer, _ := st.(cacheSizer)
	ix := &Indexer{
		store:   st,
		sizer:   sizer,
		opts:    opts,
		metrics: metrics,
		log:     log,
		pods:    make(map[string]*pod),
		models:  make(map[string]*model),
		topics:  make(map[string]uint64),
		loras:   make(map[string]string),
	}
	ctx := context.Background()
	for name, mo := range opts.Models {
		m, err := ix.model(ctx, name)
		if err != nil {
			return nil, err
		}
		for _, l := range mo.LoRAs {
			if err := ix.learnLoRA(ctx, []byte(l), m.name); err != nil {
				return nil, err
			}
		}
	}
	if err := ix.loadLoRAs(ctx); err != nil {
		return nil, err
	}
	return ix, nil
}

// Source identifies a publisher whose topic names no pod or model: its
// endpoint, and the model it serves when known.
type Source struct {
	Pod   string
	Model string
}

// pod returns the pod of a batch with this topic and rank from src,
// creating it for its model (the default model when it names none). A pod
// that does not exist yet is refused (RefusedError) when a name is not a
// valid label or MaxPods pods are known. displaced is the name of a pod
// the batch's rank showed to be misnamed (names.go), already forgotten.
func (ix *Indexer) pod(ctx context.Context, topic []byte, rank int, src Source) (p *pod, displaced string, err error) {
	var buf [128]byte
	nameBytes, modelBytes := appendName(buf[:0], topic, rank, src, ix.ranks(topic))
	ix.mu.RLock()
	p = ix.pods[string(nameBytes)] // no allocation: the conversion is only a map key
	ix.mu.RUnlock()
	if p != nil {
		return p, "", nil
	}
	if err := events.CheckLabel(nameBytes); err != nil {
		return nil, "", ix.refuse(RefuseInvalidPod, "pod %s: %w", events.Quote(nameBytes), err)
	}
	modelName := ix.opts.DefaultModel
	if len(modelBytes) > 0 {
		if err := events.CheckLabel(modelBytes); err != nil {
			return nil, "", ix.refuse(RefuseInvalidModel, "model %s of pod %s: %w", events.Quote(modelBytes), nameBytes, err)
		}
		modelName = string(modelBytes)
	}
	m, err := ix.model(ctx, modelName)
	if err != nil {
		return nil, "", err
	}
	if displaced = ix.seeRank(topic, rank); displaced != "" {
		ix.log.Info("several data-parallel ranks share a topic: the rank that had it alone is renamed", "topic", string(topic), "pod", displaced)
		if err := ix.RemovePod(ctx, displaced); err != nil {
			return nil, displaced, err
		}
		nameBytes, _ = appendName(buf[:0], topic, rank, src, ix.ranks(topic))
	}
	name := string(nameBytes)
	ix.mu.Lock()
	if p = ix.pods[name]; p != nil {
		ix.mu.Unlock()
		return p, displaced, nil
	}
	if len(ix.pods) >= ix.opts.MaxPods {
		ix.mu.Unlock()
		return nil, displaced, ix.refuse(RefuseMaxPods, "pod %s: %d pods are known, the limit (--max-pods)", name, ix.opts.MaxPods)
	}
	p = &pod{name: name, model: m}
	ix.pods[name] = p
	m.pods.Add(1)
	ix.mu.Unlock()
	if ix.sizer != nil && m.opts.CacheBlocks > 0 {
		ix.sizer.SetCacheBlocks(name, m.opts.CacheBlocks)
	}
	ix.log.Debug("new pod", "pod", name, "model", m.name)
	return p, displaced, nil
}

// AdmitPod returns the name of the pod of a batch with this topic and
// data-parallel rank from src, and creates the pod unless it is refused:
// a RefusedError when a name is not valid or MaxPods pods are known.
// Callers that keep state per pod call it before keeping any. displaced
// names a pod the batch showed to be misnamed and that was forgotten
// (see the package documentation on names): its state goes too.
func (ix *Indexer) AdmitPod(ctx context.Context, topic []byte, rank int, src Source) (name, displaced string, err error) {
	p, displaced, err := ix.pod(ctx, topic, rank, src)
	if err != nil {
		return "", displaced, err
	}
	return p.name, displaced, nil
}

// refuse counts a refused batch and returns its RefusedError.
func (ix *Indexer) refuse(reason, format string, a ...any) error {
	ix.metrics.refused.WithLabelValues(reason).Inc()
	return refuse(reason, format, a...)
}

// Applied is what Apply did with a batch.
type Applied struct {
	// Seq is the pod's applied seq after the call, as the caller should
	// track it: the store's, or the batch's when it is Held.
	Seq uint64
	// Duplicate is set when the store had applied the batch's seq already
	// (a replay overlapping, another replica first): nothing changed.
	Duplicate bool
	// Held is set when the batch is held until its model's key mode is
	// decided (key mode auto): it applies then, before any later batch of
	// the model.
	Held bool
}

// Apply applies one batch as one store batch: its events, and the pod's
// applied seq with them. The batch's topic names the pod and model; src
// names them when the topic does not. Seqs are the caller's to order: the
// store ignores a batch at or below the pod's applied seq (Duplicate) and
// otherwise records the batch's, gaps and all (see Reset, AppliedSeq).
// Errors: a RefusedError (nothing of the batch applied), ErrBehind, or the
// store's (the applied seq did not move).
func (ix *Indexer) Apply(ctx context.Context, b *events.Batch, src Source) (Applied, error) {
	p, _, err := ix.pod(ctx, b.Topic, b.DPRank, src)
	if err != nil {
		return Applied{}, err
	}
	if err := ix.checkLoRAs(b); err != nil {
		return Applied{}, err
	}
	if p.model.mode() == KeyModeAuto {
		return ix.applyAuto(ctx, p, b)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return ix.applyLocked(ctx, p, p.model.mode(), b)
}

// applyLocked applies b to pod p in key mode mode. p.mu is held.
func (ix *Indexer) applyLocked(ctx context.Context, p *pod, mode KeyMode, b *events.Batch) (Applied, error) {
	if p.lost {
		p.lost = false
		return Applied{}, fmt.Errorf("pod %s: %w", p.name, ErrBehind)
	}
	sb, err := p.b.build(ctx, ix, p, mode, b)
	if err != nil {
		return Applied{}, fmt.Errorf("pod %s seq %d: %w", p.name, b.Seq, err)
	}
	res, err := ix.store.Apply(ctx, p.name, sb)
	if err != nil {
		return Applied{}, fmt.Errorf("pod %s seq %d: %w", p.name, b.Seq, err)
	}
	if res.Duplicate {
		return Applied{Seq: res.AppliedSeq, Duplicate: true}, nil
	}
	p.lastEvent = time.Now()
	p.b.count(ix, p, b, res)
	for i := range b.Events {
		if l := b.Events[i].LoRAName; len(l) > 0 {
			if err := ix.learnLoRA(ctx, l, p.model.name); err != nil {
				ix.log.Warn("adapter not recorded in the store", "lora", string(l), "model", p.model.name, "err", err)
			}
		}
	}
	return Applied{Seq: res.AppliedSeq}, nil
}

// checkLoRAs refuses a batch whose events name an adapter by a name that
// is not valid (events.CheckName): nothing of it is applied.
func (ix *Indexer) checkLoRAs(b *events.Batch) error {
	for i := range b.Events {
		if l := b.Events[i].LoRAName; len(l) > 0 {
			if err := events.CheckName(l); err != nil {
				return ix.refuse(RefuseInvalidLoRA, "event %d: lora_name %s: %w", i, events.Quote(l), err)
			}
		}
	}
	return nil
}

func (ix *Indexer) drop(reason string, n int) {
	if n > 0 {
		ix.metrics.dropped.WithLabelValues(reason).Add(float64(n))
	}
}

func tierOf(m events.Medium) store.Tier {
	switch m {
	case events.MediumGPU:
		return store.TierGPU
	case events.MediumCPU, events.MediumCPUPinned:
		return store.TierCPU
	default:
		return store.TierDisk
	}
}

// AppliedSeq returns the seq through which the store has a pod's batches
// applied, and false when it has none (a pod never seen, or reset).
func (ix *Indexer) AppliedSeq(ctx context.Context, podName string) (uint64, bool, error) {
	return ix.store.AppliedSeq(ctx, podName)
}

// Reset drops every block of a pod and its applied seq, as when its
// engine restarted (its seq went backwards). The pod stays known.
func (ix *Indexer) Reset(ctx context.Context, podName string) error {
	ix.mu.RLock()
	p := ix.pods[podName]
	ix.mu.RUnlock()
	if p == nil {
		return nil
	}
	ix.dropPending(p)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lost = false
	p.groups.reset()
	ix.metrics.clears.WithLabelValues("reset").Inc()
	return ix.store.ForgetPod(ctx, podName)
}

// RemovePod forgets a pod that left the fleet, with all its blocks (in
// time proportional to them), its state in the store and its series of
// prefixd_events_total and prefixd_pod_stale. A later batch of the same
// name starts a new pod.
func (ix *Indexer) RemovePod(ctx context.Context, podName string) error {
	ix.mu.Lock()
	p := ix.pods[podName]
	delete(ix.pods, podName)
	if p != nil {
		p.model.pods.Add(-1)
		// Under ix.mu, so that SetStale cannot set the gauge again once
		// it is deleted.
		for k := range p.events {
			ix.metrics.events.DeleteLabelValues(events.Kind(k).String(), podName)
		}
		ix.metrics.stale.DeleteLabelValues(podName)
	}
	ix.mu.Unlock()
	if p != nil {
		p.mu.Lock()
		ix.deleteGroupSeries(p)
		p.mu.Unlock()
	}
	if p == nil {
		return nil
	}
	if ix.sizer != nil {
		ix.sizer.SetCacheBlocks(podName, 0)
	}
	ix.dropPending(p)
	p.mu.Lock()
	defer p.mu.Unlock()
	ix.metrics.clears.WithLabelValues("removed").Inc()
	return ix.store.ForgetPod(ctx, podName)
}

// dropPending drops the batches of pod p held while its model's key mode
// is undecided: applied once it is decided, they would add back blocks
// that a reset or a removal cleared.
func (ix *Indexer) dropPending(p *pod) {
	m := p.model
	m.mu.Lock()
	m.pending = slices.DeleteFunc(m.pending, func(pb pendingBatch) bool { return pb.pod == p })
	m.mu.Unlock()
}

// SetStale marks a pod as stale (its events are known to be incomplete) or
// consistent again, in the store and in prefixd_pod_stale.
func (ix *Indexer) SetStale(ctx context.Context, podName string, stale bool) error {
	v := 0.0
	if stale {
		v = 1
	}
	// The gauge is set under ix.mu so that it is not set again for a pod
	// RemovePod has just forgotten.
	// Under ix.mu, so that neither the gauge nor the store's mark outlives
	// a RemovePod that has just forgotten the pod.
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	p := ix.pods[podName]
	if p == nil {
		return nil
	}
	if stale || p.staleSeries.Load() {
		ix.metrics.stale.WithLabelValues(podName).Set(v)
		p.staleSeries.Store(true)
	}
	return ix.store.SetStale(ctx, podName, stale)
}

// PodStatus describes one pod the indexer or its store knows.
type PodStatus struct {
	Name string
	// Model is "" for a pod the store knows and this process has not seen
	// (another replica's).
	Model  string
	Blocks int
	// Seq is the seq of the last batch the store applied, when HasSeq.
	Seq    uint64
	HasSeq bool
	// LastEvent is when this process last applied a batch of the pod.
	LastEvent time.Time
	Stale     bool
	// Evicted counts the pod's blocks the store forgot to make room since
	// the pod was last cleared; Incomplete is set while it is above 0.
	Evicted    int
	Incomplete bool
}

// Pods lists the pods known here or in the store, sorted by name.
func (ix *Indexer) Pods(ctx context.Context) ([]PodStatus, error) {
	type local struct {
		model string
		last  time.Time
	}
	ix.mu.RLock()
	here := make(map[string]local, len(ix.pods))
	for _, p := range ix.pods {
		p.mu.Lock()
		here[p.name] = local{p.model.name, p.lastEvent}
		p.mu.Unlock()
	}
	ix.mu.RUnlock()
	infos, err := ix.store.Pods(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]PodStatus, 0, max(len(here), len(infos)))
	for _, in := range infos {
		l, ok := here[in.Name]
		delete(here, in.Name)
		if !ok && in.Blocks == 0 && !in.HasSeq {
			continue // state of a pod no process serves
		}
		out = append(out, PodStatus{
			Name: in.Name, Model: l.model, Blocks: in.Blocks, Seq: in.AppliedSeq, HasSeq: in.HasSeq,
			LastEvent: l.last, Stale: in.Stale, Evicted: in.Evicted, Incomplete: in.Evicted > 0,
		})
	}
	for name, l := range here {
		out = append(out, PodStatus{Name: name, Model: l.model, LastEvent: l.last})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// learnLoRA records in the store that adapter name is served on top of
// base, unless it is the model itself or MaxLoRAs adapters are known
// (counted). The caller may hold a pod's lock: loraMu comes after it.
func (ix *Indexer) learnLoRA(ctx context.Context, name []byte, base string) error {
	ix.loraMu.RLock()
	_, ok := ix.loras[string(name)] // no allocation: map index by converted bytes
	full := len(ix.loras) >= ix.opts.MaxLoRAs
	ix.loraMu.RUnlock()
	if ok || len(name) == 0 || bytes.Equal(name, []byte(base)) {
		return nil
	}
	if full {
		ix.metrics.lorasUnlearned.Inc()
		return nil
	}
	kept, err := ix.store.AddLoRA(ctx, string(name), base)
	if err != nil {
		return err
	}
	ix.loraMu.Lock()
	defer ix.loraMu.Unlock()
	if len(ix.loras) >= ix.opts.MaxLoRAs {
		ix.metrics.lorasUnlearned.Inc()
		return nil
	}
	ix.loras[string(name)] = kept
	return nil
}

// loadLoRAs takes in the adapters the store knows (other replicas').
func (ix *Indexer) loadLoRAs(ctx context.Context) error {
	models, err := ix.store.Models(ctx)
	if err != nil {
		return err
	}
	ix.loraMu.Lock()
	defer ix.loraMu.Unlock()
	for base, st := range models {
		for _, l := range st.LoRAs {
			if len(ix.loras) < ix.opts.MaxLoRAs {
				ix.loras[l] = base
			}
		}
	}
	return nil
}
