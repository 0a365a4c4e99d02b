package lease

import (
	"fmt"
	"strings"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// MsgType names the kind of a Message.
type MsgType uint8

// Message types. Up: region (Holder) to coordinator (Allocator). Down:
// coordinator to region.
const (
	// MsgHello (up) opens or resumes a session: Session, Term and Version the
	// Holder has accepted, and Entries, the allocations it holds now. The
	// Allocator answers with a full table.
	MsgHello MsgType = iota + 1
	// MsgReport (up) carries Demand for hot keys and asks for a lease
	// renewal. A Holder sends one every refresh interval, and at once when a
	// key presses on its allocation.
	MsgReport
	// MsgAck (up) acknowledges grant number Grant and reports the table
	// Version the Holder now has in Term.
	MsgAck
	// MsgRelease (up) gives back everything above the region's floors: the
	// region is shutting down cleanly.
	MsgRelease
	// MsgGrant (down) is a lease: Entries change the table from version Base
	// to Version (Full: Entries is the whole table); Renew extends the lease
	// to TTL after the Holder sent request Seq.
	MsgGrant
	// MsgExpire (down) ends the lease now: the Holder drops to its floors
	// (keeping lent floors low until their hold ends) and acknowledges.
	MsgExpire
	// MsgResync (down) asks the Holder for a hello: the Allocator does not
	// know the session, or lost track of its table.
	MsgResync
	// MsgRedirect (down) names the current leader's address in Leader ("" if
	// unknown). Transports produce it; the Allocator never does.
	MsgRedirect
)

var msgNames = [...]string{"?", "hello", "report", "ack", "release", "grant", "expire", "resync", "redirect"}

// String returns the type's lower-case name.
func (t MsgType) String() string {
	if int(t) < len(msgNames) {
		return msgNames[t]
	}
	return fmt.Sprintf("msgtype(%d)", uint8(t))
}

// Message is one protocol message in either direction. Fields not listed for
// a type are zero. Messages are values: a receiver may keep them, and
// the state machines never modify a Message after returning it from Ready.
type Message struct {
	Type MsgType
	// Region is the sending region (up) or the addressed region (down).
	// Transports set it from the authenticated peer, so a region can only
	// ever speak for itself.
	Region string
	// Session identifies the Holder's incarnation. Down messages echo the
	// session they address; a Holder ignores messages for another session.
	Session uint64
	// Term is the leader's fencing term (down), or the highest term the
	// Holder has accepted (up).
	Term uint64
	// Seq numbers the Holder's messages within a session (up). In a grant it
	// is the latest request (hello or report) the Allocator had received;
	// the Holder measures the lease from when it sent that request.
	Seq uint64
	// Grant numbers grants to a region within a term (down); an ack names
	// the grant it acknowledges.
	Grant uint64
	// Version is the allocation table version after applying a grant or
	// expire (down), or the version the Holder has (up).
	Version uint64
	// Base is the version a delta grant applies to (down, not Full).
	Base uint64
	// Full marks a grant whose Entries are the whole table.
	Full bool
	// Renew marks a grant that extends the lease.
	Renew bool
	// Learning marks a grant from a leader still learning what regions
	// hold: it never raises an allocation, whatever its entries say, since
	// they may come from a hello that later grants of the previous leader
	// have overtaken.
	Learning bool
	// Quiet marks a delta grant that only raises (no entry lower than the
	// last value sent, no renewal): the Allocator needs no acknowledgement
	// of it, so the Holder sends none. A later acknowledgement covers it.
	Quiet bool
	// TTL is the lease length, Hold how long a lent floor stays lent after
	// the grant is received, Refresh how often to report, and Drift the
	// margin for clock drift (down, grant).
	TTL, Hold, Refresh, Drift time.Duration
	// Entries are allocation changes (grant), or what the Holder holds
	// (hello).
	Entries []Entry
	// Demand lists hot keys and what the region would use (report).
	Demand []Demand
	// Leader is the leader's address (redirect).
	Leader string
	// Budgets, in a full grant, are the budgets the coordinator serves: a
	// Holder replaces its own with them, so a rules change reaches every
	// region with its next full table (floors included).
	Budgets []Budget
	// Returns, in an acknowledgement only, are the tokens the decreases it
	// acknowledges took away from the region's buckets (what each held
	// beyond its new burst): the coordinator puts them back in the budget's
	// stored reserve, at most what its decreases could have taken away.
	Returns []Return
}

// Return is tokens a decrease of a key's allocation took away from the
// region's bucket, given back to the budget's stored reserve.
type Return struct {
	Key    bucket.Key
	Tokens bucket.Tokens
}

// Entry is one region's allocation for one key: Count tokens per the
// budget's Period with a burst of Burst. Drop removes the entry, returning
// the key to the region's floor. Credit, in a grant only, is stored tokens
// of the budget's reserve that go with the burst the grant adds: the
// region puts them in its regional bucket once, when it adopts the grant
// (Holder.TakeCredits), and never again for a resent or duplicated grant.
type Entry struct {
	Key    bucket.Key
	Count  bucket.Tokens
	Burst  bucket.Tokens
	Drop   bool
	Credit bucket.Tokens
}

// Demand is what a region would use of a key: Want tokens per the budget's
// Period, measured over recent arrivals (admitted and denied).
type Demand struct {
	Key  bucket.Key
	Want bucket.Tokens
}

// Keys renders the message's keys with their values for a log, at most n
// of them and the rest counted: an entry as count/burst, a drop as floor
// (either with +credit), a demand as its want, a return as back and its
// tokens.
func (m Message) Keys(n int) string {
	var b strings.Builder
	i := 0
	item := func(k bucket.Key, format string, args ...any) {
		if i < n {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(k.Rule + "/" + k.Subject + "=")
			fmt.Fprintf(&b, format, args...)
		}
		i++
	}
	for _, e := range m.Entries {
		switch {
		case e.Drop && e.Credit > 0:
			item(e.Key, "floor+%d", e.Credit)
		case e.Drop:
			item(e.Key, "floor")
		case e.Credit > 0:
			item(e.Key, "%d/%d+%d", e.Count, e.Burst, e.Credit)
		default:
			item(e.Key, "%d/%d", e.Count, e.Burst)
		}
	}
	for _, d := range m.Demand {
		item(d.Key, "%d", d.Want)
	}
	for _, r := range m.Returns {
		item(r.Key, "back %d", r.Tokens)
	}
	if i > n {
		fmt.Fprintf(&b, " (%d more)", i-n)
	}
	return b.String()
}

// String renders a message compactly for logs and scenario tests.
func (m Message) String() string {
	s := fmt.Sprintf("%s %s", m.Type, m.Region)
	switch m.Type {
	case MsgHello:
		s += fmt.Sprintf(" term=%d ver=%d held=%d", m.Term, m.Version, len(m.Entries))
	case MsgReport:
		s += fmt.Sprintf(" seq=%d demand=%d", m.Seq, len(m.Demand))
	case MsgAck:
		s += fmt.Sprintf(" term=%d grant=%d ver=%d", m.Term, m.Grant, m.Version)
	case MsgGrant:
		s += fmt.Sprintf(" term=%d grant=%d ver=%d", m.Term, m.Grant, m.Version)
		if m.Full {
			s += " full"
		} else {
			s += fmt.Sprintf(" base=%d", m.Base)
		}
		if m.Renew {
			s += " renew"
		}
		if m.Quiet {
			s += " quiet"
		}
		s += fmt.Sprintf(" entries=%d", len(m.Entries))
	case MsgExpire:
		s += fmt.Sprintf(" term=%d ver=%d", m.Term, m.Version)
	case MsgRedirect:
		s += " leader=" + m.Leader
	}
	return s
}
