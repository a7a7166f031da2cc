package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/prefixd/prefixd/events/transport"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/ingest"
	"github.com/prefixd/prefixd/internal/recovery"
	"github.com/prefixd/prefixd/rpc"
	"github.com/prefixd/prefixd/store/memory"
)

// defaultZMQBind is where serve and record listen when given no endpoint.
const defaultZMQBind = "tcp://*:5557"

// connectSpec is one --zmq-connect value:
// [pod=]ENDPOINT[,replay=ENDPOINT][,name=NAME][,model=MODEL].
type connectSpec struct {
	endpoint string
	src      ingest.Source
}

func parseConnect(v string) (connectSpec, error) {
	var c connectSpec
	for i, part := range strings.Split(v, ",") {
		key, val, ok := strings.Cut(part, "=")
		if !ok || strings.Contains(key, "://") {
			if i != 0 {
				return c, fmt.Errorf("%q: %q is not key=value", v, part)
			}
			key, val = "pod", part
		}
		if i == 0 && strings.Contains(val, "://") && !knownConnectKey(key) {
			// NAME=ENDPOINT: the pod's name, for publishers whose topic names none.
			c.src.Name, key = key, "pod"
		}
		switch key {
		case "pod", "endpoint":
			c.endpoint = val
		case "replay":
			c.src.Replay = val
		case "name":
			c.src.Name = val
		case "model":
			c.src.Model = val
		default:
			return c, fmt.Errorf("%q: unknown key %q (want pod, replay, name or model)", v, key)
		}
	}
	if !strings.Contains(c.endpoint, "://") {
		return c, fmt.Errorf("%q: no endpoint (want [pod=]tcp://host:port[,replay=tcp://host:port])", v)
	}
	if err := transport.CheckEndpoint(c.endpoint, false); err != nil {
		return c, fmt.Errorf("%q: %w", v, err)
	}
	if c.src.Replay != "" {
		if err := transport.CheckEndpoint(c.src.Replay, false); err != nil {
			return c, fmt.Errorf("%q: replay: %w", v, err)
		}
	}
	return c, nil
}

func knownConnectKey(k string) bool {
	switch k {
	case "pod", "endpoint", "replay", "name", "model":
		return true
	}
	return false
}

// zmqFlags are the flags of commands that subscribe to publishers.
type zmqFlags struct {
	binds    listFlag
	connects listFlag
	replays  listFlag
	topic    string
	// endpointsFile lists endpoints to connect to, re-read when it changes.
	endpointsFile     string
	endpointsInterval time.Duration

	parsedConnects []connectSpec
	parsedReplays  map[string]string // pod -> replay endpoint

	// opts holds the subscriber's limits from their flags.
	opts transport.Options
}

func (z *zmqFlags) register(fs *flag.FlagSet, withReplay bool) {
	fs.Var(&z.binds, "zmq-bind", "bind a SUB for publishers that connect (llm-d-inference-sim, vLLM with a host in its endpoint),\n"+
		"tcp://HOST:PORT with HOST * for every interface; repeatable (default "+defaultZMQBind+" unless --zmq-connect is given)")
	connect := "connect to a publisher that binds (vLLM with tcp://*:port): [pod=]tcp://IP:PORT"
	if withReplay {
		connect += "[,replay=tcp://IP:PORT]\n[,name=POD][,model=MODEL] (name and model for publishers whose topic names none)"
	}
	fs.Var(&z.connects, "zmq-connect", connect+"; repeatable")
	if withReplay {
		fs.Var(&z.replays, "zmq-replay", "POD=tcp://IP:PORT: the replay endpoint of a pod that connects to a bound SUB\n(the sim's --kv-events-replay-endpoint); repeatable")
		fs.StringVar(&z.endpointsFile, "zmq-endpoints", "", "file of endpoints to connect to, one --zmq-connect value a line (# comments);\nre-read when it changes: new lines connect, removed lines disconnect and their pods leave the index")
		fs.DurationVar(&z.endpointsInterval, "zmq-endpoints-interval", 2*time.Second, "how often --zmq-endpoints is checked for changes")
	}
	fs.StringVar(&z.topic, "zmq-topic", transport.DefaultTopic, "subscription topic prefix (\"\" for vLLM's default empty topic)")
	z.opts = transport.DefaultOptions()
	z.opts.AddFlags(fs)
}

// subscriberOptions returns the subscriber's options from the flags.
func (z *zmqFlags) subscriberOptions(log *slog.Logger, guard *recovery.Guard) transport.Options {
	o := z.opts
	o.Topic, o.Logger, o.Recovery = z.topic, log, guard
	return o
}

// parse validates the flags; errors are usage errors on fs's output.
func (z *zmqFlags) parse(fs *flag.FlagSet) error {
	for _, v := range z.connects.vals {
		c, err := parseConnect(v)
		if err != nil {
			return usageErrorf(fs, "--zmq-connect %v", err)
		}
		z.parsedConnects = append(z.parsedConnects, c)
	}
	z.parsedReplays = make(map[string]string)
	for _, v := range z.replays.vals {
		pod, ep, ok := strings.Cut(v, "=")
		if !ok || pod == "" || ep == "" {
			return usageErrorf(fs, "--zmq-replay %q: want POD=tcp://IP:PORT", v)
		}
		z.parsedReplays[pod] = ep
	}
	if z.endpointsFile != "" && z.endpointsInterval <= 0 {
		return usageErrorf(fs, "--zmq-endpoints-interval %v: want > 0", z.endpointsInterval)
	}
	if err := z.opts.Validate(); err != nil {
		return usageErrorf(fs, "%v", err)
	}
	if len(z.binds.vals) == 0 && len(z.connects.vals) == 0 && z.endpointsFile == "" {
		z.binds.vals = []string{defaultZMQBind}
	}
	return nil
}

// subscribe binds and connects sub as the flags say and returns the
// addresses bound.
func (z *zmqFlags) subscribe(sub *transport.Subscriber) (bound []string, err error) {
	for _, ep := range z.binds.vals {
		addr, err := sub.Bind(ep)
		if err != nil {
			return bound, err
		}
		bound = append(bound, addr)
	}
	for _, c := range z.parsedConnects {
		if err := sub.Connect(c.endpoint); err != nil {
			return bound, fmt.Errorf("connect %s: %w", c.endpoint, err)
		}
	}
	return bound, nil
}

func (z *zmqFlags) connectEndpoints() []string {
	eps := make([]string, len(z.parsedConnects))
	for i, c := range z.parsedConnects {
		eps[i] = c.endpoint
	}
	return eps
}

func runServe(ctx context.Context, args []string, _, stderr io.Writer) error {
	start := time.Now()
	fs := newFlagSet("serve", "", stderr)
	var (
		hf       hashFlags
		zf       zmqFlags
		sf       storeFlags
		keyMode  = fs.String("key-mode", "auto", "index keys: engine (the engine's hashes), tokens (prefixd's own chain over token_ids), or auto")
		httpAddr = fs.String("http-addr", ":9090", "address of the HTTP server: /metrics, /healthz, /readyz, POST /v1/match, POST /v1/score,\nGET /v1/pods, GET /v1/stats")
		grpcAddr = fs.String("grpc-addr", ":50051", "address of the gRPC server (prefixd.v1.IndexService, health, reflection)")
		drain    = fs.Duration("drain-timeout", 10*time.Second, "on SIGTERM, how long queries in flight may take before they are cut off")
		workers  = fs.Int("workers", 0, "goroutines applying events, each owning a share of the pods (default GOMAXPROCS*2)")
		podTTL   = fs.Duration("pod-timeout", 5*time.Minute, "how long a pod whose publisher connection closed may stay away before it leaves the index\nwith its blocks and metric series; 0 keeps such pods")
		lf       logFlags
		il       indexLimits
	)
	il.register(fs)
	lf.register(fs)
	limits := rpc.DefaultLimits()
	limits.AddFlags(fs)
	hf.registerIndex(fs)
	zf.register(fs, true)
	sf.register(fs)
	fs.String("config", "", "YAML file of flag values (flag names as keys, lists for repeatable flags) and per-model\nhash settings under models:; the environment and the command line override it")
	cfg, err := parseFlagsConfig(fs, args)
	if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErrorf(fs, "serve takes no arguments; have %q", fs.Args())
	}
	if err := zf.parse(fs); err != nil {
		return err
	}
	mo, err := hf.modelOptions(fs)
	if err != nil {
		return err
	}
	if mo.KeyMode, err = indexer.ParseKeyMode(*keyMode); err != nil {
		return usageErrorf(fs, "--key-mode: %v", err)
	}
	if *workers < 0 {
		return usageErrorf(fs, "--workers %d: want 0 (default) or more", *workers)
	}
	if err := limits.Validate(); err != nil {
		return usageErrorf(fs, "%v", err)
	}
	if *drain <= 0 {
		return usageErrorf(fs, "--drain-timeout %v: want > 0", *drain)
	}
	if *podTTL < 0 {
		return usageErrorf(fs, "--pod-timeout %v: want 0 (keep pods) or more", *podTTL)
	}
	podTimeout := *podTTL
	if podTimeout == 0 {
		podTimeout = -1 // ingest: negative keeps pods
	}
	if err := il.validate(fs); err != nil {
		return err
	}
	if err := sf.validate(fs); err != nil {
		return err
	}
	defaultModel := hf.model
	if defaultModel == "" {
		defaultModel = "default"
	}
	log, err := lf.logger(fs, stderr)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ost, err := sf.open(ctx, reg, log)
	if err != nil {
		return err
	}
	defer func() { _ = ost.close() }()
	st := ost.Store
	opts := indexer.DefaultOptions()
	mo.CacheBlocks = il.cacheBlocks
	opts.Default = mo
	opts.DefaultModel = defaultModel
	opts.MaxPods, opts.MaxModels, opts.MaxLoRAs = il.maxPods, il.maxModels, il.maxLoRAs
	if cfg != nil {
		if opts.Models, err = cfg.modelOptions(mo); err != nil {
			return usageErrorf(fs, "config: %v", err)
		}
	}
	if err := opts.Validate(); err != nil {
		return usageErrorf(fs, "%v", err)
	}
	ix, err := indexer.New(st, opts, indexer.NewMetrics(reg), log)
	if err != nil {
		return err
	}
	guard := recovery.New(reg, log)

	sub, err := transport.NewSubscriber(zf.subscriberOptions(log, guard), transport.NewMetrics(reg))
	if err != nil {
		return err
	}
	defer func() { _ = sub.Close() }() // on early returns; idempotent
	sources := make(map[string]ingest.Source, len(zf.parsedConnects))
	for _, c := range zf.parsedConnects {
		sources[c.endpoint] = c.src
	}
	pipe, err := ingest.New(ix, sub, ingest.Options{
		Workers:      *workers,
		Sources:      sources,
		Replay:       zf.parsedReplays,
		DefaultModel: defaultModel,
		TrustTopics:  il.trustTopics,
		PodTimeout:   podTimeout,
		Recovery:     guard,
		Logger:       log,
	}, ingest.NewMetrics(reg))
	if err != nil {
		return err
	}

	api, err := rpc.New(ix, rpc.Options{Limits: limits, Metrics: rpc.NewMetrics(reg), Stats: newIngestRates(pipe, ost.memory), Log: log, Recovery: guard})
	if err != nil {
		return err
	}
	var ready atomic.Bool
	srv := &http.Server{
		Handler: newServeMux(api.HTTPHandler(), reg, &ready, ost.ping),
		// A query body of the largest size takes well under a second on any
		// network a router shares with prefixd; a client that trickles it,
		// or sits on an idle connection, holds a connection and a share of
		// the query byte budget.
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	var lc net.ListenConfig
	hl, err := lc.Listen(ctx, "tcp", *httpAddr)
	if err != nil {
		return fmt.Errorf("http: %w", err)
	}
	gl, err := lc.Listen(ctx, "tcp", *grpcAddr)
	if err != nil {
		_ = hl.Close()
		return fmt.Errorf("grpc: %w", err)
	}
	gsrv := api.NewGRPCServer()
	var wg sync.WaitGroup
	httpErr := make(chan error, 2)
	wg.Go(func() {
		if err := srv.Serve(hl); !errors.Is(err, http.ErrServerClosed) {
			httpErr <- fmt.Errorf("http: %w", err)
		}
	})
	wg.Go(func() {
		if err := gsrv.Serve(gl); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			httpErr <- fmt.Errorf("grpc: %w", err)
		}
	})
	// stopHTTP stops taking queries, lets those in flight finish for up to
	// the drain timeout, and waits for both servers.
	stopHTTP := func() {
		api.SetServing(false)
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), *drain)
		defer cancel()
		stopped := make(chan struct{})
		go func() {
			gsrv.GracefulStop()
			close(stopped)
		}()
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
		select {
		case <-stopped:
		case <-sctx.Done():
			gsrv.Stop()
			<-stopped
		}
		wg.Wait()
	}

	bound, err := zf.subscribe(sub)
	if err != nil {
		stopHTTP()
		return err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	if zf.endpointsFile != "" {
		w := &endpointsWatcher{path: zf.endpointsFile, interval: zf.endpointsInterval, sub: sub, pipe: pipe, log: log}
		for _, c := range zf.parsedConnects {
			w.reserved = append(w.reserved, c.endpoint)
		}
		if err := w.sync(watchCtx); err != nil {
			stopHTTP()
			return fmt.Errorf("--zmq-endpoints: %w", err)
		}
		wg.Go(func() { w.run(watchCtx) })
	}
	pipeDone := make(chan struct{})
	go func() {
		defer close(pipeDone)
		_ = pipe.Run(ctx, sub.Messages())
	}()
	ready.Store(true)
	log.Info("prefixd serving", "zmq_bound", bound, "zmq_connect", zf.connectEndpoints(), "zmq_topic", zf.topic,
		"grpc", gl.Addr().String(), "http", hl.Addr().String(), "startup", time.Since(start))

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-httpErr:
	}
	ready.Store(false)
	stopWatch()
	_ = sub.Close() // closes the queue: the pipeline ends
	_ = pipe.Close()
	<-pipeDone
	stopHTTP()
	log.Info("prefixd stopped")
	return runErr
}

// newServeMux serves the API, /metrics, /healthz and /readyz: ready once
// started and while ping says the store can be reached.
func newServeMux(api http.Handler, reg *prometheus.Registry, ready *atomic.Bool, ping func(context.Context) error) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := ping(ctx); err != nil {
			http.Error(w, "not ready: the store cannot be reached: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.Handle("/v1/", api)
	return mux
}

// indexLimits are the flags bounding what events can make the indexer keep.
type indexLimits struct {
	maxPods, maxModels, maxLoRAs int
	cacheBlocks                  int
	trustTopics                  bool
}

func (l *indexLimits) register(fs *flag.FlagSet) {
	d := indexer.DefaultOptions()
	fs.IntVar(&l.maxPods, "max-pods", memory.MaxPods, fmt.Sprintf("most pods known at once; batches of more are refused and counted\n"+
		"(prefixd_batches_refused_total{reason=\"max_pods\"}); at most %d, the in-memory index's limit", memory.MaxPods))
	fs.IntVar(&l.maxModels, "max-models", d.MaxModels, "most models known at once, configured ones included; batches naming more are refused")
	fs.IntVar(&l.maxLoRAs, "max-loras", d.MaxLoRAs, "most LoRA adapters learned from events' lora_name")
	fs.IntVar(&l.cacheBlocks, "cache-blocks", 0, "each replica's KV cache size in blocks (vLLM's num_gpu_blocks), 0 when unknown;\n"+
		"when the index is full, pods holding more lose their own blocks first (per model: cache-blocks in --config)")
	fs.BoolVar(&l.trustTopics, "zmq-trust-topics", false, "accept a kv@IP:PORT@MODEL topic from a publisher at any source address\n"+
		"(by default only from IP: a publisher writes only its own pods); for NAT and proxies")
}

func (l *indexLimits) validate(fs *flag.FlagSet) error {
	if l.maxPods < 1 || l.maxPods > memory.MaxPods {
		return usageErrorf(fs, "--max-pods %d: want 1 to %d (the in-memory index's limit)", l.maxPods, memory.MaxPods)
	}
	if l.cacheBlocks < 0 {
		return usageErrorf(fs, "--cache-blocks %d: want 0 (unknown) or more", l.cacheBlocks)
	}
	return nil
}

// ingestRates gives the gRPC Stats method the pipeline's recent rates and
// the in-memory store's memory estimate (none for Redis).
type ingestRates struct {
	pipe  *ingest.Pipeline
	store *memory.Store

	mu                    sync.Mutex // protects the fields below
	at                    time.Time
	batches, events       uint64
	lastBatches, lastEvts float64
}

func newIngestRates(pipe *ingest.Pipeline, st *memory.Store) *ingestRates {
	return &ingestRates{pipe: pipe, store: st, at: time.Now()}
}

// IngestStats returns the rates since the previous call (since start-up for
// the first), over at least a second.
func (r *ingestRates) IngestStats() rpc.IngestStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	b, e := r.pipe.Applied()
	if dt := now.Sub(r.at).Seconds(); dt >= 1 {
		r.lastBatches = float64(b-r.batches) / dt
		r.lastEvts = float64(e-r.events) / dt
		r.at, r.batches, r.events = now, b, e
	}
	st := rpc.IngestStats{BatchesPerSecond: r.lastBatches, EventsPerSecond: r.lastEvts}
	if r.store != nil {
		st.MemoryBytes = uint64(r.store.Stats().Bytes)
	}
	return st
}
