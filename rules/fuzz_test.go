package rules

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the parser: it must not panic, and
// every rejection must be a *ValidationError whose problems name the file
// and say where (a line or a field) the problem is.
func FuzzParse(f *testing.F) {
	seed, err := os.ReadFile("testdata/example.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte(""))
	f.Add([]byte("rules: [{name: a, limit: plan}]\nplans: {x: '1/s'}\ndefault_plan: x"))
	f.Add([]byte("rules:\n - name: a\n   limit: '5 per minute, burst 2'\n   costs: [{path: /x*, cost: 3}]"))
	f.Add([]byte("a: &x [*x]"))
	f.Add([]byte("rules:\n  - {name: a, match: {k: 'v*'}, limit: '1/s'}\n  - {name: b, match: {k: 'vv'}, limit: '1/s'}"))
	f.Add([]byte("no_identity: default_plan\nunknown_plan: allow\nrules: [{name: a, subject: [k], limit: '1/d'}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(data, "fuzz.yaml")
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) || !errors.Is(err, ErrInvalid) || len(ve.Problems) == 0 {
				t.Fatalf("error %v is not a *ValidationError with problems", err)
			}
			for _, p := range ve.Problems {
				if p.File != "fuzz.yaml" || (p.Line == 0 && p.Field == "" && !strings.Contains(p.Msg, "empty") && !strings.Contains(p.Msg, "bytes")) {
					t.Fatalf("problem %q does not say where it is", p.String())
				}
			}
			return
		}
		// A valid set is usable: every rule's costs fit some limit, and
		// matching and budgets work on any descriptor.
		for _, r := range s.Rules() {
			if r.Name == "" {
				t.Fatal("rule without a name")
			}
			res := s.LimitFor(r, "")
			if !res.Limit.IsZero() {
				if err := res.Limit.Validate(); err != nil {
					t.Fatalf("rule %s: %v", r.Name, err)
				}
			}
		}
		_ = s.Budgets()
		s.Match(Descriptor{{KeyPath, "/x"}, {KeyMethod, "GET"}})
	})
}

// FuzzParseQuota checks that any quota string either parses to a valid limit
// or is rejected with an error that quotes it.
func FuzzParseQuota(f *testing.F) {
	for _, s := range []string{"10 per minute", "100 per second, burst 300", "5/s", "0 per s", "1 per 0 s", "9 per 99999999 days"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseQuota(s)
		if err != nil {
			if !strings.Contains(err.Error(), "quota "+quoted(s)) {
				t.Fatalf("error %q does not quote the input %q", err, s)
			}
			return
		}
		if err := l.Validate(); err != nil {
			t.Fatalf("ParseQuota(%q) = %v, invalid: %v", s, l, err)
		}
	})
}

// FuzzDescriptor matches arbitrary descriptor values against the example
// rules and builds subjects from them: no panic, and a composite subject
// keeps distinct values distinct.
func FuzzDescriptor(f *testing.F) {
	s, err := Load("testdata/example.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add("/report", "GET", "1.2.3.4", "a&b=c")
	f.Add("", "", "", "")
	f.Add("/items/%26", "delete", "x=y", "%3D")
	f.Fuzz(func(t *testing.T, path, method, ip, other string) {
		d := Descriptor{{KeyPath, path}, {KeyMethod, method}, {"client_ip", ip}, {"endpoint", "login"}}
		if r, ok := s.Match(d); ok && r.CostOf(d) <= 0 {
			t.Fatalf("cost %d for %s", r.CostOf(d), d)
		}
		r := &Rule{SubjectKeys: []string{"a", "b"}}
		s1, ok1 := r.SubjectOf(Descriptor{{"a", ip}, {"b", other}}, "")
		s2, ok2 := r.SubjectOf(Descriptor{{"a", ip + "&b=" + other}, {"b", other}}, "")
		if ok1 && ok2 && s1 == s2 {
			t.Fatalf("distinct descriptors share subject %q", s1)
		}
	})
}

func quoted(s string) string { return strconv.Quote(s) }
