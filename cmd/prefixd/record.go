package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/events/recording"
	"github.com/prefixd/prefixd/events/transport"
	"github.com/prefixd/prefixd/internal/recovery"
)

func runRecord(ctx context.Context, args []string, _, stderr io.Writer) error {
	start := time.Now()
	fs := newFlagSet("record", "", stderr)
	var (
		zf       zmqFlags
		out      = fs.String("out", "", "the native recording to write (created or truncated); required")
		duration = fs.Duration("duration", 0, "stop after this long (default: until interrupted)")
		flush    = fs.Duration("flush-interval", time.Second, "how often what was received is flushed to the file, for readers of a recording in progress")
	)
	zf.register(fs, false)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErrorf(fs, "record takes no arguments; have %q", fs.Args())
	}
	if *out == "" {
		return usageErrorf(fs, "--out is required")
	}
	if *duration < 0 || *flush <= 0 {
		return usageErrorf(fs, "--duration must be 0 or more and --flush-interval positive; have %v and %v", *duration, *flush)
	}
	if err := zf.parse(fs); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))

	reg := prometheus.NewRegistry()
	sub, err := transport.NewSubscriber(zf.subscriberOptions(log, recovery.New(reg, log)), transport.NewMetrics(reg))
	if err != nil {
		return err
	}
	defer func() { _ = sub.Close() }() // on early returns; idempotent
	w, err := recording.Create(*out)
	if err != nil {
		return err
	}
	bound, err := zf.subscribe(sub)
	if err != nil {
		return errors.Join(err, w.Close())
	}
	log.Info("prefixd recording", "out", *out, "zmq_bound", bound, "zmq_connect", zf.connectEndpoints(),
		"zmq_topic", zf.topic, "duration", *duration, "startup", time.Since(start))

	var stop <-chan time.Time
	if *duration > 0 {
		t := time.NewTimer(*duration)
		defer t.Stop()
		stop = t.C
	}
	tick := time.NewTicker(*flush)
	defer tick.Stop()
	n := 0
	add := func(m transport.Message) error {
		if m.Closed {
			return nil // a notice, not a message a publisher sent
		}
		n++
		err := w.Append(recording.Message{RecvTime: m.RecvTime, Source: m.Source, Peer: m.Peer, Frames: m.Frames})
		m.Release() // Append has copied the frames
		return err
	}
	var werr error
loop:
	for {
		select {
		case m := <-sub.Messages():
			if werr = add(m); werr != nil {
				break loop
			}
		case <-tick.C:
			if werr = w.Flush(); werr != nil {
				break loop
			}
		case <-stop:
			break loop
		case <-ctx.Done():
			break loop
		}
	}
	// Close ends every connection and closes the queue; what it holds is
	// still written.
	_ = sub.Close()
	for m := range sub.Messages() {
		if werr != nil {
			break
		}
		werr = add(m)
	}
	if err := w.Close(); werr == nil {
		werr = err
	}
	if werr != nil {
		return fmt.Errorf("%s: %w", *out, werr)
	}
	log.Info("prefixd recording done", "out", *out, "messages", n, "dropped", droppedMessages(reg), "took", time.Since(start))
	return nil
}

// droppedMessages sums prefixd_ingest_dropped_total: messages the
// subscriber received but could not queue (the file could not keep up).
func droppedMessages(reg *prometheus.Registry) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "prefixd_ingest_dropped_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}
