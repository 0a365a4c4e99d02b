package main

import (
	"path/filepath"
	"strings"

	"github.com/allot-dev/allot/agent"
)

// openDecisionLogs opens one sampled decision log per region, as each
// region's agents would write their own: decisions.jsonl becomes
// decisions-eu.jsonl, decisions-us.jsonl... The returned function closes
// them; with an empty path there are none.
func openDecisionLogs(path string, regions []string, sample float64) (map[string]*agent.DecisionLog, func() error, error) {
	logs := map[string]*agent.DecisionLog{}
	closeAll := func() error {
		var first error
		for _, l := range logs {
			if err := l.Close(); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	if path == "" {
		return logs, closeAll, nil
	}
	ext := filepath.Ext(path)
	base := strings.TrimSuffix(path, ext)
	for _, r := range regions {
		cfg := agent.DefaultDecisionLogConfig()
		cfg.Path, cfg.Sample, cfg.Region = base+"-"+r+ext, sample, r
		l, err := agent.OpenDecisionLog(cfg)
		if err != nil {
			_ = closeAll() // the open's error is the one to report
			return nil, nil, err
		}
		logs[r] = l
	}
	return logs, closeAll, nil
}
