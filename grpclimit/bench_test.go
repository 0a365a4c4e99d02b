package grpclimit_test

import (
	"context"
	"log/slog"
	"strconv"
	"testing"

	"google.golang.org/protobuf/proto"

	allotv1 "github.com/allot-dev/allot/api/allot/v1"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/grpclimit"
	"github.com/allot-dev/allot/internal/benchcpu"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rules"
)

// BenchmarkAllowServer is the allow API's work for one call short of
// gRPC's transport: read the request's bytes, decide it (an in-process
// store, a limit nobody reaches, 1,024 subjects), write the answer's bytes.
func BenchmarkAllowServer(b *testing.B) {
	rs, err := rules.Parse([]byte("version: bench\nrules:\n  - name: api\n    limit: \"1000000000 per second\"\n"), "bench.yaml")
	if err != nil {
		b.Fatal(err)
	}
	lim, err := limiter.New(limiter.Config{Rules: rs, Store: bucket.NewMemory(bucket.MemoryOptions{}), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := grpclimit.NewAllowServer(lim)
	if err != nil {
		b.Fatal(err)
	}
	wires := make([][]byte, 1024)
	for i := range wires {
		wires[i], _ = proto.Marshal(&allotv1.AllowRequest{Subject: "tenant-" + strconv.Itoa(i),
			Descriptor_: []*allotv1.Entry{{Key: "path", Value: "/orders"}, {Key: "method", Value: "GET"}}})
	}
	ctx := context.Background()
	b.ReportAllocs()
	defer benchcpu.Start(b)()
	for i := 0; b.Loop(); i++ {
		var in allotv1.AllowRequest
		if err := proto.Unmarshal(wires[i&1023], &in); err != nil {
			b.Fatal(err)
		}
		out, err := srv.Allow(ctx, &in)
		if err != nil || !out.GetAllowed() {
			b.Fatal(out, err)
		}
		if _, err := proto.Marshal(out); err != nil {
			b.Fatal(err)
		}
	}
}
