package ingest

import (
	"context"
	"errors"
	"hash/maphash"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/events/transport"
	"github.com/prefixd/prefixd/indexer"
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

	mu      sync.Mutex // protects started
	started bool

	srcMu   sync.RWMutex // protects sources
	sources map[string]Source

	// applied and appliedEvents count the batches and events applied.
	applied, appliedEvents atomic.Uint64
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
	p.mu.Unlock()
	defer close(p.done)

	workers := make([]*worker, p.opts.Workers)
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{
			p: p, in: make(chan transport.Message, p.opts.WorkerQueue),
			pods: make(map[string]*podState), byTopic: make(map[string][]*podState), bySource: make(map[string][]*podState),
		}
		workers[i] = w
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
		w := workers[p.route(&m)]
		select {
		case w.in <- m:
		case <-ctx.Done():
			return nil
		case <-p.stop:
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
		h = maphash.String(p.seed, p.source(m).Pod)
	}
	return int(h % uint64(p.opts.Workers))
}

// source names the pod and model of a message whose topic names none.
func (p *Pipeline) source(m *transport.Message) indexer.Source {
	p.srcMu.RLock()
	s, ok := p.sources[m.Source]
	p.srcMu.RUnlock()
	if ok {
		src := indexer.Source{Pod: s.Name, Model: s.Model}
		if src.Pod == "" {
			src.Pod = m.Source
		}
		if src.Model == "" {
			src.Model = p.opts.DefaultModel
		}
		return src
	}
	src := indexer.Source{Pod: m.Peer, Model: p.opts.DefaultModel}
	if src.Pod == "" {
		src.Pod = m.Source
	}
	return src
}

// SetSource sets the settings of messages from source (an endpoint
// connected to), as Options.Sources does, while the pipeline runs.
func (p *Pipeline) SetSource(source string, s Source) {
	p.srcMu.Lock()
	p.sources[source] = s
	p.srcMu.Unlock()
}

// RemoveSource forgets the settings of source.
func (p *Pipeline) RemoveSource(source string) {
	p.srcMu.Lock()
	delete(p.sources, source)
	p.srcMu.Unlock()
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
