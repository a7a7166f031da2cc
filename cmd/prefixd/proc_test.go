package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/internal/syncbuf"
	"github.com/prefixd/prefixd/testutil/zmqpub"
)

// proc is `prefixd serve` running as a process of its own, as users run
// it: what it survives, it survives for real.
type proc struct {
	cmd    *exec.Cmd
	base   string // http://127.0.0.1:PORT
	grpc   string // 127.0.0.1:PORT
	zmq    string // tcp://127.0.0.1:PORT, bound
	stderr *syncbuf.Buffer
	exited chan struct{} // closed when the process has exited
}

// startServe starts prefixd serve bound to free loopback ports, with extra
// flags, and waits until it is ready. It is killed when the test ends.
func startServe(t testing.TB, extra ...string) *proc {
	t.Helper()
	p := &proc{
		base:   fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		grpc:   fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		zmq:    fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t)),
		stderr: &syncbuf.Buffer{},
		exited: make(chan struct{}),
	}
	args := append([]string{"serve", "--zmq-bind", p.zmq, "--grpc-addr", p.grpc, "--http-addr", strings.TrimPrefix(p.base, "http://")}, extra...)
	p.cmd = exec.Command(os.Args[0], args...)
	p.cmd.Env = append(os.Environ(), "PREFIXD_TEST_RUN_MAIN=1")
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	deadline := time.Now().Add(serveWait)
	for {
		if code, _ := get(p.base + "/readyz"); code == http.StatusOK {
			return p
		}
		select {
		case <-p.exited:
			t.Fatalf("prefixd serve exited before it was ready:\n%s", p.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("prefixd serve not ready after %v:\n%s", serveWait, p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive fails the test unless the process runs and answers /healthz.
func (p *proc) alive(t testing.TB) {
	t.Helper()
	select {
	case <-p.exited:
		t.Fatalf("prefixd serve exited (%v):\n%s", p.cmd.ProcessState, p.stderr.String())
	default:
	}
	if code, _ := get(p.base + "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz answered %d:\n%s", code, p.stderr.String())
	}
}

// waitUntil polls cond until it holds, failing the test when the process
// exits or serveWait passes.
func (p *proc) waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(serveWait)
	for !cond() {
		select {
		case <-p.exited:
			t.Fatalf("%s: prefixd serve exited (%v):\n%s", what, p.cmd.ProcessState, p.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v:\n%s", what, serveWait, p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metrics scrapes /metrics and returns the body.
func (p *proc) metrics(t testing.TB) []byte {
	t.Helper()
	code, body := get(p.base + "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics answered %d:\n%s", code, p.stderr.String())
	}
	return body
}

// metric returns the sum of the samples of family name whose labels
// include every label given as name="value" (0 when there is none).
func (p *proc) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	return sampleSum(p.metrics(t), name, labels...)
}

func sampleSum(body []byte, name string, labels ...string) float64 {
	sum := 0.0
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		series, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if series != name && !strings.HasPrefix(series, name+"{") {
			continue
		}
		matches := true
		for _, l := range labels {
			matches = matches && strings.Contains(series, l)
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil && matches {
			sum += v
		}
	}
	return sum
}

// peakRSS returns the process's peak resident set size (VmHWM), in bytes.
func (p *proc) peakRSS(t testing.TB) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/PID/status")
	return 0
}

// rawPub is a hand-driven ZMTP publisher on a TCP connection from a chosen
// source address: what a hostile tester writes, byte for byte.
type rawPub struct {
	c net.Conn
}

// dialRaw connects to a tcp:// endpoint from source IP local ("" for any)
// and completes the handshake as a PUB.
func dialRaw(t testing.TB, endpoint, local string) *rawPub {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
	}
	c, err := d.Dial("tcp", strings.TrimPrefix(endpoint, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := zmqpub.Handshake(c, "PUB"); err != nil {
		t.Fatal(err)
	}
	return &rawPub{c: c}
}

// send writes one message of frames.
func (r *rawPub) send(t testing.TB, frames ...[]byte) {
	t.Helper()
	if _, err := r.c.Write(zmqpub.Message(frames...)); err != nil {
		t.Fatal(err)
	}
}

func seqBytes(seq uint64) []byte {
	return []byte{byte(seq >> 56), byte(seq >> 48), byte(seq >> 40), byte(seq >> 32), byte(seq >> 24), byte(seq >> 16), byte(seq >> 8), byte(seq)}
}

// raceBuild reports whether the test binary, and so the prefixd process
// it runs, was built with the race detector, whose shadow memory
// multiplies a process's (the Go documentation says 5 to 10 times the
// heap): memory bounds must allow for it.
func raceBuild() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}
