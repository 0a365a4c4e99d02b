package lease

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of scenario files")

// TestScenarios runs the scenario files in testdata/. Each case is a command
// line, "----", and the expected output, ended by a blank line; lines
// starting with # are comments. Run with -args -rewrite to regenerate the
// expected output after a deliberate change, then read the diff.
//
// Commands:
//
//	config ttl=… refresh=… drift=… hold=… hysteresis=… headroom=… noise_headroom=…
//	budget rule=… count=… per=… burst=… regions=a,b reserve=… weights=… policy=…
//	start                      build the cluster; prints floors
//	demand region=… key=rule/subject want=…   (want=0 stops the demand)
//	run for=… [step=…]         advance time, checking I1 at every step
//	show                       each key's allocation per region, and leases
//	cut region=… | heal region=…
//	drop to=…|from=… n=…       lose the next n messages
//	leader                     a new leader takes over
//	release region=… | restart region=… | expire
//	rebudget rule=… count=… …  change a budget at the coordinator
//	stats
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenario files: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScenario(t, f) })
	}
}

type scenario struct {
	cfg Config
	c   *cluster
}

func runScenario(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	var out strings.Builder
	s := &scenario{cfg: DefaultConfig()}
	// The files' figures are the 5% headroom's; noise_headroom.txt turns
	// the noise headroom on (config noise_headroom=…).
	s.cfg.NoiseHeadroom = 0
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			out.WriteString(line + "\n")
			continue
		}
		cmd := line
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s:%d: command %q not followed by ----", path, i+1, cmd)
		}
		i += 2
		var want []string
		for ; i < len(lines) && lines[i] != ""; i++ {
			want = append(want, lines[i])
		}
		got, err := s.do(t, cmd)
		if err != nil {
			t.Fatalf("%s:%d: %s: %v", path, i, cmd, err)
		}
		got = strings.TrimRight(got, "\n")
		out.WriteString(cmd + "\n----\n")
		if got != "" {
			out.WriteString(got + "\n")
		}
		if i < len(lines) {
			out.WriteString("\n")
		}
		if !*rewrite && got != strings.Join(want, "\n") {
			t.Errorf("%s: %s\ngot:\n%s\nwant:\n%s", path, cmd, got, strings.Join(want, "\n"))
		}
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func args(fields []string) map[string]string {
	m := map[string]string{}
	for _, f := range fields {
		k, v, _ := strings.Cut(f, "=")
		m[k] = v
	}
	return m
}

func parseKey(s string) bucket.Key {
	r, sub, _ := strings.Cut(s, "/")
	return bucket.Key{Rule: r, Subject: sub}
}

func parseBudget(a map[string]string) (Budget, error) {
	count, err := strconv.ParseInt(a["count"], 10, 64)
	if err != nil {
		return Budget{}, fmt.Errorf("count: %w", err)
	}
	per := time.Minute
	if a["per"] != "" {
		if per, err = time.ParseDuration(a["per"]); err != nil {
			return Budget{}, err
		}
	}
	l := bucket.Per(bucket.Tokens(count), per)
	if a["burst"] != "" {
		b, err := strconv.ParseInt(a["burst"], 10, 64)
		if err != nil {
			return Budget{}, err
		}
		l = l.WithBurst(bucket.Tokens(b))
	}
	b := Budget{Rule: a["rule"], Limit: l, Regions: strings.Split(a["regions"], ","), Reserve: DefaultReserve}
	if a["reserve"] != "" {
		if b.Reserve, err = strconv.ParseFloat(a["reserve"], 64); err != nil {
			return Budget{}, err
		}
	}
	if a["weights"] != "" {
		for _, w := range strings.Split(a["weights"], ",") {
			n, err := strconv.ParseInt(w, 10, 64)
			if err != nil {
				return Budget{}, err
			}
			b.Weights = append(b.Weights, n)
		}
	}
	if b.Policy, err = ParseAllocationPolicy(a["policy"]); err != nil {
		return Budget{}, err
	}
	return b, b.Validate()
}

func (s *scenario) do(t *testing.T, line string) (string, error) {
	fields := strings.Fields(line)
	a := args(fields[1:])
	c := s.c
	dur := func(k string, def time.Duration) time.Duration {
		if a[k] == "" {
			return def
		}
		d, err := time.ParseDuration(a[k])
		if err != nil {
			t.Fatalf("%s=%q: %v", k, a[k], err)
		}
		return d
	}
	num := func(k string) int {
		n, err := strconv.Atoi(a[k])
		if err != nil {
			t.Fatalf("%s=%q: %v", k, a[k], err)
		}
		return n
	}
	switch fields[0] {
	case "config":
		s.cfg.TTL = dur("ttl", s.cfg.TTL)
		s.cfg.Refresh = dur("refresh", s.cfg.Refresh)
		s.cfg.Drift = dur("drift", s.cfg.Drift)
		s.cfg.Hold = dur("hold", s.cfg.Hold)
		s.cfg.DemandTTL = dur("demand_ttl", s.cfg.DemandTTL)
		for k, p := range map[string]*float64{"hysteresis": &s.cfg.Hysteresis, "headroom": &s.cfg.Headroom, "noise_headroom": &s.cfg.NoiseHeadroom} {
			if a[k] != "" {
				f, err := strconv.ParseFloat(a[k], 64)
				if err != nil {
					return "", err
				}
				*p = f
			}
		}
		return "", s.cfg.Validate()
	case "budget":
		b, err := parseBudget(a)
		if err != nil {
			return "", err
		}
		s.cfg.Budgets = append(s.cfg.Budgets, b)
		return "", nil
	case "start":
		s.c = newCluster(t, s.cfg)
		var sb strings.Builder
		for _, b := range s.cfg.Budgets {
			fmt.Fprintf(&sb, "%s: %s reserve=%d floors:", b.Rule, b.Limit, b.ReserveCount())
			for _, r := range b.Regions {
				f := b.Floor(r)
				fmt.Fprintf(&sb, " %s=%d/%d", r, f.Count, f.Burst)
			}
			sb.WriteString("\n")
		}
		return sb.String(), nil
	case "demand":
		r, k := a["region"], parseKey(a["key"])
		if c.demand[r] == nil {
			c.demand[r] = map[bucket.Key]bucket.Tokens{}
		}
		if w := num("want"); w > 0 {
			c.demand[r][k] = bucket.Tokens(w)
		} else {
			delete(c.demand[r], k)
		}
		return "", nil
	case "run":
		d, step := dur("for", 0), dur("step", 100*time.Millisecond)
		for end := c.now.Add(d); c.now.Before(end); {
			c.step(min(step, end.Sub(c.now)))
			if err := c.checkI1(); err != nil {
				return "", err
			}
			if err := c.checkClaims(); err != nil {
				return "", err
			}
		}
		return fmt.Sprintf("t=%s\n%s", c.now.Sub(t0), c.show()), nil
	case "show":
		return c.show(), nil
	case "cut":
		c.cut[a["region"]] = true
		return "", nil
	case "heal":
		delete(c.cut, a["region"])
		c.holders[a["region"]].Reconnect(c.now)
		c.collect()
		return "", nil
	case "drop":
		if a["to"] != "" {
			c.dropTo[a["to"]] += num("n")
		} else {
			c.dropUp[a["from"]] += num("n")
		}
		return "", nil
	case "leader":
		c.leaderChange()
		return fmt.Sprintf("term %d, learning until t=%s", c.term, c.alloc.learnUntil.Sub(t0)), nil
	case "release":
		c.holders[a["region"]].Release(c.now)
		c.collect()
		return "", nil
	case "restart":
		r := a["region"]
		hc := DefaultHolderConfig()
		hc.Region, hc.Budgets, hc.Drift, hc.Refresh = r, c.cfg.Budgets, c.cfg.Drift, c.cfg.Refresh
		h, err := RestoreHolder(hc, c.holders[r].Snapshot(), c.now)
		if err != nil {
			return "", err
		}
		c.holders[r] = h
		c.collect()
		return "", nil
	case "fresh":
		c.startHolder(a["region"])
		return "", nil
	case "expire":
		c.alloc.ExpireAll(c.now)
		c.collect()
		return "", nil
	case "rebudget":
		b, err := parseBudget(a)
		if err != nil {
			return "", err
		}
		bs := slices.Clone(c.cfg.Budgets)
		for i := range bs {
			if bs[i].Rule == b.Rule {
				bs[i] = b
			}
		}
		c.cfg.Budgets = bs
		// Only the coordinator is told: regions get the new budgets (and
		// floors) with the full table it sends them.
		if err := c.alloc.SetBudgets(c.now, bs); err != nil {
			return "", err
		}
		c.collect()
		return "", nil
	case "stats":
		st := c.alloc.Stats(c.now)
		return fmt.Sprintf("hot=%d learning=%v increases=%d decreases=%d blocked=%d expired=%d urgent=%d",
			st.HotKeys, st.Learning, st.Increases, st.Decreases, st.Blocked, st.Expired, st.Urgent), nil
	}
	return "", fmt.Errorf("unknown command %q", fields[0])
}

var _ = bufio.NewReader
