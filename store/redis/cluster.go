package redis

import (
	"context"
	"errors"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/prefixd/prefixd/store"
)

// On a cluster a batch's block keys span slots, so no script can apply it
// whole. applyCluster takes three steps, holding the pod's stripe lock
// (this process) and its lease (the others):
//
//  1. on the pod's slot (beginScript): the lease and the seq fence; the
//     membership of every key the batch adds by key, before any block
//     holds it, so that membership is never short of what the pod holds;
//     the engine-map entries of the hashes the batch names, and the
//     members when it clears;
//  2. on the block keys' nodes: read the pod's mask of every key the batch
//     names (one pipeline, split by node and run in parallel), apply the
//     ops here, then write each changed mask (another such pipeline);
//  3. on the pod's slot (endScript): if the lease is still ours, drop the
//     members left unheld, change the engine map, set the applied seq.
//
// A failure between steps leaves the seq where it was; the batch applies
// again from there, to the same end: each key's final mask is a function
// of its mask before, and applying the same ops to it again changes
// nothing more.

// keyState is one block key's mask for the pod during a batch.
type keyState struct {
	init, cur uint8
	known     bool // init was read (else the key was only cleared: written blind)
	added     bool // an add named it: its TTL is refreshed
}

// pairState is an engine-map entry a batch set (ok) or dropped.
type pairState struct {
	key uint64
	ok  bool
}

func (s *Store) applyCluster(ctx, orig context.Context, pod string, b *store.Batch) (store.Result, error) {
	unlock, err := s.lock(ctx, pod)
	if err != nil {
		return store.Result{}, err
	}
	defer unlock()
	res, err := s.applyClusterOnce(ctx, orig, pod, b, false)
	if errors.Is(err, errLostID) {
		res, err = s.applyClusterOnce(ctx, orig, pod, b, true)
	}
	return res, err
}

// errLostID says that a pod's cached id was wrong (see lostIDs).
var errLostID = errors.New("pod id changed")

func (s *Store) applyClusterOnce(ctx, orig context.Context, pod string, b *store.Batch, retried bool) (store.Result, error) {
	id, err := s.podID(ctx, pod, true)
	if err != nil {
		return store.Result{}, err
	}
	pk := s.keys.forPod(pod)
	podKeys := []string{pk.state, pk.lease, pk.emap}

	// Step 1.
	var addKeys, engines []uint64
	seenAdd := map[uint64]bool{}
	seenEng := map[uint64]bool{}
	clears, pairs := false, 0
	for i := range b.Ops {
		op := &b.Ops[i]
		switch {
		case op.Kind == store.OpClear:
			clears = true
		case len(op.Keys) == 0:
			for _, e := range op.Engine {
				if !seenEng[e] {
					seenEng[e] = true
					engines = append(engines, e)
				}
			}
		case op.Kind == store.OpAdd:
			pairs += len(op.Engine)
			for _, k := range op.Keys {
				if !seenAdd[k] {
					seenAdd[k] = true
					addKeys = append(addKeys, k)
				}
			}
		}
	}
	args := make([]any, 0, 8+2*len(addKeys)+len(engines))
	args = append(args, s.o.Owner, millis(s.o.LeaseTTL), seqArg(b.Seq), pk.members, len(addKeys))
	for _, k := range addKeys {
		args = append(args, bucketOf(k), memberOf(k))
	}
	args = append(args, len(engines))
	for _, e := range engines {
		args = append(args, engineArg(e))
	}
	args = append(args, flag(clears), pairs)
	r, err := asReply(s.run(ctx, beginScript, podKeys, args...).Result())
	if err != nil {
		return store.Result{}, err
	}
	switch r.str(0) {
	case "ok":
	case "dup", "owner":
		return scriptResult(pod, b, r)
	default:
		return store.Result{}, fmt.Errorf("begin script replied %v", []any(r))
	}
	if r.int(4) == 0 {
		// A first batch: after a loss of data every pod's next batch is
		// one, so checking the id here is enough to notice the loss.
		actual, err := s.client.HGet(ctx, s.keys.podid, pod).Result()
		if err != nil && !errors.Is(err, goredis.Nil) {
			return store.Result{}, err
		}
		if actual != id {
			s.lostIDs(pod, id, actual)
			if retried {
				return store.Result{}, fmt.Errorf("pod %q: id %s changed again to %q", pod, id, actual)
			}
			return store.Result{}, errLostID
		}
	}
	resolved := make(map[uint64]uint64, len(engines))
	for i, v := range r.list(1) {
		if dec, ok := v.(string); ok && i < len(engines) {
			k, err := parseMember(dec)
			if err != nil {
				return store.Result{}, fmt.Errorf("pod %q: engine map value %q: %w", pod, dec, err)
			}
			resolved[engines[i]] = k
		}
	}
	members, err := parseMembers(r.list(2))
	if err != nil {
		return store.Result{}, fmt.Errorf("pod %q: %w", pod, err)
	}
	// A chunk of the engine map to sweep: pairs whose key the pod does
	// not hold once the batch is applied go in step 3.
	type sweepPair struct{ hash, key uint64 }
	sweepCursor := ""
	var sweep []sweepPair
	if sl := r.list(3); len(sl) > 0 {
		sweepCursor, _ = sl[0].(string)
		for j := 1; j+1 < len(sl); j += 2 {
			e, _ := sl[j].(string)
			dec, _ := sl[j+1].(string)
			k, err := parseMember(dec)
			if len(e) != 8 || err != nil {
				continue
			}
			sweep = append(sweep, sweepPair{hash: beUint64(e), key: k})
		}
	}
	if err := orig.Err(); err != nil {
		return store.Result{}, err
	}

	// Step 2: read the masks.
	st := make(map[uint64]*keyState)
	var order []uint64
	need := func(k uint64) {
		if st[k] == nil {
			st[k] = &keyState{known: true}
			order = append(order, k)
		}
	}
	for i := range b.Ops {
		for _, k := range b.Ops[i].Keys {
			need(k)
		}
	}
	for _, k := range resolved {
		need(k)
	}
	for _, p := range sweep {
		need(p.key)
	}
	if err := s.readMasks(ctx, id, order, st); err != nil {
		return store.Result{}, err
	}
	for _, k := range members {
		if st[k] == nil {
			st[k] = &keyState{}
			order = append(order, k)
		}
	}

	// The ops, in order.
	var res store.Result
	overlay := map[uint64]pairState{}
	mapCleared := false
	resolve := func(e uint64) (uint64, bool) {
		if p, ok := overlay[e]; ok {
			return p.key, p.ok
		}
		if mapCleared {
			return 0, false
		}
		k, ok := resolved[e]
		return k, ok
	}
	for i := range b.Ops {
		op := &b.Ops[i]
		bit := uint8(1) << op.Tier
		switch {
		case op.Kind == store.OpClear:
			for _, ks := range st {
				ks.cur = 0
			}
			mapCleared = true
			clear(overlay)
		case len(op.Keys) > 0 && op.Kind == store.OpAdd:
			for j, k := range op.Keys {
				ks := st[k]
				ks.cur |= bit
				ks.added = true
				if len(op.Engine) > 0 {
					overlay[op.Engine[j]] = pairState{key: k, ok: true}
				}
			}
		case len(op.Keys) > 0:
			for _, k := range op.Keys {
				if ks := st[k]; ks.cur&bit != 0 {
					ks.cur &^= bit
					res.Removed++
				} else {
					res.Unknown++
				}
			}
		default:
			for _, e := range op.Engine {
				k, ok := resolve(e)
				if !ok {
					res.Unknown++
					continue
				}
				ks := st[k]
				switch {
				case ks.cur == 0:
					res.Unknown++
					overlay[e] = pairState{}
				case op.Kind == store.OpAdd:
					ks.cur |= bit
					ks.added = true
				case ks.cur&bit == 0:
					res.Unknown++
				default:
					ks.cur &^= bit
					res.Removed++
					if ks.cur == 0 {
						overlay[e] = pairState{}
					}
				}
			}
		}
	}

	// Step 2: write the masks.
	if err := orig.Err(); err != nil {
		return store.Result{}, err
	}
	if err := s.writeMasks(ctx, id, order, st); err != nil {
		return store.Result{}, err
	}
	if err := orig.Err(); err != nil {
		return store.Result{}, err
	}

	// Step 3.
	var set, del []uint64
	for e, p := range overlay {
		if p.ok {
			set = append(set, e)
		} else {
			del = append(del, e)
		}
	}
	for _, p := range sweep {
		if _, ok := overlay[p.hash]; !ok && !mapCleared && st[p.key].cur == 0 {
			del = append(del, p.hash)
		}
	}
	var gone []uint64
	for _, k := range order {
		if st[k].cur == 0 {
			gone = append(gone, k)
		}
	}
	args = args[:0]
	args = append(args, s.o.Owner, millis(s.o.LeaseTTL), seqArg(b.Seq), pk.members, flag(mapCleared), len(set))
	for _, e := range set {
		args = append(args, engineArg(e), memberOf(overlay[e].key))
	}
	args = append(args, len(del))
	for _, e := range del {
		args = append(args, engineArg(e))
	}
	args = append(args, len(gone))
	for _, k := range gone {
		args = append(args, bucketOf(k), memberOf(k))
	}
	args = append(args, sweepCursor)
	r, err = asReply(s.run(ctx, endScript, podKeys, args...).Result())
	if err != nil {
		return store.Result{}, err
	}
	switch r.str(0) {
	case "ok":
		res.AppliedSeq = b.Seq
		return res, nil
	case "owner":
		return store.Result{}, fmt.Errorf("lease lost while applying seq %d: %w", b.Seq, notOwner(pod, r.str(1)))
	}
	return store.Result{}, fmt.Errorf("end script replied %v", []any(r))
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func beUint64(s string) uint64 {
	var v uint64
	for i := range 8 {
		v = v<<8 | uint64(s[i])
	}
	return v
}

func parseMembers(l []any) ([]uint64, error) {
	out := make([]uint64, 0, len(l))
	for _, v := range l {
		dec, _ := v.(string)
		k, err := parseMember(dec)
		if err != nil {
			return nil, fmt.Errorf("membership entry %q: %w", dec, err)
		}
		out = append(out, k)
	}
	return out, nil
}

// readMasks reads the pod's mask of each key of order into st, in one
// pipeline (go-redis splits it by node and runs the nodes in parallel).
func (s *Store) readMasks(ctx context.Context, id string, order []uint64, st map[uint64]*keyState) error {
	if len(order) == 0 {
		return nil
	}
	cmds := make([]*goredis.StringCmd, len(order))
	_, err := s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, k := range order {
			cmds[i] = p.HGet(ctx, s.keys.blockKey(k), id)
		}
		return nil
	})
	if err != nil && !errors.Is(err, goredis.Nil) {
		return err
	}
	for i, k := range order {
		m, err := cmds[i].Int()
		switch {
		case errors.Is(err, goredis.Nil):
		case err != nil:
			return err
		default:
			st[k].init = uint8(m)
			st[k].cur = uint8(m)
		}
	}
	return nil
}

// writeMasks writes the masks that changed, and refreshes the TTL of what
// was added.
func (s *Store) writeMasks(ctx context.Context, id string, order []uint64, st map[uint64]*keyState) error {
	ttl := s.o.BlockTTL
	_, err := s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for _, k := range order {
			ks := st[k]
			changed := !ks.known || ks.cur != ks.init
			refresh := ttl > 0 && ks.added && ks.cur != 0
			if !changed && !refresh {
				continue
			}
			bk := s.keys.blockKey(k)
			if changed {
				if ks.cur == 0 {
					p.HDel(ctx, bk, id)
				} else {
					p.HSet(ctx, bk, id, int(ks.cur))
				}
			}
			if refresh {
				p.PExpire(ctx, bk, ttl)
			}
		}
		return nil
	})
	return err
}

// lookupCluster reads every key of the query in one pipeline, walks them
// here, then reads the matched pods' stale marks.
func (s *Store) lookupCluster(ctx context.Context, keys []uint64, names []string, out []store.Match) ([]store.Match, error) {
	var filter map[string]bool
	var missing []string
	if len(names) > 0 {
		filter = make(map[string]bool, len(names))
		s.mu.RLock()
		for _, n := range names {
			if id, ok := s.ids[n]; ok {
				filter[id] = true
			} else {
				missing = append(missing, n)
			}
		}
		s.mu.RUnlock()
	}
	cmds := make([]*goredis.MapStringStringCmd, len(keys))
	var ids *goredis.SliceCmd
	_, err := s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		if len(missing) > 0 {
			ids = p.HMGet(ctx, s.keys.podid, missing...)
		}
		for i, k := range keys {
			cmds[i] = p.HGetAll(ctx, s.keys.blockKey(k))
		}
		return nil
	})
	if err != nil {
		return out, err
	}
	if ids != nil {
		for i, v := range ids.Val() {
			if id, ok := v.(string); ok {
				filter[id] = true
				s.remember(missing[i], id)
			}
		}
	}
	if filter != nil && len(filter) == 0 {
		return out, nil
	}
	type count struct {
		id    string
		tiers [store.NumTiers]int
		n     int
	}
	var counts []count
	var alive []int // indexes into counts
	for i := range keys {
		h := cmds[i].Val()
		if i == 0 {
			for id, m := range h {
				if filter != nil && !filter[id] {
					continue
				}
				c := count{id: id, n: 1}
				c.tiers[fastest(m)]++
				counts = append(counts, c)
				alive = append(alive, len(counts)-1)
			}
		} else {
			k := 0
			for _, j := range alive {
				if m, ok := h[counts[j].id]; ok {
					counts[j].n++
					counts[j].tiers[fastest(m)]++
					alive[k] = j
					k++
				}
			}
			alive = alive[:k]
		}
		if len(alive) == 0 {
			break
		}
	}
	if len(counts) == 0 {
		return out, nil
	}
	idList := make([]string, len(counts))
	for i, c := range counts {
		idList[i] = c.id
	}
	podNames, err := s.podNames(ctx, idList)
	if err != nil {
		return out, err
	}
	stale := make([]*goredis.StringCmd, len(counts))
	_, err = s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, name := range podNames {
			if name != "" {
				stale[i] = p.HGet(ctx, s.keys.forPod(name).state, "st")
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, goredis.Nil) {
		return out, err
	}
	for i, c := range counts {
		if podNames[i] == "" {
			continue
		}
		out = append(out, store.Match{Pod: podNames[i], Blocks: c.n, TierBlocks: c.tiers, Stale: stale[i].Val() == "1"})
	}
	return out, nil
}

// fastest returns the fastest tier of a mask as the holder hashes spell it.
func fastest(mask string) int {
	if len(mask) == 1 {
		switch mask[0] {
		case '2', '6':
			return int(store.TierCPU)
		case '4':
			return int(store.TierDisk)
		}
	}
	return int(store.TierGPU)
}

// engineKeysCluster reads the pod's map, then whether the pod holds each
// key found.
func (s *Store) engineKeysCluster(ctx context.Context, pod string, hashes []uint64) ([]any, error) {
	out := make([]any, len(hashes))
	fields := make([]string, len(hashes))
	for i, h := range hashes {
		fields[i] = engineArg(h)
	}
	// The id is read with the map rather than taken from the cache: it is
	// no more round trips, and always right.
	var idCmd *goredis.StringCmd
	var mapCmd *goredis.SliceCmd
	_, err := s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		idCmd = p.HGet(ctx, s.keys.podid, pod)
		mapCmd = p.HMGet(ctx, s.keys.forPod(pod).emap, fields...)
		return nil
	})
	if errors.Is(err, goredis.Nil) {
		return out, nil // no id: an unknown pod
	}
	if err != nil {
		return nil, err
	}
	id, decs := idCmd.Val(), mapCmd.Val()
	held := make([]*goredis.BoolCmd, len(decs))
	_, err = s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, v := range decs {
			if dec, ok := v.(string); ok {
				if k, err := parseMember(dec); err == nil {
					held[i] = p.HExists(ctx, s.keys.blockKey(k), id)
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i, v := range decs {
		if held[i] != nil && held[i].Val() {
			out[i] = v
		}
	}
	return out, nil
}

// forgetCluster forgets pod a chunk at a time under its lease: the chunk's
// members from its slot, their holdings from the block keys' nodes, then
// the members (with the next chunk's read), and the pod once none is left.
func (s *Store) forgetCluster(ctx, orig context.Context, pod, id string) error {
	actual, err := s.client.HGet(ctx, s.keys.podid, pod).Result()
	if err != nil && !errors.Is(err, goredis.Nil) {
		return err
	}
	if actual != id {
		s.lostIDs(pod, id, actual)
		if id = actual; id == "" {
			return nil
		}
	}
	return s.chunks(ctx, orig, pod, id, "forget", 0, func(members []uint64) ([]uint64, error) {
		if len(members) == 0 {
			return nil, nil
		}
		_, err := s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for _, k := range members {
				p.HDel(ctx, s.keys.blockKey(k), id)
			}
			return nil
		})
		return members, err
	})
}

// sweepCluster drops the members of pod whose block expired, under its
// lease; a pod another process holds is left to it.
func (s *Store) sweepCluster(ctx context.Context, pod, id string, now int64) error {
	err := s.chunks(ctx, ctx, pod, id, "sweep", now, func(members []uint64) ([]uint64, error) {
		if len(members) == 0 {
			return nil, nil
		}
		held := make([]*goredis.BoolCmd, len(members))
		_, err := s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for i, k := range members {
				held[i] = p.HExists(ctx, s.keys.blockKey(k), id)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		var gone []uint64
		for i, k := range members {
			if !held[i].Val() {
				gone = append(gone, k)
			}
		}
		return gone, nil
	})
	if errors.Is(err, store.ErrNotOwner) {
		return nil
	}
	return err
}

// chunks runs chunkScript in mode until it is done, handing each chunk's
// members to deal and removing the members deal returns with the next.
func (s *Store) chunks(ctx, orig context.Context, pod, id, mode string, now int64, deal func([]uint64) ([]uint64, error)) error {
	unlock, err := s.lock(ctx, pod)
	if err != nil {
		return err
	}
	defer unlock()
	pk := s.keys.forPod(pod)
	var gone []uint64
	from := int64(0)
	for {
		args := make([]any, 0, 8+2*len(gone))
		args = append(args, s.o.Owner, millis(s.o.LeaseTTL), pk.members, mode, forgetChunk, from, now, len(gone))
		for _, k := range gone {
			args = append(args, bucketOf(k), memberOf(k))
		}
		r, err := asReply(s.run(ctx, chunkScript, []string{pk.state, pk.lease, pk.emap}, args...).Result())
		if err != nil {
			return err
		}
		switch r.str(0) {
		case "done":
			return nil
		case "owner":
			return notOwner(pod, r.str(1))
		case "more":
		default:
			return fmt.Errorf("chunk script replied %v", []any(r))
		}
		from = int64(r.int(1))
		members, err := parseMembers(r[2:])
		if err != nil {
			return fmt.Errorf("pod %q: %w", pod, err)
		}
		if err := orig.Err(); err != nil {
			return err
		}
		if gone, err = deal(members); err != nil {
			return err
		}
	}
}
