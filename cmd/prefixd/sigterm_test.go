package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prefixd/prefixd/internal/syncbuf"
)

// TestMain runs prefixd's own main instead of the tests when the test
// binary is started as a prefixd process by TestSIGTERM.
func TestMain(m *testing.M) {
	if os.Getenv("PREFIXD_TEST_RUN_MAIN") == "1" {
		os.Args = append([]string{"prefixd"}, os.Args[1:]...)
		main()
	}
	os.Exit(m.Run())
}

// TestSIGTERM starts prefixd serve as a process, waits until it is ready,
// sends SIGTERM and expects exit 0 with the stop logged.
func TestSIGTERM(t *testing.T) {
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	zmqAddr := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	cmd := exec.Command(os.Args[0], "serve", "--grpc-addr", "127.0.0.1:0", "--zmq-bind", zmqAddr, "--http-addr", httpAddr)
	cmd.Env = append(os.Environ(), "PREFIXD_TEST_RUN_MAIN=1")
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatal("prefixd serve not ready after 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("prefixd serve still running 20s after SIGTERM:\n%s", stderr.String())
	}
	all := stderr.String()
	if !strings.Contains(all, "prefixd serving") || !strings.Contains(all, "startup=") || !strings.Contains(all, "prefixd stopped") {
		t.Errorf("log lacks the start-up or stop line:\n%s", all)
	}
}
