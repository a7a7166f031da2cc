package client_test

import (
	"context"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prefixd/prefixd/rpc/client"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestClientPodsStatsErrors(t *testing.T) {
	addr, stop := startServer()
	defer stop()
	c, err := client.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	pods, err := c.Pods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 2 || pods[0].Name != "10.0.0.1:8000" || pods[0].Blocks != 4 || pods[0].Model != "sim-model" ||
		pods[0].Seq != 1 || !pods[0].HasSeq || pods[0].LastEvent.IsZero() || pods[1].Blocks != 2 {
		t.Errorf("pods %+v", pods)
	}
	st, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pods != 2 || st.IndexBlocks != 6 || st.MemoryBytes == 0 {
		t.Errorf("stats %+v", st)
	}
	res, err := c.Match(ctx, &client.Query{Model: "sim-model", TokenIDs: []uint32{1, 2, 3}, Pods: []string{"10.0.0.2:8000"}})
	if err != nil || res.Tokens != 3 || res.TotalBlocks != 0 || len(res.Pods) != 0 {
		t.Errorf("short query: %+v %v", res, err)
	}
	if _, err := c.Match(ctx, &client.Query{Model: "other", Prompt: "hello"}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown model: %v", err)
	}
	if _, err := c.Match(ctx, nil); err == nil {
		t.Error("nil query answered")
	}
}
