package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/allot-dev/allot/bucket"
)

// Bounds on a rules file, so that a file from an untrusted path (an etcd
// key, say) cannot make parsing or matching arbitrarily slow.
const (
	// MaxFileSize bounds a rules file; a larger one is rejected before parsing.
	MaxFileSize = 4 << 20
	// MaxRules bounds the rules: matching is linear and the unreachable-rule
	// check quadratic in their number.
	MaxRules = 4096
	// MaxPlans bounds the plans.
	MaxPlans = 1024
	// MaxConditions bounds the match conditions and cost entries of a rule.
	MaxConditions = 64
)

// ErrInvalid is wrapped by every error that rejects a rules file.
var ErrInvalid = errors.New("rules: invalid rules")

// Problem is one thing wrong with a rules file, located by file, line and
// field path (for example "rules[2].costs[0].cost").
type Problem struct {
	File  string
	Line  int
	Field string
	Msg   string
}

// String renders the problem as "file:line: field: message".
func (p Problem) String() string {
	var b strings.Builder
	b.WriteString(p.File)
	if p.Line > 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(p.Line))
	}
	b.WriteString(": ")
	if p.Field != "" {
		b.WriteString(p.Field)
		b.WriteString(": ")
	}
	b.WriteString(p.Msg)
	return b.String()
}

// ValidationError lists every problem found in a rules file, in file order.
type ValidationError struct {
	File     string
	Problems []Problem
}

// Error lists the problems one per line.
func (e *ValidationError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rules: %s: %d problem(s):", e.File, len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n  ")
		b.WriteString(p.String())
	}
	return b.String()
}

// Unwrap returns ErrInvalid.
func (e *ValidationError) Unwrap() error { return ErrInvalid }

// Load reads and parses the rules file at path.
func Load(path string) (*Set, error) {
	// The *fs.PathError of Open and Read names the operation and the path.
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	return Parse(data, path)
}

// Parse parses and validates a rules file from data; name (a path, or an
// etcd key) locates problems in the error. The error is a
// *ValidationError listing every problem found.
func Parse(data []byte, name string) (*Set, error) {
	p := &parser{file: name}
	if len(data) > MaxFileSize {
		p.add(0, "", "file is %d bytes, more than the %d allowed", len(data), MaxFileSize)
		return nil, p.err()
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		line := YAMLErrorLine(err)
		if line == 0 {
			// "unexpected end of stream" and the like: the end of the file.
			line = 1 + bytes.Count(data, []byte("\n"))
		}
		p.add(line, "", "not valid YAML: %s", yamlErrMsg(err))
		return nil, p.err()
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		p.add(0, "", "file is empty")
		return nil, p.err()
	}
	s := &Set{
		digest:      digestOf(data),
		source:      name,
		planKey:     KeyPlan,
		noIdentity:  NoIdentity{Action: DenyNoIdentity, Status: 401},
		unknownPlan: UnknownPlanDefault,
		plans:       map[string]*Plan{},
		byName:      map[string]*Rule{},
	}
	p.top(doc.Content[0], s)
	p.validate(s)
	if len(p.problems) > 0 {
		return nil, p.err()
	}
	s.version = s.label
	if s.version == "" {
		s.version = "sha256:" + s.digest[:12]
	}
	if d := s.plans[s.defaultPlan]; d != nil {
		s.defaultRes = &d.res
	}
	for _, p := range s.planOrder {
		p.res = Resolution{Limit: p.Limit, Plan: p.Name}
	}
	for _, r := range s.rules {
		r.compile()
	}
	return s, nil
}

type parser struct {
	file     string
	problems []Problem
	// planLine and defaultPlanLine locate fields checked after parsing.
	defaultPlanLine int
	rulesLine       int
	noIdentityLine  int
	emergencyLines  map[*Rule]int
	costLines       map[*Rule][]int
	ruleField       map[*Rule]string
	costKeyLines    map[*Rule]int
}

func (p *parser) add(line int, field, format string, args ...any) {
	p.problems = append(p.problems, Problem{File: p.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

func (p *parser) err() error {
	sort.SliceStable(p.problems, func(i, j int) bool { return p.problems[i].Line < p.problems[j].Line })
	return &ValidationError{File: p.file, Problems: p.problems}
}

var lineRE = regexp.MustCompile(`line (\d+)`)

// YAMLErrorLine is the line a yaml error names, or 0: the rules file's and
// the budgets file's parsers report a syntax error at it.
func YAMLErrorLine(err error) int {
	if m := lineRE.FindStringSubmatch(err.Error()); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n
	}
	return 0
}

func yamlErrMsg(err error) string {
	return strings.TrimPrefix(err.Error(), "yaml: ")
}

// mapping iterates over a mapping node's pairs, reporting keys not in
// allowed and duplicate keys. It returns false when n is not a mapping.
func (p *parser) mapping(n *yaml.Node, field string, allowed []string, fn func(key string, kn, vn *yaml.Node)) bool {
	if n.Kind == yaml.AliasNode {
		p.add(n.Line, field, "aliases are not supported")
		return false
	}
	if n.Kind != yaml.MappingNode {
		p.add(n.Line, field, "want a mapping, got %s", DescribeNode(n))
		return false
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := n.Content[i], n.Content[i+1]
		if kn.Kind != yaml.ScalarNode {
			p.add(kn.Line, field, "keys must be strings, got %s", DescribeNode(kn))
			continue
		}
		key := kn.Value
		sub := join(field, key)
		if first, dup := seen[key]; dup {
			p.add(kn.Line, sub, "duplicate key (first at line %d)", first)
			continue
		}
		seen[key] = kn.Line
		if allowed != nil && !slices.Contains(allowed, key) {
			p.add(kn.Line, sub, "unknown key %q (known: %s)", key, strings.Join(allowed, ", "))
			continue
		}
		if vn.Kind == yaml.AliasNode {
			p.add(vn.Line, sub, "aliases are not supported")
			continue
		}
		fn(key, kn, vn)
	}
	return true
}

func join(field, key string) string {
	if field == "" {
		return key
	}
	return field + "." + key
}

// DescribeNode names what a yaml node holds, for an error that says what
// a field got instead of what it wants.
func DescribeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "an unexpected node"
}

// str reads a scalar string.
func (p *parser) str(n *yaml.Node, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.add(n.Line, field, "want a string, got %s", DescribeNode(n))
		return "", false
	}
	return n.Value, true
}

// integer reads a whole number in [lo, hi].
func (p *parser) integer(n *yaml.Node, field string, lo, hi int64) (int64, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.add(n.Line, field, "want a whole number, got %s", DescribeNode(n))
		return 0, false
	}
	v, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(n.Value, 64)
		if ferr != nil || f != float64(int64(f)) {
			p.add(n.Line, field, "want a whole number, got %q", n.Value)
			return 0, false
		}
		v = int64(f)
	}
	if v < lo || v > hi {
		p.add(n.Line, field, "%d out of range [%d, %d]", v, lo, hi)
		return 0, false
	}
	return v, true
}

func (p *parser) boolean(n *yaml.Node, field string) (bool, bool) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!bool" {
		b, err := strconv.ParseBool(strings.ToLower(n.Value))
		if err == nil {
			return b, true
		}
	}
	p.add(n.Line, field, "want true or false, got %s", DescribeNode(n))
	return false, false
}

func (p *parser) quota(n *yaml.Node, field string) (bucket.Limit, string, bool) {
	s, ok := p.str(n, field)
	if !ok {
		return bucket.Limit{}, "", false
	}
	l, err := ParseQuota(s)
	if err != nil {
		p.add(n.Line, field, "%v", err)
		return bucket.Limit{}, "", false
	}
	return l, s, true
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$`)

var topKeys = []string{"version", "domain", "default_plan", "plan_key", "no_identity", "unknown_plan", "plans", "rules"}

func (p *parser) top(n *yaml.Node, s *Set) {
	p.emergencyLines = map[*Rule]int{}
	p.costLines = map[*Rule][]int{}
	p.ruleField = map[*Rule]string{}
	p.costKeyLines = map[*Rule]int{}
	p.mapping(n, "", topKeys, func(key string, kn, vn *yaml.Node) {
		switch key {
		case "version":
			if v, ok := p.str(vn, key); ok {
				if len(v) > 128 || strings.ContainsAny(v, "\n\r\t") {
					p.add(vn.Line, key, "version %q must be one line of at most 128 characters", v)
				} else {
					s.label = v
				}
			}
		case "domain":
			if v, ok := p.str(vn, key); ok {
				s.domain = v
			}
		case "default_plan":
			p.defaultPlanLine = vn.Line
			if v, ok := p.str(vn, key); ok {
				s.defaultPlan = v
			}
		case "plan_key":
			if v, ok := p.str(vn, key); ok {
				if v == "" {
					p.add(vn.Line, key, "must not be empty")
				} else {
					s.planKey = wellKnown(v)
				}
			}
		case "no_identity":
			p.noIdentityLine = vn.Line
			p.noIdentity(vn, s)
		case "unknown_plan":
			if v, ok := p.str(vn, key); ok {
				switch a := UnknownPlanAction(v); a {
				case UnknownPlanDefault, UnknownPlanDeny, UnknownPlanAllow:
					s.unknownPlan = a
				default:
					p.add(vn.Line, key, "unknown action %q (want default_plan, deny or allow)", v)
				}
			}
		case "plans":
			p.plans(vn, s)
		case "rules":
			p.rulesLine = kn.Line
			p.rules(vn, s)
		}
	})
}

func (p *parser) noIdentity(n *yaml.Node, s *Set) {
	action := func(vn *yaml.Node, field string) {
		if v, ok := p.str(vn, field); ok {
			switch a := IdentityAction(v); a {
			case DenyNoIdentity, DefaultPlanNoIdentity:
				s.noIdentity.Action = a
			default:
				p.add(vn.Line, field, "unknown action %q (want deny or default_plan)", v)
			}
		}
	}
	if n.Kind == yaml.ScalarNode {
		action(n, "no_identity")
		return
	}
	p.mapping(n, "no_identity", []string{"action", "status"}, func(key string, _, vn *yaml.Node) {
		switch key {
		case "action":
			action(vn, "no_identity.action")
		case "status":
			if v, ok := p.integer(vn, "no_identity.status", 400, 599); ok {
				s.noIdentity.Status = int(v)
			}
		}
	})
}

func (p *parser) plans(n *yaml.Node, s *Set) {
	if n.Kind == yaml.MappingNode && len(n.Content)/2 > MaxPlans {
		p.add(n.Line, "plans", "%d plans, more than the %d allowed", len(n.Content)/2, MaxPlans)
		return
	}
	p.mapping(n, "plans", nil, func(name string, kn, vn *yaml.Node) {
		field := "plans." + name
		if !nameRE.MatchString(name) {
			p.add(kn.Line, field, "plan name %q: use letters, digits, '_', '.', '-'", name)
			return
		}
		plan := &Plan{Name: name, Line: kn.Line}
		qn := vn
		if vn.Kind == yaml.MappingNode {
			qn = nil
			p.mapping(vn, field, []string{"limit", "description"}, func(key string, _, v *yaml.Node) {
				if key == "limit" {
					qn = v
				} else {
					p.str(v, field+"."+key)
				}
			})
			if qn == nil {
				p.add(vn.Line, field+".limit", "missing")
				return
			}
			field += ".limit"
		}
		l, q, ok := p.quota(qn, field)
		if !ok {
			return
		}
		plan.Limit, plan.Quota = l, q
		s.plans[name] = plan
		s.planOrder = append(s.planOrder, plan)
	})
}

var ruleKeys = []string{"name", "match", "limit", "subject", "cost", "costs", "scope", "on_unavailable", "shadow", "description"}

func (p *parser) rules(n *yaml.Node, s *Set) {
	if n.Kind != yaml.SequenceNode {
		p.add(n.Line, "rules", "want a list, got %s", DescribeNode(n))
		return
	}
	if len(n.Content) > MaxRules {
		p.add(n.Line, "rules", "%d rules, more than the %d allowed", len(n.Content), MaxRules)
		return
	}
	for i, rn := range n.Content {
		field := fmt.Sprintf("rules[%d]", i)
		r := &Rule{Line: rn.Line, DefaultCost: 1, Scope: ScopeGlobal, Failure: Failure{Policy: FailClosed}}
		hasName := false
		p.mapping(rn, field, ruleKeys, func(key string, _, vn *yaml.Node) {
			sub := field + "." + key
			switch key {
			case "name":
				if v, ok := p.str(vn, sub); ok {
					if !nameRE.MatchString(v) {
						p.add(vn.Line, sub, "rule name %q: use letters, digits, '_', '.', '-'", v)
					} else {
						r.Name, hasName = v, true
					}
				}
			case "description":
				p.str(vn, sub)
			case "match":
				p.match(vn, sub, r)
			case "limit":
				v, ok := p.str(vn, sub)
				if !ok {
					return
				}
				if v == "plan" {
					r.Source = FromPlan
					return
				}
				// A bad quota still marks the rule fixed, so that its error
				// is not followed by others about plans it never used.
				r.Source = Fixed
				l, err := ParseQuota(v)
				if err != nil {
					p.add(vn.Line, sub, "%v (or \"plan\" for the subject's plan)", err)
					return
				}
				r.Limit = l
			case "subject":
				p.subject(vn, sub, r)
			case "cost":
				p.costKeyLines[r] = vn.Line
				if v, ok := p.integer(vn, sub, 1, maxQuotaNumber); ok {
					r.DefaultCost = bucket.Tokens(v)
				}
			case "costs":
				p.costs(vn, sub, r)
			case "scope":
				if v, ok := p.str(vn, sub); ok {
					switch sc := Scope(v); sc {
					case ScopeGlobal, ScopeRegion, ScopeLocal:
						r.Scope = sc
					default:
						p.add(vn.Line, sub, "unknown scope %q (want global, region or local)", v)
					}
				}
			case "on_unavailable":
				p.failure(vn, sub, r)
			case "shadow":
				if v, ok := p.boolean(vn, sub); ok {
					r.Shadow = v
				}
			}
		})
		if rn.Kind != yaml.MappingNode {
			continue
		}
		if !hasName {
			if _, ok := findKey(rn, "name"); !ok {
				p.add(rn.Line, field+".name", "missing")
			}
			continue
		}
		if first, dup := s.byName[r.Name]; dup {
			p.add(rn.Line, field+".name", "duplicate rule name %q (first at line %d)", r.Name, first.Line)
			continue
		}
		s.byName[r.Name] = r
		s.rules = append(s.rules, r)
		p.ruleField[r] = field
	}
}

func findKey(n *yaml.Node, key string) (*yaml.Node, bool) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1], true
		}
	}
	return nil, false
}

func (p *parser) match(n *yaml.Node, field string, r *Rule) {
	if n.Kind == yaml.MappingNode && len(n.Content)/2 > MaxConditions {
		p.add(n.Line, field, "%d conditions, more than the %d allowed", len(n.Content)/2, MaxConditions)
		return
	}
	p.mapping(n, field, nil, func(key string, kn, vn *yaml.Node) {
		if key == "" {
			p.add(kn.Line, field, "empty descriptor key")
			return
		}
		pat := ""
		if !(vn.Kind == yaml.ScalarNode && vn.Tag == "!!null") {
			v, ok := p.str(vn, field+"."+key)
			if !ok {
				return
			}
			pat = v
		}
		r.Match = append(r.Match, Condition{Key: key, Pattern: pat})
	})
}

func (p *parser) subject(n *yaml.Node, field string, r *Rule) {
	if n.Kind == yaml.ScalarNode {
		switch n.Value {
		case "identity":
		case "shared":
			r.Shared = true
		default:
			p.add(n.Line, field, "unknown subject %q (want identity, shared, or a list of descriptor keys)", n.Value)
		}
		return
	}
	if n.Kind != yaml.SequenceNode {
		p.add(n.Line, field, "want identity, shared, or a list of descriptor keys; got %s", DescribeNode(n))
		return
	}
	if len(n.Content) == 0 {
		p.add(n.Line, field, "empty list of descriptor keys")
		return
	}
	if len(n.Content) > MaxConditions {
		p.add(n.Line, field, "%d descriptor keys, more than the %d allowed", len(n.Content), MaxConditions)
		return
	}
	for i, kn := range n.Content {
		if k, ok := p.str(kn, fmt.Sprintf("%s[%d]", field, i)); ok {
			if k == "" {
				p.add(kn.Line, fmt.Sprintf("%s[%d]", field, i), "empty descriptor key")
				continue
			}
			r.SubjectKeys = append(r.SubjectKeys, wellKnown(k))
		}
	}
}

func (p *parser) costs(n *yaml.Node, field string, r *Rule) {
	if n.Kind != yaml.SequenceNode {
		p.add(n.Line, field, "want a list, got %s", DescribeNode(n))
		return
	}
	if len(n.Content) > MaxConditions {
		p.add(n.Line, field, "%d entries, more than the %d allowed", len(n.Content), MaxConditions)
		return
	}
	for i, cn := range n.Content {
		sub := fmt.Sprintf("%s[%d]", field, i)
		c := Cost{}
		hasCost := false
		ok := p.mapping(cn, sub, []string{"method", "path", "cost"}, func(key string, _, vn *yaml.Node) {
			switch key {
			case "method":
				if v, ok := p.str(vn, sub+".method"); ok {
					c.Method = strings.ToUpper(v)
				}
			case "path":
				if v, ok := p.str(vn, sub+".path"); ok {
					c.Path = v
				}
			case "cost":
				if v, ok := p.integer(vn, sub+".cost", 1, maxQuotaNumber); ok {
					c.Cost, hasCost = bucket.Tokens(v), true
				}
			}
		})
		if !ok {
			continue
		}
		if c.Method == "" && c.Path == "" {
			p.add(cn.Line, sub, "needs a method or a path")
			continue
		}
		if !hasCost {
			if _, present := findKey(cn, "cost"); !present {
				p.add(cn.Line, sub+".cost", "missing")
			}
			continue
		}
		r.Costs = append(r.Costs, c)
		p.costLines[r] = append(p.costLines[r], cn.Line)
	}
}

func (p *parser) failure(n *yaml.Node, field string, r *Rule) {
	policy := func(vn *yaml.Node, f string) {
		if v, ok := p.str(vn, f); ok {
			switch pol := FailurePolicy(v); pol {
			case FailClosed, FailOpen, Emergency:
				r.Failure.Policy = pol
			default:
				p.add(vn.Line, f, "unknown policy %q (want fail_closed, fail_open or emergency)", v)
			}
		}
	}
	if n.Kind == yaml.ScalarNode {
		policy(n, field)
		return
	}
	var limitNode *yaml.Node
	p.mapping(n, field, []string{"policy", "limit"}, func(key string, _, vn *yaml.Node) {
		switch key {
		case "policy":
			policy(vn, field+".policy")
		case "limit":
			limitNode = vn
		}
	})
	if limitNode != nil {
		if r.Failure.Policy != Emergency {
			p.add(limitNode.Line, field+".limit", "a limit applies only to policy emergency, not %s", r.Failure.Policy)
			return
		}
		if l, _, ok := p.quota(limitNode, field+".limit"); ok {
			r.Failure.Limit = l
			p.emergencyLines[r] = limitNode.Line
		}
	}
}
