package broker

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// EdgeNodeLabel marks a Node as an edge node; KubeEdge's edged sets it when the node registers. Only such a Node's
// agent is admitted.
const EdgeNodeLabel = "node-role.kubernetes.io/edge"

// The subject of the client certificate cloudcore issues to a node at `keadm join` and at each rotation:
// CN=system:node:<node>, O=system:nodes (edge/pkg/edgehub/certificate/certmanager.go in KubeEdge).
const (
	nodeCNPrefix     = "system:node:"
	nodeOrganization = "system:nodes"
)

// Nodes says whether a node may hold a session. It is asked at every CONNECT and at every recheck of the live
// sessions, so it must answer from a cache, not by a request to the API server.
type Nodes interface {
	// IsEdgeNode tells whether a Node of that name exists and carries EdgeNodeLabel; an error is neither yes
	// nor no, and the node is refused.
	IsEdgeNode(ctx context.Context, name string) (bool, error)
}

// CacheNodes answers Nodes from a controller-runtime cache (the manager's client reads Nodes from its informer).
type CacheNodes struct{ Reader client.Reader }

// IsEdgeNode implements Nodes.
func (c CacheNodes) IsEdgeNode(ctx context.Context, name string) (bool, error) {
	node := &corev1.Node{}
	if err := c.Reader.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("reading node %s: %w", name, err)
	}
	return IsEdgeNode(node), nil
}

// IsEdgeNode tells whether a Node is an edge node (it has EdgeNodeLabel, whatever its value).
func IsEdgeNode(node *corev1.Node) bool {
	_, ok := node.Labels[EdgeNodeLabel]
	return ok
}

// ClientCerts configure certificate login: a node is known by the client certificate KubeEdge issued it.
type ClientCerts struct {
	// CAs verify node certificates: KubeEdge's CA (cloudcore's Secret kubeedge/casecret, /etc/kubeedge/ca/rootCA.crt
	// on the nodes). Nil turns certificate login off.
	CAs *x509.CertPool
	// RevokedFile, when set, is an X.509 CRL (PEM or DER) or lists revoked certificate serial numbers, in hex,
	// one a line (colons allowed, `#` starts a comment). It is read again whenever its size or modification time
	// changes; while it cannot be read or parsed, every certificate is refused.
	RevokedFile string
}

// nodeFromCertificate returns the node a verified chain's leaf names, or why it names none.
func nodeFromCertificate(leaf *x509.Certificate) (string, error) {
	cn := leaf.Subject.CommonName
	node, ok := strings.CutPrefix(cn, nodeCNPrefix)
	if !ok || len(leaf.Subject.Organization) != 1 || leaf.Subject.Organization[0] != nodeOrganization {
		return "", fmt.Errorf("subject %q is not CN=%s<node>, O=%s", leaf.Subject.String(), nodeCNPrefix, nodeOrganization)
	}
	if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 {
		return "", fmt.Errorf("node name %q in the certificate: %s", node, strings.Join(errs, "; "))
	}
	return node, nil
}

// verifyNodeCertificate checks a client's certificate chain against the CAs at now, for client authentication,
// and returns the node it names.
func verifyNodeCertificate(chain []*x509.Certificate, cas *x509.CertPool, now time.Time) (string, error) {
	intermediates := x509.NewCertPool()
	for _, c := range chain[1:] {
		intermediates.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: cas, Intermediates: intermediates, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		return "", fmt.Errorf("verifying the certificate of %q (serial %x): %w", chain[0].Subject.CommonName, chain[0].SerialNumber, err)
	}
	return nodeFromCertificate(chain[0])
}

// peerCertificates is the chain a client presented in its TLS handshake; nil on a plain connection or without a
// certificate.
func peerCertificates(conn any) []*x509.Certificate {
	if tc, ok := conn.(interface{ ConnectionState() tls.ConnectionState }); ok {
		return tc.ConnectionState().PeerCertificates
	}
	return nil
}

// revocations holds the revoked serial numbers of RevokedFile, read again when the file changes.
type revocations struct {
	file string

	mu      sync.Mutex
	size    int64
	modTime time.Time
	serials map[string]bool // big.Int.Text(16)
	err     error           // why the file could not be read; every certificate is refused meanwhile
}

// revoked tells whether serial is revoked, after reading the file again if it changed.
func (r *revocations) revoked(serial *big.Int) (bool, error) {
	if r == nil || r.file == "" {
		return false, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refresh()
	if r.err != nil {
		return true, r.err
	}
	return r.serials[serial.Text(16)], nil
}

func (r *revocations) refresh() {
	fi, err := os.Stat(r.file)
	if err != nil {
		r.err = fmt.Errorf("reading the revoked certificates: %w", err)
		r.size, r.modTime = -1, time.Time{}
		return
	}
	if r.err == nil && r.serials != nil && fi.Size() == r.size && fi.ModTime().Equal(r.modTime) {
		return
	}
	data, err := os.ReadFile(r.file)
	if err != nil {
		r.err = fmt.Errorf("reading the revoked certificates: %w", err)
		return
	}
	serials, err := parseRevoked(data)
	if err != nil {
		r.err = fmt.Errorf("parsing the revoked certificates in %s: %w", r.file, err)
		return
	}
	r.serials, r.err, r.size, r.modTime = serials, nil, fi.Size(), fi.ModTime()
}

// parseRevoked reads the revoked serial numbers from an X.509 CRL (PEM, as `openssl ca -gencrl` writes it, or
// DER), or else from a list of serial numbers (parseSerials). Whoever may write the file may revoke, so a CRL's
// signature and its next update are not checked: a CRL past its next update still revokes what it lists, rather
// than lock every node out.
func parseRevoked(data []byte) (map[string]bool, error) {
	der := data
	if block, _ := pem.Decode(data); block != nil {
		if block.Type != "X509 CRL" {
			return nil, fmt.Errorf("a PEM %q block, not an X509 CRL", block.Type)
		}
		der = block.Bytes
	}
	// A DER CRL is an ASN.1 SEQUENCE (0x30), which a list of hex serials may also begin with ('0').
	if crl, err := x509.ParseRevocationList(der); err == nil {
		serials := make(map[string]bool, len(crl.RevokedCertificateEntries))
		for _, e := range crl.RevokedCertificateEntries {
			serials[e.SerialNumber.Text(16)] = true
		}
		return serials, nil
	} else if len(der) != len(data) {
		return nil, fmt.Errorf("the CRL: %w", err)
	}
	return parseSerials(data)
}

// parseSerials reads serial numbers in hex, one a line, as `openssl x509 -serial` (`serial=1A2B`) or a
// certificate dump (`1a:2b`) prints them; blank lines and `#` comments are skipped.
func parseSerials(data []byte) (map[string]bool, error) {
	serials := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		line = strings.TrimPrefix(strings.TrimPrefix(line, "serial="), "0x")
		line = strings.ReplaceAll(line, ":", "")
		v, ok := new(big.Int).SetString(line, 16)
		if !ok || v.Sign() < 0 {
			return nil, fmt.Errorf("line %d: %q is not a serial number in hex", n, sc.Text())
		}
		serials[v.Text(16)] = true
	}
	return serials, sc.Err()
}

// errNoCertificate: certificate login is on, and the client presented none.
var errNoCertificate = errors.New("no client certificate")

// certIdentity checks a client's certificate at now and returns its node and the reason to count when refused.
func (h *nodeAccess) certIdentity(chain []*x509.Certificate, now time.Time) (node, reason string, err error) {
	if len(chain) == 0 {
		return "", "", errNoCertificate
	}
	if node, err = verifyNodeCertificate(chain, h.certs.CAs, now); err != nil {
		return "", RefusedCertificate, err
	}
	if revoked, err := h.revoked.revoked(chain[0].SerialNumber); revoked {
		if err == nil {
			err = fmt.Errorf("node %q: certificate serial %x is revoked", node, chain[0].SerialNumber)
		}
		return "", RefusedRevoked, err
	}
	return node, "", nil
}

// verifiedNode is the node of a client certificate chain that verifies now and is not revoked; "" otherwise.
func (h *nodeAccess) verifiedNode(chain []*x509.Certificate) string {
	node, _, err := h.certIdentity(chain, h.clock.Now())
	if err != nil {
		return ""
	}
	return node
}

// revokedOrUnknown tells whether serial is revoked, or the revocation list cannot be read.
func (h *nodeAccess) revokedOrUnknown(serial *big.Int) bool {
	revoked, err := h.revoked.revoked(serial)
	return revoked || err != nil
}

// clockOr is c, or the real clock.
func clockOr(c clock.PassiveClock) clock.PassiveClock {
	if c == nil {
		return clock.RealClock{}
	}
	return c
}
