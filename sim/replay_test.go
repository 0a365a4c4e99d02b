package sim

import (
	"bufio"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// demoLogCounts counts the records of the demo's log per region.
func demoLogCounts(t *testing.T) (map[string]int, int) {
	t.Helper()
	f, err := os.Open("testdata/demo/decisions.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	counts := map[string]int{}
	total := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r struct{ Region, Rule string }
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		if r.Rule != "api" {
			t.Fatalf("record of rule %q, the demo has only api", r.Rule)
		}
		counts[r.Region]++
		total++
	}
	return counts, total
}

// TestReplayDemoLog replays the decision log recorded from cmd/demo (see
// testdata/demo/replay.yaml) on the demo's budgets file: every record,
// doubled for the half the log sampled, arrives in its region, and allot
// keeps the budget.
func TestReplayDemoLog(t *testing.T) {
	sc, err := LoadScenario("testdata/demo/replay.yaml")
	if err != nil {
		t.Fatal(err)
	}
	counts, total := demoLogCounts(t)
	if total < 500 {
		t.Fatalf("the demo's log holds %d records, want a run's worth (≥ 500)", total)
	}
	if len(sc.Rules) != 1 || sc.Rules[0].Name != "api" || sc.Rules[0].Keys != 1 || sc.Rules[0].Count != 100 {
		t.Fatalf("rules %+v, want the demo's api at 100/s with its one tenant", sc.Rules)
	}
	var got map[string]int
	res, err := runTraced(sc, 1, Options{Systems: []string{"allot"}}, &got)
	if err != nil {
		t.Fatal(err)
	}
	if res.Arrivals != int64(2*total) {
		t.Errorf("%d arrivals, want 2 × %d records", res.Arrivals, total)
	}
	for r, n := range counts {
		if got[r] != 2*n {
			t.Errorf("region %s: %d arrivals, want 2 × its %d records", r, got[r], n)
		}
	}
	if res.Verdict != Pass {
		t.Errorf("verdict %s", res.Verdict)
	}
	// Nothing beyond what one global bucket could admit over the log.
	if a, ideal := res.Systems[0].Admitted, res.Ideal.Admitted; a > ideal || a == 0 {
		t.Errorf("allot admitted %d tokens, ideal %d: want 0 < allot ≤ ideal", a, ideal)
	}
}

// runTraced runs sc and counts arrivals per region (by the ideal bucket's
// decisions, which see every arrival).
func runTraced(sc *Scenario, seed uint64, opts Options, perRegion *map[string]int) (*Result, error) {
	counts := map[string]int{}
	w, err := newWorld(sc, seed, opts)
	if err != nil {
		return nil, err
	}
	for _, s := range w.sources {
		if s.replay != nil {
			counts[sc.Regions[s.region].Name] += len(s.replay.at)
		}
	}
	*perRegion = counts
	return Run(sc, seed, opts)
}

// writeReplay writes a scenario with the log and returns it loaded.
func writeReplay(t *testing.T, logName, log, replay string) (*Scenario, error) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, logName), []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	body := "name: r\nregions: [{name: us}, {name: eu}]\nlatency: {us: {eu: 40ms}}\n" +
		"rules: [{name: api, count: 100, period: 1s, burst: 100}, {name: search, count: 10, period: 1s}]\n" +
		"replay:\n  - " + replay + "\n"
	p := filepath.Join(dir, "s.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return LoadScenario(p)
}

const csvLog = `time,region,rule,subject,cost,status
# an access log mapped to the replay columns; status is ignored
1764637200.000,us,GET /api,alice,1,200
1764637200.250,us,GET /api,bob,2,200
1764637200.500,eu,GET /api,alice,,200
1764637201.000,eu,search,carol,1,429
`

// TestReplayCSV reads an access log mapped to CSV: rules renamed, cost
// defaulted, keys counted per rule, the duration taken from the log.
func TestReplayCSV(t *testing.T) {
	sc, err := writeReplay(t, "access.csv", csvLog, `{file: access.csv, rules: {"GET /api": api}}`)
	if err != nil {
		t.Fatal(err)
	}
	lg := sc.Replay[0].log
	if len(lg.at) != 4 || lg.at[3] != 1_000_000 || lg.cost[1] != 2 || lg.cost[2] != 1 {
		t.Fatalf("records at %v costs %v, want 4 from 0 to 1 s with costs 1 2 1 1", lg.at, lg.cost)
	}
	if sc.Rules[0].Keys != 2 || sc.Rules[1].Keys != 1 {
		t.Errorf("keys %d and %d, want api's 2 subjects and search's 1", sc.Rules[0].Keys, sc.Rules[1].Keys)
	}
	if lg.key[0] != lg.key[2] || lg.key[0] == lg.key[1] {
		t.Errorf("keys %v: alice's two records must share a key, bob's differ", lg.key)
	}
	if sc.Duration.Seconds() < 1 || sc.Duration.Seconds() > 1.01 {
		t.Errorf("duration %s, want the log's 1 s span", sc.Duration)
	}
	res, err := Run(sc, 1, Options{Systems: []string{"allot"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Arrivals != 4 {
		t.Errorf("%d arrivals, want the log's 4", res.Arrivals)
	}
}

// TestReplayScaleAndShift checks the scale (whole and fractional), a
// region's own scale and a move of one region's share to another, over a
// log of 1000 records in us and 1000 in eu.
func TestReplayScaleAndShift(t *testing.T) {
	var b strings.Builder
	for i := 0; i < 1000; i++ {
		for _, r := range []string{"us", "eu"} {
			b.WriteString(`{"t":` + jsonSeconds(i) + `,"region":"` + r + `","rule":"api","subject":"s` + string(rune('a'+i%5)) + `","cost":1}` + "\n")
		}
	}
	log := b.String()
	for _, tc := range []struct {
		name   string
		spec   string
		us, eu [2]int // inclusive ranges of arrivals
	}{
		{"as is", `{file: l.jsonl}`, [2]int{1000, 1000}, [2]int{1000, 1000}},
		{"×3", `{file: l.jsonl, scale: 3}`, [2]int{3000, 3000}, [2]int{3000, 3000}},
		// Binomial(1000, 0.5) per region beyond the 2 whole copies.
		{"×2.5", `{file: l.jsonl, scale: 2.5}`, [2]int{2400, 2600}, [2]int{2400, 2600}},
		{"eu ×2", `{file: l.jsonl, region_scale: {eu: 2}}`, [2]int{1000, 1000}, [2]int{2000, 2000}},
		// Binomial(1000, 0.3) of us's records move to eu.
		{"move 30% us→eu", `{file: l.jsonl, move: [{from: us, to: eu, share: 0.3}]}`, [2]int{630, 770}, [2]int{1230, 1370}},
		{"move all", `{file: l.jsonl, move: [{from: us, to: eu, share: 1}]}`, [2]int{0, 0}, [2]int{2000, 2000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := writeReplay(t, "l.jsonl", log, tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			w, err := newWorld(sc, 1, Options{})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]int{}
			for _, s := range w.sources {
				got[sc.Regions[s.region].Name] += len(s.replay.at)
				for i := 1; i < len(s.replay.at); i++ {
					if s.replay.at[i] < s.replay.at[i-1] {
						t.Fatalf("stream out of order at %d", i)
					}
				}
			}
			if got["us"] < tc.us[0] || got["us"] > tc.us[1] || got["eu"] < tc.eu[0] || got["eu"] > tc.eu[1] {
				t.Errorf("arrivals us=%d eu=%d, want us in %v and eu in %v", got["us"], got["eu"], tc.us, tc.eu)
			}
		})
	}
}

func jsonSeconds(ms int) string {
	return strings.TrimRight(strings.TrimRight(formatFloat(1764637200+float64(ms)/100), "0"), ".")
}

func formatFloat(v float64) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestReplayDeterministic: the same seed expands a scaled log the same
// way; another seed differently.
func TestReplayDeterministic(t *testing.T) {
	sc, err := LoadScenario("testdata/demo/replay.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sc.Replay[0].Scale = 1.5
	expand := func(seed uint64) []Micros {
		var out []Micros
		for _, s := range replaySources(sc, rand.New(rand.NewPCG(seed, 0)), []int{0}, us(sc.Duration)) {
			out = append(out, s.replay.at...)
		}
		return out
	}
	a, b, c := expand(1), expand(1), expand(2)
	if len(a) != len(b) || len(a) == 0 {
		t.Fatalf("seed 1 gave %d then %d arrivals", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("seed 1 differs at %d", i)
		}
	}
	same := len(a) == len(c)
	for i := 0; same && i < len(a); i++ {
		same = a[i] == c[i]
	}
	if same {
		t.Error("seeds 1 and 2 expanded the log identically")
	}
}

// TestReplayErrors: a bad log or replay block is refused with the line,
// the field and the value named.
func TestReplayErrors(t *testing.T) {
	ok := `{"t":"2026-12-02T01:00:00Z","region":"us","rule":"api","subject":"a","cost":1}` + "\n"
	for _, tc := range []struct {
		name, file, log, spec, want string
	}{
		{"unknown region", "l.jsonl", ok + `{"t":"2026-12-02T01:00:01Z","region":"mars","rule":"api","subject":"a"}`, `{file: l.jsonl}`, `line 2: region="mars" is not a region`},
		{"unknown rule", "l.jsonl", `{"t":"2026-12-02T01:00:01Z","region":"us","rule":"web","subject":"a"}`, `{file: l.jsonl}`, `line 1: rule="web" is not a rule of the scenario (rules: api, search`},
		{"bad time", "l.jsonl", `{"t":"yesterday","region":"us","rule":"api","subject":"a"}`, `{file: l.jsonl}`, `line 1: t=yesterday: want RFC 3339 or Unix seconds`},
		{"cost above burst", "l.jsonl", `{"t":1,"region":"us","rule":"search","subject":"a","cost":11}`, `{file: l.jsonl}`, `line 1: cost=11 must be in [1, burst=10 of rule "search"]`},
		{"not json", "l.jsonl", ok + "t=1 region=us\n", `{file: l.jsonl}`, "line 2: not a JSON object"},
		{"csv header", "l.csv", "when,region,rule,subject\n1,us,api,a\n", `{file: l.csv}`, `has no "time" column`},
		{"csv cost", "l.csv", "time,region,rule,subject,cost\n1,us,api,a,lots\n", `{file: l.csv}`, `line 2: cost="lots" is not a whole number`},
		{"empty", "l.jsonl", "\n", `{file: l.jsonl}`, "no records"},
		{"missing file", "l.jsonl", ok, `{file: other.jsonl}`, `replay[0].file="other.jsonl"`},
		{"bad scale", "l.jsonl", ok, `{file: l.jsonl, scale: -1}`, "replay[0].scale=-1 must be in (0, 1000]"},
		{"bad move", "l.jsonl", ok, `{file: l.jsonl, move: [{from: us, to: ap, share: 0.5}]}`, `replay[0].move[0].to="ap" is not a region`},
		{"bad share", "l.jsonl", ok, `{file: l.jsonl, move: [{from: us, to: eu, share: 2}]}`, "replay[0].move[0].share=2 must be in (0, 1]"},
		{"bad region scale", "l.jsonl", ok, `{file: l.jsonl, region_scale: {ap: 2}}`, `replay[0].region_scale: "ap" is not a region`},
		{"bad format", "l.jsonl", ok, `{file: l.jsonl, format: xml}`, `replay[0].format="xml" must be jsonl or csv`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := writeReplay(t, tc.file, tc.log, tc.spec)
			if !errors.Is(err, ErrScenario) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrScenario naming %q", err, tc.want)
			}
		})
	}
}
