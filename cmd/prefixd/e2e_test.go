package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/tokenize"
	"github.com/prefixd/prefixd/internal/fixture"
	"github.com/prefixd/prefixd/internal/syncbuf"
	"github.com/prefixd/prefixd/rpc/client"
	"github.com/prefixd/prefixd/testutil/zmqpub"
)

// TestEndToEnd runs prefixd serve as a process, publishes recording a into
// it from a real libzmq publisher, and asks every recorded request four
// ways: prefixd query, the Go client, a reflection-driven call as grpcurl
// makes, and JSON over HTTP. Each answer must equal prefixd replay's.
func TestEndToEnd(t *testing.T) {
	dir := "a_array_random_seedless"
	events := fixture.Path(t, dir, "events.jsonl")
	requests := fixture.Path(t, dir, "requests.jsonl")
	code, replayOut, errOut := runCmd(t, "replay", events, "--query", requests)
	if code != 0 {
		t.Fatalf("replay: exit %d: %s", code, errOut)
	}
	want := strings.Split(strings.TrimSpace(replayOut), "\n")

	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	grpcAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	zmqEP := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	cmd := exec.Command(os.Args[0], "serve", "--zmq-bind", zmqEP, "--grpc-addr", grpcAddr, "--http-addr", httpAddr)
	cmd.Env = append(os.Environ(), "PREFIXD_TEST_RUN_MAIN=1")
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	base := "http://" + httpAddr
	waitReady(t, base, &stderr)

	pub := zmqpub.Start(t)
	pub.Connect(zmqEP)
	pub.WaitSubscribed()
	if n := pub.SendFile(events); n != 34 {
		t.Fatalf("sent %d messages, want 34", n)
	}
	last := map[string]uint64{"127.0.0.1:8001": 10, "127.0.0.1:8002": 11, "127.0.0.1:8003": 13}
	deadline := time.Now().Add(30 * time.Second)
	for {
		at := 0
		for _, p := range servedPods(base) {
			if last[p.Name] == p.Seq {
				at++
			}
		}
		if at == len(last) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pods not at their last seq after 30s:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	match := reflectMatch(ctx, t, conn)

	reqs := fixture.Requests(t, dir)
	if len(reqs) != len(want) {
		t.Fatalf("%d requests, %d replay answers", len(reqs), len(want))
	}
	for i, r := range reqs {
		chat, err := tokenize.ParseChat(r.Body)
		if err != nil {
			t.Fatal(err)
		}
		chatFile := filepath.Join(t.TempDir(), "chat.json")
		if err := os.WriteFile(chatFile, r.Body, 0o600); err != nil {
			t.Fatal(err)
		}
		// prefixd query.
		code, got, errOut := runCmd(t, "query", "--addr", grpcAddr, "--chat", chatFile, "--json")
		if code != 0 || strings.TrimSpace(got) != want[i] {
			t.Fatalf("request %d: query --json (exit %d, %s):\n%s\nreplay:\n%s", i, code, errOut, got, want[i])
		}
		// The Go client.
		q := &client.Query{Model: chat.Model}
		for _, m := range chat.Messages {
			q.Messages = append(q.Messages, client.Message{Role: m.Role, Content: m.Content.Text})
		}
		res, err := c.Match(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if got := answerJSON(t, indexerResult(res)); got != want[i] {
			t.Fatalf("request %d: client:\n%s\nreplay:\n%s", i, got, want[i])
		}
		// grpcurl-style: descriptors from reflection, JSON in and out
		// (protojson, which refuses fields the Query lacks).
		body, _ := json.Marshal(map[string]any{"model": chat.Model, "messages": chat.Messages})
		if got := match(string(body)); got != want[i] {
			t.Fatalf("request %d: reflection:\n%s\nreplay:\n%s", i, got, want[i])
		}
		// curl on the JSON endpoint, with the body as the workload sent it
		// (max_tokens, stream and all).
		if got := httpMatch(t, base, r.Body); got != want[i] {
			t.Fatalf("request %d: POST /v1/match:\n%s\nreplay:\n%s", i, got, want[i])
		}
	}
}

func waitReady(t *testing.T, base string, stderr *syncbuf.Buffer) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if code, _ := get(base + "/readyz"); code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("prefixd serve not ready after 20s:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// answerJSON prints a result as replay --query does.
func answerJSON(t *testing.T, res *indexer.Result) string {
	t.Helper()
	b, err := json.Marshal(newQueryAnswer(res))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// reflectMatch returns a function that calls Match as grpcurl does: the
// service's descriptors come from server reflection, the request is JSON
// turned into a dynamic message, the reply goes back to JSON.
func reflectMatch(ctx context.Context, t *testing.T, conn *grpc.ClientConn) func(body string) string {
	t.Helper()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(req *reflectionpb.ServerReflectionRequest) *reflectionpb.ServerReflectionResponse {
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	services := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
	var names []string
	for _, s := range services.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !strings.Contains(strings.Join(names, " "), "prefixd.v1.IndexService") || !strings.Contains(strings.Join(names, " "), "grpc.health.v1.Health") {
		t.Fatalf("reflection lists %v", names)
	}
	fds := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "prefixd.v1.IndexService"}})
	set := &descriptorpb.FileDescriptorSet{}
	for _, raw := range fds.GetFileDescriptorResponse().GetFileDescriptorProto() {
		fd := &descriptorpb.FileDescriptorProto{}
		if err := proto.Unmarshal(raw, fd); err != nil {
			t.Fatal(err)
		}
		set.File = append(set.File, fd)
	}
	// Dependencies (timestamp.proto) the server sent, or the well-known
	// ones this process has linked in.
	files, err := protodesc.NewFiles(set)
	if err != nil {
		files = new(protoregistry.Files)
		for _, fd := range set.File {
			f, err := protodesc.NewFile(fd, protoregistry.GlobalFiles)
			if err != nil {
				t.Fatal(err)
			}
			if err := files.RegisterFile(f); err != nil {
				t.Fatal(err)
			}
		}
	}
	d, err := files.FindDescriptorByName("prefixd.v1.IndexService")
	if err != nil {
		t.Fatal(err)
	}
	m := d.(protoreflect.ServiceDescriptor).Methods().ByName("Match")
	return func(body string) string {
		t.Helper()
		in := dynamicpb.NewMessage(m.Input())
		if err := protojson.Unmarshal([]byte(body), in); err != nil {
			t.Fatalf("request JSON %s: %v", body, err)
		}
		out := dynamicpb.NewMessage(m.Output())
		if err := conn.Invoke(ctx, "/prefixd.v1.IndexService/Match", in, out); err != nil {
			t.Fatal(err)
		}
		js, err := protojson.Marshal(out)
		if err != nil {
			t.Fatal(err)
		}
		var resp struct {
			TotalBlocks int `json:"totalBlocks"`
			Pods        []struct {
				Pod    string  `json:"pod"`
				Blocks int     `json:"blocks"`
				Tokens int     `json:"tokens"`
				Score  float64 `json:"score"`
			} `json:"pods"`
		}
		if err := json.Unmarshal(js, &resp); err != nil {
			t.Fatal(err)
		}
		res := &indexer.Result{TotalBlocks: resp.TotalBlocks}
		for _, p := range resp.Pods {
			res.Pods = append(res.Pods, indexer.PodMatch{Pod: p.Pod, Blocks: p.Blocks, Tokens: p.Tokens, Score: p.Score})
		}
		return answerJSON(t, res)
	}
}

// httpMatch posts a match request and prints the answer as replay does.
func httpMatch(t *testing.T, base string, body []byte) string {
	t.Helper()
	resp, err := http.Post(base+"/v1/match", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		TotalBlocks int `json:"total_blocks"`
		Pods        []struct {
			Pod    string  `json:"pod"`
			Blocks int     `json:"blocks"`
			Tokens int     `json:"tokens"`
			Score  float64 `json:"score"`
			Stale  bool    `json:"stale"`
		} `json:"pods"`
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/match: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	res := &indexer.Result{TotalBlocks: out.TotalBlocks}
	for _, p := range out.Pods {
		res.Pods = append(res.Pods, indexer.PodMatch{Pod: p.Pod, Blocks: p.Blocks, Tokens: p.Tokens, Score: p.Score, Stale: p.Stale})
	}
	return answerJSON(t, res)
}
