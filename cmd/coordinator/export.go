package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.yaml.in/yaml/v3"

	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/lease"
)

// exportCmd runs "coordinator export": it writes the regions, budgets and
// lease settings a coordinator serves as a scenario skeleton for the
// simulator (sim, sim sweep), so a what-if starts from what runs. The
// skeleton names the budgets file itself (config.budgets_file), so the
// simulator reads the budgets through the same loader; with -status, the
// live coordinator's regions are checked against the file and its hot
// keys' reported demand becomes traffic.
func exportCmd(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("export", flag.ContinueOnError)
	budgets := fs.String("budgets", "", "budgets document the coordinator serves (standalone mode)")
	etcd := fs.String("etcd", "", "read the budgets document from etcd instead (HA mode; default $ALLOT_ETCD when -budgets is not given)")
	prefix := fs.String("prefix", "/allot", "etcd key prefix shared by the cluster")
	status := fs.String("status", "", "a live coordinator's HTTP address (its -http, e.g. 127.0.0.1:7071 or https://host:7071): its regions and hot keys' demand")
	output := fs.String("o", "", "write the scenario to this file (default stdout); with -etcd the document is written beside it")
	name := fs.String("name", "exported", "the scenario's name")
	duration := fs.Duration("duration", time.Minute, "the scenario's duration")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("export: unexpected argument %q", fs.Arg(0))
	}
	if *duration <= 0 {
		return fmt.Errorf("export: -duration=%s must be > 0", *duration)
	}
	var endpoints []string
	if *budgets == "" {
		endpoints = etcdEndpoints(*etcd)
		if len(endpoints) == 0 {
			return errors.New("export: give -budgets (the file a standalone coordinator serves) or -etcd")
		}
	}
	docPath := *budgets
	source := *budgets
	if len(endpoints) > 0 {
		if *output == "" {
			return errors.New("export: -etcd needs -o: the budgets document is written beside the scenario")
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
		if err != nil {
			return fmt.Errorf("export: etcd %v: %w", endpoints, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		data, rev, err := coordinator.GetDocument(ctx, cli, *prefix)
		cancel()
		_ = cli.Close() // the document is read; closing reports nothing to act on
		if err != nil {
			return fmt.Errorf("export: %w", err)
		}
		if data == nil {
			return fmt.Errorf("export: nothing stored at %s", coordinator.DocumentKey(*prefix))
		}
		docPath = strings.TrimSuffix(*output, filepath.Ext(*output)) + ".budgets.yaml"
		if err := os.WriteFile(docPath, data, 0o600); err != nil {
			return fmt.Errorf("export: %w", err)
		}
		source = fmt.Sprintf("%s at revision %d (copied to %s)", coordinator.DocumentKey(*prefix), rev, docPath)
	}
	// The skeleton is what a coordinator would run: a document it would
	// refuse is refused here too.
	lc, err := loadChecked(docPath)
	if err != nil {
		return err
	}
	bs := lc.Budgets
	var live *liveStatus
	if *status != "" {
		if live, err = fetchStatus(*status); err != nil {
			return err
		}
		source += ", live status " + *status
	}
	ref := docPath
	if abs, err := filepath.Abs(docPath); err == nil {
		ref = abs
		if *output != "" {
			if dir, err := filepath.Abs(filepath.Dir(*output)); err == nil {
				if rel, err := filepath.Rel(dir, abs); err == nil {
					ref = rel
				}
			}
		}
	}
	text, err := skeleton(skeletonInput{name: *name, duration: *duration, source: source, budgetsRef: ref,
		budgets: bs, lease: lc, live: live, now: time.Now().UTC()})
	if err != nil {
		return err
	}
	if *output == "" {
		_, err = io.WriteString(out, text)
		return err
	}
	if err := os.WriteFile(*output, []byte(text), 0o600); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	fmt.Fprintf(out, "wrote %s: %d budgets over %d regions; fill in its latencies and agents, then run: sim sweep %s\n", *output, len(bs), len(regionsOf(bs, nil)), *output)
	return nil
}

// liveStatus is what the export reads of a coordinator's /status.json
// (coordinator.Status; a limit does not travel in it, so the budgets file
// gives each key's period).
type liveStatus struct {
	Leading bool
	Regions []struct {
		Region    string
		Connected bool
	}
	Keys []struct {
		Key struct {
			Rule, Subject string
		}
		Regions []string
		Wants   []int64
	}
	MoreKeys bool
}

// fetchStatus reads a live coordinator's /status.json.
func fetchStatus(addr string) (*liveStatus, error) {
	url := addr
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	url = strings.TrimSuffix(url, "/") + "/status.json"
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return nil, fmt.Errorf("export: -status=%q: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("export: -status=%q: %s answered %s", addr, url, resp.Status)
	}
	var st liveStatus
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&st); err != nil {
		return nil, fmt.Errorf("export: -status=%q: %s: %w", addr, url, err)
	}
	if !st.Leading {
		return nil, fmt.Errorf("export: -status=%q is not the leader; its status holds no allocation (ask the leader)", addr)
	}
	return &st, nil
}

type skeletonInput struct {
	name       string
	duration   time.Duration
	source     string
	budgetsRef string
	budgets    []lease.Budget
	lease      lease.Config
	live       *liveStatus
	now        time.Time
}

// regionsOf lists the regions of every budget, and of the live status,
// in first-seen order.
func regionsOf(bs []lease.Budget, live *liveStatus) []string {
	var out []string
	seen := map[string]bool{}
	add := func(r string) {
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	for _, b := range bs {
		for _, r := range b.Regions {
			add(r)
		}
	}
	if live != nil {
		for _, r := range live.Regions {
			add(r.Region)
		}
	}
	return out
}

// placeholderLatency is the one-way latency written between regions until
// the operator puts in the measured one.
const placeholderLatency = 50 * time.Millisecond

// skeleton renders the scenario.
func skeleton(in skeletonInput) (string, error) {
	q := func(s string) string {
		b, _ := yaml.Marshal(s)
		return strings.TrimSpace(string(b))
	}
	regions := regionsOf(in.budgets, nil)
	var b strings.Builder
	fmt.Fprintf(&b, "# A scenario skeleton written by `coordinator export` at %s\n", in.now.Format(time.RFC3339))
	fmt.Fprintf(&b, "# from %s.\n", in.source)
	b.WriteString("# The budgets are read from the budgets file itself (config.budgets_file);\n")
	b.WriteString("# the lease timings below are the file's, for a sweep to vary. Fill in the\n")
	b.WriteString("# placeholders (agents per region, one-way latencies), then add traffic: a\n")
	b.WriteString("# replay of the agents' decision logs (-decision-log) or synthetic streams.\n")
	b.WriteString("# See docs/operators.md.\n")
	fmt.Fprintf(&b, "name: %s\n", q(in.name))
	fmt.Fprintf(&b, "description: %s\n", q("exported from "+in.source))
	fmt.Fprintf(&b, "duration: %s\n", in.duration)
	b.WriteString("regions:\n")
	for _, r := range regions {
		fmt.Fprintf(&b, "  - {name: %s, agents: 2}   # agents: placeholder\n", q(r))
	}
	b.WriteString("latency:   # placeholders: put in the measured one-way latencies\n")
	for i, a := range regions {
		var cells []string
		for _, c := range regions[i:] {
			d := placeholderLatency
			if c == a {
				d = 500 * time.Microsecond
			}
			cells = append(cells, fmt.Sprintf("%s: %s", q(c), strings.ReplaceAll(d.String(), "µs", "us")))
		}
		fmt.Fprintf(&b, "  %s: {%s}\n", q(a), strings.Join(cells, ", "))
	}
	lc := in.lease
	rho := 0.0
	if lc.Drift > 0 && lc.Drift < lc.TTL {
		// lease.DriftFor's inverse, within the simulator's range (its
		// MaxConfigRho; the binaries do not import the simulator).
		rho = min(2*float64(lc.Drift)/float64(lc.TTL-lc.Drift), 0.0999)
	}
	fmt.Fprintf(&b, "coordinator:\n  lease_ttl: %s\n  refresh: %s\n  drift: %.6g   # ρ whose margin lease.DriftFor(ttl, ρ) is the file's drift %s\n", lc.TTL, lc.Refresh, rho, lc.Drift)
	fmt.Fprintf(&b, "  # hold=%s, demand_ttl=%s, headroom=%g, noise_headroom=%g and hysteresis=%g are served;\n", lc.Hold, lc.DemandTTL, lc.Headroom, lc.NoiseHeadroom, lc.Hysteresis)
	b.WriteString("  # the simulator derives hold and demand_ttl from ttl and refresh.\n")
	fmt.Fprintf(&b, "config:\n  budgets_file: %s\n", q(in.budgetsRef))
	budgets := map[string]lease.Budget{}
	for _, bd := range in.budgets {
		budgets[bd.Rule] = bd
	}
	var lines []string
	keys := map[string]int{}
	if in.live != nil {
		for _, r := range in.live.Regions {
			if !contains(regions, r.Region) {
				fmt.Fprintf(&b, "# the live coordinator knows region %q, which no budget of the file names\n", r.Region)
			}
		}
		for _, k := range in.live.Keys {
			bd, ok := budgets[k.Key.Rule]
			if !ok {
				lines = append(lines, fmt.Sprintf("  # hot key %s/%s: budget not in the file, left out", k.Key.Rule, k.Key.Subject))
				continue
			}
			idx := keys[bd.Rule]
			keys[bd.Rule]++
			for i, r := range k.Regions {
				if i >= len(k.Wants) || k.Wants[i] <= 0 {
					continue
				}
				rate := float64(k.Wants[i]) / bd.Limit.Period().Seconds()
				lines = append(lines, fmt.Sprintf("  - {region: %s, rule: %s, rate: %.6g, key: %d}   # hot key %q's reported demand", q(r), q(bd.Rule), rate, idx, k.Key.Subject))
			}
		}
		if in.live.MoreKeys {
			lines = append(lines, "  # the status listed its first hot keys only")
		}
	}
	if len(keys) > 0 {
		names := make([]string, 0, len(keys))
		for n := range keys {
			names = append(names, n)
		}
		sort.Strings(names)
		// The simulator gives a budget 100 subjects unless told; more hot
		// keys than that need more.
		var cells []string
		for _, n := range names {
			if keys[n] > 100 {
				cells = append(cells, fmt.Sprintf("%s: %d", q(n), keys[n]))
			}
		}
		if len(cells) > 0 {
			fmt.Fprintf(&b, "  keys: {%s}\n", strings.Join(cells, ", "))
		}
	}
	if len(lines) == 0 {
		b.WriteString("traffic: []   # add streams, or replay: [{file: decisions.jsonl, scale: 100}] for a log sampled at 1%\n")
	} else {
		b.WriteString("traffic:   # the live coordinator's hot keys, at the demand each region reported\n")
		b.WriteString(strings.Join(lines, "\n") + "\n")
	}
	b.WriteString("faults: []\n")
	return b.String(), nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
