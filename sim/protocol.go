package sim

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

// The lease plane checks, from outside the Speaker, the two promises of its
// Ready order that no overshoot measure sees: within one publication they
// are leaks below a bucket's burst (see "Protocol checks" in the design).
//
//   - Settled before published: every allocation a new table changes is
//     already the limit of the region's Redis bucket when the table is
//     published (the bucket was rebased to it, took its burst out, or is
//     full, which is the same under any limit). An agent deciding with a
//     table whose allocation its bucket does not have yet refills at the old
//     rate until its next request.
//   - Adopted before acknowledged: an acknowledgement leaves for the
//     coordinator only once every live agent of the region decides with a
//     table that carries the grant. The coordinator hands on what the
//     acknowledgement gives up at once.
//
// A broken promise is a protocol violation: the run FAILs and the first few
// are listed (Result.Violations).

// maxViolations is how many violations a run lists; it counts them all.
const maxViolations = 5

// grantRef names a grant within a leader's term.
type grantRef struct{ term, grant uint64 }

// violate records one protocol violation.
func (p *leasePlane) violate(format string, args ...any) {
	p.violations++
	if len(p.violationList) < maxViolations {
		p.violationList = append(p.violationList, fmt.Sprintf(format, args...))
	}
}

// tableKeys appends to ks the keys of a and b's entries, sorted, once
// each. The caller passes the last call's slice emptied, so that a check
// at every publication does not grow a list from nothing. A table's
// entries are sorted by key (region.Table), so the two lists are merged
// in one pass; were either not, they are sorted as they come.
func tableKeys(ks []bucket.Key, a, b *region.Table) []bucket.Key {
	var ea, eb []lease.Entry
	if a != nil {
		ea = a.Entries
	}
	if b != nil {
		eb = b.Entries
	}
	byKey := func(x, y lease.Entry) int { return compareKeys(x.Key, y.Key) }
	if !slices.IsSortedFunc(ea, byKey) || !slices.IsSortedFunc(eb, byKey) {
		for _, e := range ea {
			ks = append(ks, e.Key)
		}
		for _, e := range eb {
			ks = append(ks, e.Key)
		}
		slices.SortFunc(ks, compareKeys)
		return slices.Compact(ks)
	}
	for len(ea) > 0 || len(eb) > 0 {
		var k bucket.Key
		switch {
		case len(eb) == 0:
			k, ea = ea[0].Key, ea[1:]
		case len(ea) == 0:
			k, eb = eb[0].Key, eb[1:]
		default:
			c := compareKeys(ea[0].Key, eb[0].Key)
			if c <= 0 {
				k, ea = ea[0].Key, ea[1:]
			}
			if c >= 0 {
				k, eb = eb[0].Key, eb[1:]
			}
		}
		if n := len(ks); n == 0 || ks[n-1] != k {
			ks = append(ks, k)
		}
	}
	return ks
}

// compareKeys orders keys by rule, then subject, as a table's entries are.
func compareKeys(x, y bucket.Key) int {
	return cmp.Or(cmp.Compare(x.Rule, y.Rule), cmp.Compare(x.Subject, y.Subject))
}

// viewOf returns v showing tb (no table when tb is nil), or a new view of
// region name's floors for rule ri showing it where v cannot: a view only moves
// to newer tables, and a fresh view answers as a reused one does.
func (p *leasePlane) viewOf(v *region.TableView, name string, ri int, tb *region.Table) *region.TableView {
	if v != nil && v.Table() == tb {
		return v
	}
	if v == nil || tb == nil || !v.Set(tb) {
		v = region.NewTableView(name, p.budgets[ri].Split())
		if tb != nil {
			v.Set(tb)
		}
	}
	return v
}

// checkSettled checks, as region r's speaker publishes tb at t, that every
// allocation tb changes from the speaker's previous publication is the
// limit of its bucket in the region's Redis (or the bucket is full).
// Changes the store did not take (unsettled) are listed again by the
// Speaker and not checked here.
func (p *leasePlane) checkSettled(w *world, r int, t Micros, tb *region.Table, unsettled []region.Change) {
	rp := p.regions[r]
	now := p.regionNow(w, r, t)
	rd := rp.store.rd
	if !rd.up(t) {
		return
	}
	// The Holder's floors are per budget; the agents' views take one split
	// for every rule (see "everything's report rule"), so each rule's
	// allocations are read through a view with its budget's split.
	for i := range rp.checkViews {
		if len(rp.checkViews[i]) != len(p.budgets) {
			rp.checkViews[i] = make([]*region.TableView, len(p.budgets))
		}
	}
	before, after := rp.checkViews[0], rp.checkViews[1]
	p.keyBuf = tableKeys(p.keyBuf[:0], rp.last, tb)
	for _, k := range p.keyBuf {
		b, ok := p.budgetOf(w, k)
		if !ok {
			continue
		}
		ri := int(w.ruleIdx[b])
		before[ri] = p.viewOf(before[ri], w.regions[r].name, ri, rp.last)
		after[ri] = p.viewOf(after[ri], w.regions[r].name, ri, tb)
		global := w.ruleOf(b).limit
		from, _, _ := before[ri].Allocation(now, k, global)
		to, _, _ := after[ri].Allocation(now, k, global)
		if from == to || to.IsZero() {
			continue
		}
		if slices.ContainsFunc(unsettled, func(c region.Change) bool { return c.Key == k }) {
			continue
		}
		st := rd.states[b]
		if st.Full(rd.clock.at(t)) || st.WrittenUnder(to) {
			continue
		}
		p.violate("%s: table %d published at %s with %s/%s at %s while its Redis bucket was not yet moved from %s (settle before publishing)",
			w.regions[r].name, tb.Pub, time.Duration(t)*time.Microsecond, k.Rule, k.Subject, to, from)
	}
}

// checkAdopted checks, as region r's speaker sends m at t, that an
// acknowledgement leaves only once every live agent decides with a table
// at least as new as the one that carried its grant. An agent with no
// table yet (just restarted) decides with none of the grant's allocations
// and is left out.
func (p *leasePlane) checkAdopted(w *world, r int, t Micros, m lease.Message) {
	if m.Type != lease.MsgAck {
		return
	}
	rp := p.regions[r]
	ref := grantRef{m.Term, m.Grant}
	pubs := rp.carries[ref]
	if len(pubs) == 0 {
		return
	}
	pub := pubs[0]
	if len(pubs) == 1 {
		delete(rp.carries, ref)
	} else {
		rp.carries[ref] = pubs[1:]
	}
	for i, ag := range p.a.agents[r] {
		if i == rp.speaker || !ag.alive || !slices.Contains(rp.live, ag.name) {
			continue
		}
		if tb := ag.view.Table(); tb != nil && tb.Pub < pub {
			p.violate("%s: grant %d of term %d acknowledged at %s while %s decided with table %d, not yet %d, which carries it (adopt before acknowledging)",
				w.regions[r].name, m.Grant, m.Term, time.Duration(t)*time.Microsecond, ag.name, tb.Pub, pub)
		}
	}
}
