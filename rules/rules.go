// Package rules holds allot's quota rules: the plans (tiers) that a business
// sells, and the rules that select, for each request, one budget to charge.
//
// A rules file is YAML that an operator can read:
//
//	version: "2026-11-30"
//	default_plan: free
//	no_identity: {action: deny, status: 401}
//	unknown_plan: default_plan
//	plans:
//	  free: "10 per minute"
//	  pro: "100 per second, burst 300"
//	rules:
//	  - name: api
//	    match: {path: "/api/*"}
//	    limit: plan
//	    costs:
//	      - {path: /api/report, cost: 5}
//	      - {method: POST, path: /api/export, cost: 50}
//	    scope: global
//	    on_unavailable: {policy: emergency, limit: "5 per second, burst 60"}
//
// A request is described by a Descriptor, an ordered list of key/value
// entries (the shape Envoy's rate limit service uses): identity, plan, path,
// method and anything derived from headers. The first rule, in file order,
// whose every match condition holds for the descriptor is the request's rule;
// a rule may also be named directly. A rule's budget is either the subject's
// plan ("limit: plan") or a fixed quota, and is kept per subject: the
// request's identity, values taken from the descriptor, or one bucket shared
// by all.
//
// Every limit in a Set is a global budget. The rule's scope says where it is
// enforced (split across regions, per region, or per process) and its
// failure policy what to do when the store that enforces it is unavailable.
// A later control plane reads Budgets to split the global ones across
// regions; Parse takes bytes so rules can come from etcd as well as a file.
//
// A Set is immutable once parsed and safe for concurrent use. Reloader and
// FileWatcher swap Sets on reload and keep the last good one when a new
// version is rejected.
package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"sort"
	"strings"
	"unsafe"

	"github.com/allot-dev/allot/bucket"
)

// Well-known descriptor keys. The HTTP middleware fills them from the request;
// cost tables and the plan lookup read them.
const (
	KeyPath    = "path"
	KeyMethod  = "method"
	KeyPlan    = "plan"
	KeySubject = "subject"
)

// wellKnown returns k as this package's constant when it is one of the
// well-known keys: a key parsed from a file is a string of its own, and a
// transport names the entries it fills in by the constants, so that
// comparing the two finds the same bytes at the same address and reads
// none of them.
func wellKnown(k string) string {
	switch k {
	case KeyPath:
		return KeyPath
	case KeyMethod:
		return KeyMethod
	case KeyPlan:
		return KeyPlan
	case KeySubject:
		return KeySubject
	}
	return k
}

// Subject values the limiter uses when a rule's budget is not per identity.
const (
	// SharedSubject is the one bucket of a rule with "subject: shared".
	SharedSubject = "*"
	// AnonymousSubject is the bucket shared by requests without identity when
	// no_identity is default_plan.
	AnonymousSubject = "anonymous"
	// UnknownPlanPrefix starts the subject of a request whose plan is unknown
	// and is charged the default plan's quota: its own bucket, apart from the
	// subject's bucket under a known plan.
	UnknownPlanPrefix = "unknown-plan/"
)

// Scope says where a rule's budget is enforced.
type Scope string

const (
	// ScopeGlobal: one budget worldwide, split across regions by the control
	// plane. The default.
	ScopeGlobal Scope = "global"
	// ScopeRegion: the full budget in each region, exact within the region.
	ScopeRegion Scope = "region"
	// ScopeLocal: the full budget in each process, never shared.
	ScopeLocal Scope = "local"
)

// FailurePolicy is what a rule does when its store is unavailable.
type FailurePolicy string

const (
	// FailClosed denies (HTTP 503). The default: it never overshoots.
	FailClosed FailurePolicy = "fail_closed"
	// FailOpen admits and counts each admission; overshoot is unbounded and
	// reported as such.
	FailOpen FailurePolicy = "fail_open"
	// Emergency enforces a limit in process until the store is back.
	Emergency FailurePolicy = "emergency"
)

// LimitSource says where a rule's limit comes from.
type LimitSource int

const (
	// FromPlan: the subject's plan.
	FromPlan LimitSource = iota
	// Fixed: the rule's own quota, the same for every subject.
	Fixed
)

// IdentityAction is what happens to a request without identity.
type IdentityAction string

const (
	// DenyNoIdentity rejects it with NoIdentity.Status.
	DenyNoIdentity IdentityAction = "deny"
	// DefaultPlanNoIdentity charges it to one shared anonymous bucket under
	// the default plan.
	DefaultPlanNoIdentity IdentityAction = "default_plan"
)

// UnknownPlanAction is what happens to a request whose plan is not in the
// file. None of them is unlimited by accident: "allow" must be written.
type UnknownPlanAction string

const (
	// UnknownPlanDefault charges the default plan's quota in a bucket of its
	// own. The default.
	UnknownPlanDefault UnknownPlanAction = "default_plan"
	// UnknownPlanDeny rejects the request.
	UnknownPlanDeny UnknownPlanAction = "deny"
	// UnknownPlanAllow admits the request without charging any bucket.
	UnknownPlanAllow UnknownPlanAction = "allow"
)

// Plan is a tier with its quota.
type Plan struct {
	Name  string
	Limit bucket.Limit
	// Quota is the quota as written in the file, for logs and docs.
	Quota string
	Line  int

	// res is the Resolution of a plan rule under this plan, set when the
	// plan's Set is parsed.
	res Resolution
}

// NoIdentity is the handling of requests without identity.
type NoIdentity struct {
	Action IdentityAction
	// Status is the HTTP status of a denial; 401 unless set.
	Status int
}

// Condition is one match condition on a descriptor entry. Pattern "*" (or
// empty) requires only that the key be present, a pattern ending in "*"
// matches by prefix, anything else matches exactly.
type Condition struct {
	Key     string
	Pattern string
}

// Holds reports whether the descriptor satisfies the condition.
func (c Condition) Holds(d Descriptor) bool {
	v, ok := d.Get(c.Key)
	if !ok {
		return false
	}
	return matchPattern(c.Pattern, v)
}

// matcher is a Condition compiled when its set is parsed: what
// matchPattern works out from the pattern on every call (any value, a
// prefix, an exact value) is worked out once.
type matcher struct {
	key  string
	kind matchKind
	// lit is the exact value, or the prefix without its "*".
	lit string
}

type matchKind uint8

const (
	matchAny matchKind = iota
	matchPrefix
	matchExact
)

// compile returns c's matcher.
func (c Condition) compile() matcher {
	key := wellKnown(c.Key)
	switch {
	case c.Pattern == "" || c.Pattern == "*":
		return matcher{key: key, kind: matchAny}
	case strings.HasSuffix(c.Pattern, "*"):
		return matcher{key: key, kind: matchPrefix, lit: c.Pattern[:len(c.Pattern)-1]}
	default:
		return matcher{key: key, kind: matchExact, lit: c.Pattern}
	}
}

func matchPattern(pattern, v string) bool {
	switch {
	case pattern == "" || pattern == "*":
		return true
	case strings.HasSuffix(pattern, "*"):
		return strings.HasPrefix(v, pattern[:len(pattern)-1])
	default:
		return v == pattern
	}
}

// covers reports whether every value matched by q is matched by p.
func covers(p, q string) bool {
	switch {
	case p == "" || p == "*":
		return true
	case q == "" || q == "*":
		return false
	case strings.HasSuffix(p, "*"):
		prefix := p[:len(p)-1]
		if strings.HasSuffix(q, "*") {
			return strings.HasPrefix(q[:len(q)-1], prefix)
		}
		return strings.HasPrefix(q, prefix)
	default:
		return p == q
	}
}

// Cost is one entry of a rule's cost table. Empty Path or Method matches
// any; Path may end in "*" to match a prefix.
type Cost struct {
	Method string
	Path   string
	Cost   bucket.Tokens
}

// Failure is a rule's failure policy.
type Failure struct {
	Policy FailurePolicy
	// Limit is the emergency limit per bucket; zero means the rule's normal
	// limit for that bucket. The limiter may divide it further (by the
	// number of live processes in a region).
	Limit bucket.Limit
}

// Rule selects a budget for the requests it matches.
type Rule struct {
	Name  string
	Match []Condition
	// Source says whether Limit or the subject's plan applies.
	Source LimitSource
	// Limit is the fixed quota when Source is Fixed.
	Limit bucket.Limit
	// SubjectKeys are the descriptor keys whose values form the subject;
	// empty means the request's identity.
	SubjectKeys []string
	// Shared puts every request of the rule in one bucket.
	Shared bool
	// DefaultCost is charged when no Costs entry applies.
	DefaultCost bucket.Tokens
	Costs       []Cost
	Scope       Scope
	Failure     Failure
	// Shadow rules decide, count and log as usual, and never reject.
	Shadow bool
	Line   int

	// compiled is set when the rule's Set is parsed, with Match compiled
	// into matchers: a Rule made otherwise (a literal) matches by Match.
	compiled bool
	matchers []matcher
	// fixed is a fixed rule's Resolution, set with compiled.
	fixed Resolution
	// byIdentity, set with compiled, is that the rule's subject is the
	// request's identity: neither shared nor named by subject keys.
	byIdentity bool
}

// compile compiles r's conditions into matchers and resolves its limit
// when it is fixed.
func (r *Rule) compile() {
	r.matchers = make([]matcher, len(r.Match))
	for i, c := range r.Match {
		r.matchers[i] = c.compile()
	}
	if r.Source == Fixed {
		r.fixed = Resolution{Limit: r.Limit}
	}
	r.byIdentity = !r.Shared && len(r.SubjectKeys) == 0
	r.compiled = true
}

// Matches reports whether every condition of r holds for d.
func (r *Rule) Matches(d Descriptor) bool {
	if r.compiled {
		// Condition.Holds on each compiled condition, written out here:
		// a call per condition was a fifth of a match's cost.
		for i := range r.matchers {
			m := &r.matchers[i]
			v, ok := d.Get(m.key)
			switch {
			case !ok:
				return false
			case m.kind == matchAny:
			case m.kind == matchPrefix:
				if len(v) < len(m.lit) || !SameString(v[:len(m.lit)], m.lit) {
					return false
				}
			default:
				if !SameString(v, m.lit) {
					return false
				}
			}
		}
		return true
	}
	for _, c := range r.Match {
		if !c.Holds(d) {
			return false
		}
	}
	return true
}

// CostOf returns the cost of a request described by d: the first cost table
// entry whose method and path match, else the rule's default cost.
func (r *Rule) CostOf(d Descriptor) bucket.Tokens {
	// Small enough to be inlined for a rule without a cost table, the
	// common case, which then costs no call.
	if len(r.Costs) == 0 {
		return r.DefaultCost
	}
	return r.costOf(d)
}

// costOf is CostOf on a rule with a cost table.
func (r *Rule) costOf(d Descriptor) bucket.Tokens {
	method, _ := d.Get(KeyMethod)
	path, _ := d.Get(KeyPath)
	for _, c := range r.Costs {
		if c.Method != "" && !strings.EqualFold(c.Method, method) {
			continue
		}
		if c.Path != "" && !matchPattern(c.Path, path) {
			continue
		}
		return c.Cost
	}
	return r.DefaultCost
}

// MaxCost is the largest cost the rule can charge.
func (r *Rule) MaxCost() bucket.Tokens {
	m := r.DefaultCost
	for _, c := range r.Costs {
		m = max(m, c.Cost)
	}
	return m
}

// SubjectOf returns the bucket subject of a request: SharedSubject for a
// shared rule, the escaped values of SubjectKeys when the rule names keys,
// else identity. ok is false when the request has no identity: identity is
// empty, or a subject key is missing or empty.
func (r *Rule) SubjectOf(d Descriptor, identity string) (subject string, ok bool) {
	// Small enough to be inlined for a parsed rule whose subject is the
	// identity, the common case, which then costs no call.
	if r.byIdentity {
		return identity, identity != ""
	}
	return r.subjectOf(d, identity)
}

// subjectOf is SubjectOf without the shortcut of a parsed rule.
func (r *Rule) subjectOf(d Descriptor, identity string) (subject string, ok bool) {
	if r.Shared {
		return SharedSubject, true
	}
	if len(r.SubjectKeys) == 0 {
		return identity, identity != ""
	}
	var b strings.Builder
	for i, k := range r.SubjectKeys {
		v, found := d.Get(k)
		if !found || v == "" {
			return "", false
		}
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(escape(k))
		b.WriteByte('=')
		b.WriteString(escape(v))
	}
	return b.String(), true
}

var subjectEscaper = strings.NewReplacer("%", "%25", "&", "%26", "=", "%3D")

// escape makes '&', '=' and '%' unambiguous in a composite subject.
func escape(s string) string {
	if !strings.ContainsAny(s, "&=%") {
		return s
	}
	return subjectEscaper.Replace(s)
}

// Set is one parsed, validated rules file. It is immutable.
type Set struct {
	label       string
	version     string
	digest      string
	source      string
	domain      string
	defaultPlan string
	planKey     string
	noIdentity  NoIdentity
	unknownPlan UnknownPlanAction
	plans       map[string]*Plan
	planOrder   []*Plan
	// defaultRes is the Resolution of a plan rule on the default plan,
	// found once the set is parsed; nil when the set has no default plan.
	defaultRes *Resolution
	rules      []*Rule
	byName     map[string]*Rule
}

// Version names this set in logs and metrics: the file's version label when
// it has one, else "sha256:" and the first 12 hex digits of its digest.
func (s *Set) Version() string { return s.version }

// Digest is the hex SHA-256 of the bytes the set was parsed from.
func (s *Set) Digest() string { return s.digest }

// Source is the file name or other origin the set was parsed from.
func (s *Set) Source() string { return s.source }

// Domain is the Envoy rate limit domain the set answers; empty for any.
func (s *Set) Domain() string { return s.domain }

// DefaultPlan returns the default plan; nil when the file has no plans.
func (s *Set) DefaultPlan() *Plan { return s.plans[s.defaultPlan] }

// PlanKey is the descriptor key that carries a request's plan.
func (s *Set) PlanKey() string { return s.planKey }

// NoIdentity is the handling of requests without identity.
func (s *Set) NoIdentity() NoIdentity { return s.noIdentity }

// UnknownPlan is the handling of requests whose plan is not in the set.
func (s *Set) UnknownPlan() UnknownPlanAction { return s.unknownPlan }

// Plan returns the plan called name.
func (s *Set) Plan(name string) (*Plan, bool) {
	p, ok := s.plans[name]
	return p, ok
}

// Plans returns every plan in file order. The plans belong to the set and
// must not be modified.
func (s *Set) Plans() []*Plan { return append([]*Plan(nil), s.planOrder...) }

// Rules returns every rule in file order, the order they are matched in.
// The rules belong to the set and must not be modified.
func (s *Set) Rules() []*Rule { return append([]*Rule(nil), s.rules...) }

// Rule returns the rule called name.
func (s *Set) Rule(name string) (*Rule, bool) {
	r, ok := s.byName[name]
	return r, ok
}

// Match returns the first rule that matches d.
func (s *Set) Match(d Descriptor) (*Rule, bool) {
	for _, r := range s.rules {
		if r.Matches(d) {
			return r, true
		}
	}
	return nil, false
}

// Current returns s itself, so a fixed Set is a Source.
func (s *Set) Current() *Set { return s }

// RuleBudget is one budget the set defines: a fixed rule's, or a plan
// rule's under one plan. Every bucket key the edge charges under the rule
// at this limit belongs to it. A control plane splits the budgets of global
// scope across regions (lease.Budget, named Name); the others are enforced
// whole in each region or process.
type RuleBudget struct {
	// Name names the budget: the rule's name for a fixed rule, else
	// BudgetName(rule, the first of Plans).
	Name string
	Rule string
	// Plans are the plans charged to this budget, in plan order; empty for
	// a fixed rule. Plans with equal limits share one budget: the edge
	// charges a plan rule's key {rule, subject} at the plan's limit, so it
	// cannot tell such plans apart, and neither may the budgets.
	Plans  []string
	Limit  bucket.Limit
	Scope  Scope
	Shared bool
	// Failure is the rule's failure policy.
	Failure Failure
}

// Global reports whether the budget is split across regions (scope
// global, the default).
func (b RuleBudget) Global() bool { return b.Scope == ScopeGlobal || b.Scope == "" }

// BudgetName names the budget of a plan rule under one plan: "rule/plan".
// A fixed rule's budget is named after the rule alone.
func BudgetName(rule, plan string) string { return rule + "/" + plan }

// Budgets lists every budget of the set, in rule order, then plan order:
// one per fixed rule, one per distinct limit among the plans of a plan
// rule. It is the one enumeration of a set's budgets: the edge's key
// naming, the agents' and the coordinator's lease budgets and the check
// commands all read it.
func (s *Set) Budgets() []RuleBudget {
	var out []RuleBudget
	for _, r := range s.rules {
		b := RuleBudget{Name: r.Name, Rule: r.Name, Limit: r.Limit, Scope: r.Scope, Shared: r.Shared, Failure: r.Failure}
		if r.Source == Fixed {
			out = append(out, b)
			continue
		}
		first := len(out)
		for _, p := range s.planOrder {
			if i := slices.IndexFunc(out[first:], func(o RuleBudget) bool { return o.Limit == p.Limit }); i >= 0 {
				out[first+i].Plans = append(out[first+i].Plans, p.Name)
				continue
			}
			b.Name, b.Plans, b.Limit = BudgetName(r.Name, p.Name), []string{p.Name}, p.Limit
			out = append(out, b)
		}
	}
	return out
}

// Resolution is the limit a request gets under a rule, and why.
type Resolution struct {
	Limit bucket.Limit
	// Plan is the plan whose quota applies; empty for a fixed rule.
	Plan string
	// Unknown is set when the requested plan is not in the set; Action then
	// says what to do.
	Unknown bool
	Action  UnknownPlanAction
}

// LimitFor resolves the limit of rule r for a subject on plan (empty means
// the default plan).
func (s *Set) LimitFor(r *Rule, plan string) Resolution {
	if r.Source == Fixed {
		return Resolution{Limit: r.Limit}
	}
	return *s.Resolve(r, plan)
}

// Resolve is LimitFor without copying the Resolution, which a decision
// reads a few fields of: for a rule of the set and a plan in it (or the
// default), the Resolution belongs to the set and must not be modified; for
// a plan not in the set it is new.
func (s *Set) Resolve(r *Rule, plan string) *Resolution {
	// Small enough to be inlined for a plan rule on the default plan, the
	// common case, which then costs no call.
	if plan == "" && s.defaultRes != nil && r.Source != Fixed {
		return s.defaultRes
	}
	return s.resolve(r, plan)
}

// resolve is Resolve past its shortcut.
func (s *Set) resolve(r *Rule, plan string) *Resolution {
	if r.Source == Fixed {
		if r.compiled {
			return &r.fixed
		}
		return &Resolution{Limit: r.Limit}
	}
	if plan == "" {
		// Resolve has answered for a default plan in the set.
		plan = s.defaultPlan
	}
	if len(s.planOrder) <= maxScannedPlans {
		// A few names compared cost less than hashing one.
		for _, p := range s.planOrder {
			if p.Name == plan {
				return &p.res
			}
		}
	} else if p, ok := s.plans[plan]; ok {
		return &p.res
	}
	res := s.unknown(plan)
	return &res
}

// maxScannedPlans is the most plans LimitFor finds by comparing names in
// turn rather than by the plans' map.
const maxScannedPlans = 8

// unknown is the Resolution of a plan rule for a plan not in s.
func (s *Set) unknown(plan string) Resolution {
	res := Resolution{Unknown: true, Action: s.unknownPlan, Plan: plan}
	if s.unknownPlan == UnknownPlanDefault {
		if d := s.DefaultPlan(); d != nil {
			res.Limit = d.Limit
		}
	}
	return res
}

// Source gives the current rules. Reloader and FileWatcher swap the Set they
// return on reload; a *Set is a Source that never changes.
type Source interface {
	Current() *Set
}

// Descriptor describes one request as ordered key/value entries.
type Descriptor []Entry

// Entry is one key/value pair of a Descriptor.
type Entry struct {
	Key   string
	Value string
}

// Get returns the value of the first entry with key k.
func (d Descriptor) Get(k string) (string, bool) {
	// By index: ranging over the entries by value copies each one. A key
	// at k's address (a well-known key, see wellKnown) is found without
	// the call that compares bytes.
	for i := range d {
		if e := &d[i]; SameString(e.Key, k) {
			return e.Value, true
		}
	}
	return "", false
}

// SameString is a == b, deciding the common cases without the call that
// compares bytes: a string at b's address (a well-known key, see
// wellKnown, or a rule's name passed on from the set that holds it),
// strings of one length that end differently ("path" and "plan"), and
// strings of one byte (the prefix "/"). Hot paths that compare keys and
// names the rules set handed out use it.
func SameString(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	// #nosec G103 -- the two addresses are compared, never dereferenced.
	if len(a) == 0 || unsafe.StringData(a) == unsafe.StringData(b) {
		return true
	}
	return a[len(a)-1] == b[len(b)-1] && (len(a) == 1 || a == b)
}

// String renders d as "k=v,k=v" for logs.
func (d Descriptor) String() string {
	var b strings.Builder
	for i, e := range d {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.Key)
		b.WriteByte('=')
		b.WriteString(e.Value)
	}
	return b.String()
}

func digestOf(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
