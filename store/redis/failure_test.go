package redis_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/store"
	"github.com/prefixd/prefixd/store/redis"
	"github.com/prefixd/prefixd/store/storetest"
	"github.com/prefixd/prefixd/testutil/redistest"
)

// calls makes every call of the store once, and returns their errors by
// name.
func calls(ctx context.Context, s *redis.Store, seq uint64) map[string]error {
	k := storetest.Keys(7, 4)
	_, applyErr := s.Apply(ctx, "p", batch(seq, addOp(k...)))
	_, newPodErr := s.Apply(ctx, "new", batch(seq, addOp(k...)))
	_, lookupErr := s.Lookup(ctx, k, nil, nil)
	_, filteredErr := s.Lookup(ctx, k, []string{"p"}, nil)
	_, _, seqErr := s.AppliedSeq(ctx, "p")
	_, _, engErr := s.EngineKeys(ctx, "p", k, nil, nil)
	_, podsErr := s.Pods(ctx)
	_, modelsErr := s.Models(ctx)
	_, decideErr := s.DecideKeyMode(ctx, "m", store.KeyModeEngine)
	_, loraErr := s.AddLoRA(ctx, "l", "m")
	return map[string]error{
		"Apply": applyErr, "Apply new pod": newPodErr, "Lookup": lookupErr, "Lookup filtered": filteredErr,
		"AppliedSeq": seqErr, "EngineKeys": engErr, "Pods": podsErr, "Models": modelsErr,
		"DecideKeyMode": decideErr, "AddLoRA": loraErr,
		"SetStale": s.SetStale(ctx, "p", true), "ForgetPod": s.ForgetPod(ctx, "p"), "Ping": s.Ping(ctx),
	}
}

// TestUnavailable kills the server under a store, then starts it again:
// every call fails with store.ErrUnavailable while it is gone (and
// returns: each is bounded by the store's timeout), and works again once
// it is back, on the same port, empty.
func TestUnavailable(t *testing.T) {
	p := redistest.Start(t)
	reg := prometheus.NewRegistry()
	s := newStore(t, p.URL(), redis.Options{Timeout: 500 * time.Millisecond, Registerer: reg})
	mustApply(t, s, "p", batch(1, addOp(storetest.Keys(7, 4)...)))

	p.Kill()
	for name, err := range calls(context.Background(), s, 2) {
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s with the server killed: %v, want ErrUnavailable", name, err)
		}
	}
	if n := counter(t, reg, "prefixd_store_redis_errors_total", "lookup", "unavailable"); n < 2 {
		t.Errorf("lookup errors counted: %v, want 2", n)
	}

	p.Restart()
	// The server lost everything: the pod starts again from its first
	// batch, under the id the server gives it now.
	eventually(t, "Apply after the restart", func() error {
		_, err := s.Apply(context.Background(), "other", batch(1, addOp(storetest.Keys(8, 2)...)))
		return err
	})
	for name, err := range calls(context.Background(), s, 1) {
		if err != nil {
			t.Errorf("%s after the restart: %v", name, err)
		}
	}
	if got := matches(t, s, storetest.Keys(8, 2)); !maps(got, map[string]int{"other": 2}) {
		t.Fatalf("Lookup after the restart = %v", got)
	}
}

// TestHung stops the server process (SIGSTOP): connections still open,
// and nothing answers. Calls fail with store.ErrUnavailable once their
// deadline passes, the caller's or the store's timeout, whichever is
// first, and work again when the server continues.
func TestHung(t *testing.T) {
	p := redistest.Start(t)
	s := newStore(t, p.URL(), redis.Options{Timeout: 250 * time.Millisecond})
	k := storetest.Keys(9, 4)
	mustApply(t, s, "p", batch(1, addOp(k...)))
	p.Pause()
	defer p.Resume()
	for name, err := range calls(context.Background(), s, 2) {
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s with the server stopped: %v, want ErrUnavailable", name, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.Lookup(ctx, k, nil, nil); !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Lookup past the caller's deadline: %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	// A canceled call is the caller's doing, not the server's.
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		time.Sleep(50 * time.Millisecond)
		cancel()
	}()
	if _, err := s.Lookup(ctx, k, nil, nil); !errors.Is(err, context.Canceled) || errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Lookup canceled: %v, want context.Canceled alone", err)
	}
	p.Resume()
	eventually(t, "Lookup after the server continued", func() error {
		_, err := s.Lookup(context.Background(), k, nil, nil)
		return err
	})
	if got := matches(t, s, k); !maps(got, map[string]int{"p": 4}) {
		t.Fatalf("Lookup after the server continued = %v", got)
	}
	mustApply(t, s, "p", batch(3, addOp(k...)))
}

// TestNew checks New's errors: unusable options, and a server that is not
// there, named without the URL's password.
func TestNew(t *testing.T) {
	ctx := context.Background()
	p := redistest.Start(t)
	for _, tc := range []struct {
		o    redis.Options
		want error
	}{
		{redis.Options{}, redis.ErrInvalidOptions},
		{redis.Options{URL: "http://127.0.0.1:1"}, redis.ErrInvalidOptions},
		{redis.Options{URL: p.URL(), Prefix: "a{b}:"}, redis.ErrInvalidOptions},
		{redis.Options{URL: p.URL(), BlockTTL: -time.Second}, redis.ErrInvalidOptions},
		{redis.Options{URL: p.URL(), LeaseTTL: -time.Second}, redis.ErrInvalidOptions},
	} {
		if s, err := redis.New(ctx, tc.o); !errors.Is(err, tc.want) {
			if s != nil {
				s.Close()
			}
			t.Errorf("New(%+v): %v, want %v", tc.o, err, tc.want)
		}
	}
	dead := redistest.Start(t)
	dead.Kill()
	url := "redis://u:hunter2@" + dead.Addr() + "/2"
	s, err := redis.New(ctx, redis.Options{URL: url, Timeout: 300 * time.Millisecond})
	if !errors.Is(err, store.ErrUnavailable) || s != nil {
		t.Fatalf("New on a dead server: %v, want ErrUnavailable", err)
	}
	if msg := err.Error(); strings.Contains(msg, "hunter2") || !strings.Contains(msg, "redis://u:xxxxx@"+dead.Addr()+"/2") {
		t.Errorf("New's error %q: want the URL named without its password", msg)
	}
}

// TestURLs connects with a user and password and to another database.
func TestURLs(t *testing.T) {
	ctx := context.Background()
	p := redistest.Start(t)
	if _, err := p.Do("ACL", "SETUSER", "prefixd", "on", ">s3cret", "~*", "&*", "+@all"); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, "redis://prefixd:s3cret@"+p.Addr()+"/3", redis.Options{})
	mustApply(t, s, "p", batch(1, addOp(storetest.Keys(10, 3)...)))
	if got := matches(t, s, storetest.Keys(10, 3)); !maps(got, map[string]int{"p": 3}) {
		t.Fatalf("Lookup = %v", got)
	}
	ks, err := p.Do("INFO", "keyspace")
	if err != nil || !strings.Contains(ks, "db3:keys=") || strings.Contains(ks, "db0:") {
		t.Fatalf("INFO keyspace = %q, %v; want the keys in db 3 alone", ks, err)
	}
	_, err = redis.New(ctx, redis.Options{URL: "redis://prefixd:wrong@" + p.Addr(), Timeout: time.Second})
	if err == nil || strings.Contains(err.Error(), "wrong@") || !strings.Contains(err.Error(), "xxxxx") {
		t.Fatalf("New with a wrong password: %v", err)
	}
	// rediss:// speaks TLS, which this server does not: the URL parses,
	// the handshake fails.
	_, err = redis.New(ctx, redis.Options{URL: "rediss://" + p.Addr(), Timeout: time.Second})
	if err == nil || errors.Is(err, redis.ErrInvalidOptions) {
		t.Fatalf("New(rediss:// to a plain server): %v, want a failed handshake", err)
	}
}

// TestClose checks that Close is idempotent and that calls after it fail.
func TestClose(t *testing.T) {
	p := redistest.Start(t)
	s, err := redis.New(context.Background(), redis.Options{URL: p.URL()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := s.Lookup(context.Background(), storetest.Keys(1, 1), nil, nil); err == nil {
		t.Fatal("Lookup after Close succeeded")
	}
}

// counter returns the value of the series of name with the given op and
// reason labels.
func counter(t *testing.T, reg *prometheus.Registry, name, op, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["op"] == op && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no series %s{op=%q,reason=%q}", name, op, reason)
	return 0
}

// TestClusterNodeDown kills one master of a cluster: lookups that need
// its slots fail with store.ErrUnavailable, and work again once it is
// back on its port (empty, with its slots).
func TestClusterNodeDown(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	s := newStore(t, c.URL(), redis.Options{Timeout: 500 * time.Millisecond})
	k := storetest.Keys(11, 64) // on every node
	mustApply(t, s, "p", batch(1, addOp(k...)))
	c.Nodes[0].Kill()
	if _, err := s.Lookup(context.Background(), k, nil, nil); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Lookup with a master down: %v, want ErrUnavailable", err)
	}
	if err := s.Ping(context.Background()); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Ping with a master down: %v, want ErrUnavailable", err)
	}
	c.Nodes[0].Restart()
	eventually(t, "Lookup after the master is back", func() error {
		_, err := s.Lookup(context.Background(), k, nil, nil)
		return err
	})
	eventually(t, "Apply after the master is back", func() error {
		_, err := s.Apply(context.Background(), "q", batch(1, addOp(k...)))
		return err
	})
	if got := matches(t, s, k); got["q"] != len(k) {
		t.Fatalf("Lookup after the master is back = %v", got)
	}
}
