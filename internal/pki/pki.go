// Package pki makes throwaway certificate authorities and certificates for
// loopback runs: tests (through internal/testenv) and the chaos harness,
// which starts the real binaries authenticated as production runs them.
// Nothing here is meant for a real deployment: keys are written to files
// in the clear and certificates last a few hours.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// Validity is how long either side of now a CA and its certificates are
// valid: a test or a chaos run lasts minutes.
const Validity = time.Hour

// CA is a throwaway certificate authority, valid for Validity either side
// of when it was made. It is safe for concurrent use.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	Pool *x509.CertPool // holds Cert, for RootCAs and ClientCAs
	der  []byte
	next atomic.Int64 // serial of the last certificate issued
}

// NewCA returns a new CA.
func NewCA() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key: %w", err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "allot test CA"},
		NotBefore: time.Now().Add(-Validity), NotAfter: time.Now().Add(Validity), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	ca := &CA{Cert: cert, Key: key, Pool: pool, der: der}
	ca.next.Store(1)
	return ca, nil
}

// Issue returns a certificate named cn for the given uses; one that serves
// (x509.ExtKeyUsageServerAuth) is valid for 127.0.0.1.
func (ca *CA) Issue(cn string, uses ...x509.ExtKeyUsage) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: key for %q: %w", cn, err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(ca.next.Add(1)), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-Validity), NotAfter: time.Now().Add(Validity),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: uses}
	for _, u := range uses {
		if u == x509.ExtKeyUsageServerAuth {
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: certificate for %q: %w", cn, err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// WriteFiles writes the CA's certificate and a certificate named cn for
// serving and for clients, with its key, as PEM files in dir (ca.pem,
// cert.pem, key.pem), for servers and binaries configured by file.
func (ca *CA) WriteFiles(dir, cn string) (caFile, certFile, keyFile string, err error) {
	c, err := ca.Issue(cn, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return "", "", "", err
	}
	kb, err := x509.MarshalECPrivateKey(c.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		return "", "", "", fmt.Errorf("pki: key for %q: %w", cn, err)
	}
	caFile, certFile, keyFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for f, b := range map[string]*pem.Block{
		caFile:   {Type: "CERTIFICATE", Bytes: ca.der},
		certFile: {Type: "CERTIFICATE", Bytes: c.Certificate[0]},
		keyFile:  {Type: "EC PRIVATE KEY", Bytes: kb},
	} {
		if err := os.WriteFile(f, pem.EncodeToMemory(b), 0o600); err != nil {
			return "", "", "", fmt.Errorf("pki: %w", err)
		}
	}
	return caFile, certFile, keyFile, nil
}
