package redis

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/prefixd/prefixd/store"
)

// Store is a store.Store kept in Redis, shared by every prefixd process
// that uses the same Redis and prefix: a single redis-server, or a Redis
// Cluster. It is built for an index of millions of (pod, block) holdings
// over hundreds of pods, lookups of hundreds of keys, and the batches of
// a fleet's KV events, from a few prefixd replicas.
//
// See the package documentation for the keys and for how a batch applies.
type Store struct {
	o       Options
	url     string // redacted
	client  goredis.UniversalClient
	cluster *goredis.ClusterClient // nil on a single node
	keys    keyspace
	metrics *metrics
	// locks serialize one pod's multi-step operations within this process
	// on a cluster (the lease does across processes); a stripe a pod, by
	// hash. Each is a one-slot semaphore so that waiting honors ctx.
	locks [64]chan struct{}
	seed  maphash.Seed

	mu    sync.RWMutex      // guards ids and names
	ids   map[string]string // pod name -> id, as far as this process has seen
	names map[string]string // pod id -> name

	closeOnce sync.Once
	closeErr  error
}

var _ store.Store = (*Store)(nil)

// New connects to o.URL and checks the server (PING, and loads the
// store's scripts). Its errors name the URL without its password; those
// of an unreachable server wrap store.ErrUnavailable.
func New(ctx context.Context, o Options) (*Store, error) {
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	co, err := parseURL(o.URL, o.Timeout)
	if err != nil {
		return nil, err
	}
	s := &Store{
		o:     o,
		url:   Redact(o.URL),
		keys:  newKeyspace(o.Prefix),
		seed:  maphash.MakeSeed(),
		ids:   make(map[string]string),
		names: make(map[string]string),
	}
	for i := range s.locks {
		s.locks[i] = make(chan struct{}, 1)
	}
	if co.cluster != nil {
		s.cluster = goredis.NewClusterClient(co.cluster)
		s.client = s.cluster
	} else {
		s.client = goredis.NewClient(co.single)
	}
	if s.metrics, err = newMetrics(o.Registerer); err != nil {
		_ = s.client.Close()
		return nil, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	err = s.client.Ping(ctx).Err()
	for _, sc := range allScripts {
		if err != nil {
			break
		}
		err = sc.Load(ctx, s.client).Err()
	}
	if err != nil {
		s.metrics.unregister(o.Registerer)
		_ = s.client.Close()
		return nil, fmt.Errorf("redis: connect %s: %w", s.url, classify(ctx, err))
	}
	mode := "single node"
	if s.cluster != nil {
		mode = "cluster"
	}
	o.Logger.Info("redis store connected", "url", s.url, "mode", mode, "prefix", o.Prefix, "owner", o.Owner)
	return s, nil
}

// Ping checks that Redis answers, for readiness probes.
func (s *Store) Ping(ctx context.Context) error {
	ctx, done, err := s.begin(ctx, opPing)
	if err != nil {
		return err
	}
	if s.cluster != nil {
		err = s.cluster.ForEachShard(ctx, func(ctx context.Context, c *goredis.Client) error {
			return c.Ping(ctx).Err()
		})
	} else {
		err = s.client.Ping(ctx).Err()
	}
	return done(err)
}

// Close closes the connections and stops the client's goroutines. It is
// idempotent; calls after it fail.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closeErr = s.client.Close()
		s.metrics.unregister(s.o.Registerer)
	})
	return s.closeErr
}

// Owner returns the lease owner id of this process.
func (s *Store) Owner() string { return s.o.Owner }

// keyspace builds key names.
type keyspace struct {
	podid   string // pod name -> id, and "" -> the last id allocated
	podname string // pod id -> name (single node: lookups read it)
	models  string // model -> key mode
	loras   string // adapter -> base model
	block   string // block keys: block + 16 hex digits
	pod     string // pod keys: "{" + pod + name + "}" + suffix
}

func newKeyspace(prefix string) keyspace {
	return keyspace{
		podid:   prefix + "podid",
		podname: prefix + "podname",
		models:  prefix + "models",
		loras:   prefix + "loras",
		block:   prefix + "b:",
		pod:     "{" + prefix + "p:",
	}
}

// podKeys are the keys of one pod, all in its hash tag's slot.
type podKeys struct {
	state, lease, emap string
	members            string // bucket names: members + 2 hex digits
}

func (k keyspace) forPod(name string) podKeys {
	tag := k.pod + name + "}"
	return podKeys{state: tag + "s", lease: tag + "l", emap: tag + "e", members: tag + "m:"}
}

const hexDigits = "0123456789abcdef"

// appendHex appends the 16 hex digits of key.
func appendHex(b []byte, key uint64) []byte {
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, hexDigits[key>>uint(shift)&15])
	}
	return b
}

func (k keyspace) blockKey(key uint64) string {
	b := make([]byte, 0, len(k.block)+16)
	b = append(b, k.block...)
	return string(appendHex(b, key))
}

// bucketOf names the membership bucket of key: its low byte in hex.
func bucketOf(key uint64) string {
	return string([]byte{hexDigits[key>>4&15], hexDigits[key&15]})
}

// memberOf is key as its membership entry: a signed decimal.
func memberOf(key uint64) string { return strconv.FormatInt(int64(key), 10) }

// parseMember parses a membership entry or an engine map value.
func parseMember(s string) (uint64, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	return uint64(v), err
}

// seqArg is seq as the scripts compare it.
func seqArg(seq uint64) string { return fmt.Sprintf("%020d", seq) }

// op names an operation in metrics and errors.
type op uint8

const (
	opApply op = iota
	opLookup
	opEngineKeys
	opAppliedSeq
	opForgetPod
	opSetStale
	opPods
	opModels
	opDecideKeyMode
	opAddLoRA
	opPing
	numOps
)

var opNames = [numOps]string{"apply", "lookup", "engine_keys", "applied_seq", "forget_pod", "set_stale", "pods", "models", "decide_key_mode", "add_lora", "ping"}

// bound returns ctx bounded by the store's timeout, unless it has an
// earlier deadline.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= s.o.Timeout {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.o.Timeout)
}

// begin starts a call: it fails at once when ctx is done, and otherwise
// returns ctx bounded by the timeout and the function that ends the call,
// recording it and wrapping its error.
func (s *Store) begin(ctx context.Context, o op) (context.Context, func(error) error, error) {
	if err := ctx.Err(); err != nil {
		s.metrics.errors[o][reasonCanceled].Inc()
		return nil, nil, fmt.Errorf("redis: %s: %w", opNames[o], err)
	}
	start := time.Now()
	bctx, cancel := s.bound(ctx)
	return bctx, func(err error) error {
		if err != nil {
			err = classify(bctx, err) // before cancel, which would look like the caller's
		}
		cancel()
		s.metrics.seconds[o].Observe(time.Since(start).Seconds())
		if err == nil {
			return nil
		}
		s.metrics.errors[o][reasonOf(err)].Inc()
		return fmt.Errorf("redis: %s: %w", opNames[o], err)
	}, nil
}

// classify wraps err in store.ErrUnavailable when it means that Redis
// could not be reached, did not answer in time or is failing over.
func classify(ctx context.Context, err error) error {
	if err == nil || errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrNotOwner) ||
		errors.Is(err, store.ErrInvalidBatch) {
		return err
	}
	cerr := ctx.Err()
	if d, ok := ctx.Deadline(); ok && cerr == nil && !time.Now().Before(d) {
		// The client's deadline, set from ctx's, fired before ctx's own
		// timer did.
		cerr = context.DeadlineExceeded
	}
	switch {
	case errors.Is(cerr, context.Canceled):
		// The caller's doing, whatever the client made of it.
		if errors.Is(err, context.Canceled) {
			return err
		}
		return fmt.Errorf("%w: %w", cerr, err)
	case cerr != nil:
		// The deadline passed: Redis did not answer in time.
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
		}
		return fmt.Errorf("%w: %w: %w", store.ErrUnavailable, cerr, err)
	}
	if unavailable(err) {
		return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	return err
}

// unavailablePrefixes start the Redis error replies of a server that is
// loading, failing over or otherwise unable to serve for now.
var unavailablePrefixes = []string{"LOADING", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "READONLY", "BUSY", "NOREPLICAS", "UNBLOCKED"}

func unavailable(err error) bool {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.As(err, &ne), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, goredis.ErrPoolTimeout), errors.Is(err, goredis.ErrClosed):
		return true
	}
	var re goredis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		for _, p := range unavailablePrefixes {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	// go-redis reports some connection failures as plain errors.
	msg := err.Error()
	return strings.Contains(msg, "connection refused") || strings.Contains(msg, "broken pipe") ||
		strings.Contains(msg, "connection reset") || strings.Contains(msg, "i/o timeout")
}

// lock takes the pod's stripe lock, or fails when ctx ends first.
func (s *Store) lock(ctx context.Context, pod string) (func(), error) {
	ch := s.locks[maphash.String(s.seed, pod)%uint64(len(s.locks))]
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// cachedID returns pod's id if this process knows it.
func (s *Store) cachedID(pod string) (string, bool) {
	s.mu.RLock()
	id, ok := s.ids[pod]
	s.mu.RUnlock()
	return id, ok
}

func (s *Store) remember(pod, id string) {
	s.mu.Lock()
	s.ids[pod] = id
	s.names[id] = pod
	s.mu.Unlock()
}

// podID returns pod's id, allocating one when create is set and the pod
// has none; "" when it has none.
func (s *Store) podID(ctx context.Context, pod string, create bool) (string, error) {
	if id, ok := s.cachedID(pod); ok {
		return id, nil
	}
	var id string
	var err error
	if create {
		keys := []string{s.keys.podid}
		if s.cluster == nil {
			keys = append(keys, s.keys.podname)
		}
		id, err = s.run(ctx, podIDScript, keys, pod).Text()
	} else {
		id, err = s.client.HGet(ctx, s.keys.podid, pod).Result()
		if errors.Is(err, goredis.Nil) {
			return "", nil
		}
	}
	if err != nil {
		return "", err
	}
	s.remember(pod, id)
	return id, nil
}

// lostIDs handles a pod whose id in Redis is not the one this process
// cached: the server lost its data (a restart without persistence, a
// failover to a replica behind), and every cached id may be wrong, so
// the cache starts again, with the pod's actual id if it has one.
func (s *Store) lostIDs(pod, cached, actual string) {
	s.o.Logger.Warn("redis store: pod ids changed, the server lost data", "url", s.url, "pod", pod, "cached", cached, "actual", actual)
	s.mu.Lock()
	clear(s.ids)
	clear(s.names)
	if actual != "" {
		s.ids[pod], s.names[actual] = actual, pod
	}
	s.mu.Unlock()
}

// podNames returns the names of ids, reading the pod id hash again when
// this process does not know some.
func (s *Store) podNames(ctx context.Context, ids []string) ([]string, error) {
	names := make([]string, len(ids))
	miss := false
	s.mu.RLock()
	for i, id := range ids {
		var ok bool
		if names[i], ok = s.names[id]; !ok {
			miss = true
		}
	}
	s.mu.RUnlock()
	if !miss {
		return names, nil
	}
	all, err := s.client.HGetAll(ctx, s.keys.podid).Result()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	clear(s.ids)
	clear(s.names)
	for name, id := range all {
		if name != "" {
			s.ids[name] = id
			s.names[id] = name
		}
	}
	for i, id := range ids {
		names[i] = s.names[id] // "" for an id nobody has: none matches it
	}
	s.mu.Unlock()
	return names, nil
}

// run runs a script by its SHA, loading it again should the server have
// lost it (a restart, a failover).
func (s *Store) run(ctx context.Context, sc *goredis.Script, keys []string, args ...any) *goredis.Cmd {
	return sc.Run(ctx, s.client, keys, args...)
}

// reply reads a script's array reply.
type reply []any

func asReply(v any, err error) (reply, error) {
	if err != nil {
		return nil, err
	}
	r, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("script replied %T, want an array", v)
	}
	return r, nil
}

func (r reply) str(i int) string {
	if i < len(r) {
		s, _ := r[i].(string)
		return s
	}
	return ""
}

func (r reply) int(i int) int {
	if i < len(r) {
		n, _ := r[i].(int64)
		return int(n)
	}
	return 0
}

func (r reply) list(i int) []any {
	if i < len(r) {
		l, _ := r[i].([]any)
		return l
	}
	return nil
}

// notOwner is the error of a pod whose lease another process holds.
func notOwner(pod, other string) error {
	return fmt.Errorf("%w: pod %q is applied by %q", store.ErrNotOwner, pod, other)
}
