// Package tlstest makes self-signed TLS certificates for tests that serve
// HTTPS on 127.0.0.1: the lease server's listener, the daemon's -tls-cert
// and -tls-key, and the SDK's HTTP client that trusts them.
package tlstest

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
	"testing"
	"time"
)

// Cert is a self-signed certificate for 127.0.0.1 and localhost.
type Cert struct {
	// CertFile and KeyFile are PEM files in the test's temporary
	// directory, as rateleased -tls-cert and -tls-key take them.
	CertFile, KeyFile string
	// Pool trusts the certificate, for a client's tls.Config.RootCAs.
	Pool *x509.CertPool
	// Certificate is the certificate with its key, for a server's
	// tls.Config.Certificates.
	Certificate tls.Certificate
}

// ServerConfig returns a tls.Config that serves the certificate.
func (c *Cert) ServerConfig() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{c.Certificate}, MinVersion: tls.VersionTLS12}
}

// ClientConfig returns a tls.Config that trusts the certificate.
func (c *Cert) ClientConfig() *tls.Config {
	return &tls.Config{RootCAs: c.Pool, MinVersion: tls.VersionTLS12}
}

// SelfSigned makes a certificate valid for an hour for 127.0.0.1, ::1 and
// localhost, and writes it and its key to PEM files under t.TempDir.
func SelfSigned(t testing.TB) *Cert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("tlstest: generate key: %v", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(now.UnixNano()),
		Subject:               pkix.Name{CommonName: "ratelease test"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("tlstest: create certificate: %v", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("tlstest: marshal key: %v", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	dir := t.TempDir()
	c := &Cert{CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem"), Pool: x509.NewCertPool()}
	if err := os.WriteFile(c.CertFile, certPEM, 0o600); err != nil {
		t.Fatalf("tlstest: %v", err)
	}
	if err := os.WriteFile(c.KeyFile, keyPEM, 0o600); err != nil {
		t.Fatalf("tlstest: %v", err)
	}
	if c.Certificate, err = tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatalf("tlstest: %v", err)
	}
	if !c.Pool.AppendCertsFromPEM(certPEM) {
		t.Fatal("tlstest: the certificate does not parse")
	}
	return c
}
