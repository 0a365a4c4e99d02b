package testenv

import (
	"crypto/tls"
	"crypto/x509"
	"testing"

	"github.com/allot-dev/allot/internal/pki"
)

// CA is a throwaway certificate authority for TLS tests (pki.CA with the
// test's failures reported to it), valid for an hour either side of now.
type CA struct {
	*pki.CA
}

// NewCA returns a new CA.
func NewCA(tb testing.TB) *CA {
	tb.Helper()
	ca, err := pki.NewCA()
	if err != nil {
		tb.Fatal(err)
	}
	return &CA{CA: ca}
}

// Issue returns a certificate named cn for the given uses; one that serves
// (x509.ExtKeyUsageServerAuth) is valid for 127.0.0.1.
func (ca *CA) Issue(tb testing.TB, cn string, uses ...x509.ExtKeyUsage) tls.Certificate {
	tb.Helper()
	c, err := ca.CA.Issue(cn, uses...)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// WriteFiles writes the CA's certificate and a certificate named cn for
// serving and for clients, with its key, as PEM files in dir, for servers
// and binaries configured by file.
func (ca *CA) WriteFiles(tb testing.TB, dir, cn string) (caFile, certFile, keyFile string) {
	tb.Helper()
	caFile, certFile, keyFile, err := ca.CA.WriteFiles(dir, cn)
	if err != nil {
		tb.Fatal(err)
	}
	return caFile, certFile, keyFile
}
