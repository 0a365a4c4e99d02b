package main

import (
	"context"
	"flag"
	"log/slog"
	"time"

	"github.com/allot-dev/allot/agent"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/rules"
)

// decisionLogFlags are the flags of the sampled decision log (off unless
// -decision-log names a file).
type decisionLogFlags struct {
	path     string
	sample   float64
	maxBytes int64
}

func (d *decisionLogFlags) register(fs *flag.FlagSet) {
	def := agent.DefaultDecisionLogConfig()
	fs.StringVar(&d.path, "decision-log", "", "write a sampled log of decisions to this file (JSONL: time, region, budget, subject hash, cost; replayed by sim; off when empty)")
	fs.Float64Var(&d.sample, "decision-log-sample", def.Sample, "fraction of decisions the decision log records, in (0, 1]")
	fs.Int64Var(&d.maxBytes, "decision-log-max-bytes", def.MaxBytes, "size at which the decision log moves to <file>.1 and starts again (at most twice this on disk)")
}

// wrap returns st logging its decisions when -decision-log is set, and a
// function that flushes and closes the log. The log is flushed every
// second until ctx ends.
func (d *decisionLogFlags) wrap(ctx context.Context, st bucket.Store, src rules.Source, region string, log *slog.Logger) (bucket.Store, func(), error) {
	if d.path == "" {
		return st, func() {}, nil
	}
	cfg := agent.DefaultDecisionLogConfig()
	cfg.Path, cfg.Sample, cfg.MaxBytes, cfg.Region = d.path, d.sample, d.maxBytes, region
	dl, err := agent.OpenDecisionLog(cfg)
	if err != nil {
		return nil, nil, err
	}
	done := make(chan struct{})
	go func() {
		tk := time.NewTicker(time.Second)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-done:
				return
			case <-tk.C:
				if err := dl.Flush(); err != nil {
					log.Error("agent: decision log stopped", "err", err)
					return
				}
			}
		}
	}()
	log.Info("agent: decision log", "path", d.path, "sample", d.sample, "max_bytes", d.maxBytes)
	return agent.LogDecisions(st, dl, src), func() {
		close(done)
		if err := dl.Close(); err != nil {
			log.Error("agent: decision log", "err", err)
		}
	}, nil
}
