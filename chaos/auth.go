package chaos

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/allot-dev/allot/internal/pki"
)

// clusterAuth is how a run's regions prove their names to its
// coordinators, as production does it: every region has its own token
// (auth's tokens file format), sent over TLS to coordinators whose
// certificate chains to a throwaway CA made for the run. A region's agents
// hold only their region's token.
type clusterAuth struct {
	caFile, certFile, keyFile string
	tokensFile                string
	regionToken               map[string]string // region → its token file
}

// writeAuth writes the run's CA, the coordinators' certificate (valid for
// 127.0.0.1, where the proxies the agents dial listen; a proxy forwards
// bytes, so TLS runs from agent to coordinator), the coordinators' tokens
// file and one token file per region.
func (c *Cluster) writeAuth() error {
	dir := c.path("auth")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("chaos: auth directory: %w", err)
	}
	ca, err := pki.NewCA()
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	a := clusterAuth{regionToken: map[string]string{}}
	if a.caFile, a.certFile, a.keyFile, err = ca.WriteFiles(dir, "coordinator"); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	var tokens strings.Builder
	for _, r := range c.regionNames() {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return fmt.Errorf("chaos: token for %s: %w", r, err)
		}
		tok := hex.EncodeToString(b)
		fmt.Fprintf(&tokens, "%s %s\n", r, tok)
		f := filepath.Join(dir, r+".token")
		if err := os.WriteFile(f, []byte(tok+"\n"), 0o600); err != nil {
			return fmt.Errorf("chaos: token for %s: %w", r, err)
		}
		a.regionToken[r] = f
	}
	a.tokensFile = filepath.Join(dir, "region-tokens")
	if err := os.WriteFile(a.tokensFile, []byte(tokens.String()), 0o600); err != nil {
		return fmt.Errorf("chaos: region tokens: %w", err)
	}
	c.auth = a
	return nil
}

// coordinatorArgs are a coordinator's flags for serving TLS and requiring
// every region's token.
func (a clusterAuth) coordinatorArgs() []string {
	return []string{"-tls-cert", a.certFile, "-tls-key", a.keyFile, "-region-tokens", a.tokensFile}
}

// agentArgs are an agent's flags for proving its region: TLS to the
// coordinators, verified against the run's CA alone (the agent's own
// servers stay plain, so the load and the probes need no certificate), and
// the region's token.
func (a clusterAuth) agentArgs(region string) []string {
	return []string{"-coordinator-tls", "-coordinator-ca", a.caFile, "-coordinator-token-file", a.regionToken[region]}
}
