package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/prefixd/prefixd/store"
)

// forgetChunk is how many of a pod's blocks ForgetPod (and a cluster's sweep)
// deals with a call, so that the server is never busy with one for long.
const forgetChunk = 2048

// Apply applies pod's batch b and records b.Seq as its applied seq (see
// store.Store). The batch is checked whole first. It takes the pod's
// write lease, or returns an error wrapping store.ErrNotOwner, having
// changed nothing, when another process holds it. On a single node the
// batch is one script; on a cluster it takes three steps (see the package
// documentation), and a failure between them leaves the applied seq where
// it was.
func (s *Store) Apply(ctx context.Context, pod string, b *store.Batch) (store.Result, error) {
	bctx, done, err := s.begin(ctx, opApply)
	if err != nil {
		return store.Result{}, err
	}
	if pod == "" {
		return store.Result{}, done(store.ErrInvalidPod)
	}
	if err := b.Validate(); err != nil {
		return store.Result{}, done(err)
	}
	var res store.Result
	if s.cluster != nil {
		res, err = s.applyCluster(bctx, ctx, pod, b)
	} else {
		res, err = s.applySingle(bctx, pod, b)
	}
	return res, done(err)
}

// Lookup walks keys and reports each candidate pod's longest run of
// leading keys (see store.Store): one script on a single node; on a
// cluster one pipelined read of the keys per node, the walk here, and one
// read of the matched pods' stale marks.
func (s *Store) Lookup(ctx context.Context, keys []uint64, pods []string, out []store.Match) ([]store.Match, error) {
	out = out[:0]
	bctx, done, err := s.begin(ctx, opLookup)
	if err != nil {
		return out, err
	}
	if len(keys) == 0 {
		return out, done(nil)
	}
	names := pods
	if len(pods) > 0 {
		names = make([]string, 0, len(pods))
		for _, p := range pods {
			if p != "" && !slices.Contains(names, p) {
				names = append(names, p)
			}
		}
		if len(names) == 0 {
			return out, done(nil)
		}
	}
	if s.cluster != nil {
		out, err = s.lookupCluster(bctx, keys, names, out)
	} else {
		out, err = s.lookupSingle(bctx, keys, names, out)
	}
	return out, done(err)
}

// AppliedSeq returns pod's applied seq.
func (s *Store) AppliedSeq(ctx context.Context, pod string) (uint64, bool, error) {
	bctx, done, err := s.begin(ctx, opAppliedSeq)
	if err != nil {
		return 0, false, err
	}
	if pod == "" {
		return 0, false, done(store.ErrInvalidPod)
	}
	q, err := s.client.HGet(bctx, s.keys.forPod(pod).state, "q").Result()
	if errors.Is(err, goredis.Nil) {
		return 0, false, done(nil)
	}
	if err != nil {
		return 0, false, done(err)
	}
	seq, err := strconv.ParseUint(q, 10, 64)
	if err != nil {
		return 0, false, done(fmt.Errorf("pod %q: applied seq %q: %w", pod, q, err))
	}
	return seq, true, done(nil)
}

// SetStale marks pod stale or consistent again.
func (s *Store) SetStale(ctx context.Context, pod string, stale bool) error {
	bctx, done, err := s.begin(ctx, opSetStale)
	if err != nil {
		return err
	}
	if pod == "" {
		return done(store.ErrInvalidPod)
	}
	st := s.keys.forPod(pod).state
	if !stale {
		return done(s.client.HDel(bctx, st, "st").Err())
	}
	// Pods lists the pods of the id hash: a pod known by its mark alone
	// needs an id too.
	if _, err := s.podID(bctx, pod, true); err != nil {
		return done(err)
	}
	return done(s.client.HSet(bctx, st, "st", "1").Err())
}

// ForgetPod removes every block of pod, its engine-hash map, applied seq
// and stale mark, a chunk of blocks a call. Its id stays. Like Apply, it
// takes the pod's lease, and returns an error wrapping store.ErrNotOwner
// when another process holds it: that process applies the pod's events,
// and forgets it when its engine restarts or it leaves.
func (s *Store) ForgetPod(ctx context.Context, pod string) error {
	bctx, done, err := s.begin(ctx, opForgetPod)
	if err != nil {
		return err
	}
	if pod == "" {
		return done(store.ErrInvalidPod)
	}
	id, err := s.podID(bctx, pod, false)
	if err != nil || id == "" {
		return done(err)
	}
	if s.cluster != nil {
		err = s.forgetCluster(bctx, ctx, pod, id)
	} else {
		err = s.forgetSingle(bctx, ctx, pod, id)
	}
	return done(err)
}

// EngineKeys resolves engine hashes through pod's engine-hash map: a hash
// resolves while the pod holds its key.
func (s *Store) EngineKeys(ctx context.Context, pod string, hashes []uint64, keys []uint64, found []bool) ([]uint64, []bool, error) {
	keys, found = keys[:0], found[:0]
	bctx, done, err := s.begin(ctx, opEngineKeys)
	if err != nil {
		return keys, found, err
	}
	if pod == "" {
		return keys, found, done(store.ErrInvalidPod)
	}
	if len(hashes) == 0 {
		return keys, found, done(nil)
	}
	var decs []any
	if s.cluster != nil {
		decs, err = s.engineKeysCluster(bctx, pod, hashes)
	} else {
		args := make([]any, 0, 3+len(hashes))
		args = append(args, s.keys.podid, pod, s.keys.block)
		for _, h := range hashes {
			args = append(args, engineArg(h))
		}
		decs, err = asReply(s.run(bctx, engineKeysScript, []string{s.keys.forPod(pod).emap}, args...).Result())
	}
	if err != nil {
		return keys, found, done(err)
	}
	if len(decs) != len(hashes) {
		return keys, found, done(fmt.Errorf("engine keys: %d answers for %d hashes", len(decs), len(hashes)))
	}
	for _, d := range decs {
		dec, _ := d.(string)
		k, err := parseMember(dec)
		ok := dec != "" && err == nil
		if !ok {
			k = 0
		}
		keys, found = append(keys, k), append(found, ok)
	}
	return keys, found, done(nil)
}

// engineArg is an engine hash as the scripts take it: 8 bytes, big-endian.
func engineArg(h uint64) string {
	return string([]byte{byte(h >> 56), byte(h >> 48), byte(h >> 40), byte(h >> 32), byte(h >> 24), byte(h >> 16), byte(h >> 8), byte(h)})
}

// Pods lists the pods known to the store, sorted by name. With a BlockTTL,
// it first checks the membership of each pod not checked within the last
// BlockTTL against its blocks, so that expired blocks stop being counted.
func (s *Store) Pods(ctx context.Context) ([]store.PodInfo, error) {
	bctx, done, err := s.begin(ctx, opPods)
	if err != nil {
		return nil, err
	}
	out, err := s.pods(bctx, ctx)
	return out, done(err)
}

type podEntry struct {
	name, id string
	state    *goredis.SliceCmd
}

func (s *Store) pods(ctx, orig context.Context) ([]store.PodInfo, error) {
	all := make(map[string]string)
	var cursor uint64
	for {
		kv, next, err := s.client.HScan(ctx, s.keys.podid, cursor, "*", 1000).Result()
		if err != nil {
			return nil, err
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i] != "" {
				all[kv[i]] = kv[i+1]
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	s.mu.Lock()
	clear(s.ids)
	clear(s.names)
	for name, id := range all {
		s.ids[name], s.names[id] = id, name
	}
	s.mu.Unlock()
	entries := make([]podEntry, 0, len(all))
	for name, id := range all {
		entries = append(entries, podEntry{name: name, id: id})
	}
	read := func(es []podEntry) error {
		if len(es) == 0 {
			return nil
		}
		_, err := s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for i := range es {
				es[i].state = p.HMGet(ctx, s.keys.forPod(es[i].name).state, "q", "st", "ev", "n", "swt")
			}
			return nil
		})
		return err
	}
	if err := read(entries); err != nil {
		return nil, err
	}
	if ttl := s.o.BlockTTL; ttl > 0 {
		// A pod never swept starts its clock now: its first sweep is a
		// BlockTTL away, so that a prefixd starting on a loaded store
		// does not check it all at once.
		now := time.Now().UnixMilli()
		var swept, start []podEntry
		for _, e := range entries {
			v := e.state.Val()
			if str(v, 3) == "" {
				continue // no blocks
			}
			if str(v, 4) == "" {
				start = append(start, e)
				continue
			}
			swt, _ := strconv.ParseInt(str(v, 4), 10, 64)
			if now-swt > ttl.Milliseconds() {
				if err := orig.Err(); err != nil {
					return nil, err
				}
				if err := s.sweep(ctx, e.name, e.id, now); err != nil {
					return nil, err
				}
				swept = append(swept, e)
			}
		}
		if len(start) > 0 {
			_, err := s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
				for _, e := range start {
					p.HSetNX(ctx, s.keys.forPod(e.name).state, "swt", now)
				}
				return nil
			})
			if err != nil {
				return nil, err
			}
		}
		if err := read(swept); err != nil {
			return nil, err
		}
	}
	out := make([]store.PodInfo, 0, len(entries))
	for _, e := range entries {
		v := e.state.Val()
		p := store.PodInfo{Name: e.name, Stale: str(v, 1) == "1"}
		if q := str(v, 0); q != "" {
			seq, err := strconv.ParseUint(q, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("pod %q: applied seq %q: %w", e.name, q, err)
			}
			p.AppliedSeq, p.HasSeq = seq, true
		}
		p.Evicted, _ = strconv.Atoi(str(v, 2))
		p.Blocks, _ = strconv.Atoi(str(v, 3))
		if p.Blocks > 0 || p.Evicted > 0 || p.HasSeq || p.Stale {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b store.PodInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// str returns v[i] as a string, "" for a nil.
func str(v []any, i int) string {
	if i < len(v) {
		s, _ := v[i].(string)
		return s
	}
	return ""
}

// sweep drops the membership entries of pod's expired blocks (BlockTTL).
// On a single node each chunk is one script; on a cluster it needs the
// pod's lease, and a pod another process holds is left to it.
func (s *Store) sweep(ctx context.Context, pod, id string, now int64) error {
	pk := s.keys.forPod(pod)
	if s.cluster == nil {
		for from := 0; from < 256; from += 32 {
			err := s.run(ctx, sweepScript, []string{pk.state}, id, pk.members, s.keys.block, from, from+32, now).Err()
			if err != nil {
				return err
			}
		}
		return nil
	}
	return s.sweepCluster(ctx, pod, id, now)
}

// Models returns every model's key mode and adapters.
func (s *Store) Models(ctx context.Context) (map[string]store.ModelState, error) {
	bctx, done, err := s.begin(ctx, opModels)
	if err != nil {
		return nil, err
	}
	var modes, loras *goredis.MapStringStringCmd
	_, err = s.client.Pipelined(bctx, func(p goredis.Pipeliner) error {
		modes = p.HGetAll(bctx, s.keys.models)
		loras = p.HGetAll(bctx, s.keys.loras)
		return nil
	})
	if err != nil {
		return nil, done(err)
	}
	out := make(map[string]store.ModelState)
	for model, mode := range modes.Val() {
		out[model] = store.ModelState{KeyMode: mode}
	}
	for adapter, base := range loras.Val() {
		m := out[base]
		m.LoRAs = append(m.LoRAs, adapter)
		out[base] = m
	}
	return out, done(nil)
}

// DecideKeyMode records mode as model's key mode unless one is recorded,
// and returns the recorded one.
func (s *Store) DecideKeyMode(ctx context.Context, model, mode string) (string, error) {
	bctx, done, err := s.begin(ctx, opDecideKeyMode)
	if err != nil {
		return "", err
	}
	if model == "" || mode != store.KeyModeEngine && mode != store.KeyModeTokens {
		return "", done(fmt.Errorf("%w: model %q, key mode %q", store.ErrInvalidName, model, mode))
	}
	got, err := s.run(bctx, firstWinsScript, []string{s.keys.models}, model, mode).Text()
	return got, done(err)
}

// AddLoRA records adapter's base model unless it is recorded, and returns
// the recorded one.
func (s *Store) AddLoRA(ctx context.Context, adapter, base string) (string, error) {
	bctx, done, err := s.begin(ctx, opAddLoRA)
	if err != nil {
		return "", err
	}
	if adapter == "" || base == "" {
		return "", done(fmt.Errorf("%w: adapter %q, base %q", store.ErrInvalidName, adapter, base))
	}
	got, err := s.run(bctx, firstWinsScript, []string{s.keys.loras}, adapter, base).Text()
	return got, done(err)
}
