package ingest

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/events/transport"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/ratelog"
)

// Replayer asks a publisher's replay endpoint for the batches it buffers
// from seq start on. *transport.Subscriber is one.
type Replayer interface {
	Replay(ctx context.Context, endpoint string, start uint64, fn transport.ReplayFunc) error
}

var _ Replayer = (*transport.Subscriber)(nil)

// ErrRunning is returned by a second call of Run.
var ErrRunning = errors.New("ingest: pipeline already ran")

// Pipeline applies the messages of a subscriber's queue to an Indexer:
// each pod's batches in order on one worker, pods in parallel, with seq
// tracking, restarts and gap repair (see the package documentation). It is
// built for a few hundred pods and tens of thousands of batches a second.
type Pipeline struct {
	ix   *indexer.Indexer
	rp   Replayer // nil: no replays
	opts Options
	m    *Metrics
	log  *slog.Logger
	seed maphash.Seed

	stop     chan struct{} // closed by Close
	stopOnce sync.Once
	done     chan struct{} // closed when Run has returned

	mu      sync.Mutex // protects started and workers
	started bool
	workers []*worker // set by Run

	srcMu   sync.RWMutex // protects sources and gone
	sources map[string]Source
	// gone holds the sources removed by RemoveSource and not set again:
	// their messages are dropped.
	gone map[string]struct{}

	// applied and appliedEvents count the batches and events applied.
	applied, appliedEvents atomic.Uint64
	// refusals bounds the log lines of refused messages.
	refusals *ratelog.Limiter
}

// Applied returns how many batches, and events in them, were applied so far.
func (p *Pipeline) Applied() (batches, events uint64) {
	return p.applied.Load(), p.appliedEvents.Load()
}

// New returns a Pipeline that applies to ix and repairs gaps with rp, which
// may be nil (gaps then mark pods stale). m may be nil.
func New(ix *indexer.Indexer, rp Replayer, opts Options, m *Metrics) (*Pipeline, error) {
	if ix == nil {
		return nil, errors.New("ingest: nil indexer")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	opts = opts.withDefaults()
	return &Pipeline{
		ix:   ix,
		rp:   rp,
		opts: opts,
		m:    m,
		log:  opts.Logger,
		seed: maphash.MakeSeed(),
		stop: make(chan struct{}),
		done: make(chan struct{}),

		sources: maps.Collect(maps.All(opts.Sources)), // never nil, unlike a clone of nil
		gone:    make(map[string]struct{}),

		refusals: ratelog.New(10 * time.Second),
	}, nil
}

// Run applies the messages of in until in is closed, ctx is done or Close
// is called, then stops its workers and waits for them. Messages already
// handed to workers are applied unless ctx is done. It returns nil, or
// ErrRunning when called more than once.
func (p *Pipeline) Run(ctx context.Context, in <-chan transport.Message) error {
	p.mu.Lock()
	if p.started {
		p.mu.Unlock()
		return ErrRunning
	}
	p.started = true
	workers := make([]*worker, p.opts.Workers)
	for i := range workers {
		workers[i] = &worker{
			p: p, in: make(chan transport.Message, p.opts.WorkerQueue), ctl: make(chan func()), done: make(chan struct{}),
			pods: make(map[string]*podState), byTopic: make(map[string][]*podState), bySource: make(map[string][]*podState),
		}
	}
	p.workers = workers
	p.mu.Unlock()
	defer close(p.done)

	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() { w.run(ctx) })
	}
	defer func() {
		for _, w := range workers {
			close(w.in)
		}
		wg.Wait()
	}()

	for {
		var (
			m  transport.Message
			ok bool
		)
		select {
		case m, ok = <-in:
			if !ok {
				return nil
			}
		case <-ctx.Done():
			return nil
		case <-p.stop:
			return nil
		}
		if m.Closed {
			// Every worker may hold pods of the connection.
			for _, w := range workers {
				select {
				case w.in <- m:
				case <-ctx.Done():
					return nil
				case <-p.stop:
					return nil
				}
			}
			continue
		}
		w := workers[p.route(&m)]
		select {
		case w.in <- m:
		case <-ctx.Done():
			m.Release()
			return nil
		case <-p.stop:
			m.Release()
			return nil
		}
	}
}

// Close makes Run return after its workers have applied what they hold,
// and waits for it. It may be called more than once, and before Run (which
// then returns at once).
func (p *Pipeline) Close() error {
	p.stopOnce.Do(func() { close(p.stop) })
	p.mu.Lock()
	started := p.started
	p.mu.Unlock()
	if started {
		<-p.done
	}
	return nil
}

// route returns the worker of a message: by the pod its topic names, or by
// the name its source gives pods without one. A pod's name (indexer.PodName)
// is that, plus the rank, so one pod always lands on one worker.
func (p *Pipeline) route(m *transport.Message) int {
	var topic []byte
	switch len(m.Frames) {
	case 3:
		topic = m.Frames[0]
	case 4:
		topic = m.Frames[1]
	}
	var h uint64
	if pod, _, ok := events.ParseTopic(topic); ok {
		h = maphash.Bytes(p.seed, pod)
	} else {
		src, _ := p.source(m)
		h = maphash.String(p.seed, src.Pod)
	}
	return int(h % uint64(p.opts.Workers))
}

// source names the pod and model of a message whose topic names none. ok
// is false when the message's source was removed (RemoveSource).
func (p *Pipeline) source(m *transport.Message) (src indexer.Source, ok bool) {
	p.srcMu.RLock()
	s, known := p.sources[m.Source]
	_, gone := p.gone[m.Source]
	p.srcMu.RUnlock()
	if known {
		src = indexer.Source{Pod: s.Name, Model: s.Model}
		if src.Pod == "" {
			src.Pod = m.Source
		}
		if src.Model == "" {
			src.Model = p.opts.DefaultModel
		}
		return src, !gone
	}
	src = indexer.Source{Pod: m.Peer, Model: p.opts.DefaultModel}
	if src.Pod == "" {
		src.Pod = m.Source
	}
	return src, !gone
}

// SetSource sets the settings of messages from source (an endpoint
// connected to), as Options.Sources does, while the pipeline runs. A source
// removed by RemoveSource is taken again.
func (p *Pipeline) SetSource(source string, s Source) {
	p.srcMu.Lock()
	p.sources[source] = s
	delete(p.gone, source)
	p.srcMu.Unlock()
}

// RemoveSource forgets source, an endpoint that left the fleet, and every
// pod last seen from it: the pod's blocks (indexer.RemovePod), its seq
// tracking and its series of the pipeline's metrics. It returns the names
// of the pods removed, sorted.
//
// Call it once the subscriber receives nothing more from source
// (transport.Subscriber.Disconnect). Messages of source still queued, or
// handled later, are dropped and counted in
// prefixd_ingest_dropped_total{reason="source_removed"} until SetSource
// takes source again, so they cannot bring a removed pod back.
//
// It waits until every worker has forgotten its pods of source, or Run has
// returned, or ctx is done: it then returns ctx's error, and pods not yet
// forgotten stay until another call. Before Run there is nothing to forget.
func (p *Pipeline) RemoveSource(ctx context.Context, source string) ([]string, error) {
	p.srcMu.Lock()
	delete(p.sources, source)
	p.gone[source] = struct{}{}
	p.srcMu.Unlock()

	p.mu.Lock()
	workers := p.workers
	p.mu.Unlock()
	if len(workers) == 0 {
		return nil, nil // Run has not started: no pod was seen
	}
	// A removal a worker has taken runs to its end whatever ctx does: a pod
	// half removed would leave blocks no pod owns.
	rctx := context.WithoutCancel(ctx)
	results := make(chan removal, len(workers)) // never blocks a worker
	sent := 0
	for _, w := range workers {
		select {
		case w.ctl <- func() { results <- w.removeSource(rctx, source) }:
			sent++
		case <-w.done: // Run has returned: nothing applies to its pods any more
		case <-ctx.Done():
			return nil, fmt.Errorf("ingest: remove source %s: %w", source, ctx.Err())
		}
	}
	var (
		pods []string
		errs []error
	)
	for range sent {
		select {
		case r := <-results:
			pods = append(pods, r.pods...)
			errs = append(errs, r.err)
		case <-ctx.Done():
			return nil, fmt.Errorf("ingest: remove source %s: %w", source, ctx.Err())
		}
	}
	slices.Sort(pods)
	if err := errors.Join(errs...); err != nil {
		return pods, fmt.Errorf("ingest: remove source %s: %w", source, err)
	}
	return pods, nil
}

// replayEndpoint returns the replay endpoint of a pod, or "".
func (p *Pipeline) replayEndpoint(source, pod string) string {
	p.srcMu.RLock()
	s, ok := p.sources[source]
	p.srcMu.RUnlock()
	if ok && s.Replay != "" {
		return s.Replay
	}
	return p.opts.Replay[pod]
}
