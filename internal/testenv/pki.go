package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a throwaway certificate authority for TLS tests, valid for an hour
// either side of now.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	Pool *x509.CertPool // holds Cert, for RootCAs and ClientCAs
	der  []byte
	next atomic.Int64 // serial of the next certificate
}

// NewCA returns a new CA.
func NewCA(tb testing.TB) *CA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "allot test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	ca := &CA{Cert: cert, Key: key, Pool: pool, der: der}
	ca.next.Store(1)
	return ca
}

// Issue returns a certificate named cn for the given uses; one that serves
// (x509.ExtKeyUsageServerAuth) is valid for 127.0.0.1.
func (ca *CA) Issue(tb testing.TB, cn string, uses ...x509.ExtKeyUsage) tls.Certificate {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(ca.next.Add(1)), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: uses}
	for _, u := range uses {
		if u == x509.ExtKeyUsageServerAuth {
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		tb.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// WriteFiles writes the CA's certificate and a certificate named cn for
// serving and for clients, with its key, as PEM files in dir, for servers
// and binaries configured by file.
func (ca *CA) WriteFiles(tb testing.TB, dir, cn string) (caFile, certFile, keyFile string) {
	tb.Helper()
	c := ca.Issue(tb, cn, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	kb, err := x509.MarshalECPrivateKey(c.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		tb.Fatal(err)
	}
	caFile, certFile, keyFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for f, b := range map[string]*pem.Block{
		caFile:   {Type: "CERTIFICATE", Bytes: ca.der},
		certFile: {Type: "CERTIFICATE", Bytes: c.Certificate[0]},
		keyFile:  {Type: "EC PRIVATE KEY", Bytes: kb},
	} {
		if err := os.WriteFile(f, pem.EncodeToMemory(b), 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	return caFile, certFile, keyFile
}
