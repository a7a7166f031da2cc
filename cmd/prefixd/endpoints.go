package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prefixd/prefixd/events/transport"
	"github.com/prefixd/prefixd/indexer/ingest"
)

// parseEndpoints reads an endpoints file: one --zmq-connect value a line,
// blank lines and lines starting with # ignored.
func parseEndpoints(data []byte) (map[string]connectSpec, error) {
	out := make(map[string]connectSpec)
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		c, err := parseConnect(text)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if _, dup := out[c.endpoint]; dup {
			return nil, fmt.Errorf("line %d: endpoint %s listed twice", line, c.endpoint)
		}
		out[c.endpoint] = c
	}
	return out, sc.Err()
}

// endpointsWatcher keeps a subscriber's connections equal to the endpoints
// listed in a file, re-reading it when it changes.
type endpointsWatcher struct {
	path     string
	interval time.Duration
	sub      *transport.Subscriber
	pipe     *ingest.Pipeline
	log      *slog.Logger

	// reserved are endpoints connected by --zmq-connect, which the file
	// may not list.
	reserved []string
	current  map[string]connectSpec
	stamp    string // size and modification time of the file last read
}

// sync reads the file if it changed and connects, reconnects or
// disconnects what differs; the pods of an endpoint disconnected are
// removed from the index. A file that does not parse, or names an
// endpoint that cannot be connected to, changes nothing; one whose
// endpoints could not all be connected is undone as far as it was
// applied, and tried again at the next sync.
func (w *endpointsWatcher) sync(ctx context.Context) error {
	fi, err := os.Stat(w.path)
	if err != nil {
		return err
	}
	stamp := fmt.Sprint(fi.Size(), fi.ModTime().UnixNano())
	if stamp == w.stamp {
		return nil
	}
	data, err := os.ReadFile(w.path)
	if err != nil {
		return err
	}
	want, err := parseEndpoints(data)
	if err != nil {
		return fmt.Errorf("%s: %w", w.path, err)
	}
	for _, ep := range w.reserved {
		if _, ok := want[ep]; ok {
			return fmt.Errorf("%s: endpoint %s is also given by --zmq-connect", w.path, ep)
		}
	}
	var added []string
	for ep, c := range want {
		if _, had := w.current[ep]; had {
			continue
		}
		w.pipe.SetSource(ep, c.src)
		if err := w.sub.Connect(ep); err != nil {
			for _, a := range added {
				w.sub.Disconnect(a)
				_, _ = w.pipe.RemoveSource(ctx, a)
			}
			return fmt.Errorf("%s: connect %s: %w (nothing of the file applied; tried again)", w.path, ep, err)
		}
		added = append(added, ep)
	}
	for ep := range w.current {
		if _, ok := want[ep]; !ok {
			w.sub.Disconnect(ep) // its messages are all queued now
			pods, err := w.pipe.RemoveSource(ctx, ep)
			if err != nil {
				w.log.Warn("endpoint removed; its pods not all removed", "endpoint", ep, "file", w.path, "pods", pods, "err", err)
				continue
			}
			w.log.Info("endpoint removed", "endpoint", ep, "file", w.path, "pods", pods)
		}
	}
	for ep, c := range want {
		if old, had := w.current[ep]; had && old != c {
			w.pipe.SetSource(ep, c.src)
		}
	}
	for _, ep := range added {
		w.log.Info("endpoint added", "endpoint", ep, "replay", want[ep].src.Replay, "file", w.path)
	}
	w.current, w.stamp = want, stamp
	return nil
}

// run syncs every interval until ctx is done.
func (w *endpointsWatcher) run(ctx context.Context) {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := w.sync(ctx); err != nil {
				w.log.Warn("endpoints file not applied", "err", err)
			}
		}
	}
}
