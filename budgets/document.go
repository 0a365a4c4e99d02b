// Package budgets reads the coordinator's budgets document: which regions
// share every global budget, their floor weights, the reserve, the
// allocation policy, the rules the budgets come from and the lease
// timings. The coordinator serves it (package coordinator re-exports it);
// the simulator reads the same files through it. It imports no gRPC or
// etcd, so the simulator can.
package budgets

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/rules"
)

// Document is the coordinator's budgets document, in a file (standalone)
// or under an etcd key (HA):
//
//	regions: [us, eu, ap]          # who shares every budget
//	weights: [2, 1, 1]             # floor weights (default equal)
//	reserve: 0.333                 # kept out of floors (default 1/3)
//	policy: max-min                # or proportional, static
//	budgets:                       # explicit budgets
//	  - rule: api
//	    limit: "6000 per minute, burst 100"
//	    regions: [us, eu]          # optional; so are weights, reserve, policy
//	rules: |                       # and/or a rules file inline, whose global
//	  plans: {free: "10 per minute"} #   rules become budgets
//	  rules: [{name: api, limit: plan, scope: global}]
//	lease: {ttl: 10s, refresh: 3s, drift: 500ms, hold: 20s}
//
// Regions take their floors from the same budgets, so the document is the
// one source both sides read.
type Document struct {
	Regions []string
	Weights []int64
	Reserve *float64
	Policy  string
	Budgets []BudgetDocument
	Rules   string
	// RulesFile names a rules file instead of Rules (files only); a
	// relative path is taken from the budgets file's directory.
	RulesFile string
	Lease     LeaseDocument

	// name and lines locate problems: lines maps a field path
	// ("regions[1]", "budgets[0].limit") to its line in name.
	name  string
	lines map[string]int
	// set is Rules parsed, when ParseDocument or LoadDocument did it.
	set *rules.Set
}

// BudgetDocument is one explicit budget.
type BudgetDocument struct {
	Rule    string
	Limit   string
	Regions []string
	Weights []int64
	Reserve *float64
	Policy  string
}

// LeaseDocument overrides lease timings; zero fields keep the defaults.
type LeaseDocument struct {
	TTL        time.Duration
	Refresh    time.Duration
	Drift      time.Duration
	Hold       time.Duration
	DemandTTL  time.Duration
	Headroom   *float64
	Hysteresis *float64
}

// RulesBudgets turns a rules set into budgets split among regions the way
// regions split them (the agent's region.Budgets); the coordinator binary
// supplies it so both sides name and size budgets identically.
type RulesBudgets func(set *rules.Set, regions []string, weights []int64, reserve float64, policy lease.AllocationPolicy) []lease.Budget

// ErrInvalidDocument: a budgets document cannot be served. Every error
// that rejects a document's content wraps it; one that cannot read the
// file does not.
var ErrInvalidDocument = errors.New("coordinator: invalid budgets document")

// DocumentError lists every problem found in a budgets document, in file
// order, each located like the rules file's: "file:line: field: message".
type DocumentError struct {
	File     string
	Problems []rules.Problem
}

// Error lists the problems one per line.
func (e *DocumentError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v: %s: %d problem(s):", ErrInvalidDocument, e.File, len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n  ")
		b.WriteString(p.String())
	}
	return b.String()
}

// Unwrap returns ErrInvalidDocument.
func (e *DocumentError) Unwrap() error { return ErrInvalidDocument }

// The keys each mapping of the document accepts, in the order errors list
// them.
var (
	documentKeys = []string{"regions", "weights", "reserve", "policy", "budgets", "rules", "rules_file", "lease"}
	budgetKeys   = []string{"rule", "limit", "regions", "weights", "reserve", "policy"}
	leaseKeys    = []string{"ttl", "refresh", "drift", "hold", "demand_ttl", "headroom", "hysteresis"}
)

// maxWeight bounds a floor weight, as lease.Budget.Validate does.
const maxWeight = 1 << 20

// ParseDocument parses and validates a budgets document; name (a path, or
// an etcd key) locates problems in the error, a *DocumentError listing
// every problem found. A rules_file is not read here (LoadDocument reads
// it); inline rules are parsed and their problems located in the document.
func ParseDocument(data []byte, name string) (*Document, error) {
	d := &Document{name: name, lines: map[string]int{}}
	p := &docParser{d: d}
	if len(data) > rules.MaxFileSize {
		p.add(0, "", "file is %d bytes, more than the %d allowed", len(data), rules.MaxFileSize)
		return nil, p.err()
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		line := rules.YAMLErrorLine(err)
		if line == 0 {
			line = 1 + strings.Count(string(data), "\n")
		}
		p.add(line, "", "not valid YAML: %s", strings.TrimPrefix(err.Error(), "yaml: "))
		return nil, p.err()
	}
	if root.Kind == 0 || len(root.Content) == 0 {
		p.add(0, "", "file is empty")
		return nil, p.err()
	}
	p.top(root.Content[0])
	d.check(p)
	if len(p.problems) > 0 {
		return nil, p.err()
	}
	return d, nil
}

// LoadDocument reads and parses a budgets file, and the rules file it
// names. A file that cannot be read is reported as such (fs.ErrNotExist
// and the like), not as an invalid document.
func LoadDocument(path string) (*Document, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("coordinator: budgets: %w", err)
	}
	d, err := ParseDocument(data, path)
	if err != nil {
		return nil, err
	}
	if d.RulesFile != "" {
		rp := d.RulesFile
		if !filepath.IsAbs(rp) {
			rp = filepath.Join(filepath.Dir(path), rp)
		}
		where := fmt.Sprintf("%s:%d: rules_file", path, d.line("rules_file"))
		rb, err := os.ReadFile(rp)
		if err != nil {
			return nil, fmt.Errorf("coordinator: budgets: %s: %w", where, err)
		}
		set, err := rules.Parse(rb, rp)
		if err != nil {
			// The rules' own error locates each problem in their file.
			return nil, fmt.Errorf("%w: %s: %w", ErrInvalidDocument, where, err)
		}
		d.Rules, d.RulesFile, d.set = string(rb), "", set
	}
	return d, nil
}

// LeaseConfig applies the document's lease timings to base.
func (d *Document) LeaseConfig(base lease.Config) lease.Config {
	l := d.Lease
	set := func(dst *time.Duration, v time.Duration) {
		if v != 0 {
			*dst = v
		}
	}
	set(&base.TTL, l.TTL)
	set(&base.Refresh, l.Refresh)
	set(&base.Drift, l.Drift)
	set(&base.Hold, l.Hold)
	set(&base.DemandTTL, l.DemandTTL)
	if l.Headroom != nil {
		base.Headroom = *l.Headroom
	}
	if l.Hysteresis != nil {
		base.Hysteresis = *l.Hysteresis
	}
	return base
}

// Resolve returns the document's budgets, validated: the explicit ones and
// those of its rules (through fromRules, which may be nil when the document
// has no rules). Errors are a *DocumentError locating each problem at the
// field it comes from: a top-level default at the top level, a budget's own
// field under budgets[i].
func (d *Document) Resolve(fromRules RulesBudgets) ([]lease.Budget, error) {
	p := &docParser{d: d}
	d.check(p)
	if len(p.problems) > 0 {
		return nil, p.err()
	}
	reserve := lease.DefaultReserve
	if d.Reserve != nil {
		reserve = *d.Reserve
	}
	policy, _ := lease.ParseAllocationPolicy(d.Policy) // check validated it
	var out []lease.Budget
	// from names where each budget came from, for the backstop below.
	var from []string
	for i, bd := range d.Budgets {
		l, _ := rules.ParseQuota(bd.Limit)
		b := lease.Budget{Rule: bd.Rule, Limit: l, Regions: d.Regions, Weights: d.Weights, Reserve: reserve, Policy: policy}
		if bd.Regions != nil {
			b.Regions, b.Weights = bd.Regions, nil
		}
		if bd.Weights != nil {
			b.Weights = bd.Weights
		}
		if bd.Reserve != nil {
			b.Reserve = *bd.Reserve
		}
		if bd.Policy != "" {
			b.Policy, _ = lease.ParseAllocationPolicy(bd.Policy)
		}
		out = append(out, b)
		from = append(from, fmt.Sprintf("budgets[%d]", i))
	}
	if d.Rules != "" {
		if fromRules == nil {
			p.add(d.line("rules"), "rules", "given, but this coordinator cannot read rules")
			return nil, p.err()
		}
		set := d.set
		if set == nil {
			p.inlineRules(d.Rules, d.line("rules"), false)
			if len(p.problems) > 0 {
				return nil, p.err()
			}
			set = d.set
		}
		for _, b := range fromRules(set, d.Regions, d.Weights, reserve, policy) {
			out = append(out, b)
			from = append(from, "rules")
		}
	}
	// The checks above cover every field; this backstop catches what a
	// change to lease.Budget's rules would add, at the budget it concerns.
	first := map[string]string{}
	for i, b := range out {
		if err := b.Validate(); err != nil {
			p.add(d.line(from[i]), from[i], "%v", err)
			continue
		}
		if f, dup := first[b.Rule]; dup {
			p.add(d.line(from[i]), from[i], "budget %q defined twice (first in %s)", b.Rule, f)
			continue
		}
		first[b.Rule] = from[i]
	}
	if len(p.problems) > 0 {
		return nil, p.err()
	}
	return out, nil
}

// line returns the line of field, or of the nearest enclosing field the
// document located (a missing key is reported at its mapping), or 0.
func (d *Document) line(field string) int {
	for field != "" {
		if l, ok := d.lines[field]; ok {
			return l
		}
		i := strings.LastIndexAny(field, ".[")
		if i < 0 {
			break
		}
		field = field[:i]
	}
	return 0
}

// check validates the document's values, each problem at the field it
// comes from.
func (d *Document) check(p *docParser) {
	p.regions(d.Regions, "regions")
	p.weights(d.Weights, "weights")
	if d.Weights != nil {
		switch {
		case d.Regions == nil:
			p.add(d.line("weights"), "weights", "given without regions at the top level")
		case len(d.Weights) != len(d.Regions):
			p.add(d.line("weights"), "weights", "%d weights for %d regions", len(d.Weights), len(d.Regions))
		}
	}
	p.reserve(d.Reserve, "reserve")
	p.policy(d.Policy, "policy")
	first := map[string]string{}
	for i, bd := range d.Budgets {
		f := fmt.Sprintf("budgets[%d]", i)
		switch {
		case bd.Rule == "":
			p.add(d.line(f+".rule"), f+".rule", "missing")
		case first[bd.Rule] != "":
			p.add(d.line(f+".rule"), f+".rule", "budget %q defined twice (first in %s)", bd.Rule, first[bd.Rule])
		default:
			first[bd.Rule] = f
		}
		if bd.Limit == "" {
			p.add(d.line(f+".limit"), f+".limit", "missing")
		} else if _, err := rules.ParseQuota(bd.Limit); err != nil {
			p.add(d.line(f+".limit"), f+".limit", "%v", err)
		}
		p.regions(bd.Regions, f+".regions")
		p.weights(bd.Weights, f+".weights")
		regions, where := d.Regions, "regions at the top level"
		if bd.Regions != nil {
			regions, where = bd.Regions, f+".regions"
		}
		if len(regions) == 0 {
			p.add(d.line(f+".regions"), f+".regions", "missing, and no regions at the top level")
		} else if bd.Weights != nil && len(bd.Weights) != len(regions) {
			p.add(d.line(f+".weights"), f+".weights", "%d weights for %d %s", len(bd.Weights), len(regions), where)
		}
		p.reserve(bd.Reserve, f+".reserve")
		p.policy(bd.Policy, f+".policy")
	}
	if (d.Rules != "" || d.RulesFile != "") && len(d.Regions) == 0 {
		f := "rules"
		if d.RulesFile != "" {
			f = "rules_file"
		}
		p.add(d.line(f), f, "rules need regions at the top level")
	}
	if d.Rules != "" && d.RulesFile != "" {
		p.add(d.line("rules_file"), "rules_file", "give rules or rules_file, not both")
	}
	lc := d.LeaseConfig(lease.DefaultConfig())
	lc.Budgets = nil
	if err := lc.Validate(); err != nil {
		msg := strings.TrimPrefix(err.Error(), lease.ErrInvalidConfig.Error()+": ")
		f := "lease"
		if m := leaseFieldRE.FindStringSubmatch(msg); m != nil && d.lines["lease."+m[1]] != 0 {
			f = "lease." + m[1]
		}
		p.add(d.line(f), f, "%s (with the defaults for the timings not given)", msg)
	}
}

// leaseFieldRE finds the field a lease.Config error names first.
var leaseFieldRE = regexp.MustCompile(`^([a-z_]+)=`)

// docParser collects a document's problems.
type docParser struct {
	d        *Document
	problems []rules.Problem
}

func (p *docParser) add(line int, field, format string, args ...any) {
	p.problems = append(p.problems, rules.Problem{File: p.d.name, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

func (p *docParser) err() error {
	sort.SliceStable(p.problems, func(i, j int) bool { return p.problems[i].Line < p.problems[j].Line })
	return &DocumentError{File: p.d.name, Problems: p.problems}
}

func (p *docParser) regions(rs []string, field string) {
	first := map[string]string{}
	for i, r := range rs {
		f := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case r == "":
			p.add(p.d.line(f), f, "empty region name")
		case first[r] != "":
			p.add(p.d.line(f), f, "region %q listed twice (first as %s)", r, first[r])
		default:
			first[r] = f
		}
	}
}

func (p *docParser) weights(ws []int64, field string) {
	for i, w := range ws {
		if w < 1 || w > maxWeight {
			f := fmt.Sprintf("%s[%d]", field, i)
			p.add(p.d.line(f), f, "%d out of range [1, %d]", w, maxWeight)
		}
	}
}

func (p *docParser) reserve(r *float64, field string) {
	if r != nil && (math.IsNaN(*r) || *r < 0 || *r >= 1) {
		p.add(p.d.line(field), field, "%v out of range [0, 1)", *r)
	}
}

func (p *docParser) policy(s, field string) {
	if _, err := lease.ParseAllocationPolicy(s); err != nil {
		p.add(p.d.line(field), field, "unknown policy %q (want max-min, proportional or static)", s)
	}
}

// top reads the document's mapping into p.d.
func (p *docParser) top(n *yaml.Node) {
	d := p.d
	p.mapping(n, "", documentKeys, func(key string, vn *yaml.Node) {
		switch key {
		case "regions":
			d.Regions = p.stringList(vn, key)
		case "weights":
			d.Weights = p.intList(vn, key)
		case "reserve":
			d.Reserve = p.float(vn, key)
		case "policy":
			d.Policy, _ = p.str(vn, key)
		case "budgets":
			p.budgets(vn)
		case "rules":
			if s, ok := p.str(vn, key); ok {
				d.Rules = s
				p.inlineRules(s, vn.Line, vn.Style&yaml.LiteralStyle != 0)
			}
		case "rules_file":
			if s, ok := p.str(vn, key); ok && s == "" {
				p.add(vn.Line, key, "must not be empty")
			} else {
				d.RulesFile = s
			}
		case "lease":
			p.lease(vn)
		}
	})
}

func (p *docParser) budgets(n *yaml.Node) {
	if n.Kind != yaml.SequenceNode {
		p.add(n.Line, "budgets", "want a list, got %s", rules.DescribeNode(n))
		return
	}
	for i, bn := range n.Content {
		f := fmt.Sprintf("budgets[%d]", i)
		p.d.lines[f] = bn.Line
		var bd BudgetDocument
		p.mapping(bn, f, budgetKeys, func(key string, vn *yaml.Node) {
			sub := f + "." + key
			switch key {
			case "rule":
				bd.Rule, _ = p.str(vn, sub)
			case "limit":
				bd.Limit, _ = p.str(vn, sub)
			case "regions":
				bd.Regions = p.stringList(vn, sub)
			case "weights":
				bd.Weights = p.intList(vn, sub)
			case "reserve":
				bd.Reserve = p.float(vn, sub)
			case "policy":
				bd.Policy, _ = p.str(vn, sub)
			}
		})
		p.d.Budgets = append(p.d.Budgets, bd)
	}
}

func (p *docParser) lease(n *yaml.Node) {
	l := &p.d.Lease
	p.mapping(n, "lease", leaseKeys, func(key string, vn *yaml.Node) {
		sub := "lease." + key
		switch key {
		case "ttl":
			l.TTL = p.duration(vn, sub)
		case "refresh":
			l.Refresh = p.duration(vn, sub)
		case "drift":
			l.Drift = p.duration(vn, sub)
		case "hold":
			l.Hold = p.duration(vn, sub)
		case "demand_ttl":
			l.DemandTTL = p.duration(vn, sub)
		case "headroom":
			l.Headroom = p.float(vn, sub)
		case "hysteresis":
			l.Hysteresis = p.float(vn, sub)
		}
	})
}

// inlineRules parses rules given inline and keeps their problems, located
// in the document: exactly for a literal block ("rules: |"), whose lines
// follow the key's, else at the key with the rules' own line in the
// message.
func (p *docParser) inlineRules(s string, line int, literal bool) {
	set, err := rules.Parse([]byte(s), p.d.name+" (inline rules)")
	var ve *rules.ValidationError
	switch {
	case err == nil:
		p.d.set = set
	case errors.As(err, &ve):
		for _, q := range ve.Problems {
			f := "rules"
			if q.Field != "" {
				f = "rules: " + q.Field
			}
			switch {
			case literal && q.Line > 0:
				p.add(line+q.Line, f, "%s", q.Msg)
			case q.Line > 0:
				p.add(line, f, "%s (line %d of the inline rules)", q.Msg, q.Line)
			default:
				p.add(line, f, "%s", q.Msg)
			}
		}
	default:
		p.add(line, "rules", "%v", err)
	}
}

// mapping calls fn for each pair of the mapping n, recording each value's
// line, and reports keys not in allowed (with the known ones) and
// duplicate keys.
func (p *docParser) mapping(n *yaml.Node, field string, allowed []string, fn func(key string, vn *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		p.add(n.Line, field, "want a mapping, got %s", rules.DescribeNode(n))
		return
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := n.Content[i], n.Content[i+1]
		sub := kn.Value
		if field != "" {
			sub = field + "." + kn.Value
		}
		switch first, dup := seen[kn.Value]; {
		case kn.Kind != yaml.ScalarNode:
			p.add(kn.Line, field, "keys must be strings, got %s", rules.DescribeNode(kn))
		case dup:
			p.add(kn.Line, sub, "duplicate key (first at line %d)", first)
		case !slices.Contains(allowed, kn.Value):
			p.add(kn.Line, sub, "unknown key %q (known: %s)", kn.Value, strings.Join(allowed, ", "))
		case vn.Kind == yaml.AliasNode:
			p.add(vn.Line, sub, "aliases are not supported")
		default:
			seen[kn.Value] = kn.Line
			p.d.lines[sub] = vn.Line
			fn(kn.Value, vn)
		}
	}
}

func (p *docParser) str(n *yaml.Node, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.add(n.Line, field, "want a string, got %s", rules.DescribeNode(n))
		return "", false
	}
	return n.Value, true
}

func (p *docParser) stringList(n *yaml.Node, field string) []string {
	return list(p, n, field, p.str)
}

func (p *docParser) intList(n *yaml.Node, field string) []int64 {
	return list(p, n, field, p.int)
}

// list reads a sequence whose elements elem reads, recording each
// element's line; an element elem refuses (it said why) is left out.
func list[T any](p *docParser, n *yaml.Node, field string, elem func(*yaml.Node, string) (T, bool)) []T {
	if n.Kind != yaml.SequenceNode {
		p.add(n.Line, field, "want a list, got %s", rules.DescribeNode(n))
		return nil
	}
	out := []T{}
	for i, en := range n.Content {
		f := fmt.Sprintf("%s[%d]", field, i)
		p.d.lines[f] = en.Line
		if v, ok := elem(en, f); ok {
			out = append(out, v)
		}
	}
	return out
}

func (p *docParser) int(n *yaml.Node, field string) (int64, bool) {
	v, err := strconv.ParseInt(n.Value, 10, 64)
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" || err != nil {
		p.add(n.Line, field, "want a whole number, got %s", rules.DescribeNode(n))
		return 0, false
	}
	return v, true
}

func (p *docParser) float(n *yaml.Node, field string) *float64 {
	v, err := strconv.ParseFloat(n.Value, 64)
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" || err != nil {
		p.add(n.Line, field, "want a number, got %s", rules.DescribeNode(n))
		return nil
	}
	return &v
}

func (p *docParser) duration(n *yaml.Node, field string) time.Duration {
	v, err := time.ParseDuration(n.Value)
	switch {
	case n.Kind != yaml.ScalarNode || n.Tag == "!!null" || err != nil:
		p.add(n.Line, field, "want a duration such as 10s or 500ms, got %s", rules.DescribeNode(n))
	case v <= 0:
		p.add(n.Line, field, "%s must be > 0 (leave it out for the default)", v)
	default:
		return v
	}
	return 0
}
