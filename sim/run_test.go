package sim

import (
	"encoding/json"
	"testing"
)

func TestTry(t *testing.T) {
	sc, err := LoadScenario("scenarios/01-steady-skewed.yaml")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(sc, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range res.Systems {
		s.AdmittedRate = nil
		s.Overshoot = nil
		b, _ := json.Marshal(s)
		t.Logf("%s", b)
	}
	t.Logf("arrivals=%d decisions=%d events=%d verdict=%s", res.Arrivals, res.Decisions, res.Events, res.Verdict)
}
