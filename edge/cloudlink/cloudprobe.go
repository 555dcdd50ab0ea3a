// Package cloudlink tells whether the node reaches the cloud: a probe of a URL there (the API server, or
// cloudcore), cheap enough to ask several times a second, and what edgecore's configuration says of where the
// cloud and the node's MetaServer are. It exists because a cut must be seen within a second or so, which neither a
// watch on a dead link nor the MetaServer (it answers from the node's own store) can tell; the agent's loop only
// asks whether the API server is reachable now.
package cloudlink

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kubeedge/api/apis/common/constants"
	"sigs.k8s.io/yaml"
)

// Probe tells whether the node reaches the cloud by a request to a URL there: the API server's /readyz, or
// the cloudcore endpoint edgecore's edgeHub connects to. Any HTTP answer counts: only the round trip matters. It
// is needed when the agent reads its workers from KubeEdge's MetaServer, which answers from the node's own store
// whether or not the cloud is reachable, and it is how a cut is seen fast: a watch on a dead link tells only when
// TCP gives up.
//
// A cut is told at most Period + Timeout after it begins. Attempts are frequent, so they must cost the cloud
// nothing: over HTTP/2 the probe keeps one connection, sends the URL's request once on it, and then a PING frame
// per attempt, which the server's framer answers without a request, a handler or an authentication.
type Probe struct {
	URL string
	// TLS checks the cloud's certificate; nil: not checked (nothing read from the answer is trusted).
	TLS *tls.Config
	// Timeout of one attempt (default 1 s): longer than the link's worst round trip, or a slow link is taken for
	// a cut one.
	Timeout time.Duration
	// Period between attempts (default 250 ms).
	Period time.Duration

	reachable atomic.Bool
	probed    atomic.Bool // an attempt has ended
	initOnce  sync.Once
	changes   chan struct{}
}

// Default timing of the probe.
const (
	DefaultProbeTimeout = time.Second
	DefaultProbePeriod  = 250 * time.Millisecond
)

// Run probes every Period until ctx ends.
func (p *Probe) Run(ctx context.Context) {
	timeout, period := cmp.Or(p.Timeout, DefaultProbeTimeout), cmp.Or(p.Period, DefaultProbePeriod)
	link, badURL := newCloudLink(p.URL, p.TLS)
	defer link.close()
	for {
		err := badURL
		if err == nil {
			attempt, cancel := context.WithTimeout(ctx, timeout)
			err = link.answers(attempt)
			cancel()
		}
		if ctx.Err() != nil {
			return // the attempt was cut short by the end, not by the link
		}
		p.record(err == nil)
		select {
		case <-ctx.Done():
			return
		case <-time.After(period):
		}
	}
}

// record keeps an attempt's outcome and tells a change.
func (p *Probe) record(reachable bool) {
	p.init()
	was := p.reachable.Swap(reachable)
	if first := !p.probed.Swap(true); first || was != reachable {
		select {
		case p.changes <- struct{}{}:
		default:
		}
	}
}

func (p *Probe) init() { p.initOnce.Do(func() { p.changes = make(chan struct{}, 1) }) }

// Reachable tells the outcome of the latest attempt.
func (p *Probe) Reachable() bool { return p.reachable.Load() }

// Probed tells whether an attempt has ended, so Reachable means something.
func (p *Probe) Probed() bool { return p.probed.Load() }

// Changes receives after the first attempt and whenever Reachable changes, so that the heartbeat tells a cut as
// soon as it is seen; a change not yet received is not queued twice.
func (p *Probe) Changes() <-chan struct{} {
	p.init()
	return p.changes
}

// edgecoreConfig is what the agent reads of edgecore's configuration: where edgeHub reaches cloudcore's HTTPS
// server, and the cloud's CA on the node.
type edgecoreConfig struct {
	Modules struct {
		EdgeHub struct {
			HTTPServer string `json:"httpServer"`
			TLSCAFile  string `json:"tlsCaFile"`
		} `json:"edgeHub"`
		MetaManager struct {
			MetaServer struct {
				Enable bool   `json:"enable"`
				Server string `json:"server"`
			} `json:"metaServer"`
		} `json:"metaManager"`
	} `json:"modules"`
	FeatureGates map[string]bool `json:"featureGates"`
}

// MetaServerCAFile is where edgecore keeps the CA of the MetaServer's serving certificate when the
// requireAuthorization feature gate is on: the API server's CA, fetched from the cloud
// (edge/pkg/metamanager/metaserver/certificate in KubeEdge).
const MetaServerCAFile = "/etc/kubeedge/pki/metaserver/ca.crt"

// MetaServerEndpoint is how edgecore's configuration says the MetaServer is reached.
type MetaServerEndpoint struct {
	// Enabled is modules.metaManager.metaServer.enable: off (edgecore's default), nothing listens.
	Enabled bool
	// URL is http://<server>, or https://<server> under the requireAuthorization feature gate, where the
	// MetaServer authenticates a service-account token and authorizes it by RBAC.
	URL string
	// CAFile verifies the MetaServer's certificate, with https only.
	CAFile string
}

// EdgecoreMetaServer reads where the MetaServer listens, and how, from edgecore's configuration at path.
func EdgecoreMetaServer(path string) (MetaServerEndpoint, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return MetaServerEndpoint{}, fmt.Errorf("reading edgecore's configuration: %w", err)
	}
	var cfg edgecoreConfig
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return MetaServerEndpoint{}, fmt.Errorf("decoding edgecore's configuration %s: %w", path, err)
	}
	ms := cfg.Modules.MetaManager.MetaServer
	server := strings.TrimSpace(ms.Server)
	if server == "" {
		server = constants.DefaultMetaServerAddr
	}
	ep := MetaServerEndpoint{Enabled: ms.Enable, URL: "http://" + server}
	if cfg.FeatureGates["requireAuthorization"] {
		ep.URL, ep.CAFile = "https://"+server, MetaServerCAFile
	}
	return ep, nil
}

// EdgecoreProbe is the probe of cloudcore that edgecore's configuration at path implies: a GET of
// <modules.edgeHub.httpServer>/ca.crt, which cloudcore's HTTPS server (10002) answers without a client
// certificate; its websocket port (10000) requires one and never answers the agent. The server's certificate is
// checked against the cloud's CA that edgecore's tlsCaFile names (default /etc/kubeedge/ca/rootCA.crt), by chain
// only: edgecore may reach cloudcore by an address its certificate does not name. Without that file it is not
// checked; the message says why that is acceptable. It returns an error when the configuration names no server.
func EdgecoreProbe(path string) (*Probe, string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("reading edgecore's configuration: %w", err)
	}
	var cfg edgecoreConfig
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return nil, "", fmt.Errorf("decoding edgecore's configuration %s: %w", path, err)
	}
	hub := cfg.Modules.EdgeHub
	server, err := url.Parse(strings.TrimSpace(hub.HTTPServer))
	if err != nil || server.Scheme != "https" || server.Host == "" {
		return nil, "", fmt.Errorf("edgecore's configuration %s: modules.edgeHub.httpServer %q is not an https URL", path, hub.HTTPServer)
	}
	probe := &Probe{URL: strings.TrimSuffix(server.String(), "/") + "/ca.crt"}
	caFile := hub.TLSCAFile
	if caFile == "" {
		caFile = constants.DefaultCAFile
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return probe, fmt.Sprintf("the cloud's certificate is not checked (%v): nothing read from the answer is trusted, and a "+
			"forged answer, which takes a place on the node's path to the cloud, can only make a cut-off node look connected", err), nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, "", fmt.Errorf("the cloud's CA %s holds no certificate", caFile)
	}
	probe.TLS = chainOnlyTLS(pool)
	return probe, "the cloud's certificate is checked against " + caFile, nil
}

// chainOnlyTLS verifies the server's certificate chain against roots, whatever name it was reached by.
func chainOnlyTLS(roots *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, //nolint:gosec // the chain is verified below, only the name is not
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the cloud sent no certificate")
			}
			intermediates := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				intermediates.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: intermediates})
			return err
		},
	}
}

// ProbeTLS is how a probe of an explicit URL checks the cloud's certificate: its chain against caFile's CA,
// whatever name it was reached by (as the probe edgecore's configuration implies: cloudcore's certificate may not
// name the address a node reaches it at), or chain and name against the system's CAs when caFile is empty. A URL
// that is not HTTPS is refused: whoever is on the path could answer it and keep a cut-off node looking connected.
func ProbeTLS(url, caFile string) (*tls.Config, error) {
	if !strings.HasPrefix(url, "https://") {
		return nil, fmt.Errorf("cloud probe %s: not HTTPS, so anyone on the path could answer it", url)
	}
	if caFile == "" {
		return &tls.Config{MinVersion: tls.VersionTLS12}, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("the cloud probe's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("the cloud probe's CA %s holds no certificate", caFile)
	}
	return chainOnlyTLS(pool), nil
}
