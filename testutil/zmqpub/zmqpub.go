package zmqpub

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/internal/syncbuf"
)

// Python is the interpreter that has pyzmq (Debian's python3-zmq); the
// python3 first on PATH may not.
const Python = "/usr/bin/python3"

// replyTimeout bounds the wait for the answer to one command.
const replyTimeout = 30 * time.Second

// Publisher is one scripts/zmqpub.py process: an XPUB on real libzmq,
// driven over stdin and stdout. Its methods fail the test on error and must
// be called from the test's goroutine; Do may be called from any.
type Publisher struct {
	tb    testing.TB
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string   // stdout lines; closed when stdout ends
	read  chan struct{} // closed when the stdout reader has returned
	// stderr collects the script's standard error for failure messages.
	stderr syncbuf.Buffer

	mu     sync.Mutex // serializes commands and Stop/Kill
	exited bool
}

// Start starts a publisher process; it is killed when the test ends. The
// test is skipped when /usr/bin/python3 lacks zmq, and fails instead under
// CI=true.
func Start(tb testing.TB) *Publisher {
	tb.Helper()
	Require(tb)
	script := scriptPath(tb)
	p := &Publisher{tb: tb, lines: make(chan string, 16), read: make(chan struct{})}
	p.cmd = exec.Command(Python, "-u", script)
	p.cmd.Stderr = &p.stderr
	stdin, err := p.cmd.StdinPipe()
	if err != nil {
		tb.Fatalf("zmqpub: %v", err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		tb.Fatalf("zmqpub: %v", err)
	}
	if err := p.cmd.Start(); err != nil {
		tb.Fatalf("zmqpub: starting %s %s: %v", Python, script, err)
	}
	p.stdin = stdin
	go func() {
		defer close(p.read)
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	tb.Cleanup(p.Kill)
	return p
}

// Do sends one command line and returns the answer after "ok", or an error
// carrying the script's "err" answer.
func (p *Publisher) Do(line string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return "", errors.New("zmqpub: the publisher process has ended")
	}
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		return "", fmt.Errorf("zmqpub: writing %q: %w (stderr: %s)", short(line), err, p.stderr.String())
	}
	t := time.NewTimer(replyTimeout)
	defer t.Stop()
	select {
	case ans, ok := <-p.lines:
		if !ok {
			return "", fmt.Errorf("zmqpub: the publisher exited during %q (stderr: %s)", short(line), p.stderr.String())
		}
		if rest, ok := strings.CutPrefix(ans, "ok"); ok {
			return strings.TrimSpace(rest), nil
		}
		return "", fmt.Errorf("zmqpub: %q: %s", short(line), ans)
	case <-t.C:
		return "", fmt.Errorf("zmqpub: no answer to %q within %v", short(line), replyTimeout)
	}
}

func (p *Publisher) must(line string) string {
	p.tb.Helper()
	out, err := p.Do(line)
	if err != nil {
		p.tb.Fatal(err)
	}
	return out
}

// Bind binds the publisher (tcp://127.0.0.1:0 for any port) and returns the
// bound endpoint.
func (p *Publisher) Bind(endpoint string) string {
	p.tb.Helper()
	return p.must("bind " + endpoint)
}

// Connect connects the publisher to a bound SUB.
func (p *Publisher) Connect(endpoint string) {
	p.tb.Helper()
	p.must("connect " + endpoint)
}

// WaitSubscribed waits until a subscriber's subscription has reached the
// publisher, and returns it (a 1 byte, then the topic prefix). Messages
// sent after it reach that subscriber.
func (p *Publisher) WaitSubscribed() []byte {
	p.tb.Helper()
	out := p.must("wait-sub 20")
	b, err := hex.DecodeString(out)
	if err != nil {
		p.tb.Fatalf("zmqpub: subscription %q: %v", out, err)
	}
	return b
}

// Send publishes one message.
func (p *Publisher) Send(frames ...[]byte) {
	p.tb.Helper()
	var b strings.Builder
	b.WriteString("send")
	for _, f := range frames {
		b.WriteByte(' ')
		if len(f) == 0 {
			b.WriteByte('-') // an empty frame: base64 would write nothing
			continue
		}
		b.WriteString(base64.StdEncoding.EncodeToString(f))
	}
	p.must(b.String())
}

// SendFile publishes the live messages of a JSONL recording (its 3-frame
// messages; a replay file's leading empty frame is dropped and its end
// marker skipped) and returns how many were sent, skipped seqs excluded.
func (p *Publisher) SendFile(path string) int {
	p.tb.Helper()
	out := p.must("sendfile " + path)
	n, err := strconv.Atoi(out)
	if err != nil {
		p.tb.Fatalf("zmqpub: sendfile answered %q", out)
	}
	return n
}

// Skip withholds messages with these seqs from the live stream; they are
// still served by the replay endpoint.
func (p *Publisher) Skip(seqs ...uint64) {
	p.tb.Helper()
	var b strings.Builder
	b.WriteString("skip")
	for _, s := range seqs {
		b.WriteByte(' ')
		b.WriteString(strconv.FormatUint(s, 10))
	}
	p.must(b.String())
}

// Replay reply shapes served by ReplayBind.
const (
	ShapeTopic    = "topic"    // ["", topic, seq, payload], as the sim and vLLM >= 0.26
	ShapeNoTopic  = "notopic"  // ["", seq, payload], as vLLM <= 0.25
	ShapeShortSeq = "shortseq" // a 4-byte seq frame: malformed
	ShapeNoDelim  = "nodelim"  // no empty first frame: malformed
	ShapeNoEnd    = "noend"    // ["", seq, payload] without the end marker
)

// ReplayBind serves a ROUTER replay endpoint over everything published so
// far, replying in the given shape, and returns the bound endpoint.
func (p *Publisher) ReplayBind(endpoint, shape string) string {
	p.tb.Helper()
	return p.must("replay-bind " + endpoint + " shape=" + shape)
}

// Raw opens a plain TCP connection to a tcp:// endpoint and writes data on
// it; the connection stays open until CloseSockets.
func (p *Publisher) Raw(endpoint string, data []byte) {
	p.tb.Helper()
	p.must("raw " + endpoint + " " + base64.StdEncoding.EncodeToString(data))
}

// Bench publishes n messages [topic, seq 1..n, size-byte payload] as fast
// as the script can and returns how long sending took on its side.
func (p *Publisher) Bench(n, size int) time.Duration {
	p.tb.Helper()
	out := p.must(fmt.Sprintf("bench %d %d", n, size))
	secs, err := strconv.ParseFloat(out, 64)
	if err != nil {
		p.tb.Fatalf("zmqpub: bench answered %q", out)
	}
	return time.Duration(secs * float64(time.Second))
}

// CloseSockets closes the publisher's sockets and raw connections; the
// process stays up.
func (p *Publisher) CloseSockets() {
	p.tb.Helper()
	p.must("close")
}

// Stop asks the process to exit and waits for it.
func (p *Publisher) Stop() {
	p.tb.Helper()
	if _, err := p.Do("quit"); err != nil {
		p.tb.Error(err)
	}
	p.Kill()
}

// Kill ends the process at once (as a crash would) and waits for it. It
// may be called more than once.
func (p *Publisher) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return
	}
	p.exited = true
	_ = p.cmd.Process.Kill()
	_ = p.stdin.Close()
	for range p.lines { // unblock the reader if it waits on a full channel
	}
	<-p.read
	_ = p.cmd.Wait()
}

// Require skips the test when /usr/bin/python3 cannot import zmq, or fails
// it when CI=true.
func Require(tb testing.TB) {
	tb.Helper()
	probeOnce.Do(func() {
		out, err := exec.Command(Python, "-c", "import zmq").CombinedOutput()
		if err != nil {
			probeErr = fmt.Errorf("%s cannot import zmq: %w: %s", Python, err, bytes.TrimSpace(out))
		}
	})
	if probeErr == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		tb.Fatalf("real libzmq publishers are required under CI=true (scripts/test-deps.sh installs python3-zmq): %v", probeErr)
	}
	tb.Skipf("skipping: %v (scripts/test-deps.sh installs python3-zmq)", probeErr)
}

var (
	probeOnce sync.Once
	probeErr  error
)

// scriptPath finds scripts/zmqpub.py at the module root above the working
// directory.
func scriptPath(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "scripts", "zmqpub.py")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatal("zmqpub: no go.mod above the working directory")
		}
		dir = parent
	}
}

func short(line string) string {
	if len(line) > 80 {
		return line[:80] + "..."
	}
	return line
}
