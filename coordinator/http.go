package coordinator

import (
	"encoding/json"
	"html/template"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
)

// Status is a snapshot of a Server for the status page.
type Status struct {
	// Auth is how regions prove who they are (Server.AuthMode).
	Auth     string
	Leading  bool
	Term     uint64
	Leader   string
	Learning bool
	// First is set under the first leader that ever served the regions
	// (RunElection's etcd record, LedKey): keys' stored reserves started
	// full.
	First    bool
	Now      time.Time
	Regions  []RegionView
	Budgets  []lease.BudgetTotals
	Keys     []lease.KeyStatus
	MoreKeys bool
}

// RegionView is one region on the status page.
type RegionView struct {
	lease.RegionStatus
	Connected bool
	// Authenticated is set when the region's stream proved its region.
	Authenticated bool
	LeaseLeft     time.Duration
}

// Status reports the Server's state, with up to maxKeys hot keys.
func (s *Server) Status(maxKeys int) Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Clock.Now()
	st := Status{Auth: s.AuthMode(), Leading: s.alloc != nil, Term: s.term, Leader: s.leader, Now: now}
	if s.alloc == nil {
		return st
	}
	st.Learning = s.alloc.Learning(now)
	st.First = s.alloc.First()
	for _, r := range s.alloc.Regions() {
		c := s.streams[r.Region]
		v := RegionView{RegionStatus: r, Connected: c != nil, Authenticated: c != nil && c.authed}
		if r.LeaseEnd.After(now) {
			v.LeaseLeft = r.LeaseEnd.Sub(now).Round(time.Millisecond)
		}
		st.Regions = append(st.Regions, v)
	}
	st.Budgets = s.alloc.Totals()
	st.Keys = s.alloc.Keys(maxKeys + 1)
	if len(st.Keys) > maxKeys {
		st.Keys, st.MoreKeys = st.Keys[:maxKeys], true
	}
	return st
}

// Handler serves /healthz, /readyz, /metrics (with reg's metrics; nil
// registers a Collector for s on a new registry), /status (HTML) and
// /status.json.
func (s *Server) Handler(reg *prometheus.Registry) http.Handler {
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(NewCollector(s))
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		// Ready: leading, or following a known leader regions can be sent to.
		leading, _ := s.Leading()
		if !leading && s.Leader() == "" {
			http.Error(w, "no leader known\n", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/status.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.Status(1000))
	})
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_ = statusPage.Execute(w, s.Status(200))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		http.Redirect(w, r, "/status", http.StatusFound)
	})
	return mux
}

var statusPage = template.Must(template.New("status").Funcs(template.FuncMap{
	// bar is the width in pixels of an allocation of c out of budget b.
	"bar": func(c bucket.Tokens, b lease.Budget) int64 {
		if b.Limit.Count() <= 0 {
			return 0
		}
		return int64(200 * c / b.Limit.Count())
	},
}).Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>allot coordinator</title>
<meta http-equiv="refresh" content="2">
<style>
body{font:14px system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3} td.l,th.l{text-align:left}
.bar{display:inline-block;height:10px;background:#4a7;vertical-align:middle}
.warn{color:#a40}
</style></head><body>
<h1>allot coordinator</h1>
<p>Region authentication: {{if eq .Auth "insecure"}}<span class="warn">insecure — regions are accepted by name alone</span>{{else}}{{.Auth}}{{end}}.</p>
{{if .Leading}}<p>Leader, term {{.Term}}{{if .First}} (the first leader: reserves started full){{end}}{{if .Learning}} — <span class="warn">learning: {{if .First}}no region raised above its share of a static split yet{{else}}no increases yet{{end}}</span>{{end}}.</p>
{{else}}<p>Following; leader: {{if .Leader}}{{.Leader}}{{else}}<span class="warn">unknown</span>{{end}}.</p>{{end}}
{{if .Leading}}
<h2>Regions</h2>
<table><tr><th class="l">region</th><th>stream</th><th>lease left</th><th>version</th><th>acked</th><th>renewal</th></tr>
{{range .Regions}}<tr><td class="l">{{.Region}}</td><td>{{if .Connected}}open{{if not .Authenticated}} <span class="warn">(unauthenticated)</span>{{end}}{{else}}—{{end}}</td><td>{{.LeaseLeft}}</td>
<td>{{.Version}}</td><td>{{.Acked}}</td><td>{{if not .Known}}—{{else if .Blocked}}<span class="warn">withheld</span>{{else}}ok{{end}}</td></tr>{{end}}
</table>
<h2>Budgets</h2>
<table><tr><th class="l">budget</th><th>hot keys</th><th>escrow headroom</th><th class="l">allocation per region (Σ over hot keys)</th></tr>
{{range .Budgets}}<tr><td class="l">{{.Rule}}</td><td>{{.HotKeys}}</td><td>{{.Headroom}}</td><td class="l">{{$b := .}}{{range $i, $r := .Regions}}{{$r}}={{index $b.Counts $i}} {{end}}</td></tr>{{end}}
</table>
<h2>Hot keys</h2>
<table><tr><th class="l">key</th><th>budget</th><th>escrow</th><th class="l">allocation per region (want; claim)</th></tr>
{{range .Keys}}{{$k := .}}<tr><td class="l">{{.Key.Rule}}/{{.Key.Subject}}</td><td>{{.Budget.Limit}}</td><td>{{.Escrow}}</td>
<td class="l">{{range $i, $r := .Regions}}{{$c := index $k.Counts $i}}{{$r}} {{$c}} ({{index $k.Wants $i}}; {{index $k.Claims $i}})
<span class="bar" style="width:{{bar $c $k.Budget}}px"></span> {{end}}</td></tr>{{end}}
</table>{{if .MoreKeys}}<p>… more keys not shown.</p>{{end}}
{{end}}
</body></html>
`))
