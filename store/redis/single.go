package redis

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/prefixd/prefixd/store"
)

// opCode is an op's code for applyScript: kind, mode (k: keys, p: keys
// and engine hashes, e: engine hashes), tier bit.
func opCode(op *store.Op) string {
	bit := byte('0' + 1<<op.Tier)
	switch {
	case op.Kind == store.OpClear:
		return "ck0"
	case len(op.Keys) == 0:
		return string([]byte{kindChar(op.Kind), 'e', bit})
	case op.Kind == store.OpAdd && len(op.Engine) > 0:
		return string([]byte{'a', 'p', bit})
	default:
		return string([]byte{kindChar(op.Kind), 'k', bit})
	}
}

func kindChar(k store.OpKind) byte {
	if k == store.OpAdd {
		return 'a'
	}
	return 'r'
}

func millis(d time.Duration) string {
	return strconv.FormatInt(d.Milliseconds(), 10)
}

// applySingle applies b as one script.
func (s *Store) applySingle(ctx context.Context, pod string, b *store.Batch) (store.Result, error) {
	return s.applySingleOnce(ctx, pod, b, false)
}

func (s *Store) applySingleOnce(ctx context.Context, pod string, b *store.Batch, retried bool) (store.Result, error) {
	id, err := s.podID(ctx, pod, true)
	if err != nil {
		return store.Result{}, err
	}
	pk := s.keys.forPod(pod)
	if hasClear(b) {
		switch r, err := s.clearChunks(ctx, pod, id, b.Seq); {
		case err != nil:
			return store.Result{}, err
		case r != nil && r.str(0) == "id" && !retried:
			s.lostIDs(pod, id, r.str(1))
			return s.applySingleOnce(ctx, pod, b, true)
		case r != nil:
			return scriptResult(pod, b, *r)
		}
	}
	n := 8
	for i := range b.Ops {
		n += 2 + 3*max(len(b.Ops[i].Keys), len(b.Ops[i].Engine))
	}
	args := make([]any, 0, n)
	args = append(args, s.o.Owner, millis(s.o.LeaseTTL), seqArg(b.Seq), id, pk.members, s.keys.block, millis(s.o.BlockTTL), pod, len(b.Ops))
	var buf []byte
	kl := len(s.keys.block) + 16
	for i := range b.Ops {
		op := &b.Ops[i]
		code := opCode(op)
		switch code[1] {
		case 'k', 'p':
			args = append(args, code, len(op.Keys))
			buf = buf[:0]
			for _, k := range op.Keys {
				buf = append(buf, s.keys.block...)
				buf = appendHex(buf, k)
			}
			all := string(buf) // one allocation for the op's key names
			for j, k := range op.Keys {
				args = append(args, all[kl*j:kl*j+kl], memberOf(k))
				if code[1] == 'p' {
					args = append(args, engineArg(op.Engine[j]))
				}
			}
		case 'e':
			args = append(args, code, len(op.Engine))
			for _, e := range op.Engine {
				args = append(args, engineArg(e))
			}
		}
	}
	r, err := asReply(s.run(ctx, applyScript, []string{pk.state, pk.lease, pk.emap, s.keys.podid}, args...).Result())
	if err != nil {
		return store.Result{}, err
	}
	if r.str(0) == "id" {
		if retried {
			return store.Result{}, fmt.Errorf("pod %q: id %s changed again to %q", pod, id, r.str(1))
		}
		s.lostIDs(pod, id, r.str(1))
		return s.applySingleOnce(ctx, pod, b, true)
	}
	return scriptResult(pod, b, r)
}

func hasClear(b *store.Batch) bool {
	for i := range b.Ops {
		if b.Ops[i].Kind == store.OpClear {
			return true
		}
	}
	return false
}

// clearChunks takes a clearing batch's pod's blocks away a chunk a script
// (clearChunkScript) until none is left; it returns the reply of a check
// that failed (the batch is a duplicate, another process holds the lease,
// the pod's id changed), nil when the batch's script may run.
func (s *Store) clearChunks(ctx context.Context, pod, id string, seq uint64) (*reply, error) {
	pk := s.keys.forPod(pod)
	for {
		r, err := asReply(s.run(ctx, clearChunkScript, []string{pk.state, pk.lease, s.keys.podid},
			s.o.Owner, millis(s.o.LeaseTTL), seqArg(seq), id, pk.members, s.keys.block, forgetChunk, pod).Result())
		if err != nil {
			return nil, err
		}
		switch r.str(0) {
		case "done":
			return nil, nil
		case "more":
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		default:
			return &r, nil
		}
	}
}

// scriptResult reads the reply of applyScript.
func scriptResult(pod string, b *store.Batch, r reply) (store.Result, error) {
	switch r.str(0) {
	case "ok":
		return store.Result{AppliedSeq: b.Seq, Removed: r.int(1), Unknown: r.int(2)}, nil
	case "dup":
		seq, err := strconv.ParseUint(r.str(1), 10, 64)
		if err != nil {
			return store.Result{}, fmt.Errorf("pod %q: applied seq %q: %w", pod, r.str(1), err)
		}
		return store.Result{Duplicate: true, AppliedSeq: seq}, nil
	case "owner":
		return store.Result{}, notOwner(pod, r.str(1))
	}
	return store.Result{}, fmt.Errorf("apply script replied %v", []any(r))
}

// lookupSingle walks keys in one script.
func (s *Store) lookupSingle(ctx context.Context, keys []uint64, names []string, out []store.Match) ([]store.Match, error) {
	// The keys' names share one allocation.
	kl := len(s.keys.block) + 16
	buf := make([]byte, 0, kl*len(keys))
	for _, k := range keys {
		buf = append(buf, s.keys.block...)
		buf = appendHex(buf, k)
	}
	all := string(buf)
	args := make([]any, 0, 4+len(keys)+len(names))
	args = append(args, s.keys.pod, s.keys.podid, s.keys.podname, len(keys))
	for i := range keys {
		args = append(args, all[i*kl:(i+1)*kl])
	}
	for _, n := range names {
		args = append(args, n)
	}
	r, err := asReply(s.run(ctx, lookupScript, nil, args...).Result())
	if err != nil {
		return out, err
	}
	for i := 0; i+5 < len(r); i += 6 {
		m := store.Match{Pod: r.str(i), Blocks: r.int(i + 1), Stale: r.int(i+5) == 1}
		for t := range store.NumTiers {
			m.TierBlocks[t] = r.int(i + 2 + int(t))
		}
		out = append(out, m)
	}
	return out, nil
}

// forgetSingle forgets pod a chunk a script.
func (s *Store) forgetSingle(ctx, orig context.Context, pod, id string) error {
	pk := s.keys.forPod(pod)
	for {
		r, err := asReply(s.run(ctx, forgetScript, []string{pk.state, pk.lease, pk.emap, s.keys.podid},
			s.o.Owner, millis(s.o.LeaseTTL), id, pk.members, s.keys.block, forgetChunk, pod).Result())
		if err != nil {
			return err
		}
		switch r.str(0) {
		case "done":
			return nil
		case "id":
			s.lostIDs(pod, id, r.str(1))
			if id = r.str(1); id == "" {
				return nil // not known any more: nothing to forget
			}
			continue
		case "owner":
			return notOwner(pod, r.str(1))
		case "more":
		default:
			return fmt.Errorf("forget script replied %v", []any(r))
		}
		if err := orig.Err(); err != nil {
			return err
		}
	}
}
