package coordinator

import (
	"context"
	"sync"
	"time"

	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/lease"
)

// HolderDriver runs a region's lease.Holder over a Client: it keeps a
// stream open to the leading coordinator (reconnecting after Redial and
// saying hello on every new stream), ticks the Holder every Tick, delivers
// what arrives and sends what the Holder says. The Holder is shared with
// the caller under Mu: hold it to call Allocation, Demand or Status.
type HolderDriver struct {
	Client *Client
	Holder *lease.Holder
	// Mu guards Holder; the driver holds it for every call into Holder.
	Mu *sync.Mutex
	// Clock reads the time; clock.Real in production.
	Clock clock.Clock
	// Tick is how often the Holder is ticked (default 100 ms).
	Tick time.Duration
	// Redial is the pause after a stream ends or fails (default 200 ms).
	Redial time.Duration
	// OnRecv, when set, is called after each message is stepped (with Mu
	// held), e.g. to publish the table or record grants.
	OnRecv func(m lease.Message)
}

// Run drives the Holder until ctx ends.
func (d *HolderDriver) Run(ctx context.Context) error {
	if d.Tick <= 0 {
		d.Tick = 100 * time.Millisecond
	}
	if d.Redial <= 0 {
		d.Redial = 200 * time.Millisecond
	}
	for ctx.Err() == nil {
		st, err := d.Client.Connect(ctx)
		if err == nil {
			d.stream(ctx, st)
			st.Close()
		}
		select {
		case <-ctx.Done():
		case <-time.After(d.Redial):
		}
	}
	return nil
}

func (d *HolderDriver) stream(ctx context.Context, st lease.Stream) {
	recv := make(chan lease.Message, 64)
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case recv <- m:
			case <-ctx.Done():
				errc <- ctx.Err()
				return
			}
		}
	}()
	d.Mu.Lock()
	d.Holder.Reconnect(d.Clock.Now())
	d.Mu.Unlock()
	t := time.NewTicker(d.Tick)
	defer t.Stop()
	for {
		d.Mu.Lock()
		out := d.Holder.Ready()
		d.Mu.Unlock()
		for _, m := range out {
			if err := st.Send(m); err != nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-errc:
			return // ended, failed or redirected: reconnect
		case m := <-recv:
			d.Mu.Lock()
			_ = d.Holder.Step(d.Clock.Now(), m)
			if d.OnRecv != nil {
				d.OnRecv(m)
			}
			d.Mu.Unlock()
		case <-t.C:
			d.Mu.Lock()
			d.Holder.Tick(d.Clock.Now())
			d.Mu.Unlock()
		}
	}
}
