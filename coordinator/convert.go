package coordinator

import (
	"math"
	"time"

	leasev1 "github.com/allot-dev/allot/api/lease/v1"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
)

// ToProto converts a lease.Message to its wire form.
func ToProto(m lease.Message) *leasev1.Message {
	p := &leasev1.Message{
		Type: leasev1.Type(m.Type), Region: m.Region, Session: m.Session, Term: m.Term, Seq: m.Seq,
		Grant: m.Grant, Version: m.Version, Base: m.Base, Full: m.Full, Renew: m.Renew,
		TtlUs: m.TTL.Microseconds(), HoldUs: m.Hold.Microseconds(), RefreshUs: m.Refresh.Microseconds(),
		DriftUs: m.Drift.Microseconds(), Leader: m.Leader, Learning: m.Learning, Quiet: m.Quiet,
	}
	if len(m.Entries) > 0 {
		p.Entries = make([]*leasev1.Entry, len(m.Entries))
		for i, e := range m.Entries {
			p.Entries[i] = &leasev1.Entry{Key: &leasev1.Key{Rule: e.Key.Rule, Subject: e.Key.Subject},
				Count: int64(e.Count), Burst: int64(e.Burst), Drop: e.Drop, Credit: int64(e.Credit)}
		}
	}
	for _, b := range m.Budgets {
		p.Budgets = append(p.Budgets, &leasev1.Budget{Rule: b.Rule, Count: int64(b.Limit.Count()),
			PeriodUs: b.Limit.Period().Microseconds(), Burst: int64(b.Limit.Burst()), Regions: b.Regions,
			Weights: b.Weights, Reserve: b.Reserve, Policy: int32(b.Policy)})
	}
	if len(m.Returns) > 0 {
		p.Returns = make([]*leasev1.Return, len(m.Returns))
		for i, r := range m.Returns {
			p.Returns[i] = &leasev1.Return{Key: &leasev1.Key{Rule: r.Key.Rule, Subject: r.Key.Subject}, Tokens: int64(r.Tokens)}
		}
	}
	if len(m.Demand) > 0 {
		p.Demand = make([]*leasev1.Demand, len(m.Demand))
		for i, d := range m.Demand {
			p.Demand[i] = &leasev1.Demand{Key: &leasev1.Key{Rule: d.Key.Rule, Subject: d.Key.Subject}, Want: int64(d.Want)}
		}
	}
	return p
}

// FromProto converts a wire message to a lease.Message.
func FromProto(p *leasev1.Message) lease.Message {
	m := lease.Message{
		Type: msgType(p.GetType()), Region: p.GetRegion(), Session: p.GetSession(), Term: p.GetTerm(),
		Seq: p.GetSeq(), Grant: p.GetGrant(), Version: p.GetVersion(), Base: p.GetBase(), Full: p.GetFull(),
		Renew: p.GetRenew(), TTL: us(p.GetTtlUs()), Hold: us(p.GetHoldUs()), Refresh: us(p.GetRefreshUs()),
		Drift: us(p.GetDriftUs()), Leader: p.GetLeader(), Learning: p.GetLearning(), Quiet: p.GetQuiet(),
	}
	if len(p.GetReturns()) > 0 {
		m.Returns = make([]lease.Return, len(p.Returns))
		for i, r := range p.Returns {
			m.Returns[i] = lease.Return{Key: key(r.GetKey()), Tokens: bucket.Tokens(r.GetTokens())}
		}
	}
	if len(p.GetEntries()) > 0 {
		m.Entries = make([]lease.Entry, len(p.Entries))
		for i, e := range p.Entries {
			m.Entries[i] = lease.Entry{Key: key(e.GetKey()), Count: bucket.Tokens(e.GetCount()),
				Burst: bucket.Tokens(e.GetBurst()), Drop: e.GetDrop(), Credit: bucket.Tokens(e.GetCredit())}
		}
	}
	for _, b := range p.GetBudgets() {
		m.Budgets = append(m.Budgets, lease.Budget{Rule: b.GetRule(),
			Limit:   bucket.Per(bucket.Tokens(b.GetCount()), us(b.GetPeriodUs())).WithBurst(bucket.Tokens(b.GetBurst())),
			Regions: b.GetRegions(), Weights: b.GetWeights(), Reserve: b.GetReserve(), Policy: policy(b.GetPolicy())})
	}
	if len(p.GetDemand()) > 0 {
		m.Demand = make([]lease.Demand, len(p.Demand))
		for i, d := range p.Demand {
			m.Demand[i] = lease.Demand{Key: key(d.GetKey()), Want: bucket.Tokens(d.GetWant())}
		}
	}
	return m
}

// msgType converts a wire type. A value outside lease.MsgType's range
// becomes 0, a type no side accepts, instead of wrapping onto a real one.
func msgType(t leasev1.Type) lease.MsgType {
	if t < 0 || t > math.MaxUint8 {
		return 0
	}
	return lease.MsgType(t)
}

// policy converts a wire policy. A value outside lease.AllocationPolicy's
// range becomes 255, which Budget.Validate rejects, instead of wrapping
// onto a real policy.
func policy(p int32) lease.AllocationPolicy {
	if p < 0 || p > math.MaxUint8 {
		return math.MaxUint8
	}
	return lease.AllocationPolicy(p)
}

func key(k *leasev1.Key) bucket.Key { return bucket.Key{Rule: k.GetRule(), Subject: k.GetSubject()} }

func us(n int64) time.Duration { return time.Duration(n) * time.Microsecond }
