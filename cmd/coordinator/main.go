// Command coordinator is allot's control plane: it leases every region a
// share of each global budget over gRPC (package coordinator around the
// lease allocator).
//
//	coordinator serve -budgets budgets.yaml -tls-cert c.pem -tls-key k.pem -tls-client-ca ca.pem   # standalone, mutual TLS
//	coordinator serve -etcd 127.0.0.1:2379 -advertise host:7070 -tls-cert c.pem -tls-key k.pem -region-tokens tokens   # HA, one of several
//	coordinator rules put -etcd 127.0.0.1:2379 -f budgets.yaml
//	coordinator rules get -etcd 127.0.0.1:2379
//	coordinator rules check -f budgets.yaml         # floors per region
//	coordinator export -budgets budgets.yaml -status 127.0.0.1:7071 -o what-if.yaml   # a scenario for sim sweep
//
// Standalone mode serves the budgets of a file and leads on its own. HA
// mode runs several coordinators on etcd: one leads (elected, its etcd
// revision the fencing term), the others redirect regions to it, and the
// budgets document lives in etcd, watched and validated, so a change reaches
// every region without a restart.
//
// Regions prove who they are with a client certificate (-tls-client-ca) or
// a token (-region-tokens); a coordinator with neither does not start unless
// given -insecure, which accepts a region by its name alone.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/allot-dev/allot/auth"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/httpserver"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
	"github.com/allot-dev/allot/rules"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "rules":
		err = rulesCmd(os.Args[2:], os.Stdout)
	case "export":
		err = exportCmd(os.Args[2:], os.Stdout)
	default:
		usage()
	}
	if err != nil {
		msg := err.Error()
		if !strings.HasPrefix(msg, "coordinator:") {
			msg = "coordinator: " + msg
		}
		fmt.Fprintln(os.Stderr, msg)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, `usage:
  coordinator serve [flags]            run a coordinator (-h for flags)
  coordinator rules check -f F         validate a budgets document and print every region's floors
  coordinator rules put -etcd E -f F   validate a budgets document and store it in etcd
  coordinator rules get -etcd E        print the stored budgets document
  coordinator export -budgets F [-status ADDR] [-o S]   write a simulator scenario skeleton of what runs`)
	os.Exit(2)
}

// fromRules sizes the budgets of a rules file exactly as regions do.
func fromRules(set *rules.Set, regions []string, weights []int64, reserve float64, p lease.AllocationPolicy) []lease.Budget {
	return region.Budgets(set, lease.Split{Regions: regions, Weights: weights, Reserve: reserve}, p)
}

func etcdEndpoints(flagValue string) []string {
	if flagValue == "" {
		flagValue = os.Getenv("ALLOT_ETCD")
	}
	if flagValue == "" {
		return nil
	}
	return strings.Split(flagValue, ",")
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:7070", "gRPC address for regions")
	httpAddr := fs.String("http", "127.0.0.1:7071", "address for /healthz, /readyz, /metrics and /status")
	advertise := fs.String("advertise", "", "address regions reach this coordinator at (default: -listen)")
	budgets := fs.String("budgets", "", "budgets document (standalone mode; in HA mode only its lease timings are read)")
	etcd := fs.String("etcd", "", "etcd endpoints, comma-separated (HA mode; default $ALLOT_ETCD)")
	prefix := fs.String("prefix", "/allot", "etcd key prefix shared by the cluster")
	sessionTTL := fs.Int("session-ttl", 3, "seconds a dead leader keeps its leadership in etcd")
	certFile := fs.String("tls-cert", "", "server certificate (PEM); enables TLS")
	keyFile := fs.String("tls-key", "", "server key (PEM)")
	clientCA := fs.String("tls-client-ca", "", "CA (PEM) for client certificates: mutual TLS, the certificate's common name is the region")
	tokensFile := fs.String("region-tokens", "", "tokens file (\"<region> <token>\" or \"<region> sha256:<hex>\" a line): a region proves its name with its token (needs -tls-cert)")
	insecure := fs.Bool("insecure", false, "accept a region by its name alone, without a certificate or token (any client that reaches -listen can speak for any region)")
	takeover := fs.Duration("takeover-after", 0, "silence after which another stream of a region may take its stream's place (0: twice the lease refresh)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error; debug also logs every lease message up and down, with its keys")
	lim := coordinator.DefaultLimits()
	fs.IntVar(&lim.MaxMessageBytes, "max-message-bytes", lim.MaxMessageBytes, "largest lease message a region may send; a larger one ends its stream")
	fs.IntVar(&lim.MaxReportKeys, "max-report-keys", lim.MaxReportKeys, "most keys of one region's message; beyond it those with the largest values are kept")
	fs.IntVar(&lim.MaxKeyBytes, "max-key-bytes", lim.MaxKeyBytes, "longest key (rule and subject) a region may report; longer ones are dropped")
	hc := httpserver.DefaultConfig()
	hc.RegisterFlags(fs)
	_ = fs.Parse(args)
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("serve: -log-level=%q: %w", *logLevel, err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if *advertise == "" {
		*advertise = *listen
	}
	endpoints := etcdEndpoints(*etcd)
	if len(endpoints) == 0 && *budgets == "" {
		return errors.New("serve: give -budgets (standalone) or -etcd (HA)")
	}
	if _, _, err := net.SplitHostPort(*advertise); err != nil {
		return fmt.Errorf("serve: -advertise=%q must be host:port: %w", *advertise, err)
	}
	ecfg := coordinator.DefaultElectionConfig(*prefix)
	ecfg.SessionTTL, ecfg.Logger = *sessionTTL, log
	if len(endpoints) > 0 {
		if err := ecfg.Validate(); err != nil {
			return fmt.Errorf("serve: -session-ttl, -prefix: %w", err)
		}
	}

	switch {
	case *clientCA == "" && *tokensFile == "" && !*insecure:
		return errors.New("serve: regions must prove who they are: give -tls-client-ca (mutual TLS) or -region-tokens with -tls-cert, or -insecure to accept a region by its name alone")
	case *tokensFile != "" && *certFile == "" && !*insecure:
		return fmt.Errorf("serve: -region-tokens=%q without -tls-cert would send tokens in clear; give -tls-cert and -tls-key (or -insecure)", *tokensFile)
	case *clientCA != "" && *certFile == "":
		return fmt.Errorf("serve: -tls-client-ca=%q needs -tls-cert and -tls-key", *clientCA)
	}
	cfg := coordinator.DefaultConfig()
	cfg.Advertise = *advertise
	cfg.Logger = log
	cfg.Insecure, cfg.TakeoverAfter, cfg.Limits = *insecure, *takeover, lim
	if *tokensFile != "" {
		tk, err := auth.LoadTokens(*tokensFile)
		if err != nil {
			return fmt.Errorf("serve: -region-tokens: %w", err)
		}
		cfg.RegionTokens = tk
	}
	if *budgets != "" {
		doc, err := coordinator.LoadDocument(*budgets)
		if err != nil {
			return err
		}
		cfg.Lease = doc.LeaseConfig(cfg.Lease)
		if len(endpoints) == 0 {
			if cfg.Lease.Budgets, err = doc.Resolve(fromRules); err != nil {
				return err
			}
		}
	}
	var cli *clientv3.Client
	if len(endpoints) > 0 {
		var err error
		cli, err = clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: nil})
		if err != nil {
			return fmt.Errorf("etcd %v: %w", endpoints, err)
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		data, _, err := coordinator.GetDocument(ctx, cli, *prefix)
		cancel()
		if err != nil {
			return err
		}
		if data != nil {
			if doc, err := coordinator.ParseDocument(data, coordinator.DocumentKey(*prefix)); err == nil {
				cfg.Lease = doc.LeaseConfig(cfg.Lease)
				if bs, err := doc.Resolve(fromRules); err == nil {
					cfg.Lease.Budgets = bs
				}
			}
		}
	}
	var creds credentials.TransportCredentials
	if *certFile != "" {
		tc, err := serverTLS(*certFile, *keyFile, *clientCA)
		if err != nil {
			return err
		}
		creds = credentials.NewTLS(tc)
		cfg.RequireClientCert = *clientCA != ""
	}
	s, err := coordinator.NewServer(cfg)
	if err != nil {
		return err
	}

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigc)
	go func() {
		select {
		case sig := <-sigc:
			log.Info("coordinator: stopping", "signal", sig.String())
			stop()
		case <-ctx.Done():
		}
	}()
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	opts := lim.ServerOptions()
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	g := grpc.NewServer(opts...)
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	reg := prometheus.NewRegistry()
	reg.MustRegister(coordinator.NewCollector(s))
	hs, err := httpserver.New(hc, s.Handler(reg), nil)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	reg.MustRegister(httpserver.NewCollector(map[string]*httpserver.Server{"status": hs}))
	hl, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		return err
	}
	go func() { _ = hs.Serve(hl) }()
	go func() { _ = s.Run(ctx) }()
	log.Info("coordinator: serving", "grpc", lis.Addr().String(), "http", hl.Addr().String(), "advertise", *advertise,
		"mode", map[bool]string{true: "ha", false: "standalone"}[cli != nil], "budgets", len(cfg.Lease.Budgets), "region_auth", s.AuthMode())

	if cli != nil {
		go func() {
			_ = coordinator.WatchDocument(ctx, cli, *prefix, fromRules, log, func(bs []lease.Budget) {
				if err := s.SetBudgets(bs); err != nil {
					log.Warn("coordinator: budgets not applied", "err", err)
				}
			})
		}()
		_ = coordinator.RunElection(ctx, cli, ecfg, s) // returns when ctx ends, after resigning
		log.Info("coordinator: left the election")
	} else {
		// The start time orders incarnations: a restart fences the last.
		if err := s.BecomeLeader(uint64(time.Now().UnixMilli())); err != nil {
			return err
		}
		<-ctx.Done()
		log.Info("coordinator: expiring every region's lease before exit")
		s.ExpireAll()
		time.Sleep(200 * time.Millisecond) // let the expiries reach the regions
	}
	g.Stop()
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err = hs.Shutdown(sctx)
	log.Info("coordinator: stopped")
	return err
}

func serverTLS(certFile, keyFile, clientCA string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCA != "" {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return nil, fmt.Errorf("tls client ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls client ca %s: no certificate found", clientCA)
		}
		tc.ClientCAs, tc.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

func rulesCmd(args []string, out io.Writer) error {
	if len(args) > 0 && args[0] == "check" {
		fs := flag.NewFlagSet("rules check", flag.ExitOnError)
		file := fs.String("f", "", "budgets document to check")
		_ = fs.Parse(args[1:])
		if *file == "" {
			return errors.New("rules check: -f is required")
		}
		return check(*file, out)
	}
	if len(args) == 0 || (args[0] != "put" && args[0] != "get") {
		usage()
	}
	fs := flag.NewFlagSet("rules "+args[0], flag.ExitOnError)
	etcd := fs.String("etcd", "", "etcd endpoints, comma-separated (default $ALLOT_ETCD)")
	prefix := fs.String("prefix", "/allot", "etcd key prefix shared by the cluster")
	file := fs.String("f", "", "budgets document to store (put)")
	_ = fs.Parse(args[1:])
	endpoints := etcdEndpoints(*etcd)
	if len(endpoints) == 0 {
		return errors.New("rules: -etcd or $ALLOT_ETCD is required")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if args[0] == "get" {
		data, rev, err := coordinator.GetDocument(ctx, cli, *prefix)
		if err != nil {
			return err
		}
		if data == nil {
			return fmt.Errorf("rules get: nothing stored at %s", coordinator.DocumentKey(*prefix))
		}
		fmt.Fprintf(out, "# %s at revision %d\n%s", coordinator.DocumentKey(*prefix), rev, data)
		return nil
	}
	if *file == "" {
		return errors.New("rules put: -f is required")
	}
	data, err := os.ReadFile(*file) // #nosec G703 -- the operator's -f flag
	if err != nil {
		return err
	}
	if err := coordinator.PutDocument(ctx, cli, *prefix, data, fromRules); err != nil {
		return err
	}
	fmt.Fprintf(out, "stored %s at %s\n", *file, coordinator.DocumentKey(*prefix))
	return nil
}

// loadChecked reads a budgets document as the coordinator would run it:
// its budgets resolved against their rules files and its lease settings
// validated with them.
func loadChecked(path string) (lease.Config, error) {
	doc, err := coordinator.LoadDocument(path)
	if err != nil {
		return lease.Config{}, err
	}
	bs, err := doc.Resolve(fromRules)
	if err != nil {
		return lease.Config{}, err
	}
	lc := doc.LeaseConfig(lease.DefaultConfig())
	lc.Budgets = bs
	return lc, lc.Validate()
}

// check validates a budgets document and prints each budget's split.
func check(path string, out io.Writer) error {
	lc, err := loadChecked(path)
	if err != nil {
		return err
	}
	bs := lc.Budgets
	noun := "budgets"
	if len(bs) == 1 {
		noun = "budget"
	}
	fmt.Fprintf(out, "%s: %d %s; lease ttl=%s refresh=%s drift=%s hold=%s\n", path, len(bs), noun, lc.TTL, lc.Refresh, lc.Drift, lc.Hold)
	for _, b := range bs {
		p := b.Limit.Period()
		fmt.Fprintf(out, "%s: %s (%s); reserve %s\n", b.Rule, rules.FormatQuota(b.Limit), b.Policy, quota(b.ReserveCount(), -1, p))
		fmt.Fprintln(out, "  floors, what each region may use without a lease:")
		var sum bucket.Tokens
		least := b.Limit.Count()
		w := 0
		for _, r := range b.Regions {
			w = max(w, len(r))
		}
		for _, r := range b.Regions {
			f := b.Floor(r)
			sum += f.Count
			least = min(least, f.Count)
			fmt.Fprintf(out, "    %-*s  %s\n", w, r, quota(f.Count, f.Burst, p))
		}
		fmt.Fprintf(out, "    %-*s  %s of the budget's %s\n", w, "Σ", quota(sum, -1, p), quota(b.Limit.Count(), -1, p))
		if u := b.Unit(); least < u {
			fmt.Fprintf(out, "  note: a share below %[1]s carries burst 0 and admits nothing. Floors below it admit\n"+
				"  nothing without a lease; the coordinator leases the budget in shares of at least %[1]s,\n"+
				"  to at most %[2]d region(s) at once\n", quota(u, -1, p), b.Limit.Count()/u)
		}
	}
	return nil
}

// quota renders count per period with burst as the rules write a quota
// ("1000 per minute, burst 16"); a negative burst leaves it out.
func quota(count, burst bucket.Tokens, period time.Duration) string {
	if burst < 0 {
		burst = count
	}
	return rules.FormatQuota(bucket.Per(count, period).WithBurst(burst))
}
