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
// removed from the index. A file that does not parse changes nothing.
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
	w.stamp = stamp
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
		old, had := w.current[ep]
		if had && old == c {
			continue
		}
		w.pipe.SetSource(ep, c.src)
		if !had {
			if err := w.sub.Connect(ep); err != nil {
				return fmt.Errorf("connect %s: %w", ep, err)
			}
			w.log.Info("endpoint added", "endpoint", ep, "replay", c.src.Replay, "file", w.path)
		}
	}
	w.current = want
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
