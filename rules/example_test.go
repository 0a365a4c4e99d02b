package rules_test

import (
	"fmt"

	"github.com/allot-dev/allot/rules"
)

func ExampleParse() {
	src := `
version: "2026-11-30"
default_plan: free
no_identity: {action: deny, status: 401}
unknown_plan: default_plan
plans:
  free: "10 per minute"
  pro: "100 per second, burst 300"
rules:
  - name: api
    match: {path: "/api/*"}
    limit: plan
    costs:
      - {path: /api/report, cost: 5}
      - {method: POST, path: /api/export, cost: 50}
    scope: global
    on_unavailable: {policy: emergency, limit: "5 per second, burst 60"}
`
	set, err := rules.Parse([]byte(src), "rules.yaml")
	if err != nil {
		fmt.Println(err)
		return
	}
	d := rules.Descriptor{{Key: rules.KeyPath, Value: "/api/export"}, {Key: rules.KeyMethod, Value: "POST"}}
	r, _ := set.Match(d)
	fmt.Println(set.Version(), r.Name, r.CostOf(d))
	for _, b := range set.Budgets() {
		fmt.Println(b.Name, rules.FormatQuota(b.Limit), b.Scope)
	}
	// Output:
	// 2026-11-30 api 50
	// api/free 10 per minute global
	// api/pro 100 per second, burst 300 global
}

func ExampleParse_problems() {
	_, err := rules.Parse([]byte(`
plans:
  free: "0 per minute"
rules:
  - name: api
    limit: "3 per minute"
    cost: 5
    colour: blue
`), "rules.yaml")
	fmt.Println(err)
	// Output:
	// rules: rules.yaml: 3 problem(s):
	//   rules.yaml:3: plans.free: quota "0 per minute": rate count=0 must be > 0
	//   rules.yaml:7: rules[0].cost: cost 5 exceeds the burst 3 of the rule's limit "3 per minute": it could never be admitted
	//   rules.yaml:8: rules[0].colour: unknown key "colour" (known: name, match, limit, subject, cost, costs, scope, on_unavailable, shadow, description)
}
