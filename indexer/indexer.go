package indexer

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/store"
)

// Indexer applies replicas' KV events to a store and answers prefix queries.
//
// Apply is safe for concurrent use by different pods; the batches of one pod
// must be applied in publish order, by one goroutine at a time (the pod's
// lock makes overlapping calls safe but cannot restore an order the caller
// lost). Match is safe for concurrent use with everything.
//
// Lock order: model.mu, then pod.mu, then loraMu; ix.mu, then pod.mu. No
// goroutine holding a pod's lock takes ix.mu, so Pods (which holds ix.mu
// while it reads each pod) cannot wait on an Apply that waits on it.
type Indexer struct {
	store   store.Store
	chainer store.Chainer // store, when it keeps chains together; else nil
	sizer   cacheSizer    // store, when it shares capacity by cache size; else nil
	opts    Options
	metrics *Metrics
	log     *slog.Logger

	mu     sync.RWMutex // protects pods and models
	pods   map[string]*pod
	models map[string]*model

	loraMu sync.RWMutex      // protects loras
	loras  map[string]string // adapter name -> base model name
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
	seq       uint64
	hasSeq    bool
	lastEvent time.Time
	stale     atomic.Bool
	// keys maps engine hash -> own key in tokens mode, with the tiers the
	// pod holds the block on.
	keys map[uint64]ownKey
	// scratch reused across events.
	buf []uint64
	// events counts the pod's events by Kind, each series created when the
	// pod's first event of that kind comes, so that a pod costs the series
	// it uses and no more.
	events [events.KindAllBlocksCleared + 1]prometheus.Counter
	// lora is the last adapter name that passed events.CheckName.
	lora []byte
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

type ownKey struct {
	key   uint64
	tiers uint8
}

// New returns an Indexer over st. metrics may be nil (NewMetrics(nil) is used).
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
	chainer, _ := st.(store.Chainer)
	sizer, _ := st.(cacheSizer)
	ix := &Indexer{
		store:   st,
		chainer: chainer,
		sizer:   sizer,
		opts:    opts,
		metrics: metrics,
		log:     log,
		pods:    make(map[string]*pod),
		models:  make(map[string]*model),
		loras:   make(map[string]string),
	}
	for name, mo := range opts.Models {
		m, err := ix.model(name)
		if err != nil {
			return nil, err
		}
		for _, l := range mo.LoRAs {
			ix.loras[l] = m.name
		}
	}
	return ix, nil
}

// Source identifies a publisher whose topic names no pod or model: its
// endpoint, and the model it serves when known.
type Source struct {
	Pod   string
	Model string
}

// PodName returns the holder name of a batch: the topic's ip:port, with
// "#<rank>" appended for data-parallel ranks above 0. Topics that are not
// kv@<pod>@<model> name the pod by src.
func PodName(topic []byte, rank int, src Source) (podName, modelName string) {
	var buf [128]byte
	name, model := appendPodName(buf[:0], topic, rank, src)
	return string(name), string(model)
}

// appendPodName appends a batch's holder name to dst; model is a view of
// topic, or src.Model's bytes.
func appendPodName(dst, topic []byte, rank int, src Source) (name, model []byte) {
	pod, model, ok := events.ParseTopic(topic)
	if ok {
		dst = append(dst, pod...)
	} else {
		dst = append(dst, src.Pod...)
		model = []byte(src.Model)
	}
	if rank > 0 {
		dst = append(dst, '#')
		dst = strconv.AppendInt(dst, int64(rank), 10)
	}
	return dst, model
}

// pod returns the pod named name, creating it for model modelName (the
// default model when empty). A pod that does not exist yet is refused
// (RefusedError) when a name is not a valid label or MaxPods pods are
// known.
func (ix *Indexer) pod(nameBytes, modelBytes []byte) (*pod, error) {
	ix.mu.RLock()
	p := ix.pods[string(nameBytes)] // no allocation: the conversion is only a map key
	ix.mu.RUnlock()
	if p != nil {
		return p, nil
	}
	if err := events.CheckLabel(nameBytes); err != nil {
		return nil, ix.refuse(RefuseInvalidPod, "pod %s: %w", events.Quote(nameBytes), err)
	}
	modelName := ix.opts.DefaultModel
	if len(modelBytes) > 0 {
		if err := events.CheckLabel(modelBytes); err != nil {
			return nil, ix.refuse(RefuseInvalidModel, "model %s of pod %s: %w", events.Quote(modelBytes), nameBytes, err)
		}
		modelName = string(modelBytes)
	}
	m, err := ix.model(modelName)
	if err != nil {
		return nil, err
	}
	name := string(nameBytes)
	ix.mu.Lock()
	if p = ix.pods[name]; p != nil {
		ix.mu.Unlock()
		return p, nil
	}
	if len(ix.pods) >= ix.opts.MaxPods {
		ix.mu.Unlock()
		return nil, ix.refuse(RefuseMaxPods, "pod %s: %d pods are known, the limit (--max-pods)", name, ix.opts.MaxPods)
	}
	p = &pod{name: name, model: m}
	ix.pods[name] = p
	ix.mu.Unlock()
	if ix.sizer != nil && m.opts.CacheBlocks > 0 {
		ix.sizer.SetCacheBlocks(name, m.opts.CacheBlocks)
	}
	ix.log.Debug("new pod", "pod", name, "model", m.name)
	return p, nil
}

// AdmitPod returns the name of the pod of a batch with this topic and
// data-parallel rank from src (see PodName), and creates the pod unless
// it is refused: a RefusedError when a name is not valid or MaxPods pods
// are known. Callers that keep state per pod call it before keeping any.
func (ix *Indexer) AdmitPod(topic []byte, rank int, src Source) (string, error) {
	var buf [128]byte
	name, modelName := appendPodName(buf[:0], topic, rank, src)
	p, err := ix.pod(name, modelName)
	if err != nil {
		return "", err
	}
	return p.name, nil
}

// refuse counts a refused batch and returns its RefusedError.
func (ix *Indexer) refuse(reason, format string, a ...any) error {
	ix.metrics.refused.WithLabelValues(reason).Inc()
	return refuse(reason, format, a...)
}

// Apply applies one batch. The batch's topic names the pod and model; src
// names them when the topic does not. The batch's seq is recorded, not
// checked: callers order batches and handle gaps and restarts (see Reset).
func (ix *Indexer) Apply(ctx context.Context, b *events.Batch, src Source) error {
	var buf [128]byte
	name, modelName := appendPodName(buf[:0], b.Topic, b.DPRank, src)
	p, err := ix.pod(name, modelName)
	if err != nil {
		return err
	}
	if err := ix.checkLoRAs(b); err != nil {
		return err
	}
	if p.model.mode() == KeyModeAuto {
		return ix.applyAuto(ctx, p, b)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return ix.applyLocked(ctx, p, p.model.mode(), b)
}

// applyLocked records the batch's seq and applies it. p.mu is held.
func (ix *Indexer) applyLocked(ctx context.Context, p *pod, mode KeyMode, b *events.Batch) error {
	p.seq, p.hasSeq = b.Seq, true
	p.lastEvent = time.Now()
	return ix.applyBatch(ctx, p, mode, b)
}

// applyBatch applies every event of b to pod p in key mode mode. p.mu is held.
func (ix *Indexer) applyBatch(ctx context.Context, p *pod, mode KeyMode, b *events.Batch) error {
	for i := range b.Events {
		if err := ix.applyEvent(ctx, p, mode, &b.Events[i]); err != nil {
			return fmt.Errorf("pod %s seq %d event %d: %w", p.name, b.Seq, i, err)
		}
	}
	p.countEvents(ix, events.KindUnknown, b.Skipped)
	return nil
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

func (ix *Indexer) applyEvent(ctx context.Context, p *pod, mode KeyMode, e *events.Event) error {
	p.countEvents(ix, e.Kind, 1)
	switch e.Kind {
	case events.KindBlockStored:
		return ix.stored(ctx, p, mode, e)
	case events.KindBlockRemoved:
		return ix.removed(ctx, p, mode, e)
	case events.KindAllBlocksCleared:
		ix.metrics.clears.WithLabelValues("all_blocks_cleared").Inc()
		return ix.clear(ctx, p)
	default:
		ix.drop(dropUnknownEvent, 1)
		return nil
	}
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

func (ix *Indexer) stored(ctx context.Context, p *pod, mode KeyMode, e *events.Event) error {
	m := p.model
	tier := tierOf(e.Medium)
	if len(e.LoRAName) > 0 {
		ix.learnLoRA(e.LoRAName, m.name)
	}
	if len(e.TokenIDs) > 0 {
		m.check(ix, p, e)
	}
	if mode == KeyModeEngine {
		return ix.add(ctx, p.name, tier, e.HasParent, e.ParentHash, e.BlockHashes)
	}
	// Tokens mode.
	if len(e.TokenIDs) == 0 {
		// The blocks are known; this event adds a tier to them.
		keys := p.buf[:0]
		for _, h := range e.BlockHashes {
			k, ok := p.keys[h]
			if !ok {
				ix.drop(dropUnknownHash, 1)
				continue
			}
			k.tiers |= 1 << tier
			p.keys[h] = k
			keys = append(keys, k.key)
		}
		p.buf = keys
		return ix.store.Add(ctx, p.name, tier, keys)
	}
	bs := m.opts.BlockSize
	if e.BlockSize != 0 && e.BlockSize != bs {
		ix.drop(dropBlockSize, len(e.BlockHashes))
		return nil
	}
	n := len(e.BlockHashes)
	if len(e.TokenIDs) != n*bs {
		ix.drop(dropTokenCount, n)
		return nil
	}
	var (
		keys   []uint64
		parent uint64
	)
	if e.HasParent {
		k, ok := p.keys[e.ParentHash]
		if !ok {
			ix.drop(dropUnknownParent, n)
			return nil
		}
		parent = k.key
		keys, _ = rechain(m.own, p.buf[:0], k.key, e.TokenIDs)
	} else {
		keys = prompt(m.own, p.buf[:0], e.TokenIDs, m.prompt(e))
	}
	p.buf = keys
	if p.keys == nil {
		p.keys = make(map[uint64]ownKey)
	}
	for i, h := range e.BlockHashes {
		k := p.keys[h]
		k.key = keys[i]
		k.tiers |= 1 << tier
		p.keys[h] = k
	}
	return ix.add(ctx, p.name, tier, e.HasParent, parent, keys)
}

// add adds keys for a pod, after their parent when they have one and the
// store keeps chains together (store.Chainer).
func (ix *Indexer) add(ctx context.Context, pod string, tier store.Tier, hasParent bool, parent uint64, keys []uint64) error {
	if ix.chainer != nil && hasParent {
		return ix.chainer.AddAfter(ctx, pod, tier, parent, keys)
	}
	return ix.store.Add(ctx, pod, tier, keys)
}

func (ix *Indexer) removed(ctx context.Context, p *pod, mode KeyMode, e *events.Event) error {
	tier := tierOf(e.Medium)
	keys := e.BlockHashes
	unknown := 0
	if mode == KeyModeTokens {
		keys = p.buf[:0]
		for _, h := range e.BlockHashes {
			k, ok := p.keys[h]
			if !ok || k.tiers&(1<<tier) == 0 {
				unknown++
				continue
			}
			keys = append(keys, k.key)
			if k.tiers &^= 1 << tier; k.tiers == 0 {
				delete(p.keys, h)
			} else {
				p.keys[h] = k
			}
		}
		p.buf = keys
	}
	n, err := ix.store.Remove(ctx, p.name, tier, keys)
	if err != nil {
		return err
	}
	ix.drop(dropUnknownHash, unknown+len(keys)-n)
	return nil
}

func (ix *Indexer) clear(ctx context.Context, p *pod) error {
	p.keys = nil
	return ix.store.ClearPod(ctx, p.name)
}

// Reset drops every block of a pod, as when its engine restarted (its seq
// went backwards). The pod stays known.
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
	p.hasSeq = false
	ix.metrics.clears.WithLabelValues("reset").Inc()
	return ix.clear(ctx, p)
}

// RemovePod forgets a pod that left the fleet, with all its blocks (in
// time proportional to them) and its series of prefixd_events_total and
// prefixd_pod_stale. A later batch of the same name starts a new pod.
func (ix *Indexer) RemovePod(ctx context.Context, podName string) error {
	ix.mu.Lock()
	p := ix.pods[podName]
	delete(ix.pods, podName)
	if p != nil {
		// Under ix.mu, so that SetStale cannot set the gauge again once
		// it is deleted.
		for k := range p.events {
			ix.metrics.events.DeleteLabelValues(events.Kind(k).String(), podName)
		}
		ix.metrics.stale.DeleteLabelValues(podName)
	}
	ix.mu.Unlock()
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
	return ix.clear(ctx, p)
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
// consistent again.
func (ix *Indexer) SetStale(podName string, stale bool) {
	v := 0.0
	if stale {
		v = 1
	}
	// The gauge is set under ix.mu so that it is not set again for a pod
	// RemovePod has just forgotten.
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	p := ix.pods[podName]
	if p == nil {
		return
	}
	p.stale.Store(stale)
	ix.metrics.stale.WithLabelValues(podName).Set(v)
}

// PodStatus describes one pod the indexer knows.
type PodStatus struct {
	Name      string
	Model     string
	Blocks    int
	Seq       uint64
	HasSeq    bool
	LastEvent time.Time
	Stale     bool
	// Evicted counts the pod's blocks the store forgot to make room since
	// the pod was last cleared; Incomplete is set while it is above 0.
	Evicted    int
	Incomplete bool
}

// Pods lists the known pods, sorted by name, with their block counts. Each
// pod's seq is read before its block count, so the blocks reflect at least
// the batches up to that seq.
func (ix *Indexer) Pods(ctx context.Context) ([]PodStatus, error) {
	ix.mu.RLock()
	out := make([]PodStatus, 0, len(ix.pods))
	for _, p := range ix.pods {
		p.mu.Lock()
		out = append(out, PodStatus{
			Name: p.name, Model: p.model.name,
			Seq: p.seq, HasSeq: p.hasSeq, LastEvent: p.lastEvent, Stale: p.stale.Load(),
		})
		p.mu.Unlock()
	}
	ix.mu.RUnlock()
	infos, err := ix.store.Pods(ctx)
	if err != nil {
		return nil, err
	}
	byName := make(map[string]store.PodInfo, len(infos))
	for _, in := range infos {
		byName[in.Name] = in
	}
	for i := range out {
		in := byName[out[i].Name]
		out[i].Blocks, out[i].Evicted, out[i].Incomplete = in.Blocks, in.Evicted, in.Evicted > 0
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// LastSeq returns the seq of the last batch applied to a pod.
func (ix *Indexer) LastSeq(podName string) (seq uint64, ok bool) {
	ix.mu.RLock()
	p := ix.pods[podName]
	ix.mu.RUnlock()
	if p == nil {
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq, p.hasSeq
}

// learnLoRA records that adapter name is served on top of base, unless
// MaxLoRAs adapters are known (counted). The caller may hold a pod's lock:
// loraMu comes after it.
func (ix *Indexer) learnLoRA(name []byte, base string) {
	ix.loraMu.RLock()
	_, ok := ix.loras[string(name)] // no allocation: map index by converted bytes
	full := len(ix.loras) >= ix.opts.MaxLoRAs
	ix.loraMu.RUnlock()
	if ok || len(name) == 0 || bytes.Equal(name, []byte(base)) {
		return
	}
	if !full {
		ix.loraMu.Lock()
		if full = len(ix.loras) >= ix.opts.MaxLoRAs; !full {
			ix.loras[string(name)] = base
		}
		ix.loraMu.Unlock()
	}
	if full {
		ix.metrics.lorasUnlearned.Inc()
	}
}
