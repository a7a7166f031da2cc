package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/prefixd/prefixd/internal/ratelog"
	"github.com/prefixd/prefixd/store"
	"github.com/prefixd/prefixd/store/memory"
	"github.com/prefixd/prefixd/store/redis"
)

// storeFlags choose and configure the block store: in memory (the
// default), or Redis shared by several prefixd processes.
type storeFlags struct {
	url      string
	mem      memory.Options
	prefix   string
	blockTTL time.Duration
	leaseTTL time.Duration
	timeout  time.Duration
}

func (f *storeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "store", "memory", "where the index lives: memory, redis://[user:pass@]HOST:PORT[/DB], rediss://... (TLS),\n"+
		"or redis-cluster://HOST:PORT,HOST:PORT,... (seed nodes of a Redis Cluster); several prefixd\nprocesses on one Redis share one index")
	f.mem.AddFlags(fs)
	fs.StringVar(&f.prefix, "redis-prefix", "prefixd:", "prefix of every Redis key, so that several fleets share one Redis")
	fs.DurationVar(&f.blockTTL, "redis-block-ttl", 0, "a block no event stores again within this time expires from Redis; 0 keeps blocks until removed")
	fs.DurationVar(&f.leaseTTL, "redis-lease-ttl", 10*time.Second, "how long a pod's write lease outlives its holder's last batch: another prefixd process\ntakes over the pod's stream after it")
	fs.DurationVar(&f.timeout, "redis-timeout", 2*time.Second, "longest a Redis call may take before it fails as unavailable")
}

// isMemory reports whether the in-memory store is chosen.
func (f *storeFlags) isMemory() bool { return f.url == "" || f.url == "memory" }

// validate checks the flags; it names the store URL without its password.
func (f *storeFlags) validate(fs *flag.FlagSet) error {
	if f.isMemory() {
		return nil
	}
	scheme, _, ok := strings.Cut(f.url, "://")
	switch {
	case !ok:
		return usageErrorf(fs, "--store %s: want memory, redis://, rediss:// or redis-cluster://", redis.Redact(f.url))
	case scheme != "redis" && scheme != "rediss" && scheme != "redis-cluster":
		return usageErrorf(fs, "--store %s: scheme %q: want memory, redis://, rediss:// or redis-cluster://", redis.Redact(f.url), scheme)
	case f.blockTTL < 0:
		return usageErrorf(fs, "--redis-block-ttl %v: want 0 (no expiry) or more", f.blockTTL)
	case f.leaseTTL <= 0:
		return usageErrorf(fs, "--redis-lease-ttl %v: want > 0", f.leaseTTL)
	case f.timeout <= 0:
		return usageErrorf(fs, "--redis-timeout %v: want > 0", f.timeout)
	}
	return nil
}

// openedStore is the chosen store with what serve needs besides the
// contract.
type openedStore struct {
	store.Store
	// memory is the in-memory store, nil for Redis.
	memory *memory.Store
	// ping reports whether the store can be reached (always, in memory).
	ping  func(context.Context) error
	close func() error
}

// open opens the store the flags choose.
func (f *storeFlags) open(ctx context.Context, reg prometheus.Registerer, log *slog.Logger) (*openedStore, error) {
	if f.isMemory() {
		o := f.mem
		o.Registerer = reg
		st, err := memory.New(o)
		if err != nil {
			return nil, err
		}
		return &openedStore{Store: st, memory: st, ping: func(context.Context) error { return nil }, close: func() error { return nil }}, nil
	}
	goredis.SetLogger(redisLog{log: log, limit: ratelog.New(10 * time.Second)})
	st, err := redis.New(ctx, redis.Options{
		URL: f.url, Prefix: f.prefix, BlockTTL: f.blockTTL, LeaseTTL: f.leaseTTL, Timeout: f.timeout,
		Logger: log, Registerer: reg,
	})
	if err != nil {
		return nil, fmt.Errorf("--store %s: %w", redis.Redact(f.url), err)
	}
	return &openedStore{Store: st, ping: st.Ping, close: st.Close}, nil
}

// redisLog writes the Redis client's own log lines (connection pool
// trouble, mostly) to prefixd's log, at most one every ten seconds: an
// outage would otherwise write one per attempt.
type redisLog struct {
	log   *slog.Logger
	limit *ratelog.Limiter
}

func (l redisLog) Printf(_ context.Context, format string, v ...any) {
	if ok, suppressed := l.limit.Allow(); ok {
		l.log.Warn("redis client: "+fmt.Sprintf(format, v...), "lines_not_logged", suppressed)
	}
}
