package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rules"
)

// rssEnv names the scenario a child process started by BenchmarkRSS runs;
// rssArgsEnv holds the gateway's flags for a "serve" child.
const (
	rssEnv     = "ALLOT_GATEWAY_RSS_CHILD"
	rssArgsEnv = "ALLOT_GATEWAY_RSS_ARGS"
)

func TestMain(m *testing.M) {
	if sc := os.Getenv(rssEnv); sc != "" {
		os.Exit(rssChild(sc))
	}
	os.Exit(m.Run())
}

// memKB reads the process's resident set (VmRSS) and its peak (VmHWM), in
// kilobytes.
func memKB() (rss, peak int64) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			rss = n
		case "VmHWM":
			peak = n
		}
	}
	return rss, peak
}

// rssChild runs one scenario in a fresh process and prints
// "rss <start> <peak> <retained>" (kB): the resident set before, its peak,
// and what stays resident once the garbage is collected and returned.
func rssChild(scenario string) int {
	start, _ := memKB()
	switch scenario {
	case "distinct", "distinct-256":
		// The gateway's limiter on the in-process store with its defaults,
		// asked for a million distinct subjects: every bucket is in debt
		// (free plan, 10 a minute), so every one is kept.
		set, err := rules.Parse(exampleRules, "rules.yaml")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		lim, err := limiter.New(limiter.Config{Rules: set, Store: bucket.NewMemory(bucket.MemoryOptions{})})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		pad := ""
		if scenario == "distinct-256" {
			pad = strings.Repeat("x", 256-len("tenant-0000000-"))
		}
		ctx := context.Background()
		denied := 0
		for i := range 1_000_000 {
			d, err := lim.Allow(ctx, limiter.Request{Subject: fmt.Sprintf("tenant-%07d-%s", i, pad)[:len(pad)+15],
				Descriptor: rules.Descriptor{{Key: rules.KeyPath, Value: "/items"}, {Key: rules.KeyMethod, Value: "GET"}}})
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			if !d.Allowed {
				denied++
			}
		}
		fmt.Fprintf(os.Stderr, "denied %d\n", denied)
		defer runtime.KeepAlive(lim) // its buckets are what is measured
	case "serve":
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ready := make(chan Ready, 1)
		done := make(chan error, 1)
		go func() { done <- run(ctx, strings.Fields(os.Getenv(rssArgsEnv)), io.Discard, io.Discard, ready) }()
		select {
		case r := <-ready:
			fmt.Println("addr", r.HTTP)
		case err := <-done:
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		_, _ = io.Copy(io.Discard, os.Stdin) // until the parent is done; the gateway still holds its buckets
	default:
		fmt.Fprintln(os.Stderr, "unknown scenario", scenario)
		return 1
	}
	_, peak := memKB()
	debug.FreeOSMemory()
	retained, _ := memKB()
	fmt.Printf("rss %d %d %d\n", start, peak, retained)
	return 0
}

// BenchmarkRSS measures the gateway's resident memory, each scenario in a
// fresh process (go test -run '^$' -bench RSS -benchtime 1x ./cmd/gateway):
// a million distinct subjects through its limiter, with 15-byte and with
// 256-byte (the largest allowed) subjects; 1,000 HTTP requests, each with
// a different 256-byte X-Tenant; and 400 requests with a 1 MB X-Tenant,
// refused by the bounds, beside the baseline without them (the bounds
// raised past 1 MB), where each was kept as a bucket key.
func BenchmarkRSS(b *testing.B) {
	mb := func(kb int64) float64 { return float64(kb) / 1024 }
	report := func(b *testing.B, line string) {
		var start, peak, retained int64
		if _, err := fmt.Sscanf(line, "rss %d %d %d", &start, &peak, &retained); err != nil {
			b.Fatalf("child said %q: %v", line, err)
		}
		b.ReportMetric(mb(peak), "peak-RSS-MB")
		b.ReportMetric(mb(retained), "retained-RSS-MB")
		b.ReportMetric(mb(peak-start), "growth-MB")
	}
	for _, sc := range []string{"distinct", "distinct-256"} {
		b.Run(map[string]string{"distinct": "1M-subjects-15B", "distinct-256": "1M-subjects-256B"}[sc], func(b *testing.B) {
			for range b.N {
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), rssEnv+"="+sc)
				cmd.Stderr = os.Stderr
				out, err := cmd.Output()
				if err != nil {
					b.Fatalf("%s: %v", sc, err)
				}
				report(b, strings.TrimSpace(string(out)))
			}
		})
	}
	for _, c := range []struct {
		name   string
		args   string
		n      int
		tenant func(i int) string
		want   int
	}{
		{"1k-requests-256B-subject", "", 1000, func(i int) string { return fmt.Sprintf("%0256d", i) }, 200},
		{"400-requests-1MB-subject", "", 400, func(i int) string { return fmt.Sprintf("%01048576d", i) }, 431},
		{"400-requests-1MB-subject-unbounded-baseline", "-max-subject-bytes 2000000 -http-max-header-bytes 4194304", 400,
			func(i int) string { return fmt.Sprintf("%01048576d", i) }, 200},
	} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), rssEnv+"=serve", rssArgsEnv+"=-http 127.0.0.1:0 -grpc= -log-level error "+c.args)
				cmd.Stderr = os.Stderr
				stdin, _ := cmd.StdinPipe()
				stdout, _ := cmd.StdoutPipe()
				if err := cmd.Start(); err != nil {
					b.Fatal(err)
				}
				lines := bufio.NewScanner(stdout)
				lines.Buffer(make([]byte, 1<<16), 1<<16)
				if !lines.Scan() || !strings.HasPrefix(lines.Text(), "addr ") {
					b.Fatalf("child did not start: %q", lines.Text())
				}
				url := "http://" + strings.TrimPrefix(lines.Text(), "addr ") + "/items"
				// Sixteen clients at once: a server answering 431 lingers
				// half a second before closing the connection.
				client := &http.Client{Timeout: 30 * time.Second}
				var got atomic.Int64
				var wg sync.WaitGroup
				next := make(chan int)
				for range 16 {
					wg.Go(func() {
						for i := range next {
							req, _ := http.NewRequest("GET", url, nil)
							req.Header.Set("X-Tenant", c.tenant(i))
							resp, err := client.Do(req)
							if err != nil {
								continue // a server refusing a huge header may close before the client has written it all
							}
							_, _ = io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
							if resp.StatusCode == c.want {
								got.Add(1)
							}
						}
					})
				}
				for i := range c.n {
					next <- i
				}
				close(next)
				wg.Wait()
				if got := int(got.Load()); got < c.n*9/10 {
					b.Errorf("%d of %d requests answered %d", got, c.n, c.want)
				}
				stdin.Close()
				if !lines.Scan() {
					b.Fatal("child said nothing at the end")
				}
				report(b, lines.Text())
				_ = cmd.Wait()
			}
		})
	}
}
