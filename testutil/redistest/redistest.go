package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prefixd/prefixd/internal/syncbuf"
)

// The Debian binaries scripts/test-deps.sh installs; a redis-server first
// on PATH may be another version and is not used.
const (
	RedisServer = "/usr/bin/redis-server"
	RedisCLI    = "/usr/bin/redis-cli"
)

// startTimeout bounds the wait for a server to answer, or a cluster to be
// ok.
const startTimeout = 20 * time.Second

// Require skips the test when /usr/bin/redis-server or redis-cli is
// missing, or fails it when CI=true.
func Require(tb testing.TB) {
	tb.Helper()
	var missing []string
	for _, bin := range []string{RedisServer, RedisCLI} {
		if _, err := os.Stat(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("%s not found (scripts/test-deps.sh installs redis-server)", strings.Join(missing, " and "))
	if os.Getenv("CI") == "true" {
		tb.Fatalf("a real redis-server is required under CI=true: %s", msg)
	}
	tb.Skipf("skipping: %s", msg)
}

// Process is one redis-server on a loopback port, killed when the test
// ends. Its methods fail the test on error.
type Process struct {
	tb   testing.TB
	Port int
	dir  string
	args []string // beyond the common ones

	mu     sync.Mutex // guards cmd, exited and log
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd's Wait returned
	log    *syncbuf.Buffer
}

// Server starts a redis-server and returns its URL, "redis://127.0.0.1:N".
func Server(tb testing.TB) string {
	tb.Helper()
	return Start(tb).URL()
}

// Start starts a redis-server without persistence on a free loopback port
// (below 55535, so that a cluster bus port fits above it) and waits until
// it answers PING. It is killed when the test ends.
func Start(tb testing.TB) *Process {
	tb.Helper()
	return start(tb, nil)
}

func start(tb testing.TB, extra func(dir string) []string) *Process {
	tb.Helper()
	Require(tb)
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			tb.Fatalf("redistest: %v", err)
		}
		dir := filepath.Join(tb.TempDir(), strconv.Itoa(port))
		if err := os.Mkdir(dir, 0o755); err != nil {
			tb.Fatalf("redistest: %v", err)
		}
		p := &Process{tb: tb, Port: port, dir: dir}
		if extra != nil {
			p.args = extra(dir)
		}
		if lastErr = p.launch(); lastErr == nil {
			tb.Cleanup(p.Kill)
			return p
		}
	}
	tb.Fatalf("redistest: could not start redis-server: %v", lastErr)
	return nil
}

// freePort returns a port below 55535 that is free on 127.0.0.1, as is
// the port 10000 above it.
func freePort() (int, error) {
	for range 100 {
		port := 20000 + rand.IntN(35535)
		if free(port) && free(port+10000) {
			return port, nil
		}
	}
	return 0, errors.New("no free port pair found")
}

func free(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// launch starts the process and waits for PING.
func (p *Process) launch() error {
	args := []string{
		"--port", strconv.Itoa(p.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", p.dir,
	}
	args = append(args, p.args...)
	cmd := exec.Command(RedisServer, args...)
	log := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", RedisServer, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	deadline := time.Now().Add(startTimeout)
	for {
		if r, err := Do(p.Addr(), "PING"); err == nil && r == "PONG" {
			break
		}
		select {
		case <-exited:
			return fmt.Errorf("redis-server on port %d exited: %s", p.Port, lastLines(log.String(), 5))
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("redis-server on port %d did not answer PING within %v: %s", p.Port, startTimeout, lastLines(log.String(), 5))
		}
	}
	p.mu.Lock()
	p.cmd, p.exited, p.log = cmd, exited, log
	p.mu.Unlock()
	return nil
}

// URL returns "redis://127.0.0.1:N".
func (p *Process) URL() string { return "redis://" + p.Addr() }

// Addr returns "127.0.0.1:N".
func (p *Process) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Port)) }

// Kill kills the server (SIGKILL: no shutdown, its data is gone) and
// waits for it to exit. Killing a server that is not running does nothing.
func (p *Process) Kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.cmd, p.exited = nil, nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

// Restart starts the server again, empty, on the same port, after Kill,
// and waits until it answers.
func (p *Process) Restart() {
	p.tb.Helper()
	p.Kill()
	deadline := time.Now().Add(startTimeout)
	for {
		err := p.launch()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			p.tb.Fatalf("redistest: restart on port %d: %v", p.Port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Pause stops the server process (SIGSTOP): connections are still
// accepted by the kernel, and nothing answers, as with a server that
// hangs. Resume continues it.
func (p *Process) Pause() { p.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (p *Process) Resume() { p.signal(syscall.SIGCONT) }

func (p *Process) signal(sig syscall.Signal) {
	p.tb.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		p.tb.Fatalf("redistest: server on port %d is not running", p.Port)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.tb.Fatalf("redistest: %v: %v", sig, err)
	}
}

// Log returns what the server wrote so far.
func (p *Process) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.log == nil {
		return ""
	}
	return p.log.String()
}

// Do sends one command to the server (e.g. "FLUSHALL", "INFO memory")
// and returns its reply.
func (p *Process) Do(args ...string) (string, error) { return Do(p.Addr(), args...) }

// ClusterNodes is a Redis Cluster of masters without replicas.
type ClusterNodes struct {
	Nodes []*Process
}

// Cluster starts a cluster of 3 masters and returns its URL,
// "redis-cluster://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C".
func Cluster(tb testing.TB) string {
	tb.Helper()
	return StartCluster(tb, 3).URL()
}

// StartCluster starts n (at least 3) masters with cluster mode on, joins
// them with redis-cli --cluster create, and waits until every node says
// cluster_state:ok. They are killed when the test ends.
func StartCluster(tb testing.TB, n int) *ClusterNodes {
	tb.Helper()
	if n < 3 {
		tb.Fatalf("redistest: a cluster needs 3 masters, not %d", n)
	}
	c := &ClusterNodes{}
	args := []string{"--cluster", "create"}
	for range n {
		p := start(tb, func(dir string) []string {
			return []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
				"--cluster-node-timeout", "5000",
			}
		})
		c.Nodes = append(c.Nodes, p)
		args = append(args, p.Addr())
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(RedisCLI, args...).CombinedOutput(); err != nil {
		tb.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	deadline := time.Now().Add(startTimeout)
	for _, p := range c.Nodes {
		for {
			info, err := p.Do("CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)+"\r") {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("redistest: cluster node %s not ok within %v: %q, %v", p.Addr(), startTimeout, info, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return c
}

// URL returns the cluster's URL, every node a seed.
func (c *ClusterNodes) URL() string {
	addrs := make([]string, len(c.Nodes))
	for i, p := range c.Nodes {
		addrs[i] = p.Addr()
	}
	return "redis-cluster://" + strings.Join(addrs, ",")
}

// Do sends one command to addr over a new connection and returns the
// reply: a status or bulk string as is, an integer in decimal, an array's
// elements one a line. An error reply is returned as an error.
func Do(addr string, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	var req bytes.Buffer
	fmt.Fprintf(&req, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&req, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write(req.Bytes()); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(conn))
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply line")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", err
		}
		var out []string
		for range n {
			s, err := readReply(r)
			if err != nil {
				return "", err
			}
			out = append(out, s)
		}
		return strings.Join(out, "\n"), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

// Info returns the value of field in the server's INFO section, e.g.
// Info(addr, "memory", "used_memory").
func Info(addr, section, field string) (string, error) {
	info, err := Do(addr, "INFO", section)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("INFO %s has no %s", section, field)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
